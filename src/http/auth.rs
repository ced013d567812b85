//! Who may call what: bearer tokens with scopes, each read from a file and compared in
//! constant time. `read` looks (`/status`, `/metrics`, `/events`), `write` changes and
//! can read too; `/health` is open to everyone, and `/upgrade` has its own token (and
//! the bundle's signature guards what runs). With no read token configured and no
//! `--public-read`, reads are closed (401): nothing is served to anybody by accident.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header::{HeaderValue, WWW_AUTHENTICATE};
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};
use serde_json::json;

use crate::config::AccessArgs;
use crate::error::Result;
use crate::tokens;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Look: status, metrics, the feed, the API's reads.
    Read,
    /// Change: submit, pause, cancel… (and look).
    Write,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// The tokens a process accepts, by scope.
#[derive(Clone, Default)]
pub struct Access {
    read: Option<String>,
    write: Option<String>,
    public_read: bool,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("read_token", &self.read.as_ref().map(|_| "***"))
            .field("write_token", &self.write.as_ref().map(|_| "***"))
            .field("public_read", &self.public_read)
            .finish()
    }
}

impl Access {
    /// Reads the token files the flags name; an unreadable or empty file is refused.
    pub fn from_args(args: &AccessArgs) -> Result<Access> {
        Access::from_args_inner(args)
    }

    /// A planner's `--metrics`: reads need the token of `token_file`, or none without one.
    pub fn metrics_only(token_file: Option<&std::path::Path>) -> Result<Access> {
        let read = tokens::from_file(token_file, "--metrics-token-file")?;
        Ok(Access {
            public_read: read.is_none(),
            read,
            write: None,
        })
    }

    fn from_args_inner(args: &AccessArgs) -> Result<Access> {
        Ok(Access {
            read: tokens::from_file(args.read_token_file.as_deref(), "--read-token-file")?,
            write: tokens::from_file(args.write_token_file.as_deref(), "--write-token-file")?,
            public_read: args.public_read,
        })
    }

    /// Whether the `Authorization` header grants `scope`.
    pub fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<(), Denied> {
        if scope == Scope::Read && self.public_read {
            return Ok(());
        }
        let accepted: Vec<&str> = match scope {
            Scope::Read => [&self.read, &self.write],
            Scope::Write => [&self.write, &None],
        }
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
        if accepted.is_empty() {
            return Err(Denied::NotConfigured(scope));
        }
        let given = tokens::bearer(authorization).unwrap_or("");
        // Every configured token is compared, whichever matches: the time taken says
        // nothing about which one was close.
        let matched = accepted
            .iter()
            .fold(false, |hit, t| tokens::matches(given, t) | hit);
        if matched {
            Ok(())
        } else {
            Err(Denied::WrongToken(scope))
        }
    }
}

/// Why a request was refused: 401 with a JSON reason.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// No token of this scope is configured (and reads are not public).
    #[error("{} is closed: this process has no {} token configured (--{}-token-file{})",
        .0.as_str(), .0.as_str(), .0.as_str(),
        if *.0 == Scope::Read { ", or --public-read" } else { "" })]
    NotConfigured(Scope),
    /// The token is missing or wrong.
    #[error("missing or wrong bearer token (Authorization: Bearer …) for the {} scope", .0.as_str())]
    WrongToken(Scope),
}

impl ResponseError for Denied {
    fn status_code(&self) -> StatusCode {
        StatusCode::UNAUTHORIZED
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::Unauthorized()
            .insert_header((WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")))
            // The API's Error shape (docs/openapi.json): `field` is always there.
            .json(json!({ "error": self.to_string(), "field": null }))
    }
}

/// Extractor: the request carries the read scope. Put it first in a handler's
/// arguments, so nothing else is extracted (or read) for a caller without it.
pub struct CanRead;

impl FromRequest for CanRead {
    type Error = Denied;
    type Future = Ready<Result<CanRead, Denied>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Read).map(|()| CanRead))
    }
}

/// Extractor: the request carries the write scope.
pub struct CanWrite;

impl FromRequest for CanWrite {
    type Error = Denied;
    type Future = Ready<Result<CanWrite, Denied>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Write).map(|()| CanWrite))
    }
}

fn check(req: &HttpRequest, scope: Scope) -> Result<(), Denied> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok());
    match req.app_data::<web::Data<Access>>() {
        Some(access) => access.check(header, scope),
        // An app built without an access table serves nothing that needs one.
        None => Err(Denied::NotConfigured(scope)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(read: Option<&str>, write: Option<&str>, public_read: bool) -> Access {
        Access {
            read: read.map(String::from),
            write: write.map(String::from),
            public_read,
        }
    }

    #[test]
    fn reads_need_the_read_or_the_write_token() {
        let a = access(Some("r"), Some("w"), false);
        assert!(a.check(Some("Bearer r"), Scope::Read).is_ok());
        assert!(a.check(Some("Bearer w"), Scope::Read).is_ok());
        assert!(matches!(
            a.check(Some("Bearer x"), Scope::Read),
            Err(Denied::WrongToken(Scope::Read))
        ));
        assert!(a.check(None, Scope::Read).is_err());
        assert!(
            a.check(Some("r"), Scope::Read).is_err(),
            "not a bearer header"
        );
    }

    #[test]
    fn writes_need_the_write_token() {
        let a = access(Some("r"), Some("w"), true);
        assert!(a.check(Some("Bearer w"), Scope::Write).is_ok());
        assert!(a.check(Some("Bearer r"), Scope::Write).is_err());
        // Public reads open reads, never writes.
        assert!(a.check(None, Scope::Read).is_ok());
        assert!(a.check(None, Scope::Write).is_err());
    }

    #[test]
    fn nothing_configured_is_closed_and_says_how_to_open_it() {
        let a = access(None, None, false);
        let e = a.check(Some("Bearer anything"), Scope::Read).unwrap_err();
        assert!(matches!(e, Denied::NotConfigured(Scope::Read)));
        assert!(e.to_string().contains("--public-read"), "{e}");
    }
}

//! Who may call what: bearer tokens with scopes. `read` looks (`/status`, `/metrics`,
//! `/events`), `write` changes and can read too, `admin` manages the named tokens and
//! can write too; `/health` is open to everyone, and `/upgrade` has its own token (and
//! the bundle's signature guards what runs). A token is one of a file's (per scope,
//! compared in constant time) or a named token of the blackboard (`artex token create`,
//! matched by its secret's SHA-256, read again every [`NAMED_REFRESH`]). With no read
//! token configured and no `--public-read`, reads are closed (401): nothing is served to
//! anybody by accident. Each request let in keeps its [`Caller`]: the audit records a
//! named token's name for what it changes.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::http::header::{HeaderValue, WWW_AUTHENTICATE};
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use artex_actors::blackboard::{LiveToken, OperatorBoard};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

pub use artex_actors::blackboard::TokenScope as Scope;

use crate::config::AccessArgs;
use crate::error::Result;
use crate::tokens;

/// How often a process reads the named tokens again: a token made or revoked works, or
/// stops working, within this (and one request's time).
pub const NAMED_REFRESH: Duration = Duration::from_secs(2);

/// A named token as a process holds it: by the SHA-256 of its secret.
#[derive(Debug, Clone)]
struct Grant {
    name: String,
    scope: Scope,
    expires_at: Option<DateTime<Utc>>,
}

type Named = Arc<RwLock<HashMap<[u8; 32], Grant>>>;

/// Who made a request, as its token says: what `/api/v1/whoami` answers and the audit
/// records (see `api::actor`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Caller {
    /// The named token's name; none for a token file or a public read.
    pub name: Option<String>,
    /// What the token may do.
    pub scope: Scope,
    /// `named` (`artex token create`), `file` (`--read-token-file`,
    /// `--write-token-file`) or `public` (`--public-read`, no token).
    pub by: &'static str,
    /// When a named token stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Caller {
    fn file(scope: Scope) -> Caller {
        Caller {
            name: None,
            scope,
            by: "file",
            expires_at: None,
        }
    }
}

/// The tokens a process accepts: one file per scope, and the named tokens of the
/// blackboard once [`Access::watch`] reads them.
#[derive(Clone, Default)]
pub struct Access {
    read: Option<String>,
    write: Option<String>,
    public_read: bool,
    named: Named,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("read_token", &self.read.as_ref().map(|_| "***"))
            .field("write_token", &self.write.as_ref().map(|_| "***"))
            .field("public_read", &self.public_read)
            .field("named_tokens", &self.named_count())
            .finish()
    }
}

impl Access {
    /// Reads the token files the flags name; an unreadable or empty file is refused.
    pub fn from_args(args: &AccessArgs) -> Result<Access> {
        Ok(Access {
            read: tokens::from_file(args.read_token_file.as_deref(), "--read-token-file")?,
            write: tokens::from_file(args.write_token_file.as_deref(), "--write-token-file")?,
            public_read: args.public_read,
            named: Named::default(),
        })
    }

    /// A planner's `--metrics`: reads need the token of `token_file`, or none without one.
    pub fn metrics_only(token_file: Option<&std::path::Path>) -> Result<Access> {
        let read = tokens::from_file(token_file, "--metrics-token-file")?;
        Ok(Access {
            public_read: read.is_none(),
            read,
            write: None,
            named: Named::default(),
        })
    }

    fn named_count(&self) -> usize {
        self.named.read().map_or(0, |n| n.len())
    }

    /// Reads the named tokens now, then every [`NAMED_REFRESH`] for as long as a clone of
    /// this access table lives. A read that fails keeps the tokens of the last one (the
    /// blackboard out of reach refuses the writes anyway) and says so once.
    pub async fn watch(&self, board: OperatorBoard) {
        let mut failing = !refresh(&self.named, &board, false).await;
        let named = Arc::downgrade(&self.named);
        actix::spawn(async move {
            loop {
                tokio::time::sleep(NAMED_REFRESH).await;
                let Some(named) = named.upgrade() else {
                    return;
                };
                failing = !refresh(&named, &board, failing).await;
            }
        });
    }

    /// Who the `Authorization` header says the caller is, if it names a token this
    /// process accepts (a named token that expired since the last read does not count).
    fn identify(&self, given: &str) -> Option<Caller> {
        // Both files are compared, whichever matches: the time taken says nothing about
        // which one was close. A named token is found by its secret's hash.
        let write = self
            .write
            .as_deref()
            .is_some_and(|t| tokens::matches(given, t));
        let read = self
            .read
            .as_deref()
            .is_some_and(|t| tokens::matches(given, t));
        if write {
            return Some(Caller::file(Scope::Write));
        }
        if read {
            return Some(Caller::file(Scope::Read));
        }
        if given.is_empty() {
            return None;
        }
        let named = self.named.read().ok()?;
        let grant = named.get(&tokens::secret_sha256(given))?;
        if grant.expires_at.is_some_and(|at| at <= Utc::now()) {
            return None;
        }
        Some(Caller {
            name: Some(grant.name.clone()),
            scope: grant.scope,
            by: "named",
            expires_at: grant.expires_at,
        })
    }

    /// Whether the `Authorization` header grants `scope`, and to whom.
    pub fn check(&self, authorization: Option<&str>, scope: Scope) -> Result<Caller, Denied> {
        let given = tokens::bearer(authorization).unwrap_or("");
        let caller = self.identify(given);
        match caller {
            Some(c) if c.scope >= scope => return Ok(c),
            Some(Caller {
                name: Some(name),
                scope: has,
                ..
            }) if !self.public_read || scope != Scope::Read => {
                return Err(Denied::TooNarrow {
                    name,
                    has,
                    needs: scope,
                })
            }
            _ => {}
        }
        if scope == Scope::Read && self.public_read {
            return Ok(Caller {
                name: None,
                scope: Scope::Read,
                by: "public",
                expires_at: None,
            });
        }
        let file = match scope {
            Scope::Read => self.read.is_some() || self.write.is_some(),
            Scope::Write => self.write.is_some(),
            Scope::Admin => false,
        };
        if !file && self.named_count() == 0 {
            return Err(Denied::NotConfigured(scope));
        }
        Err(Denied::WrongToken(scope))
    }
}

/// Replaces `named` with the live tokens of the blackboard: whether it could read them.
async fn refresh(named: &Named, board: &OperatorBoard, was_failing: bool) -> bool {
    match board.live_tokens().await {
        Ok(live) => {
            let by_hash = live.into_iter().filter_map(grant).collect();
            if let Ok(mut n) = named.write() {
                *n = by_hash;
            }
            if was_failing {
                tracing::info!("named tokens: read again from the blackboard");
            }
            true
        }
        Err(e) => {
            if !was_failing {
                tracing::warn!(error = %e,
                    "named tokens: cannot read them; the last ones read stay in use");
            }
            false
        }
    }
}

fn grant(t: LiveToken) -> Option<([u8; 32], Grant)> {
    let hash = <[u8; 32]>::try_from(t.secret_sha256.as_slice()).ok()?;
    Some((
        hash,
        Grant {
            name: t.name,
            scope: t.scope,
            expires_at: t.expires_at,
        },
    ))
}

/// Why a request was refused: 401 with a JSON reason.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// No token of this scope is configured (and reads are not public).
    #[error("{} is closed: this process has no {} token configured ({}a named token: \
        artex token create NAME --scope {}{})",
        .0.as_str(), .0.as_str(),
        if *.0 == Scope::Admin { String::new() } else { format!("--{}-token-file, ", .0.as_str()) },
        .0.as_str(),
        if *.0 == Scope::Read { ", or --public-read" } else { "" })]
    NotConfigured(Scope),
    /// The token is missing or wrong (or revoked, or expired).
    #[error("missing or wrong bearer token (Authorization: Bearer …) for the {} scope", .0.as_str())]
    WrongToken(Scope),
    /// A named token whose scope does not reach this.
    #[error("the token {name:?} has the {} scope; this needs {}", .has.as_str(), .needs.as_str())]
    TooNarrow {
        /// The token's name.
        name: String,
        /// Its scope.
        has: Scope,
        /// The scope needed.
        needs: Scope,
    },
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

/// Extractor: the request carries the admin scope (a named token's only).
pub struct CanAdmin;

impl FromRequest for CanAdmin {
    type Error = Denied;
    type Future = Ready<Result<CanAdmin, Denied>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Admin).map(|()| CanAdmin))
    }
}

/// Checks `req` for `scope` and keeps its [`Caller`] in the request (see [`caller`]).
fn check(req: &HttpRequest, scope: Scope) -> Result<(), Denied> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok());
    let caller = match req.app_data::<web::Data<Access>>() {
        Some(access) => access.check(header, scope)?,
        // An app built without an access table serves nothing that needs one.
        None => return Err(Denied::NotConfigured(scope)),
    };
    req.extensions_mut().insert(caller);
    Ok(())
}

/// Who made `req`, once an extractor above let it in.
pub fn caller(req: &HttpRequest) -> Option<Caller> {
    req.extensions().get::<Caller>().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(read: Option<&str>, write: Option<&str>, public_read: bool) -> Access {
        Access {
            read: read.map(String::from),
            write: write.map(String::from),
            public_read,
            named: Named::default(),
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

    fn with_named(a: Access, secret: &str, name: &str, scope: Scope, expired: bool) -> Access {
        let expires_at = expired.then(|| Utc::now() - chrono::Duration::seconds(1));
        let grant = Grant {
            name: name.into(),
            scope,
            expires_at,
        };
        a.named
            .write()
            .unwrap()
            .insert(tokens::secret_sha256(secret), grant);
        a
    }

    #[test]
    fn a_named_token_grants_its_scope_and_those_below_it() {
        let a = with_named(
            access(None, None, false),
            "s-admin",
            "ops",
            Scope::Admin,
            false,
        );
        let a = with_named(a, "s-read", "viewer", Scope::Read, false);
        let a = with_named(a, "s-old", "old", Scope::Write, true);
        let c = a.check(Some("Bearer s-admin"), Scope::Write).unwrap();
        assert_eq!(
            (c.name.as_deref(), c.scope, c.by),
            (Some("ops"), Scope::Admin, "named")
        );
        assert!(a.check(Some("Bearer s-read"), Scope::Read).is_ok());
        let e = a.check(Some("Bearer s-read"), Scope::Write).unwrap_err();
        assert!(matches!(e, Denied::TooNarrow { .. }), "{e}");
        assert!(
            e.to_string().contains("\"viewer\" has the read scope"),
            "{e}"
        );
        // Expired since the last read: refused at once.
        assert!(matches!(
            a.check(Some("Bearer s-old"), Scope::Read),
            Err(Denied::WrongToken(Scope::Read))
        ));
        // Named tokens exist: a wrong one is wrong, not "not configured".
        assert!(matches!(
            a.check(Some("Bearer nope"), Scope::Read),
            Err(Denied::WrongToken(Scope::Read))
        ));
    }

    #[test]
    fn files_never_grant_admin_and_public_reads_still_name_the_caller() {
        let a = access(Some("r"), Some("w"), true);
        assert!(matches!(
            a.check(Some("Bearer w"), Scope::Admin),
            Err(Denied::NotConfigured(Scope::Admin))
        ));
        let a = with_named(a, "s", "viewer", Scope::Read, false);
        let c = a.check(Some("Bearer s"), Scope::Read).unwrap();
        assert_eq!(c.name.as_deref(), Some("viewer"));
        assert_eq!(a.check(None, Scope::Read).unwrap().by, "public");
        assert_eq!(
            a.check(Some("Bearer w"), Scope::Read).unwrap().scope,
            Scope::Write
        );
    }

    #[test]
    fn nothing_configured_is_closed_and_says_how_to_open_it() {
        let a = access(None, None, false);
        let e = a.check(Some("Bearer anything"), Scope::Read).unwrap_err();
        assert!(matches!(e, Denied::NotConfigured(Scope::Read)));
        assert!(e.to_string().contains("--public-read"), "{e}");
    }
}

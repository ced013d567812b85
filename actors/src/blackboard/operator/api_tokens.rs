//! Named API tokens (`artex token create|list|revoke`, `/api/v1/tokens`): each has a
//! name, a scope (read, write or admin) and maybe an expiry; the blackboard holds the
//! SHA-256 of its secret, never the secret (migrations/V41__named_tokens.sql). Every
//! `artex serve` and worker reads the live ones ([`OperatorBoard::live_tokens`]) every
//! few seconds. Revoking keeps the row: who made a token, who revoked it and when stay
//! readable. The caller makes the secret and hashes it; this module stores and reads.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OperatorBoard;
use crate::error::{Error, Result};

/// The most characters a token's name may have (the column's check).
pub const MAX_TOKEN_NAME_CHARS: usize = 64;

const CREATE: &str = "insert into artex.api_tokens
        (name, scope, secret_sha256, created_by, expires_at)
    values ($1, $2, decode($3, 'hex'), $4, $5)
    on conflict (name) where revoked_at is null do nothing
    returning created_at";
const REVOKE: &str = "update artex.api_tokens set revoked_at = now(), revoked_by = $2
    where name = $1 and revoked_at is null
    returning revoked_at";
const LIST: &str = "select name, scope, created_by, created_at, expires_at,
        revoked_by, revoked_at
    from artex.api_tokens
    where $1 or revoked_at is null
    order by name, id";
const LIVE: &str = "select secret_sha256, name, scope, expires_at from artex.api_tokens
    where revoked_at is null and (expires_at is null or expires_at > now())";

/// What a token may do; each scope can do what the ones before it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Look: the API's reads, `/status`, `/metrics`, `/events`.
    Read,
    /// Change: submit, control, limits, pauses, schedules, signals, uploads.
    Write,
    /// Manage the named tokens too.
    Admin,
}

impl TokenScope {
    /// The scope's name, as the CLI, the API and the table spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Write => "write",
            TokenScope::Admin => "admin",
        }
    }

    /// The scope named `s`, or why not.
    pub fn parse(s: &str) -> Result<TokenScope> {
        match s {
            "read" => Ok(TokenScope::Read),
            "write" => Ok(TokenScope::Write),
            "admin" => Ok(TokenScope::Admin),
            other => Err(Error::Invalid(format!(
                "scope: {other:?} is not a scope; read, write or admin"
            ))),
        }
    }
}

/// A named token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenInfo {
    /// Its name: what the audit records for what it does.
    pub name: String,
    /// What it may do.
    pub scope: TokenScope,
    /// Who made it.
    pub created_by: String,
    /// When.
    pub created_at: DateTime<Utc>,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// Who revoked it, if anyone.
    pub revoked_by: Option<String>,
    /// When.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A token a process accepts now: the hash of its secret, its name, scope and expiry.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveToken {
    /// SHA-256 of the secret.
    pub secret_sha256: Vec<u8>,
    /// Its name.
    pub name: String,
    /// What it may do.
    pub scope: TokenScope,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Why `name` cannot name a token (the table's check, said in words).
pub fn check_token_name(name: &str) -> Result {
    let valid = name.chars().count() <= MAX_TOKEN_NAME_CHARS
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'));
    if valid {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "name: {name:?} is not a token name; 1 to {MAX_TOKEN_NAME_CHARS} characters, \
             letters, digits and . _ @ -, starting with a letter or a digit"
        )))
    }
}

impl OperatorBoard {
    /// Stores a token named `name` whose secret hashes to `secret_sha256`, made by
    /// `actor`: refused when a live token has that name.
    pub async fn create_token(
        &self,
        name: &str,
        scope: TokenScope,
        secret_sha256: &[u8],
        expires_at: Option<DateTime<Utc>>,
        actor: &str,
    ) -> Result<DateTime<Utc>> {
        check_token_name(name)?;
        if expires_at.is_some_and(|at| at <= Utc::now()) {
            return Err(Error::Invalid("expires: must be in the future".into()));
        }
        let hash: String = secret_sha256.iter().map(|b| format!("{b:02x}")).collect();
        let client = self.bb.client().await?;
        let row = client
            .query_opt(
                CREATE,
                &[&name, &scope.as_str(), &hash, &actor, &expires_at],
            )
            .await?;
        match row {
            Some(r) => Ok(r.try_get(0)?),
            None => Err(Error::Refused(format!(
                "name: a live token is named {name:?} already; revoke it first \
                 (artex token revoke {name})"
            ))),
        }
    }

    /// Revokes the live token named `name` as `actor`: when, or `None` when no live
    /// token has that name.
    pub async fn revoke_token(&self, name: &str, actor: &str) -> Result<Option<DateTime<Utc>>> {
        check_token_name(name)?;
        let client = self.bb.client().await?;
        Ok(match client.query_opt(REVOKE, &[&name, &actor]).await? {
            Some(r) => Some(r.try_get(0)?),
            None => None,
        })
    }

    /// The tokens by name, the revoked ones too when `revoked`.
    pub async fn tokens(&self, revoked: bool) -> Result<Vec<TokenInfo>> {
        let client = self.bb.client().await?;
        client
            .query(LIST, &[&revoked])
            .await?
            .iter()
            .map(|r| {
                Ok(TokenInfo {
                    name: r.try_get(0)?,
                    scope: TokenScope::parse(r.try_get(1)?)?,
                    created_by: r.try_get(2)?,
                    created_at: r.try_get(3)?,
                    expires_at: r.try_get(4)?,
                    revoked_by: r.try_get(5)?,
                    revoked_at: r.try_get(6)?,
                })
            })
            .collect()
    }

    /// The tokens that work now: neither revoked nor expired.
    pub async fn live_tokens(&self) -> Result<Vec<LiveToken>> {
        let client = self.bb.client().await?;
        client
            .query(LIVE, &[])
            .await?
            .iter()
            .map(|r| {
                Ok(LiveToken {
                    secret_sha256: r.try_get(0)?,
                    name: r.try_get(1)?,
                    scope: TokenScope::parse(r.try_get(2)?)?,
                    expires_at: r.try_get(3)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_names_follow_the_tables_check() {
        for good in ["ci", "team-a.deploy", "alice@ops", "x_1", &"a".repeat(64)] {
            assert!(check_token_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-ci", "a b", "ci/1", "é", &"a".repeat(65)] {
            let e = check_token_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("name:"), "{bad}: {e}");
        }
    }

    #[test]
    fn scopes_parse_and_order() {
        for s in [TokenScope::Read, TokenScope::Write, TokenScope::Admin] {
            assert_eq!(TokenScope::parse(s.as_str()).unwrap(), s);
        }
        assert!(TokenScope::Read < TokenScope::Write && TokenScope::Write < TokenScope::Admin);
        let e = TokenScope::parse("root").unwrap_err().to_string();
        assert!(e.contains("read, write or admin"), "{e}");
    }
}

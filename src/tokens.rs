//! Bearer tokens: read from a file (trimmed; an empty file is refused), taken from an
//! `Authorization: Bearer …` header, and compared in constant time. Used by every scope:
//! read and write (`http::auth`) and upgrade (`hot_upgrade`). Named tokens
//! (`artex token create`) are made here: a random secret, of which the blackboard keeps
//! only the SHA-256.

use std::path::Path;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// The token in `file`, named by `flag` in errors; `None` without a file.
pub fn from_file(file: Option<&Path>, flag: &str) -> Result<Option<String>> {
    let Some(file) = file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("reading {flag} {}", file.display()), e))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(Error::Invalid(format!(
            "{flag} {}: the file is empty; put the token in it",
            file.display()
        )));
    }
    Ok(Some(token.to_string()))
}

/// What a named token's secret starts with: a secret found in a log or a repository
/// says what it is.
pub const SECRET_PREFIX: &str = "artex_";

/// A new named token's secret: [`SECRET_PREFIX`] and 32 random bytes from the operating
/// system, in hex.
pub fn new_secret() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Invalid(format!("no randomness for a token's secret: {e}")))?;
    Ok(format!("{SECRET_PREFIX}{}", hex::encode(bytes)))
}

/// When a named token made now for `lifetime` stops working; why not, if it cannot
/// (a lifetime of 0, or one past what a timestamp holds).
pub fn expiry(lifetime: std::time::Duration) -> std::result::Result<DateTime<Utc>, String> {
    chrono::Duration::from_std(lifetime)
        .ok()
        .filter(|d| *d > chrono::Duration::zero())
        .and_then(|d| Utc::now().checked_add_signed(d))
        .ok_or_else(|| "must be more than 0 and less than a few centuries".to_string())
}

/// The SHA-256 of a secret: what the blackboard holds and requests are matched by.
pub fn secret_sha256(secret: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(secret.as_bytes()).into()
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    authorization
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Whether `given` is `token`, taking as long whatever the first differing byte: a
/// token compared byte by byte with an early exit tells an attacker, by timing, how much
/// they got right. Empty never matches.
pub fn matches(given: &str, token: &str) -> bool {
    let (a, b) = (given.as_bytes(), token.as_bytes());
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_whole_and_never_empty() {
        assert!(matches("s3cret", "s3cret"));
        assert!(!matches("s3cre", "s3cret"));
        assert!(!matches("s3creT", "s3cret"));
        assert!(!matches("", ""));
        assert_eq!(bearer(Some("Bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn secrets_are_new_each_time_and_hash_to_32_bytes() {
        let (a, b) = (new_secret().unwrap(), new_secret().unwrap());
        assert_ne!(a, b);
        assert!(
            a.starts_with(SECRET_PREFIX) && a.len() == SECRET_PREFIX.len() + 64,
            "{a}"
        );
        assert_eq!(secret_sha256(&a), secret_sha256(&a.clone()));
        assert_ne!(secret_sha256(&a), secret_sha256(&b));
    }

    #[test]
    fn a_token_file_must_hold_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, " tok\n").unwrap();
        assert_eq!(from_file(Some(&f), "--x").unwrap().as_deref(), Some("tok"));
        std::fs::write(&f, "\n").unwrap();
        let e = from_file(Some(&f), "--x").unwrap_err().to_string();
        assert!(e.contains("--x") && e.contains("empty"), "{e}");
        assert!(from_file(None, "--x").unwrap().is_none());
    }
}

//! Bearer tokens: read from a file (trimmed; an empty file is refused), taken from an
//! `Authorization: Bearer …` header, and compared in constant time. Used by every scope:
//! read and write (`http::auth`) and upgrade (`hot_upgrade`).

use std::path::Path;

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

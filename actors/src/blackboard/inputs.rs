//! What the blackboard accepts from submitters (migrations/V4__input_limits.sql): kinds
//! are names, payloads are JSON PostgreSQL can store and no larger than
//! `artex.limits.max_payload_bytes`, and `artex.kinds` remembers every kind a worker has
//! declared. The database enforces the first two for every writer; the rules are
//! repeated here only as checks that give a submitter a clean message first.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

/// The longest kind name, in bytes (as `artex.is_kind_name`).
pub const MAX_KIND_BYTES: usize = 100;

/// The payload size limit a fresh blackboard starts with: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: i32 = 1 << 20;

/// What a kind name may be, for messages and documentation.
pub const KIND_CHARSET: &str = "letters, digits and . _ : - (starting with a letter or digit)";

/// Why `kind` is not a kind name, or `Ok`: `[A-Za-z0-9][A-Za-z0-9._:-]*`, at most
/// [`MAX_KIND_BYTES`] bytes, the rule `artex.is_kind_name` applies in the database.
pub fn check_kind(kind: &str) -> std::result::Result<(), String> {
    if kind.is_empty() {
        return Err("must not be empty".into());
    }
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    let starts_well = kind.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !starts_well || !kind.chars().all(name_char) {
        // Debug formatting keeps a newline or a quote in the kind on one visible line.
        return Err(format!(
            "{kind:?} is not a kind name; expected {KIND_CHARSET}, at most {MAX_KIND_BYTES} bytes"
        ));
    }
    if kind.len() > MAX_KIND_BYTES {
        return Err(format!(
            "{} bytes long, at most {MAX_KIND_BYTES} allowed",
            kind.len()
        ));
    }
    Ok(())
}

/// Why PostgreSQL's `jsonb` would refuse `payload`, or `Ok`: it cannot hold the
/// character U+0000 (`\u0000`) in a string or a key.
pub fn check_payload(payload: &Value) -> std::result::Result<(), String> {
    fn has_nul(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(a) => a.iter().any(has_nul),
            Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    if has_nul(payload) {
        return Err(
            "contains the character \\u0000, which PostgreSQL cannot store in jsonb".into(),
        );
    }
    Ok(())
}

/// The size the database's limit counts: bytes of `payload` as PostgreSQL prints it
/// (`octet_length(payload::text)`). That is the compact JSON artex sends plus the space
/// PostgreSQL writes after every `:` and `,`.
pub fn payload_text_len(payload: &Value) -> usize {
    fn separators(v: &Value) -> usize {
        match v {
            Value::Array(a) => a.len().saturating_sub(1) + a.iter().map(separators).sum::<usize>(),
            Value::Object(o) => {
                o.len() + o.len().saturating_sub(1) + o.values().map(separators).sum::<usize>()
            }
            _ => 0,
        }
    }
    // Writing into a counter, not a buffer: a large payload is not copied to be measured.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serializing a `Value` into a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, payload);
    count.0 + separators(payload)
}

/// What the blackboard accepts (the row of `artex.limits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// The largest payload, in bytes of its JSON text.
    pub max_payload_bytes: i32,
    /// When the limits were last changed.
    pub updated_at: DateTime<Utc>,
}

/// A kind some worker has declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnownKind {
    /// The kind.
    pub kind: String,
    /// When a worker first registered with it.
    pub first_seen: DateTime<Utc>,
    /// When a worker last registered with it.
    pub last_seen: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_are_names() {
        for ok in [
            "echo",
            "resize.v2",
            "img:thumb",
            "a_b-c",
            "9",
            &"k".repeat(100),
        ] {
            assert_eq!(check_kind(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "a\nb", "a'b", "a\"b", "../etc", "a/b", ".hidden", "-x", "a b", "é",
        ] {
            assert!(check_kind(bad).is_err(), "{bad:?}");
        }
        let long = check_kind(&"k".repeat(101)).unwrap_err();
        assert!(long.contains("101 bytes"), "{long}");
        let newline = check_kind("a\nb").unwrap_err();
        assert_eq!(newline.lines().count(), 1, "{newline}");
    }

    #[test]
    fn nul_is_refused_anywhere_in_the_payload() {
        assert!(check_payload(&json!({"a": [1, "x\u{0}"]})).is_err());
        assert!(check_payload(&json!({"k\u{0}": 1})).is_err());
        assert!(check_payload(&json!({"a": [1, "x", {"b": null}]})).is_ok());
    }

    #[test]
    fn payload_size_counts_what_postgres_prints() {
        // PostgreSQL prints {"a": 1, "b": [1, 2, {}], "c": "x"}.
        let v = json!({"a": 1, "b": [1, 2, {}], "c": "x"});
        assert_eq!(
            payload_text_len(&v),
            r#"{"a": 1, "b": [1, 2, {}], "c": "x"}"#.len()
        );
        assert_eq!(payload_text_len(&json!({})), 2);
        assert_eq!(payload_text_len(&json!([])), 2);
        assert_eq!(payload_text_len(&json!("é")), 4);
    }
}

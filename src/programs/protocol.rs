//! What a program says on its descriptor 3 (protocol version 1, docs/programs.md): one
//! JSON object per line, each with one key the protocol knows. A pure rule: the line in,
//! what it says (or what is wrong with it) out.

use serde_json::{Map, Value};

/// The longest line read on descriptor 3 (a result or checkpoint is one line).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// One line of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// How far it is, 0 to 1, with an optional message.
    Progress(f64, Option<String>),
    /// Progress to save, durably, fenced by the attempt's lease.
    Checkpoint(Value),
    /// The task's result if the program exits 0 (the last one wins).
    Result(Value),
    /// Fail now, no retry.
    Discard(String),
    /// Run again after this many milliseconds, no attempt counted.
    Snooze(u64),
    /// Retried at this time, an attempt counted.
    RetryAt(chrono::DateTime<chrono::Utc>, String),
}

/// Reads one line (without its newline). `Ok(None)` for a blank line. The error says
/// what is wrong, for the task's error after `fd 3 line N: `.
pub fn parse(line: &[u8]) -> Result<Option<Line>, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut obj) = value else {
        return Err(format!("expected a JSON object, got {}", kind_of(&value)));
    };
    let line = if obj.contains_key("progress") {
        let fraction = number(&obj, "progress")?;
        let message = match obj.remove("message") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => return Err(wrong("message", "a string", &other)),
        };
        only(&obj, "progress", &[])?;
        Line::Progress(fraction, message)
    } else if let Some(v) = obj.remove("checkpoint") {
        only(&obj, "checkpoint", &[])?;
        Line::Checkpoint(v)
    } else if let Some(v) = obj.remove("result") {
        only(&obj, "result", &[])?;
        Line::Result(v)
    } else if let Some(v) = obj.remove("discard") {
        only(&obj, "discard", &[])?;
        match v {
            Value::String(reason) => Line::Discard(reason),
            other => return Err(wrong("discard", "a string (the reason)", &other)),
        }
    } else if let Some(v) = obj.remove("snooze_ms") {
        only(&obj, "snooze_ms", &[])?;
        match v.as_u64() {
            Some(ms) => Line::Snooze(ms),
            None => return Err(wrong("snooze_ms", "a whole number of milliseconds", &v)),
        }
    } else if let Some(v) = obj.remove("retry_at") {
        let reason = match obj.remove("reason") {
            None | Some(Value::Null) => String::from("asked by the program"),
            Some(Value::String(s)) => s,
            Some(other) => return Err(wrong("reason", "a string", &other)),
        };
        only(&obj, "retry_at", &[])?;
        let at = v
            .as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .ok_or_else(|| wrong("retry_at", "an RFC 3339 time", &v))?;
        Line::RetryAt(at.with_timezone(&chrono::Utc), reason)
    } else {
        return Err(match obj.keys().next() {
            Some(k) => format!("unknown key {k:?}; expected one of progress, checkpoint, result, discard, snooze_ms, retry_at"),
            None => "an empty object; expected one of progress, checkpoint, result, discard, snooze_ms, retry_at".into(),
        });
    };
    Ok(Some(line))
}

fn number(obj: &Map<String, Value>, key: &str) -> Result<f64, String> {
    let v = &obj[key];
    v.as_f64()
        .filter(|f| f.is_finite())
        .ok_or_else(|| wrong(key, "a number", v))
}

/// No key but `key` (already taken out) and `also` may be left in `obj`.
fn only(obj: &Map<String, Value>, key: &str, also: &[&str]) -> Result<(), String> {
    match obj
        .keys()
        .find(|k| k.as_str() != key && !also.contains(&k.as_str()))
    {
        Some(extra) => Err(format!("unknown key {extra:?} beside {key:?}")),
        None => Ok(()),
    }
}

fn wrong(key: &str, expected: &str, got: &Value) -> String {
    format!("expected {expected} for {key:?}, got {}", kind_of(got))
}

fn kind_of(v: &Value) -> String {
    let text = v.to_string();
    let shown: String = text.chars().take(40).collect();
    let more = if shown.len() < text.len() { "…" } else { "" };
    format!("{shown}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(s: &str) -> Option<Line> {
        parse(s.as_bytes()).unwrap()
    }

    fn err(s: &str) -> String {
        parse(s.as_bytes()).unwrap_err()
    }

    #[test]
    fn each_key_reads_as_its_line() {
        assert_eq!(
            ok(r#"{"progress": 0.4, "message": "resizing"}"#),
            Some(Line::Progress(0.4, Some("resizing".into())))
        );
        assert_eq!(ok(r#"{"progress": 1}"#), Some(Line::Progress(1.0, None)));
        assert_eq!(
            ok(r#"{"checkpoint": {"step": 3}}"#),
            Some(Line::Checkpoint(json!({"step": 3})))
        );
        assert_eq!(ok(r#"{"result": null}"#), Some(Line::Result(Value::Null)));
        assert_eq!(
            ok(r#"{"discard": "no such file"}"#),
            Some(Line::Discard("no such file".into()))
        );
        assert_eq!(ok(r#"{"snooze_ms": 250}"#), Some(Line::Snooze(250)));
        let at = chrono::DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z").unwrap();
        assert_eq!(
            ok(r#"{"retry_at": "2030-01-02T03:04:05Z", "reason": "rate limited"}"#),
            Some(Line::RetryAt(at.into(), "rate limited".into()))
        );
        assert_eq!(ok("   "), None);
        assert_eq!(ok(""), None);
    }

    #[test]
    fn a_bad_line_says_what_is_wrong() {
        let cases = [
            ("[1]", "expected a JSON object, got [1]"),
            (
                r#"{"progress": "half"}"#,
                r#"expected a number for "progress", got "half""#,
            ),
            (
                r#"{"progres": 0.5}"#,
                r#"unknown key "progres"; expected one of progress, checkpoint, result, discard, snooze_ms, retry_at"#,
            ),
            (
                r#"{"result": 1, "extra": 2}"#,
                r#"unknown key "extra" beside "result""#,
            ),
            (
                r#"{"snooze_ms": -5}"#,
                r#"expected a whole number of milliseconds for "snooze_ms", got -5"#,
            ),
            (
                r#"{"retry_at": "tomorrow"}"#,
                r#"expected an RFC 3339 time for "retry_at", got "tomorrow""#,
            ),
            (
                r#"{"discard": 3}"#,
                r#"expected a string (the reason) for "discard", got 3"#,
            ),
        ];
        for (line, says) in cases {
            assert_eq!(err(line), says, "{line}");
        }
        assert!(
            err("{not json").starts_with("not JSON: "),
            "{}",
            err("{not json")
        );
        assert!(err("{}").starts_with("an empty object"));
    }
}

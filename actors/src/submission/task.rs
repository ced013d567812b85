//! The rules on one task's fields, wherever it is submitted (alone, in a batch, in a
//! flow): its kind is a name, its payload fits `jsonb`, retries, timeout, shard, unique
//! and limit keys and tags within the columns' checks.

use serde_json::Value;

use super::{Field, FlowTaskSpec, NewTask};

/// The longest kind name, in bytes (as `artex.is_kind_name`).
pub const MAX_KIND_BYTES: usize = 100;

/// What a kind name may be, for messages and documentation.
pub const KIND_CHARSET: &str = "letters, digits and . _ : - (starting with a letter or digit)";

/// Retries after the first attempt, at most: a task that fails a thousand times will not
/// succeed on the next, and each attempt is rows in the history.
pub const MAX_RETRIES: i32 = 1000;

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

/// The fields of a task the rules are about, borrowed: a flow's tasks are checked
/// without copying their payloads.
pub(super) struct TaskFields<'a> {
    kind: &'a str,
    payload: &'a Value,
    max_retries: Option<i32>,
    timeout_ms: Option<i32>,
    shard_key: Option<&'a str>,
    unique_key: Option<&'a str>,
    unique_for: Option<std::time::Duration>,
    tags: &'a [String],
    limit_key: Option<&'a str>,
    traceparent: Option<&'a str>,
}

impl<'a> From<&'a NewTask> for TaskFields<'a> {
    fn from(t: &'a NewTask) -> Self {
        TaskFields {
            kind: &t.kind,
            payload: &t.payload,
            max_retries: t.max_retries,
            timeout_ms: t.timeout_ms,
            shard_key: t.shard_key.as_deref(),
            unique_key: t.unique_key.as_deref(),
            unique_for: t.unique_for,
            tags: &t.tags,
            limit_key: t.limit_key.as_deref(),
            traceparent: t.traceparent.as_deref(),
        }
    }
}

impl<'a> From<&'a FlowTaskSpec> for TaskFields<'a> {
    fn from(t: &'a FlowTaskSpec) -> Self {
        TaskFields {
            kind: &t.kind,
            payload: &t.payload,
            max_retries: t.max_retries,
            timeout_ms: t.timeout_ms,
            shard_key: t.shard_key.as_deref(),
            unique_key: None,
            unique_for: None,
            tags: &[],
            limit_key: None,
            traceparent: None,
        }
    }
}

/// The longest unique key, in bytes (the column's check).
pub const MAX_UNIQUE_KEY_BYTES: usize = 200;

/// The longest `unique_for` window: 100 years, all the history there can be. A longer
/// one reached past the oldest time PostgreSQL holds and failed the duplicate check with
/// "timestamp out of range" (found by tests/api/submit_fuzz.rs).
pub const MAX_UNIQUE_FOR: std::time::Duration = std::time::Duration::from_secs(36_500 * 86_400);

/// The most tags a task may carry (the column's check, `artex.tags_valid`).
pub const MAX_TAGS: usize = 20;

/// The longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;

/// The longest limit key, in bytes (the column's check).
pub const MAX_LIMIT_KEY_BYTES: usize = 200;

/// Why a key (unique or limit) breaks the column's rules, if it does.
fn key_rules(key: &str, max: usize) -> Option<String> {
    if key.is_empty() {
        Some("must not be empty".into())
    } else if key.contains('\0') {
        // PostgreSQL text cannot hold U+0000.
        Some("contains the character \\u0000, which PostgreSQL cannot store".into())
    } else if key.len() > max {
        Some(format!("{} bytes long, at most {max} allowed", key.len()))
    } else {
        None
    }
}

/// Why a task's tags break the column's rules, if they do.
fn tags_rules(tags: &[String]) -> Option<String> {
    if tags.len() > MAX_TAGS {
        return Some(format!("{} tags, at most {MAX_TAGS} allowed", tags.len()));
    }
    tags.iter()
        .enumerate()
        .find_map(|(i, t)| key_rules(t, MAX_TAG_BYTES).map(|why| format!("tag #{} {why}", i + 1)))
}

/// The first field of a task that breaks a rule, and why.
pub(super) fn task_rules<'a>(
    t: impl Into<TaskFields<'a>>,
) -> std::result::Result<(), (Field, String)> {
    let t = t.into();
    check_kind(t.kind).map_err(|e| (Field::Kind, e))?;
    if t.kind == super::WAIT_KIND {
        return Err((
            Field::Kind,
            format!(
                "{WAIT_KIND:?} is the kind of flows' waits; a task cannot have it (a flow \
                     task waits with \"wait\": {{…}})",
                WAIT_KIND = super::WAIT_KIND
            ),
        ));
    }
    check_payload(t.payload).map_err(|e| (Field::Payload, e))?;
    if let Some(n) = t.max_retries.filter(|n| !(0..=MAX_RETRIES).contains(n)) {
        return Err((
            Field::MaxRetries,
            format!("{n}; expected 0 to {MAX_RETRIES}"),
        ));
    }
    if let Some(ms) = t.timeout_ms.filter(|&ms| ms <= 0) {
        return Err((
            Field::TimeoutMs,
            format!("{ms}; expected a positive number of milliseconds"),
        ));
    }
    match t.shard_key {
        Some("") => return Err((Field::ShardKey, "must not be empty".into())),
        // PostgreSQL text cannot hold U+0000 either.
        Some(k) if k.contains('\0') => {
            return Err((
                Field::ShardKey,
                "contains the character \\u0000, which PostgreSQL cannot store".into(),
            ))
        }
        _ => {}
    }
    if let Some(why) = t
        .unique_key
        .and_then(|k| key_rules(k, MAX_UNIQUE_KEY_BYTES))
    {
        return Err((Field::UniqueKey, why));
    }
    if let Some(why) = t.limit_key.and_then(|k| key_rules(k, MAX_LIMIT_KEY_BYTES)) {
        return Err((Field::LimitKey, why));
    }
    if let Some(why) = tags_rules(t.tags) {
        return Err((Field::Tags, why));
    }
    if let Some(tp) = t.traceparent {
        crate::trace::TraceParent::parse(tp).map_err(|why| (Field::TraceParent, why))?;
    }
    if t.unique_for.is_some() && t.unique_key.is_none() {
        return Err((
            Field::UniqueFor,
            "needs a unique_key: the window is how long a finished task keeps its key".into(),
        ));
    }
    if let Some(w) = t.unique_for.filter(|w| *w > MAX_UNIQUE_FOR) {
        return Err((
            Field::UniqueFor,
            format!(
                "{} s; at most {} s (36500d, 100 years)",
                w.as_secs(),
                MAX_UNIQUE_FOR.as_secs()
            ),
        ));
    }
    Ok(())
}

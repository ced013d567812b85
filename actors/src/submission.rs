//! What a submission is and every rule on it, in one place: a new task ([`NewTask`]), a
//! batch of them, or a flow ([`FlowSpec`]), built by each surface (CLI, HTTP API,
//! uploads, the library) from its own syntax and checked here by [`Submission::check`].
//! Pure — no SQL: what a check needs from the blackboard (the payload limit, the kinds
//! workers declared) comes in as [`Facts`], read by the caller. A refusal says which
//! logical [`Field`] failed, so each surface names it its own way (`--payload`,
//! `[2].kind`, `task.kind`) around one wording of the rule.
//!
//! The database enforces what it can (kind names, payload size, `\u0000`, the column
//! checks of `artex.tasks`) for every writer; the rules are checked here first so a
//! submitter gets a message naming the field, and nothing is sent.

use std::collections::HashMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The longest kind name, in bytes (as `artex.is_kind_name`).
pub const MAX_KIND_BYTES: usize = 100;

/// What a kind name may be, for messages and documentation.
pub const KIND_CHARSET: &str = "letters, digits and . _ : - (starting with a letter or digit)";

/// Retries after the first attempt, at most: a task that fails a thousand times will not
/// succeed on the next, and each attempt is rows in the history.
pub const MAX_RETRIES: i32 = 1000;

/// How many known kinds a refusal lists before it says "…".
const KINDS_LISTED: usize = 20;

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

/// A task to submit. Only `kind` is required; the rest default as in the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewTask {
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    pub payload: Value,
    /// Higher runs first; 0 by default.
    pub priority: i32,
    /// Not before this time; now by default.
    pub run_at: Option<DateTime<Utc>>,
    /// Retries after the first attempt; 3 by default.
    pub max_retries: Option<i32>,
    /// Per-attempt handler timeout in milliseconds; the handler's default otherwise.
    pub timeout_ms: Option<i32>,
    /// Business shard key: tasks with one key go to one planner shard.
    pub shard_key: Option<String>,
    /// While a task with this key is unfinished (or finished within `unique_for`), a
    /// submission with it writes nothing and gets that task's id (migrations/V17).
    pub unique_key: Option<String>,
    /// With `unique_key`: a task with the key that finished within this long counts too.
    pub unique_for: Option<std::time::Duration>,
    /// Labels for search (`artex tasks --tag`); none by default. At most [`MAX_TAGS`],
    /// each 1 to [`MAX_TAG_BYTES`] bytes.
    pub tags: Vec<String>,
    /// Within its kind's `key_concurrency` (`artex kind limit`), at most that many tasks
    /// with this key are held at once, fleet-wide (e.g. a customer id).
    pub limit_key: Option<String>,
}

impl NewTask {
    /// A task of `kind` with `payload`, everything else default.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        NewTask {
            kind: kind.into(),
            payload,
            ..Default::default()
        }
    }

    /// Checks the rules that need nothing from the database (see [`Submission`]), with
    /// a message naming the field (`kind: …`). The payload size limit and the known
    /// kinds are [`Submission::check`]'s; the database enforces the limit anyway.
    pub fn validate(&self) -> Result {
        task_rules(self)
            .map_err(|(field, why)| Error::Invalid(format!("{}: {why}", field.as_str())))
    }
}

/// A flow as submitted: a name and its tasks, each naming the tasks it depends on.
///
/// ```
/// use artex_actors::blackboard::FlowSpec;
/// let spec = FlowSpec::from_json(r#"{"name": "nightly-etl", "tasks": [
///     {"name": "extract", "kind": "echo"},
///     {"name": "load", "kind": "echo", "depends_on": ["extract"]}]}"#).unwrap();
/// assert_eq!(spec.tasks[1].depends_on, ["extract"]);
/// spec.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    /// The flow's name (need not be unique; its id is).
    pub name: String,
    /// Its tasks, in any order.
    pub tasks: Vec<FlowTaskSpec>,
}

/// One task of a [`FlowSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTaskSpec {
    /// Unique within the flow; what `depends_on` refers to.
    pub name: String,
    /// The handler kind.
    pub kind: String,
    /// The handler's input; `{}` by default.
    #[serde(default = "empty_object")]
    pub payload: Value,
    /// Names of the tasks that must succeed before this one runs.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Higher runs first; 0 by default.
    #[serde(default)]
    pub priority: i32,
    /// Retries after the first attempt; 3 by default.
    #[serde(default)]
    pub max_retries: Option<i32>,
    /// Per-attempt handler timeout in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<i32>,
    /// Business shard key.
    #[serde(default)]
    pub shard_key: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl FlowSpec {
    /// Parses a flow from JSON; a syntax error or an unknown field names line and column.
    pub fn from_json(text: &str) -> Result<FlowSpec> {
        serde_json::from_str(text).map_err(|e| Error::Invalid(format!("flow file: {e}")))
    }

    /// Checks the rules that need nothing from the database: a name, at least one task,
    /// unique task names, each task valid as a task, dependencies that name tasks of
    /// this flow, and no cycle. The error names the offending task. Returns, per task,
    /// the indices of the tasks it depends on.
    pub fn validate(&self) -> Result<Vec<Vec<usize>>> {
        flow_rules(self).map_err(|r| Error::Invalid(r.to_string()))
    }
}

/// What is submitted: tasks on their own (one, or a batch written all or nothing), or a
/// flow. Each surface parses its syntax into [`NewTask`]s or a [`FlowSpec`], views them
/// as a submission and calls [`Submission::check`]; then writes what it holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Submission<'a> {
    /// Tasks on their own.
    Tasks {
        /// The tasks, in the order the submitter gave them.
        tasks: &'a [NewTask],
        /// Per task: its kind may be one no worker declared yet (the submitter says its
        /// workers start later). Missing entries are `false`.
        allow_unregistered_kind: Vec<bool>,
    },
    /// A flow.
    Flow {
        /// The flow.
        spec: &'a FlowSpec,
        /// Its tasks' kinds may be ones no worker declared yet.
        allow_unregistered_kind: bool,
    },
}

/// What a check needs from the blackboard, read by the caller (the submitting role's
/// `submission_facts`: `OperatorBoard::submission_facts`, `WorkerBoard::submission_facts`):
/// the payload limit in force and the kinds workers declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `artex.limits.max_payload_bytes`: the largest payload, bytes of its JSON text.
    pub max_payload_bytes: i32,
    /// Every kind a worker has declared (`artex.kinds`); may be left empty when
    /// [`Submission::needs_known_kinds`] says no task needs it.
    pub known_kinds: Vec<String>,
}

/// A part of a submission a rule is about. Each surface names it its own way; [`as_str`]
/// is the name in JSON (the API's and the flow file's).
///
/// [`as_str`]: Field::as_str
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// A task's kind.
    Kind,
    /// A task's payload.
    Payload,
    /// A task's priority.
    Priority,
    /// A task's earliest start.
    RunAt,
    /// A task's retries.
    MaxRetries,
    /// A task's per-attempt timeout.
    TimeoutMs,
    /// A task's shard key.
    ShardKey,
    /// A task's unique key.
    UniqueKey,
    /// How long a finished task keeps its unique key.
    UniqueFor,
    /// A task's tags.
    Tags,
    /// A task's limit key.
    LimitKey,
    /// The flow's name.
    FlowName,
    /// A flow task's name.
    TaskName,
    /// A flow task's dependencies.
    DependsOn,
    /// The flow's list of tasks as a whole.
    Tasks,
}

impl Field {
    /// The field's name in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Kind => "kind",
            Field::Payload => "payload",
            Field::Priority => "priority",
            Field::RunAt => "run_at",
            Field::MaxRetries => "max_retries",
            Field::TimeoutMs => "timeout_ms",
            Field::ShardKey => "shard_key",
            Field::UniqueKey => "unique_key",
            Field::UniqueFor => "unique_for",
            Field::Tags => "tags",
            Field::LimitKey => "limit_key",
            Field::FlowName | Field::TaskName => "name",
            Field::DependsOn => "depends_on",
            Field::Tasks => "tasks",
        }
    }
}

/// Why a submission is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The value breaks a rule: what is wrong and what is expected (without the field's
    /// name, which the surface puts before it).
    Invalid(String),
    /// A fault of the flow's shape (duplicate names, references, cycles, no tasks), said
    /// in a whole sentence naming the tasks.
    Flow(String),
    /// No worker has declared this kind.
    UnknownKind {
        /// The kind.
        kind: String,
        /// What workers declared, for the message: `known kinds: a, b` or `no worker has
        /// registered yet`.
        known: String,
    },
    /// The payload is larger than the limit in force.
    PayloadTooLarge {
        /// Its size, bytes of its JSON text as PostgreSQL prints it.
        bytes: usize,
        /// The limit.
        limit: i32,
    },
}

/// A refused submission: which task and which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The task at fault: its place in the batch or flow, from 0 (`None` for the flow as
    /// a whole). A single task is at 0.
    pub task: Option<usize>,
    /// The flow task's name, for a task of a flow.
    pub task_name: Option<String>,
    /// The field at fault.
    pub field: Field,
    /// Why.
    pub reason: Reason,
}

impl Refusal {
    /// The message as a surface words it: `{place}: {why}`, where `place` is how the
    /// surface names the field (`--payload`, `[1].kind`, `task.kind`) and `allow` how it
    /// lets a kind no worker declared through (`pass --allow-unregistered-kind`). A
    /// [`Reason::Flow`] is a sentence of its own, without `place`.
    pub fn message(&self, place: &str, allow: &str) -> String {
        match &self.reason {
            Reason::Flow(sentence) => sentence.clone(),
            Reason::Invalid(why) => format!("{place}: {why}"),
            Reason::UnknownKind { kind, known } => format!(
                "{place}: {kind:?} has never been declared by a worker ({known}); check the \
                 name, or {allow} to submit it before its workers run"
            ),
            Reason::PayloadTooLarge { bytes, limit } => format!(
                "{place}: {bytes} bytes, more than the limit of {limit} bytes (an operator \
                 can raise it: artex limits --max-payload-bytes N)"
            ),
        }
    }

    /// How the library names the field at fault: `task 'load': kind`, `task #2: kind`,
    /// `flow name` (a flow file on the command line is named this way too).
    pub fn place(&self) -> String {
        match (&self.task_name, self.task, self.field) {
            (_, _, Field::FlowName) => "flow name".to_string(),
            (Some(name), _, field) => format!("task '{name}': {}", field.as_str()),
            (None, Some(i), field) => format!("task #{}: {}", i + 1, field.as_str()),
            (None, None, field) => field.as_str().to_string(),
        }
    }

    fn of_task(task: usize, name: Option<&str>, field: Field, reason: Reason) -> Self {
        Refusal {
            task: Some(task),
            task_name: name.map(str::to_string),
            field,
            reason,
        }
    }
}

/// The library's wording, and the CLI's for a flow file: `task 'load': kind: …`.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message(&self.place(), "allow unregistered kinds"))
    }
}

impl std::error::Error for Refusal {}

impl<'a> Submission<'a> {
    /// One task; `allow_unregistered_kind`: its kind may be one no worker declared yet.
    pub fn task(task: &'a NewTask, allow_unregistered_kind: bool) -> Self {
        Submission::Tasks {
            tasks: std::slice::from_ref(task),
            allow_unregistered_kind: vec![allow_unregistered_kind],
        }
    }

    /// Whether some task's kind must be one a worker declared: only then does
    /// [`Facts::known_kinds`] matter.
    pub fn needs_known_kinds(&self) -> bool {
        self.entries().iter().any(|e| !e.allow_unregistered_kind)
    }

    /// Each task as the checks against the facts see it.
    fn entries(&self) -> Vec<Entry<'_>> {
        match self {
            Submission::Tasks {
                tasks,
                allow_unregistered_kind,
            } => tasks
                .iter()
                .enumerate()
                .map(|(at, t)| Entry {
                    at,
                    name: None,
                    kind: &t.kind,
                    payload: &t.payload,
                    allow_unregistered_kind: allow_unregistered_kind
                        .get(at)
                        .copied()
                        .unwrap_or(false),
                })
                .collect(),
            Submission::Flow {
                spec,
                allow_unregistered_kind,
            } => spec
                .tasks
                .iter()
                .enumerate()
                .map(|(at, t)| Entry {
                    at,
                    name: Some(&t.name),
                    kind: &t.kind,
                    payload: &t.payload,
                    allow_unregistered_kind: *allow_unregistered_kind,
                })
                .collect(),
        }
    }

    /// Checks the rules that need nothing from the database (so a surface can refuse
    /// bad input before it connects): each task's kind is a name, its payload holds no
    /// `\u0000`, 0 to [`MAX_RETRIES`] retries, a positive timeout, a non-empty shard
    /// key; a flow has a name, tasks with unique names, dependencies on tasks of the
    /// flow and no cycle. Returns, for a flow, per task the indices of the tasks it
    /// depends on (empty lists for tasks on their own).
    pub fn check_shape(&self) -> std::result::Result<Vec<Vec<usize>>, Refusal> {
        match self {
            Submission::Tasks { tasks, .. } => {
                for (i, t) in tasks.iter().enumerate() {
                    task_rules(t).map_err(|(field, why)| {
                        Refusal::of_task(i, None, field, Reason::Invalid(why))
                    })?;
                }
                Ok(vec![Vec::new(); tasks.len()])
            }
            Submission::Flow { spec, .. } => flow_rules(spec),
        }
    }

    /// Checks every rule: [`Submission::check_shape`], then against `facts` each
    /// payload within the limit (the database refuses a larger one too; here the
    /// message names the field and the payload is never sent) and each kind declared by
    /// some worker unless allowed (a typo would wait for ever). The first fault found
    /// is returned: shape, then sizes, then kinds, task by task.
    pub fn check(&self, facts: &Facts) -> std::result::Result<Vec<Vec<usize>>, Refusal> {
        let deps = self.check_shape()?;
        let entries = self.entries();
        // A limit of 0 or less cannot be set (the database's check); read as none.
        let limit = facts.max_payload_bytes;
        for e in &entries {
            let bytes = payload_text_len(e.payload);
            if limit > 0 && bytes > limit as usize {
                let reason = Reason::PayloadTooLarge { bytes, limit };
                return Err(Refusal::of_task(e.at, e.name, Field::Payload, reason));
            }
        }
        for e in entries.iter().filter(|e| !e.allow_unregistered_kind) {
            if !facts.known_kinds.iter().any(|k| k == e.kind) {
                let reason = Reason::UnknownKind {
                    kind: e.kind.to_string(),
                    known: listing(&facts.known_kinds),
                };
                return Err(Refusal::of_task(e.at, e.name, Field::Kind, reason));
            }
        }
        Ok(deps)
    }
}

/// One task of a submission, as the checks against the facts see it.
struct Entry<'a> {
    /// Its place in the batch or flow.
    at: usize,
    /// Its name, in a flow.
    name: Option<&'a str>,
    kind: &'a str,
    payload: &'a Value,
    allow_unregistered_kind: bool,
}

/// The kinds workers declared, for a message: at most [`KINDS_LISTED`], then "…".
fn listing(known: &[String]) -> String {
    // A kind registered through the library may be no name at all (a newline in it):
    // such a kind cannot be submitted, and listing it would break the one-line message.
    let names: Vec<&str> = known
        .iter()
        .map(String::as_str)
        .filter(|k| check_kind(k).is_ok())
        .collect();
    if names.is_empty() {
        return "no worker has registered yet".into();
    }
    let more = if names.len() > KINDS_LISTED {
        ", …"
    } else {
        ""
    };
    let listed: Vec<&str> = names.into_iter().take(KINDS_LISTED).collect();
    format!("known kinds: {}{more}", listed.join(", "))
}

/// Why a text holding U+0000 is refused.
const NUL: &str = "contains the character \\u0000, which PostgreSQL cannot store";

/// The fields of a task the rules are about, borrowed: a flow's tasks are checked
/// without copying their payloads.
struct TaskFields<'a> {
    kind: &'a str,
    payload: &'a Value,
    max_retries: Option<i32>,
    timeout_ms: Option<i32>,
    shard_key: Option<&'a str>,
    unique_key: Option<&'a str>,
    unique_for: Option<std::time::Duration>,
    tags: &'a [String],
    limit_key: Option<&'a str>,
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
fn task_rules<'a>(t: impl Into<TaskFields<'a>>) -> std::result::Result<(), (Field, String)> {
    let t = t.into();
    check_kind(t.kind).map_err(|e| (Field::Kind, e))?;
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

/// The flow's rules (see [`FlowSpec::validate`]); per task, what it depends on.
fn flow_rules(spec: &FlowSpec) -> std::result::Result<Vec<Vec<usize>>, Refusal> {
    let whole = |field, reason| Refusal {
        task: None,
        task_name: None,
        field,
        reason,
    };
    if spec.name.trim().is_empty() {
        return Err(whole(
            Field::FlowName,
            Reason::Invalid("must not be empty".into()),
        ));
    }
    // PostgreSQL's text cannot hold U+0000: the insert would fail in the database.
    if spec.name.contains('\0') {
        return Err(whole(Field::FlowName, Reason::Invalid(NUL.into())));
    }
    if spec.tasks.is_empty() {
        return Err(whole(
            Field::Tasks,
            Reason::Flow(format!(
                "flow '{}' has no tasks; expected at least one",
                spec.name
            )),
        ));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(spec.tasks.len());
    for (i, t) in spec.tasks.iter().enumerate() {
        if t.name.trim().is_empty() {
            let why = format!(
                "task #{} (kind '{}'): name must not be empty",
                i + 1,
                t.kind
            );
            return Err(Refusal::of_task(
                i,
                None,
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        if t.name.contains('\0') {
            let why = format!("task #{} (kind '{}'): name {NUL}", i + 1, t.kind);
            return Err(Refusal::of_task(
                i,
                None,
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        if let Some(first) = index.insert(&t.name, i) {
            let why = format!(
                "task '{}' is defined twice (tasks #{} and #{}); task names must be unique in \
                 a flow",
                t.name,
                first + 1,
                i + 1
            );
            return Err(Refusal::of_task(
                i,
                Some(&t.name),
                Field::TaskName,
                Reason::Flow(why),
            ));
        }
        task_rules(t).map_err(|(field, why)| {
            Refusal::of_task(i, Some(&t.name), field, Reason::Invalid(why))
        })?;
    }
    let mut deps = Vec::with_capacity(spec.tasks.len());
    for (i, t) in spec.tasks.iter().enumerate() {
        let refuse =
            |why: String| Refusal::of_task(i, Some(&t.name), Field::DependsOn, Reason::Flow(why));
        let mut mine: Vec<usize> = Vec::with_capacity(t.depends_on.len());
        for d in &t.depends_on {
            if d == &t.name {
                return Err(refuse(format!(
                    "task '{}' depends on itself (a cycle)",
                    t.name
                )));
            }
            let Some(&j) = index.get(d.as_str()) else {
                return Err(refuse(format!(
                    "task '{}' depends on '{d}', which is not a task of flow '{}'",
                    t.name, spec.name
                )));
            };
            if mine.contains(&j) {
                return Err(refuse(format!(
                    "task '{}' lists '{d}' twice in depends_on",
                    t.name
                )));
            }
            mine.push(j);
        }
        deps.push(mine);
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&i| spec.tasks[i].name.as_str()).collect();
        let why = format!(
            "task '{}' is part of a dependency cycle: {} (each depends on the next)",
            names[0],
            names.join(" -> ")
        );
        return Err(Refusal::of_task(
            cycle[0],
            Some(names[0]),
            Field::DependsOn,
            Reason::Flow(why),
        ));
    }
    Ok(deps)
}

/// A cycle in the dependency graph (`deps[i]` = what task i depends on), as a path that
/// starts and ends on the same task, or `None` for a DAG. Iterative (a chain of 10,000
/// tasks must not overflow the stack): depth-first with colours.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut colour = vec![WHITE; deps.len()];
    for start in 0..deps.len() {
        if colour[start] != WHITE {
            continue;
        }
        // (node, next edge to follow)
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = GREY;
        while let Some(&mut (node, ref mut edge)) = stack.last_mut() {
            if let Some(&next) = deps[node].get(*edge) {
                *edge += 1;
                match colour[next] {
                    WHITE => {
                        colour[next] = GREY;
                        stack.push((next, 0));
                    }
                    GREY => {
                        // `next` is on the current path: the cycle is the path from it.
                        let from = stack.iter().position(|&(n, _)| n == next).unwrap_or(0);
                        let mut cycle: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                        cycle.push(next);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                colour[node] = BLACK;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(limit: i32, kinds: &[&str]) -> Facts {
        Facts {
            max_payload_bytes: limit,
            known_kinds: kinds.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn flow(tasks: &[(&str, &[&str])]) -> FlowSpec {
        FlowSpec {
            name: "f".into(),
            tasks: tasks
                .iter()
                .map(|(n, d)| FlowTaskSpec {
                    name: n.to_string(),
                    kind: "echo".into(),
                    payload: empty_object(),
                    depends_on: d.iter().map(|s| s.to_string()).collect(),
                    priority: 0,
                    max_retries: None,
                    timeout_ms: None,
                    shard_key: None,
                })
                .collect(),
        }
    }

    fn err(s: &FlowSpec) -> String {
        s.validate().unwrap_err().to_string()
    }

    /// A submission and what it borrows, for a table.
    enum Given {
        Tasks(Vec<NewTask>, Vec<bool>),
        Flow(FlowSpec, bool),
    }

    impl Given {
        fn task(t: NewTask) -> Given {
            Given::Tasks(vec![t], vec![false])
        }

        fn flow(spec: FlowSpec) -> Given {
            Given::Flow(spec, false)
        }

        fn view(&self) -> Submission<'_> {
            match self {
                Given::Tasks(tasks, allow) => Submission::Tasks {
                    tasks,
                    allow_unregistered_kind: allow.clone(),
                },
                Given::Flow(spec, allow) => Submission::Flow {
                    spec,
                    allow_unregistered_kind: *allow,
                },
            }
        }
    }

    /// The flow task `name`, of kind echo, changed by `f`.
    fn flow_task(name: &str, f: fn(&mut FlowTaskSpec)) -> FlowTaskSpec {
        let mut t = flow(&[(name, &[])]).tasks.remove(0);
        f(&mut t);
        t
    }

    #[test]
    fn a_table_of_submissions_each_accepted_or_refused_on_its_field() {
        let echo = || NewTask::new("echo", json!({"n": 1}));
        let with = |f: fn(&mut NewTask)| {
            let mut t = echo();
            f(&mut t);
            Given::task(t)
        };
        let flow_of = |tasks: Vec<FlowTaskSpec>| {
            Given::flow(FlowSpec {
                name: "f".into(),
                tasks,
            })
        };
        let known = facts(100, &["echo", "resize.v2"]);
        let (a, b) = (Some(0), Some(1));
        // What, the submission, and the task and field refused (None: accepted).
        type Refused = Option<(Option<usize>, Field)>;
        let cases: Vec<(&str, Given, Refused)> = vec![
            ("a plain task", Given::task(echo()), None),
            (
                "every setting",
                with(|t| {
                    t.priority = -5;
                    t.run_at = Some(Utc::now());
                    t.max_retries = Some(MAX_RETRIES);
                    t.timeout_ms = Some(1);
                    t.shard_key = Some("site-1".into());
                }),
                None,
            ),
            ("no retries", with(|t| t.max_retries = Some(0)), None),
            (
                "an empty kind",
                with(|t| t.kind.clear()),
                Some((a, Field::Kind)),
            ),
            (
                "a path as kind",
                with(|t| t.kind = "../x".into()),
                Some((a, Field::Kind)),
            ),
            (
                "a NUL in the payload",
                with(|t| t.payload = json!({"a": "x\u{0}"})),
                Some((a, Field::Payload)),
            ),
            (
                "negative retries",
                with(|t| t.max_retries = Some(-1)),
                Some((a, Field::MaxRetries)),
            ),
            (
                "too many retries",
                with(|t| t.max_retries = Some(MAX_RETRIES + 1)),
                Some((a, Field::MaxRetries)),
            ),
            (
                "no timeout",
                with(|t| t.timeout_ms = Some(0)),
                Some((a, Field::TimeoutMs)),
            ),
            (
                "an empty shard key",
                with(|t| t.shard_key = Some(String::new())),
                Some((a, Field::ShardKey)),
            ),
            (
                "a NUL in the shard key",
                with(|t| t.shard_key = Some("a\u{0}".into())),
                Some((a, Field::ShardKey)),
            ),
            (
                "a payload over the limit",
                with(|t| t.payload = json!({"s": "x".repeat(100)})),
                Some((a, Field::Payload)),
            ),
            (
                "an undeclared kind",
                with(|t| t.kind = "ech0".into()),
                Some((a, Field::Kind)),
            ),
            (
                "an undeclared kind, allowed",
                Given::Tasks(vec![NewTask::new("ech0", json!({}))], vec![true]),
                None,
            ),
            (
                "the second of a batch",
                Given::Tasks(vec![echo(), NewTask::new("ech0", json!({}))], vec![true]),
                Some((b, Field::Kind)),
            ),
            (
                "a flow",
                Given::flow(flow(&[("a", &[]), ("b", &["a"])])),
                None,
            ),
            (
                "a flow without a name",
                Given::flow(FlowSpec {
                    name: " ".into(),
                    ..flow(&[("a", &[])])
                }),
                Some((None, Field::FlowName)),
            ),
            (
                "a flow without tasks",
                Given::flow(flow(&[])),
                Some((None, Field::Tasks)),
            ),
            (
                "a flow task without a name",
                Given::flow(flow(&[("a", &[]), ("", &[])])),
                Some((b, Field::TaskName)),
            ),
            (
                "a flow task defined twice",
                Given::flow(flow(&[("a", &[]), ("a", &[])])),
                Some((b, Field::TaskName)),
            ),
            (
                "a cycle",
                Given::flow(flow(&[("a", &["b"]), ("b", &["a"])])),
                Some((a, Field::DependsOn)),
            ),
            (
                "a dependency on no task",
                Given::flow(flow(&[("a", &[]), ("b", &["c"])])),
                Some((b, Field::DependsOn)),
            ),
            (
                "a flow task of an undeclared kind",
                flow_of(vec![
                    flow_task("a", |_| {}),
                    flow_task("b", |t| t.kind = "ech0".into()),
                ]),
                Some((b, Field::Kind)),
            ),
            (
                "a flow task of an undeclared kind, allowed",
                Given::Flow(
                    FlowSpec {
                        tasks: vec![flow_task("b", |t| t.kind = "ech0".into())],
                        ..flow(&[])
                    },
                    true,
                ),
                None,
            ),
            (
                "a flow task with too many retries",
                flow_of(vec![flow_task("a", |t| t.max_retries = Some(5000))]),
                Some((a, Field::MaxRetries)),
            ),
            (
                "a flow task's payload over the limit",
                flow_of(vec![flow_task("a", |t| {
                    t.payload = json!({"s": "x".repeat(100)})
                })]),
                Some((a, Field::Payload)),
            ),
        ];
        for (what, given, expect) in cases {
            let got = given.view().check(&known).err().map(|r| (r.task, r.field));
            assert_eq!(got, expect, "{what}");
        }
    }

    #[test]
    fn the_shape_is_checked_without_the_facts_and_the_facts_after_it() {
        let task = NewTask::new("ech0", json!({"s": "x".repeat(200)}));
        let t = Submission::task(&task, false);
        assert!(
            t.check_shape().is_ok(),
            "the size and the kind need the facts"
        );
        // Sizes before kinds, as a submitter fixes one thing at a time.
        let r = t.check(&facts(100, &["echo"])).unwrap_err();
        assert_eq!(
            r.reason,
            Reason::PayloadTooLarge {
                bytes: 209,
                limit: 100
            }
        );
        let r = t.check(&facts(1000, &["echo"])).unwrap_err();
        assert_eq!(r.field, Field::Kind);
        assert!(t.needs_known_kinds());
        let spec = flow(&[("a", &[])]);
        let allowed = Submission::Flow {
            spec: &spec,
            allow_unregistered_kind: true,
        };
        assert!(!allowed.needs_known_kinds());
        assert_eq!(allowed.check(&facts(1000, &[])), Ok(vec![vec![]]));
    }

    #[test]
    fn each_surface_words_the_same_refusal_with_its_own_names() {
        let task = NewTask::new("ech0", json!({}));
        let r = Submission::task(&task, false)
            .check(&facts(100, &["echo", "resize.v2"]))
            .unwrap_err();
        assert_eq!(
            r.message("kind", "pass --allow-unregistered-kind"),
            "kind: \"ech0\" has never been declared by a worker (known kinds: echo, \
             resize.v2); check the name, or pass --allow-unregistered-kind to submit it \
             before its workers run"
        );
        assert!(r
            .message("task.kind", "x")
            .starts_with("task.kind: \"ech0\""));
        let task = NewTask::new("echo", json!({"s": "x".repeat(192)}));
        let big = Submission::task(&task, false)
            .check(&facts(100, &["echo"]))
            .unwrap_err();
        assert!(big
            .message("--payload", "")
            .starts_with("--payload: 201 bytes, more than the limit of 100 bytes"));
        // The library's wording names a flow task by its name.
        let mut spec = flow(&[("a", &[])]);
        spec.tasks[0].kind = String::new();
        assert_eq!(err(&spec), "task 'a': kind: must not be empty");
        let e = NewTask::new("echo", json!({"k\u{0}": 1}))
            .validate()
            .unwrap_err();
        assert!(e.to_string().starts_with("payload: contains"), "{e}");
    }

    #[test]
    fn the_known_kinds_listed_are_names_and_at_most_twenty() {
        assert_eq!(listing(&[]), "no worker has registered yet");
        assert_eq!(listing(&["a\nb".into()]), "no worker has registered yet");
        let many: Vec<String> = (0..30).map(|i| format!("k{i:02}")).collect();
        let l = listing(&many);
        assert!(
            l.starts_with("known kinds: k00, k01") && l.ends_with("k19, …"),
            "{l}"
        );
    }

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

    #[test]
    fn a_dag_is_accepted_with_its_edges() {
        let s = flow(&[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])]);
        assert_eq!(
            s.validate().unwrap(),
            vec![vec![], vec![0], vec![0], vec![1, 2]]
        );
    }

    #[test]
    fn cycles_are_named() {
        let e = err(&flow(&[
            ("a", &["c"]),
            ("b", &["a"]),
            ("c", &["b"]),
            ("x", &[]),
        ]));
        assert!(e.contains("dependency cycle: a -> c -> b -> a"), "{e}");
        let e = err(&flow(&[("a", &["a"])]));
        assert!(e.contains("task 'a' depends on itself"), "{e}");
    }

    #[test]
    fn bad_references_duplicates_and_empty_flows_are_named() {
        let e = err(&flow(&[("a", &[]), ("b", &["nope"])]));
        assert!(
            e.contains("task 'b' depends on 'nope', which is not a task"),
            "{e}"
        );
        let e = err(&flow(&[("a", &[]), ("a", &[])]));
        assert!(
            e.contains("task 'a' is defined twice (tasks #1 and #2)"),
            "{e}"
        );
        let e = err(&flow(&[("a", &[]), ("b", &["a", "a"])]));
        assert!(e.contains("task 'b' lists 'a' twice"), "{e}");
        let e = err(&flow(&[]));
        assert!(e.contains("has no tasks"), "{e}");
        let mut s = flow(&[("a", &[])]);
        s.tasks[0].kind = String::new();
        assert!(err(&s).contains("task 'a': kind"), "{}", err(&s));
        s.name = String::new();
        assert_eq!(err(&s), "flow name: must not be empty");
    }

    #[test]
    fn a_long_chain_is_checked_without_recursion() {
        let names: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
        let mut s = flow(&[]);
        for (i, n) in names.iter().enumerate() {
            let mut t = flow(&[(n, &[])]).tasks.remove(0);
            if i > 0 {
                t.depends_on = vec![names[i - 1].clone()];
            }
            s.tasks.push(t);
        }
        assert_eq!(s.validate().unwrap().len(), 100_000);
        s.tasks[0].depends_on = vec!["t99999".into()];
        assert!(err(&s).contains("dependency cycle"));
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let e = FlowSpec::from_json(
            r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo", "dependson": []}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `dependson`"), "{e}");
    }
}

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
//!
//! # Layout
//! - here: what is submitted ([`NewTask`], [`FlowSpec`], [`Submission`]) and the checks
//!   against the [`Facts`] (payload limit, known kinds).
//! - `task`: the rules on one task's fields ([`check_kind`], [`check_payload`], the
//!   limits on keys and tags).
//! - `flow`: the rules on a flow as a whole (names, dependencies, no cycle).
//! - `wait`: the rules on a flow's waits ([`WaitSpec`]: a signal, a time or a delay).
//! - `refusal`: [`Refusal`]: the [`Field`] at fault and the [`Reason`].

mod flow;
mod refusal;
mod task;
#[cfg(test)]
mod tests;
mod wait;
#[cfg(test)]
mod wait_tests;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use flow::flow_rules;
use task::task_rules;

pub use refusal::{Field, Reason, Refusal};
pub use task::{
    check_kind, check_payload, payload_text_len, KIND_CHARSET, MAX_KIND_BYTES, MAX_LIMIT_KEY_BYTES,
    MAX_RETRIES, MAX_TAGS, MAX_TAG_BYTES, MAX_UNIQUE_FOR, MAX_UNIQUE_KEY_BYTES,
};
pub use wait::{parse_wait_duration, OnTimeout, Wait, WaitSpec, WAIT_KIND};

/// How many known kinds a refusal lists before it says "…".
const KINDS_LISTED: usize = 20;

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
    /// The W3C trace context the task is submitted in (`00-<trace id>-<span id>-<flags>`):
    /// its spans are children of it (docs/tracing.md). None: the submitter starts a trace
    /// when tracing is on, else the task is not traced.
    pub traceparent: Option<String>,
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

/// A flow as submitted: a name and its tasks, each naming the tasks it depends on. A task
/// runs a handler (`kind`) or is a wait ([`WaitSpec`]).
///
/// ```
/// use artex_actors::blackboard::FlowSpec;
/// let spec = FlowSpec::from_json(r#"{"name": "nightly-etl", "tasks": [
///     {"name": "extract", "kind": "echo"},
///     {"name": "approval", "wait": {"signal": "approved", "timeout": "24h"},
///      "depends_on": ["extract"]},
///     {"name": "load", "kind": "echo", "depends_on": ["approval"]}]}"#).unwrap();
/// assert_eq!(spec.tasks[1].depends_on, ["extract"]);
/// assert_eq!(spec.tasks[1].wait.as_ref().unwrap().signal.as_deref(), Some("approved"));
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
    /// The handler kind; none for a wait.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// A wait instead of a handler: the task completes on a signal or at a time, and no
    /// worker ever takes it (see [`WaitSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitSpec>,
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
                    // A wait has no kind: no worker declares one.
                    allow_unregistered_kind: *allow_unregistered_kind || t.wait.is_some(),
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

//! Why a submission is refused: the logical [`Field`] at fault and the [`Reason`], which
//! each surface words around its own name for the field (`--payload`, `[2].kind`).

use std::fmt;

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
    /// The W3C trace context a task is submitted in.
    TraceParent,
    /// The flow's name.
    FlowName,
    /// A flow task's name.
    TaskName,
    /// A flow task's dependencies.
    DependsOn,
    /// The flow's list of tasks as a whole.
    Tasks,
    /// A flow task's wait (a signal, a time or a delay).
    Wait,
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
            Field::TraceParent => "traceparent",
            Field::FlowName | Field::TaskName => "name",
            Field::DependsOn => "depends_on",
            Field::Tasks => "tasks",
            Field::Wait => "wait",
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

    pub(super) fn of_task(task: usize, name: Option<&str>, field: Field, reason: Reason) -> Self {
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

//! Tasks as users see them: submit, show with full history, list. The status machine
//! itself is enforced by the database, not here: its legal moves are
//! `artex.transition_allowed` (migrations/V1__blackboard.sql, last redefined by
//! V11__stranded_uploads.sql), applied by the
//! `tasks_before_update` trigger as migrations/V3__batched_hot_path.sql last defined it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};

/// A task's status, mirroring the `artex.task_status` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Runnable once `run_at` has passed.
    Pending,
    /// Given to a worker, not yet started.
    Assigned,
    /// A worker runs it.
    Running,
    /// Finished with a result.
    Succeeded,
    /// Failed for good.
    Failed,
    /// Out of time for good (lease or handler timeout past its retries).
    Timeout,
    /// Held by an operator.
    Paused,
    /// Waiting on upstream tasks of its flow.
    Blocked,
    /// Canceled by an operator or by a failed upstream task.
    Canceled,
}

impl TaskStatus {
    /// Every status, in the order of the enum.
    pub const ALL: [TaskStatus; 9] = [
        TaskStatus::Pending,
        TaskStatus::Assigned,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Timeout,
        TaskStatus::Paused,
        TaskStatus::Blocked,
        TaskStatus::Canceled,
    ];

    /// The name used in the database and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Assigned => "assigned",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Timeout => "timeout",
            TaskStatus::Paused => "paused",
            TaskStatus::Blocked => "blocked",
            TaskStatus::Canceled => "canceled",
        }
    }

    /// Whether no transition leaves this status.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Timeout | TaskStatus::Canceled
        )
    }

    /// Whether a task in this status has a holder (assigned, running). Lists of these
    /// walk the held set (`tasks_holder`); every other status is in `tasks_listed`, on
    /// the generated column `listed` (migrations/V15__hot_task_rows.sql).
    pub fn is_held(self) -> bool {
        matches!(self, TaskStatus::Assigned | TaskStatus::Running)
    }

    /// The condition that lists the tasks of this status through an index, given the
    /// SQL that names the status (a literal, or a parameter cast to the enum).
    pub fn list_condition(self, status_sql: &str) -> String {
        if self.is_held() {
            format!("assigned_to is not null and status = {status_sql}")
        } else {
            format!("listed = {status_sql}")
        }
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        TaskStatus::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown status '{s}'; expected one of: {}",
                    TaskStatus::ALL.map(|t| t.as_str()).join(", ")
                ))
            })
    }
}

/// A task as stored.
#[derive(Debug, Clone, Serialize)]
pub struct TaskRow {
    /// Its id.
    pub id: Uuid,
    /// Its kind.
    pub kind: String,
    /// Its status.
    pub status: TaskStatus,
    /// Its input.
    pub payload: serde_json::Value,
    /// Its result, once succeeded.
    pub result: Option<serde_json::Value>,
    /// The last error.
    pub error: Option<String>,
    /// The worker holding it (assigned or running); `None` otherwise.
    pub assigned_to: Option<String>,
    /// The worker holding it, or for a finished task the one whose transition ended it
    /// (a finished task holds no `assigned_to`): what `task show`, the API and the
    /// dashboard name as its worker.
    pub worker: Option<String>,
    /// Until when the holder's lease runs.
    pub lease_until: Option<DateTime<Utc>>,
    /// The fencing token.
    pub lease_epoch: i64,
    /// Failed attempts so far.
    pub retries: i32,
    /// Retries allowed after the first attempt.
    pub max_retries: i32,
    /// Dispatch priority.
    pub priority: i32,
    /// Not before.
    pub run_at: DateTime<Utc>,
    /// Per-attempt timeout.
    pub timeout_ms: Option<i32>,
    /// Business shard key.
    pub shard_key: Option<String>,
    /// Its flow.
    pub flow_id: Option<Uuid>,
    /// Its name in the flow.
    pub flow_task: Option<String>,
    /// Saved progress.
    pub checkpoint: Option<serde_json::Value>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// Last started.
    pub started_at: Option<DateTime<Utc>>,
    /// Ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// While it is unfinished, no other task gets this key (migrations/V17).
    pub unique_key: Option<String>,
    /// Labels given at submission (migrations/V18); empty for none.
    pub tags: Vec<String>,
    /// Counted against its kind's per-key limit (migrations/V18).
    pub limit_key: Option<String>,
    /// How far its handler said it was, 0 to 1 (`TaskContext::progress`; migrations/V19):
    /// the latest value its worker wrote, at most once a second.
    pub progress: Option<f32>,
    /// What the handler said with it.
    pub progress_message: Option<String>,
    /// When it was written.
    pub progress_at: Option<DateTime<Utc>>,
}

/// One row of a task's audit trail.
#[derive(Debug, Clone, Serialize)]
pub struct TransitionRow {
    /// From (None for the creation).
    pub from_status: Option<TaskStatus>,
    /// To.
    pub to_status: TaskStatus,
    /// Why.
    pub reason: Option<String>,
    /// Who.
    pub actor: String,
    /// The worker holding the task then.
    pub worker: Option<String>,
    /// The fencing token then.
    pub lease_epoch: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// On a start: when the assignment it started was made (an assignment followed by
    /// a start has no row of its own).
    pub assigned_at: Option<DateTime<Utc>>,
}

/// A task's worker (see [`TaskRow::worker`]) as a column of a select whose task is `t`:
/// one walk of the history's task index, for finished tasks only.
macro_rules! worker_of_t {
    () => {
        "coalesce(t.assigned_to, case when t.status in ('succeeded', 'failed', 'timeout', \
         'canceled') then (select h.worker from artex.task_transitions h \
         where h.task_id = t.id and h.to_status = t.status order by h.id desc limit 1) end)"
    };
}
pub(crate) use worker_of_t;

/// The columns [`task_from_row`] reads, from `artex.tasks t`.
pub(crate) const TASK_COLUMNS: &str = "id, kind, status::text, payload, result, error, \
    assigned_to, lease_until, lease_epoch, retries, max_retries, priority, run_at, timeout_ms, \
    shard_key, flow_id, flow_task, checkpoint, created_at, updated_at, started_at, finished_at, \
    unique_key, tags, limit_key, progress, progress_message, progress_at";

pub(crate) fn task_from_row(r: &tokio_postgres::Row) -> Result<TaskRow> {
    Ok(TaskRow {
        id: r.try_get(0)?,
        kind: r.try_get(1)?,
        status: r.try_get::<_, String>(2)?.parse()?,
        payload: r.try_get(3)?,
        result: r.try_get(4)?,
        error: r.try_get(5)?,
        assigned_to: r.try_get(6)?,
        worker: r.try_get(28)?,
        lease_until: r.try_get(7)?,
        lease_epoch: r.try_get(8)?,
        retries: r.try_get(9)?,
        max_retries: r.try_get(10)?,
        priority: r.try_get(11)?,
        run_at: r.try_get(12)?,
        timeout_ms: r.try_get(13)?,
        shard_key: r.try_get(14)?,
        flow_id: r.try_get(15)?,
        flow_task: r.try_get(16)?,
        checkpoint: r.try_get(17)?,
        created_at: r.try_get(18)?,
        updated_at: r.try_get(19)?,
        started_at: r.try_get(20)?,
        finished_at: r.try_get(21)?,
        unique_key: r.try_get(22)?,
        tags: r.try_get::<_, Option<Vec<String>>>(23)?.unwrap_or_default(),
        limit_key: r.try_get(24)?,
        progress: r.try_get(25)?,
        progress_message: r.try_get(26)?,
        progress_at: r.try_get(27)?,
    })
}

/// A task as shown or listed without `--full`: each large value (payload, result, error,
/// checkpoint) longer than the cut stands in `task` as a JSON string of its first
/// characters, and is named in `cut` with its whole size.
#[derive(Debug, Clone, Serialize)]
pub struct TaskPreview {
    /// The task, large values cut.
    #[serde(flatten)]
    pub task: TaskRow,
    /// The values that were cut; empty when the task is whole.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<CutValue>,
}

/// A value of a [`TaskPreview`] that was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutValue {
    /// Which: `payload`, `result`, `error` or `checkpoint`.
    pub field: &'static str,
    /// Its whole size in bytes (of its JSON text for the JSON values); `None` when a cut
    /// of 0 left the JSON value unread.
    pub bytes: Option<i64>,
}

impl TaskPreview {
    /// Whether `field` was cut, and its whole size if it was measured.
    pub fn cut_of(&self, field: &str) -> Option<&CutValue> {
        self.cut.iter().find(|c| c.field == field)
    }
}

pub(crate) fn preview_from_row(r: &tokio_postgres::Row) -> Result<TaskPreview> {
    let id: Uuid = r.try_get(0)?;
    let mut cut = Vec::new();
    // A value is whole when its first characters are all of its bytes; a value that is
    // there but was not read (a cut of 0) is cut entirely.
    let mut text = |field: &'static str, at: usize| -> Result<Option<(String, bool)>> {
        let head: Option<String> = r.try_get(at)?;
        let bytes: Option<i32> = r.try_get(at + 1)?;
        let present: bool = r.try_get(at + 2)?;
        if !present {
            return Ok(None);
        }
        let head = head.unwrap_or_default();
        let bytes = bytes.map(i64::from);
        let whole = bytes.is_some_and(|b| head.len() as i64 >= b);
        if !whole {
            cut.push(CutValue { field, bytes });
        }
        Ok(Some((head, whole)))
    };
    let json = |v: Option<(String, bool)>| -> Result<Option<serde_json::Value>> {
        match v {
            Some((head, true)) => serde_json::from_str(&head).map(Some).map_err(|e| {
                Error::Invalid(format!("task {id}: a stored JSON value did not parse: {e}"))
            }),
            Some((head, false)) => Ok(Some(serde_json::Value::String(head))),
            None => Ok(None),
        }
    };
    let payload = json(text("payload", 3)?)?.unwrap_or(serde_json::Value::Null);
    let result = json(text("result", 6)?)?;
    let error = text("error", 9)?.map(|(head, _)| head);
    let checkpoint = json(text("checkpoint", 23)?)?;
    let task = TaskRow {
        id,
        kind: r.try_get(1)?,
        status: r.try_get::<_, String>(2)?.parse()?,
        payload,
        result,
        error,
        assigned_to: r.try_get(12)?,
        worker: r.try_get(36)?,
        lease_until: r.try_get(13)?,
        lease_epoch: r.try_get(14)?,
        retries: r.try_get(15)?,
        max_retries: r.try_get(16)?,
        priority: r.try_get(17)?,
        run_at: r.try_get(18)?,
        timeout_ms: r.try_get(19)?,
        shard_key: r.try_get(20)?,
        flow_id: r.try_get(21)?,
        flow_task: r.try_get(22)?,
        checkpoint,
        created_at: r.try_get(26)?,
        updated_at: r.try_get(27)?,
        started_at: r.try_get(28)?,
        finished_at: r.try_get(29)?,
        unique_key: r.try_get(30)?,
        tags: r.try_get::<_, Option<Vec<String>>>(31)?.unwrap_or_default(),
        limit_key: r.try_get(32)?,
        progress: r.try_get(33)?,
        progress_message: r.try_get(34)?,
        progress_at: r.try_get(35)?,
    };
    Ok(TaskPreview { task, cut })
}

/// A task's history, oldest first (`task_transitions_task`). By time, then id: the
/// history from before V10 mixes the ids of the old audit and outbox tables.
pub(crate) const TRANSITIONS: &str = "select from_status::text, to_status::text, reason, actor,
        worker, lease_epoch, at, assigned_at
    from artex.task_transitions where task_id = $1 order by at, id";

//! Tasks as users see them: submit, show with full history, list. The status machine
//! itself is enforced by the database, not here: its legal moves are
//! `artex.transition_allowed` (migrations/V1__blackboard.sql, last redefined by
//! V11__stranded_uploads.sql), applied by the
//! `tasks_before_update` trigger as migrations/V3__batched_hot_path.sql last defined it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::Blackboard;
use crate::error::{Error, Result};
use crate::submission::NewTask;

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
    /// The worker holding it.
    pub assigned_to: Option<String>,
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

pub(crate) const TASK_COLUMNS: &str = "id, kind, status::text, payload, result, error, \
    assigned_to, lease_until, lease_epoch, retries, max_retries, priority, run_at, timeout_ms, \
    shard_key, flow_id, flow_task, checkpoint, created_at, updated_at, started_at, finished_at";

pub(crate) fn task_from_row(r: &tokio_postgres::Row) -> Result<TaskRow> {
    Ok(TaskRow {
        id: r.try_get(0)?,
        kind: r.try_get(1)?,
        status: r.try_get::<_, String>(2)?.parse()?,
        payload: r.try_get(3)?,
        result: r.try_get(4)?,
        error: r.try_get(5)?,
        assigned_to: r.try_get(6)?,
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

/// The columns of a preview: the task's columns with payload, result, error and
/// checkpoint as their first `$1` characters and their size in bytes. Each JSON value is
/// turned into text once, in the lateral subquery (`offset 0` keeps the planner from
/// inlining it into both uses); that conversion is what a large value costs (~0.4 s per
/// 100 MB), so with `$1 = 0` it is skipped and only whether each value is there is read.
/// `left` and `octet_length` of a text column read only what they need.
macro_rules! preview_select {
    ($from:literal) => {
        concat!(
            "select t.id, t.kind, t.status::text,
                    left(v.payload, $1), octet_length(v.payload), true,
                    left(v.result, $1), octet_length(v.result), t.result is not null,
                    left(t.error, $1), octet_length(t.error), t.error is not null,
                    t.assigned_to, t.lease_until, t.lease_epoch, t.retries, t.max_retries,
                    t.priority, t.run_at, t.timeout_ms, t.shard_key, t.flow_id, t.flow_task,
                    left(v.checkpoint, $1), octet_length(v.checkpoint), t.checkpoint is not null,
                    t.created_at, t.updated_at, t.started_at, t.finished_at
             from ",
            $from,
            " cross join lateral (select case when $1 > 0 then t.payload::text end as payload,
                                        case when $1 > 0 then t.result::text end as result,
                                        case when $1 > 0 then t.checkpoint::text end
                                            as checkpoint
                                 offset 0) v"
        )
    };
}

/// One task, large values cut to `$1` characters.
const TASK_PREVIEW: &str = concat!(preview_select!("artex.tasks t"), " where t.id = $2");

/// The newest tasks, large values cut to `$1` characters. The page is chosen first, in
/// a subquery, so only its rows' values are read and turned into text: a listing of 5
/// tasks costs 5 payloads, however many tasks match.
const TASKS_PREVIEW: &str = concat!(
    preview_select!(
        "(select * from artex.tasks
          where ($2::text is null or status = $2::text::artex.task_status)
          order by created_at desc, id desc limit $3) t"
    ),
    " order by t.created_at desc, t.id desc"
);

fn preview_from_row(r: &tokio_postgres::Row) -> Result<TaskPreview> {
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
    };
    Ok(TaskPreview { task, cut })
}

/// A task's history, oldest first (`task_transitions_task`). By time, then id: the
/// history from before V10 mixes the ids of the old audit and outbox tables.
pub(crate) const TRANSITIONS: &str = "select from_status::text, to_status::text, reason, actor,
        worker, lease_epoch, at, assigned_at
    from artex.task_transitions where task_id = $1 order by at, id";

const SUBMIT: &str = "insert into artex.tasks
        (id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key)
    select v.id, v.kind, v.payload, v.priority, coalesce(v.run_at, now()),
           coalesce(v.max_retries, 3), v.timeout_ms, v.shard_key
    from artex.set_context($1, $2) ctx,
         unnest($3::uuid[], $4::text[], $5::jsonb[], $6::int4[], $7::timestamptz[],
                $8::int4[], $9::int4[], $10::text[])
           as v(id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key)
    where ctx";

impl Blackboard {
    /// Inserts one task; returns its id.
    pub async fn submit(&self, task: &NewTask, actor: &str) -> Result<Uuid> {
        let ids = self.submit_many(std::slice::from_ref(task), actor).await?;
        Ok(ids[0])
    }

    /// Inserts many tasks in one statement (one audit insert, one NOTIFY); returns their
    /// ids in order. All or nothing.
    pub async fn submit_many(&self, tasks: &[NewTask], actor: &str) -> Result<Vec<Uuid>> {
        for (i, t) in tasks.iter().enumerate() {
            t.validate()
                .map_err(|e| Error::Invalid(format!("task #{}: {e}", i + 1)))?;
        }
        // Time-ordered ids keep the primary key's inserts on the rightmost pages.
        let ids: Vec<Uuid> = tasks.iter().map(|_| Uuid::now_v7()).collect();
        let kinds: Vec<&str> = tasks.iter().map(|t| t.kind.as_str()).collect();
        let payloads: Vec<&serde_json::Value> = tasks.iter().map(|t| &t.payload).collect();
        let priorities: Vec<i32> = tasks.iter().map(|t| t.priority).collect();
        let run_ats: Vec<Option<DateTime<Utc>>> = tasks.iter().map(|t| t.run_at).collect();
        let max_retries: Vec<Option<i32>> = tasks.iter().map(|t| t.max_retries).collect();
        let timeouts: Vec<Option<i32>> = tasks.iter().map(|t| t.timeout_ms).collect();
        let shard_keys: Vec<Option<&str>> = tasks.iter().map(|t| t.shard_key.as_deref()).collect();
        let client = self.client().await?;
        let stmt = client.prepare_cached(SUBMIT).await?;
        client
            .execute(
                &stmt,
                &[
                    &actor,
                    &"submitted",
                    &ids,
                    &kinds,
                    &payloads,
                    &priorities,
                    &run_ats,
                    &max_retries,
                    &timeouts,
                    &shard_keys,
                ],
            )
            .await?;
        Ok(ids)
    }

    /// One task, or `TaskNotFound`.
    pub async fn task(&self, id: Uuid) -> Result<TaskRow> {
        let client = self.client().await?;
        let sql = format!("select {TASK_COLUMNS} from artex.tasks where id = $1");
        let stmt = client.prepare_cached(&sql).await?;
        match client.query_opt(&stmt, &[&id]).await? {
            Some(row) => task_from_row(&row),
            None => Err(Error::TaskNotFound(id)),
        }
    }

    /// A task's audit trail, oldest first.
    pub async fn transitions(&self, id: Uuid) -> Result<Vec<TransitionRow>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(TRANSITIONS).await?;
        let rows = client.query(&stmt, &[&id]).await?;
        rows.iter()
            .map(|r| {
                Ok(TransitionRow {
                    from_status: r
                        .try_get::<_, Option<String>>(0)?
                        .map(|s| s.parse())
                        .transpose()?,
                    to_status: r.try_get::<_, String>(1)?.parse()?,
                    reason: r.try_get(2)?,
                    actor: r.try_get(3)?,
                    worker: r.try_get(4)?,
                    lease_epoch: r.try_get(5)?,
                    at: r.try_get(6)?,
                    assigned_at: r.try_get(7)?,
                })
            })
            .collect()
    }

    /// The newest tasks, optionally of one status, at most `limit`.
    pub async fn tasks(&self, status: Option<TaskStatus>, limit: i64) -> Result<Vec<TaskRow>> {
        let client = self.client().await?;
        let sql = format!(
            "select {TASK_COLUMNS} from artex.tasks
             where ($1::text is null or status = $1::text::artex.task_status)
             order by created_at desc, id desc limit $2"
        );
        let stmt = client.prepare_cached(&sql).await?;
        let status = status.map(|s| s.as_str());
        let rows = client.query(&stmt, &[&status, &limit]).await?;
        rows.iter().map(task_from_row).collect()
    }

    /// One task with values longer than `cut` characters cut (see [`TaskPreview`]), or
    /// `TaskNotFound`. A cut of 0 reads none of its JSON values.
    pub async fn task_preview(&self, id: Uuid, cut: i32) -> Result<TaskPreview> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(TASK_PREVIEW).await?;
        match client.query_opt(&stmt, &[&cut, &id]).await? {
            Some(row) => preview_from_row(&row),
            None => Err(Error::TaskNotFound(id)),
        }
    }

    /// As [`Blackboard::tasks`], with values longer than `cut` characters cut: the
    /// database sends only their first characters. A cut of 0 reads no JSON value at all
    /// (for a listing that shows none): each is then cut entirely, its size unmeasured.
    pub async fn tasks_preview(
        &self,
        status: Option<TaskStatus>,
        limit: i64,
        cut: i32,
    ) -> Result<Vec<TaskPreview>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(TASKS_PREVIEW).await?;
        let status = status.map(|s| s.as_str());
        let rows = client.query(&stmt, &[&cut, &status, &limit]).await?;
        rows.iter().map(preview_from_row).collect()
    }
}

/// Which tasks a page lists (`GET /api/v1/tasks`): every filter given must hold. Pages
/// are newest first by id (ids artex creates are time-ordered UUIDv7s) and continue
/// after the last id of the previous page: keyset pagination, one index walk per page
/// however deep (migrations/V8__api_indexes.sql).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// In this status.
    pub status: Option<TaskStatus>,
    /// Of this kind.
    pub kind: Option<String>,
    /// Of this flow.
    pub flow: Option<Uuid>,
    /// Held (assigned or running) by this worker now.
    pub worker: Option<String>,
    /// With an id below this one: the last id of the previous page.
    pub after: Option<Uuid>,
    /// At most this many.
    pub limit: i64,
}

impl TaskFilter {
    /// The page's statement: the filters given (each an index's leading column), newest
    /// first by id; `$1` is the cut (see [`TaskPreview`]). Only the page's rows are read
    /// whole, after the page is chosen. One statement per set of filters given, so each
    /// is planned for what it filters on (a `$n is null or …` test would let a generic
    /// plan fall back to a scan of the whole table).
    fn page_sql(&self) -> String {
        let mut conds = Vec::new();
        let mut n = 1;
        let mut next = || {
            n += 1;
            n
        };
        if self.status.is_some() {
            conds.push(format!("status = ${}::text::artex.task_status", next()));
        }
        if self.kind.is_some() {
            conds.push(format!("kind = ${}", next()));
        }
        if self.flow.is_some() {
            conds.push(format!("flow_id = ${}", next()));
        }
        if self.worker.is_some() {
            // Only held tasks have a holder: said outright, the partial index `tasks_held`
            // serves.
            conds.push(format!(
                "assigned_to = ${} and status in ('assigned', 'running')",
                next()
            ));
        }
        if self.after.is_some() {
            conds.push(format!("id < ${}", next()));
        }
        let limit = next();
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!(" where {}", conds.join(" and "))
        };
        let page = format!("(select * from artex.tasks{filter} order by id desc limit ${limit}) t");
        format!(
            "{} order by t.id desc",
            preview_select!("{page}").replace("{page}", &page)
        )
    }

    /// The page's parameters after the cut, in [`TaskFilter::page_sql`]'s order.
    fn page_params<'a>(
        &'a self,
        status: &'a Option<&'static str>,
    ) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
        if let Some(s) = status {
            params.push(s);
        }
        if let Some(k) = &self.kind {
            params.push(k);
        }
        if let Some(f) = &self.flow {
            params.push(f);
        }
        if let Some(w) = &self.worker {
            params.push(w);
        }
        if let Some(a) = &self.after {
            params.push(a);
        }
        params.push(&self.limit);
        params
    }
}

// A retry is a new task: `failed`, `timeout` and `canceled` are terminal in the status
// machine (`artex.transition_allowed`), so a finished task's history, finish time and
// the flow cascades that followed it stay true. The copy carries the original's kind,
// payload and settings, and its creation row in the audit trail names the original.
const RETRY: &str = "insert into artex.tasks
        (id, kind, payload, priority, max_retries, timeout_ms, shard_key)
    select $3, o.kind, o.payload, o.priority, o.max_retries, o.timeout_ms, o.shard_key
    from artex.set_context($1, $2) ctx, artex.tasks o
    where ctx and o.id = $4 and o.status in ('failed', 'timeout', 'canceled')
      and o.flow_id is null
    returning id";

const RETRY_REFUSED: &str = "select status::text, flow_id from artex.tasks where id = $1";

impl Blackboard {
    /// A page of tasks (see [`TaskFilter`]), values longer than `cut` characters cut
    /// (see [`Blackboard::tasks_preview`]).
    pub async fn tasks_page(&self, filter: &TaskFilter, cut: i32) -> Result<Vec<TaskPreview>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(&filter.page_sql()).await?;
        let status = filter.status.map(TaskStatus::as_str);
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&cut];
        params.extend(filter.page_params(&status));
        let rows = client.query(&stmt, &params).await?;
        rows.iter().map(preview_from_row).collect()
    }

    /// PostgreSQL's plan for [`Blackboard::tasks_page`] with `filter`, one line per
    /// node: how a listing finds its rows (the tests show each walks an index).
    pub async fn explain_tasks_page(&self, filter: &TaskFilter) -> Result<Vec<String>> {
        let client = self.client().await?;
        let sql = format!("explain {}", filter.page_sql());
        let status = filter.status.map(TaskStatus::as_str);
        let cut = 0i32;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&cut];
        params.extend(filter.page_params(&status));
        let rows = client.query(&sql, &params).await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<_, String>(0)?))
            .collect()
    }

    /// Retries a task that ended without success (`failed`, `timeout`, `canceled`) as a
    /// new task with its kind, payload, priority, retries and timeout, recording
    /// `reason` and the original's id in the new task's history; returns the new id.
    /// `TaskNotFound` for an unknown id; `Refused` for any other status, and for a
    /// task of a flow (its downstream tasks were canceled with it: resubmit the flow).
    pub async fn retry(&self, id: Uuid, actor: &str, reason: Option<&str>) -> Result<Uuid> {
        let new_id = Uuid::now_v7();
        let reason = match reason {
            Some(r) => format!("retry of task {id}: {r}"),
            None => format!("retry of task {id}"),
        };
        let client = self.client().await?;
        let stmt = client.prepare_cached(RETRY).await?;
        if let Some(row) = client
            .query_opt(&stmt, &[&actor, &reason, &new_id, &id])
            .await?
        {
            return Ok(row.try_get(0)?);
        }
        let stmt = client.prepare_cached(RETRY_REFUSED).await?;
        let Some(row) = client.query_opt(&stmt, &[&id]).await? else {
            return Err(Error::TaskNotFound(id));
        };
        let status: String = row.try_get(0)?;
        let flow: Option<Uuid> = row.try_get(1)?;
        Err(Error::Refused(match flow {
            Some(flow) if matches!(status.as_str(), "failed" | "timeout" | "canceled") => {
                format!(
                    "cannot retry task {id}: it belongs to flow {flow}, whose downstream tasks \
                     ended with it; submit the flow again"
                )
            }
            _ => format!(
                "cannot retry task {id}: it is {status}; retry applies to failed, timeout or \
                 canceled tasks"
            ),
        }))
    }
}

//! An operator's reads of tasks: one with its history, pages of them by [`TaskFilter`]
//! (keyset pagination, one index walk per page); and the retry of one that ended without
//! success. Submitting is `submit.rs`, bulk actions `bulk.rs`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::OperatorBoard;
use crate::blackboard::sql::Param;
use crate::blackboard::tasks::{
    preview_from_row, task_from_row, worker_of_t, TaskPreview, TaskRow, TaskStatus, TransitionRow,
    TASK_COLUMNS, TRANSITIONS,
};
use crate::error::{Error, Result};

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
                    t.created_at, t.updated_at, t.started_at, t.finished_at, t.unique_key,
                    t.tags, t.limit_key, t.progress, t.progress_message, t.progress_at, ",
            worker_of_t!(),
            "
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
    /// Carrying this tag (migrations/V18: the GIN index `tasks_tags`).
    pub tag: Option<String>,
    /// Created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Created before this time.
    pub until: Option<DateTime<Utc>>,
    /// Whose payload contains this JSON (PostgreSQL's `@>`: `{"customer": 42}` matches
    /// every payload with that field and value). Not indexed: it filters the rows the
    /// other filters and the id order lead to.
    pub payload_contains: Option<serde_json::Value>,
    /// At most this many.
    pub limit: i64,
}

impl TaskFilter {
    /// The conditions of the filters given after `$first` (each `$n` numbered by
    /// `next`), as [`TaskFilter::params`] gives their values. The time range bounds the
    /// id too (ids are time-ordered: `artex.uuid_v7_floor`, the smallest UUIDv7 of a
    /// time, V69), so that the walk of the primary key starts and stops at the range's
    /// ends.
    pub(super) fn conditions(&self, next: &mut impl FnMut() -> usize) -> Vec<String> {
        let mut conds = Vec::new();
        if let Some(status) = self.status {
            conds.push(status.list_condition(&format!("${}::text::artex.task_status", next())));
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
        if self.tag.is_some() {
            conds.push(format!(
                "tags is not null and tags @> array[${}::text]",
                next()
            ));
        }
        if self.since.is_some() {
            let t = next();
            conds.push(format!(
                "created_at >= ${t} and id >= artex.uuid_v7_floor(${t})"
            ));
        }
        if self.until.is_some() {
            let t = next();
            conds.push(format!(
                "created_at < ${t} and id < artex.uuid_v7_floor(${t})"
            ));
        }
        if self.payload_contains.is_some() {
            conds.push(format!("payload @> ${}::jsonb", next()));
        }
        conds
    }

    /// The values of [`TaskFilter::conditions`], in order; `status` is the status's
    /// name.
    pub(super) fn params<'a>(&'a self, status: &'a Option<&'static str>) -> Vec<&'a dyn Param> {
        let mut params: Vec<&dyn Param> = Vec::new();
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
        if let Some(t) = &self.tag {
            params.push(t);
        }
        if let Some(t) = &self.since {
            params.push(t);
        }
        if let Some(t) = &self.until {
            params.push(t);
        }
        if let Some(p) = &self.payload_contains {
            params.push(p);
        }
        params
    }

    /// The tasks matching `conds` (its [`TaskFilter::conditions`] and any the caller
    /// adds), newest first, at most `limit` (a parameter): a statement to select from.
    /// The kind index holds no held task (migrations/V28): a kind listed without a status
    /// or a worker is its unheld tasks by that index and its held ones by the holder
    /// index (the fleet's work in flight), merged by id.
    pub(super) fn newest_first(&self, conds: &[String], limit: &str) -> String {
        let filter = |extra: Option<&str>| {
            let all: Vec<&str> = conds.iter().map(String::as_str).chain(extra).collect();
            if all.is_empty() {
                String::new()
            } else {
                format!(" where {}", all.join(" and "))
            }
        };
        if self.kind.is_none() || self.status.is_some() || self.worker.is_some() {
            return format!(
                "select * from artex.tasks{} order by id desc limit {limit}",
                filter(None)
            );
        }
        format!(
            "(select * from artex.tasks{} order by id desc limit {limit})
             union all
             (select * from artex.tasks{} order by id desc limit {limit})
             order by id desc limit {limit}",
            filter(Some("listed is not null")),
            filter(Some(
                "assigned_to is not null and status in ('assigned', 'running')"
            )),
        )
    }

    /// The page's statement: the filters given (each an index's leading column), newest
    /// first by id; `$1` is the cut (see [`TaskPreview`]). Only the page's rows are read
    /// whole, after the page is chosen. One statement per set of filters given, so each
    /// is planned for what it filters on (a `$n is null or …` test would let a generic
    /// plan fall back to a scan of the whole table).
    fn page_sql(&self) -> String {
        let mut n = 1;
        let mut next = || {
            n += 1;
            n
        };
        let mut conds = self.conditions(&mut next);
        if self.after.is_some() {
            conds.push(format!("id < ${}", next()));
        }
        let limit = format!("${}", next());
        let page = format!("({}) t", self.newest_first(&conds, &limit));
        format!(
            "{} order by t.id desc",
            preview_select!("{page}").replace("{page}", &page)
        )
    }

    /// The page's parameters after the cut, in [`TaskFilter::page_sql`]'s order.
    fn page_params<'a>(&'a self, status: &'a Option<&'static str>) -> Vec<&'a dyn Param> {
        let mut params = self.params(status);
        if let Some(a) = &self.after {
            params.push(a);
        }
        params.push(&self.limit);
        params
    }
}

/// One task, large values cut to `$1` characters.
const TASK_PREVIEW: &str = concat!(preview_select!("artex.tasks t"), " where t.id = $2");

// A retry is a new task: `failed`, `timeout` and `canceled` are terminal in the status
// machine (`artex.transition_allowed`), so a finished task's history, finish time and
// the flow cascades that followed it stay true. The copy carries the original's kind,
// payload and settings, and its creation row in the audit trail names the original.
const RETRY: &str = "insert into artex.tasks
        (id, kind, payload, priority, max_retries, timeout_ms, shard_key, tags, limit_key)
    select $3, o.kind, o.payload, o.priority, o.max_retries, o.timeout_ms, o.shard_key,
           o.tags, o.limit_key
    from artex.set_context($1, $2) ctx, artex.tasks o
    where ctx and o.id = $4 and o.status in ('failed', 'timeout', 'canceled')
      and o.flow_id is null
    returning id";

const RETRY_REFUSED: &str = "select status::text, flow_id from artex.tasks where id = $1";

impl OperatorBoard {
    /// One task, or `TaskNotFound`.
    pub async fn task(&self, id: Uuid) -> Result<TaskRow> {
        let client = self.bb.client().await?;
        let sql = format!(
            "select {TASK_COLUMNS}, {} from artex.tasks t where id = $1",
            worker_of_t!()
        );
        match client.query_opt(&sql, &[&id]).await? {
            Some(row) => task_from_row(&row),
            None => Err(Error::TaskNotFound(id)),
        }
    }

    /// A task's audit trail, oldest first.
    pub async fn transitions(&self, id: Uuid) -> Result<Vec<TransitionRow>> {
        let client = self.bb.client().await?;
        let rows = client.query(TRANSITIONS, &[&id]).await?;
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

    /// One task with values longer than `cut` characters cut (see [`TaskPreview`]), or
    /// `TaskNotFound`. A cut of 0 reads none of its JSON values.
    pub async fn task_preview(&self, id: Uuid, cut: i32) -> Result<TaskPreview> {
        let client = self.bb.client().await?;
        match client.query_opt(TASK_PREVIEW, &[&cut, &id]).await? {
            Some(row) => preview_from_row(&row),
            None => Err(Error::TaskNotFound(id)),
        }
    }

    /// A page of tasks (see [`TaskFilter`]), values longer than `cut` characters cut
    /// (see [`TaskPreview`]).
    pub async fn tasks_page(&self, filter: &TaskFilter, cut: i32) -> Result<Vec<TaskPreview>> {
        let client = self.bb.client().await?;
        let status = filter.status.map(TaskStatus::as_str);
        let mut params: Vec<&dyn Param> = vec![&cut];
        params.extend(filter.page_params(&status));
        let rows = client.query(&filter.page_sql(), &params).await?;
        rows.iter().map(preview_from_row).collect()
    }

    /// PostgreSQL's plan for [`OperatorBoard::tasks_page`] with `filter`, one line per
    /// node: how a listing finds its rows (the tests show each walks an index).
    pub async fn explain_tasks_page(&self, filter: &TaskFilter) -> Result<Vec<String>> {
        let client = self.bb.client().await?;
        let sql = format!("explain {}", filter.page_sql());
        let status = filter.status.map(TaskStatus::as_str);
        let cut = 0i32;
        let mut params: Vec<&dyn Param> = vec![&cut];
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
        let client = self.bb.client().await?;
        if let Some(row) = client
            .query_opt(RETRY, &[&actor, &reason, &new_id, &id])
            .await?
        {
            return Ok(row.try_get(0)?);
        }
        let Some(row) = client.query_opt(RETRY_REFUSED, &[&id]).await? else {
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

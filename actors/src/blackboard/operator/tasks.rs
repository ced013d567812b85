//! An operator's statements on tasks: submit them (one or a batch, in one statement),
//! read one with its history, list pages of them by [`TaskFilter`] (keyset pagination,
//! one index walk per page), retry one that ended without success.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::OperatorBoard;
use crate::blackboard::sql::{Param, Tx};
use crate::blackboard::tasks::{
    preview_from_row, task_from_row, worker_of_t, TaskPreview, TaskRow, TaskStatus, TransitionRow,
    TASK_COLUMNS, TRANSITIONS,
};
use crate::error::{Error, Result};
use crate::submission::NewTask;

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

/// The smallest UUIDv7 of millisecond `ms`: every id artex made at `ms` or later is at
/// least this (ids are time-ordered: migrations/V7__time_ordered_ids.sql).
fn v7_floor(at: DateTime<Utc>) -> Uuid {
    let ms = at.timestamp_millis().clamp(0, (1 << 48) - 1) as u64;
    Uuid::from_u128((u128::from(ms) << 80) | (0x7u128 << 76) | (0b10u128 << 62))
}

impl TaskFilter {
    /// The conditions of the filters given after `$first` (each `$n` numbered by
    /// `next`), as [`TaskFilter::params`] gives their values. The time range bounds the
    /// id too (ids are time-ordered), so that the walk of the primary key starts and
    /// stops at the range's ends.
    fn conditions(&self, next: &mut impl FnMut() -> usize) -> Vec<String> {
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
            let (t, id) = (next(), next());
            conds.push(format!("created_at >= ${t} and id >= ${id}"));
        }
        if self.until.is_some() {
            let (t, id) = (next(), next());
            conds.push(format!("created_at < ${t} and id < ${id}"));
        }
        if self.payload_contains.is_some() {
            conds.push(format!("payload @> ${}::jsonb", next()));
        }
        conds
    }

    /// The values of [`TaskFilter::conditions`], in order; `status` is the status's
    /// name, and `bounds` the time range's id bounds (see [`TaskFilter::bounds`]).
    fn params<'a>(
        &'a self,
        status: &'a Option<&'static str>,
        bounds: &'a (Option<Uuid>, Option<Uuid>),
    ) -> Vec<&'a dyn Param> {
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
        if let (Some(t), Some(id)) = (&self.since, &bounds.0) {
            params.push(t);
            params.push(id);
        }
        if let (Some(t), Some(id)) = (&self.until, &bounds.1) {
            params.push(t);
            params.push(id);
        }
        if let Some(p) = &self.payload_contains {
            params.push(p);
        }
        params
    }

    /// The time range's bounds on ids.
    fn bounds(&self) -> (Option<Uuid>, Option<Uuid>) {
        (self.since.map(v7_floor), self.until.map(v7_floor))
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
        bounds: &'a (Option<Uuid>, Option<Uuid>),
    ) -> Vec<&'a dyn Param> {
        let mut params = self.params(status, bounds);
        if let Some(a) = &self.after {
            params.push(a);
        }
        params.push(&self.limit);
        params
    }
}

/// What a bulk action does to every task a [`TaskFilter`] matches (`artex tasks retry|
/// cancel|delete`, `POST /api/v1/tasks/bulk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BulkAction {
    /// A new task for each failed, timed-out or canceled one outside a flow (as `retry`).
    Retry,
    /// Each unfinished task ends `canceled`; a running handler is told.
    Cancel,
    /// Each finished task outside a flow is deleted, and the deletion recorded in
    /// `artex.task_deletions` (its history stays).
    Delete,
}

impl BulkAction {
    /// Its name, as the API and the CLI take it.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }
}

impl std::str::FromStr for BulkAction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "retry" => Ok(BulkAction::Retry),
            "cancel" => Ok(BulkAction::Cancel),
            "delete" => Ok(BulkAction::Delete),
            _ => Err(format!("{s:?}; expected retry, cancel or delete")),
        }
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BulkReport {
    /// The action.
    pub action: BulkAction,
    /// Tasks the filter matched (a dry run: counted, nothing changed).
    pub matched: u64,
    /// Tasks changed: retried (a new task each), canceled or deleted. A matched task the
    /// action does not apply to (a retry of a succeeded task, a cancel of an ended one,
    /// a task of a flow for retry and delete) is left as it is.
    pub changed: u64,
    /// Transactions it took, each of at most [`BULK_BATCH`] tasks.
    pub batches: u64,
    /// Nothing was changed: `matched` is what the action would look at.
    pub dry_run: bool,
}

/// A bulk action's tasks per transaction: each batch's locks are held for one short
/// statement, never for the whole action.
pub const BULK_BATCH: i64 = 500;

// A bulk action's batches, each its own transaction, on the ids of one page of the
// filter's matches (newest first, below the last batch's smallest id, so that tasks the
// action makes, being newer, are never visited). The statements are the single-task
// controls' (flows.rs, CANCEL; RETRY below), over a list of ids.
const BULK_CANCEL: &str = "with target as materialized (
        select id from artex.tasks where id = any($3::uuid[])
          and status not in ('succeeded', 'failed', 'timeout', 'canceled')
        order by id for update
    )
    update artex.tasks t set status = 'canceled'
    from artex.set_context($1, $2) ctx, target
    where ctx and t.id = target.id
    returning t.id";

const BULK_RETRY: &str = "insert into artex.tasks
        (id, kind, payload, priority, max_retries, timeout_ms, shard_key, tags, limit_key)
    select artex.uuid_v7(), o.kind, o.payload, o.priority, o.max_retries, o.timeout_ms,
           o.shard_key, o.tags, o.limit_key
    from artex.set_context($1, $2) ctx, artex.tasks o
    where ctx and o.id = any($3::uuid[]) and o.status in ('failed', 'timeout', 'canceled')
      and o.flow_id is null
    order by o.id
    returning id";

// The history of a deleted task stays (it is the audit trail); the deletion itself is
// recorded beside it, with who and why.
const BULK_DELETE: &str = "with doomed as materialized (
        select id from artex.tasks where id = any($3::uuid[])
          and status in ('succeeded', 'failed', 'timeout', 'canceled') and flow_id is null
        order by id for update
    ),
    gone as (
        delete from artex.tasks t using doomed where t.id = doomed.id
        returning t.id, t.kind, t.status
    )
    insert into artex.task_deletions (task_id, kind, status, actor, reason)
    select id, kind, status, $1, $2 from gone
    returning task_id";

/// What a submission did: the task's id, and whether that is an existing task with the
/// same unique key (then nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Submitted {
    /// The new task, or the existing one.
    pub id: Uuid,
    /// True when a task with the submission's unique key was unfinished (or finished
    /// within its window): its id is `id`, and nothing was written.
    pub duplicate: bool,
}

/// A batch's columns as the submission statements take them, each task checked first
/// (the message names the task by its place in the batch).
struct Columns<'a> {
    kinds: Vec<&'a str>,
    payloads: Vec<&'a serde_json::Value>,
    priorities: Vec<i32>,
    run_ats: Vec<Option<DateTime<Utc>>>,
    max_retries: Vec<Option<i32>>,
    timeouts: Vec<Option<i32>>,
    shard_keys: Vec<Option<&'a str>>,
    /// Each task's tags as a JSON array, or null for none: the statement unnests one
    /// row per task, and a text[][] cannot hold lists of different lengths.
    tags: Vec<Option<serde_json::Value>>,
    limit_keys: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn of(tasks: &'a [NewTask]) -> Result<Self> {
        for (i, t) in tasks.iter().enumerate() {
            t.validate()
                .map_err(|e| Error::Invalid(format!("task #{}: {e}", i + 1)))?;
        }
        Ok(Columns {
            kinds: tasks.iter().map(|t| t.kind.as_str()).collect(),
            payloads: tasks.iter().map(|t| &t.payload).collect(),
            priorities: tasks.iter().map(|t| t.priority).collect(),
            run_ats: tasks.iter().map(|t| t.run_at).collect(),
            max_retries: tasks.iter().map(|t| t.max_retries).collect(),
            timeouts: tasks.iter().map(|t| t.timeout_ms).collect(),
            shard_keys: tasks.iter().map(|t| t.shard_key.as_deref()).collect(),
            tags: tasks
                .iter()
                .map(|t| (!t.tags.is_empty()).then(|| serde_json::json!(t.tags)))
                .collect(),
            limit_keys: tasks.iter().map(|t| t.limit_key.as_deref()).collect(),
        })
    }
}

/// A keyed batch's first statement (public so the benchmark runs it): the batch's keys
/// locked first, in one order for every batch. Two batches naming the same keys in
/// different orders would otherwise each hold one and wait for the other (the locks are
/// the transaction's; `artex.submit` taking one again is a no-op).
pub const LOCK_KEYS: &str = "select count(artex.lock_unique_key(k))
    from (select distinct k from unnest($1::text[]) as u(k) where k is not null order by k) keys";

/// A keyed batch's statement (public so the benchmark runs it).
///
/// A batch in which a task carries a unique key, set-based, after LOCK_KEYS in the same
/// transaction (so what it reads of each key is settled). Per keyed task, the task already
/// holding its key (`held`: unfinished, or finished within the task's window); written are
/// the tasks without a key and, per key, the batch's first task whose key nobody holds.
/// Each task of the batch then answers as if submitted one after the other (as
/// `artex.submit` would): the new task, or an earlier task of the batch with its key (the
/// newest holder), or the holder found. One insert, so the statement triggers run once.
/// The kinds were checked by the caller, as for the plain batch below.
pub const SUBMIT_KEYED: &str = "with v as materialized (
        select * from unnest($3::text[], $4::jsonb[], $5::int4[], $6::timestamptz[],
                             $7::int4[], $8::int4[], $9::text[], $10::text[], $11::float8[],
                             $12::jsonb[], $13::text[])
            with ordinality as v(kind, payload, priority, run_at, max_retries, timeout_ms,
                                 shard_key, unique_key, unique_for_secs, tags, limit_key, n)
    ),
    held as materialized (
        select v.n, v.unique_key,
               artex.task_with_unique_key(v.unique_key,
                                          make_interval(secs => v.unique_for_secs)) as id
        from v where v.unique_key is not null
    ),
    fresh as materialized (
        select v.*, artex.uuid_v7() as new_id
        from v
        where v.unique_key is null
           or v.n = (select min(h.n) from held h
                     where h.unique_key = v.unique_key and h.id is null)
    ),
    written as (
        insert into artex.tasks
            (id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key, unique_key,
             tags, limit_key)
        select f.new_id, f.kind, f.payload, f.priority, coalesce(f.run_at, now()),
               coalesce(f.max_retries, artex.default_max_retries(f.kind)), f.timeout_ms,
               f.shard_key, f.unique_key, artex.tags_of(f.tags), f.limit_key
        from artex.set_context($1, $2) ctx, fresh f
        where ctx
        order by f.n
        returning 1
    )
    select coalesce(f.new_id,
                    (select e.new_id from fresh e
                     where e.unique_key = v.unique_key and e.n < v.n),
                    h.id),
           f.new_id is null
    from v left join fresh f on f.n = v.n left join held h on h.n = v.n
    order by v.n";

// One task in the caller's own transaction (`submit_in`): `artex.submit` with every check,
// the kinds workers declared included unless the caller allows any.
const SUBMIT_IN: &str = "select id, duplicate from artex.submit($1::text, $2::jsonb, $3::int4,
    $4::timestamptz, $5::int4, $6::int4, $7::text, $8::text, make_interval(secs => $9::float8),
    $10::bool, $11::text, 'submitted', $12::text[], $13::text)";

/// Submits `task` inside the caller's transaction `tx` (transactional enqueue): the task
/// exists, and wakes a worker, only if the caller commits. The same checks as every other
/// entry (the rules here, then `artex.submit`'s in the database: the kinds workers
/// declared, unless `allow_unregistered_kind`). A task with a unique key that is already
/// taken returns the existing task's id with `duplicate` set, and writes nothing.
pub async fn submit_in(
    tx: &tokio_postgres::Transaction<'_>,
    task: &NewTask,
    actor: &str,
    allow_unregistered_kind: bool,
) -> Result<Submitted> {
    task.validate()?;
    let row = tx
        .query_one(
            SUBMIT_IN,
            &[
                &task.kind,
                &task.payload,
                &task.priority,
                &task.run_at,
                &task.max_retries,
                &task.timeout_ms,
                &task.shard_key,
                &task.unique_key,
                &task.unique_for.map(|d| d.as_secs_f64()),
                &allow_unregistered_kind,
                &actor,
                &(!task.tags.is_empty()).then_some(&task.tags),
                &task.limit_key,
            ],
        )
        .await?;
    Ok(Submitted {
        id: row.try_get(0)?,
        duplicate: row.try_get(1)?,
    })
}

// A task that states no `max_retries` gets its kind's default (its retry policy's
// attempts less one, else 3: `artex.default_max_retries`, migrations/V18), as in
// `artex.submit`, SUBMIT_KEYED and a flow's tasks.
const SUBMIT: &str = "insert into artex.tasks
        (id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key, tags,
         limit_key)
    select v.id, v.kind, v.payload, v.priority, coalesce(v.run_at, now()),
           coalesce(v.max_retries, artex.default_max_retries(v.kind)), v.timeout_ms,
           v.shard_key, artex.tags_of(v.tags), v.limit_key
    from artex.set_context($1, $2) ctx,
         unnest($3::uuid[], $4::text[], $5::jsonb[], $6::int4[], $7::timestamptz[],
                $8::int4[], $9::int4[], $10::text[], $11::jsonb[], $12::text[])
           as v(id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key,
                tags, limit_key)
    where ctx";

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
    /// Inserts one task; returns its id.
    pub async fn submit(&self, task: &NewTask, actor: &str) -> Result<Uuid> {
        let ids = self.submit_many(std::slice::from_ref(task), actor).await?;
        Ok(ids[0])
    }

    /// Inserts many tasks in one statement (one audit insert, one NOTIFY); returns their
    /// ids in order. All or nothing.
    pub async fn submit_many(&self, tasks: &[NewTask], actor: &str) -> Result<Vec<Uuid>> {
        Ok(self
            .submit_all(tasks, actor)
            .await?
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    /// As [`OperatorBoard::submit_many`], saying of each task whether it is an existing
    /// one with the same unique key (see [`NewTask::unique_key`]).
    pub async fn submit_all(&self, tasks: &[NewTask], actor: &str) -> Result<Vec<Submitted>> {
        if tasks.iter().any(|t| t.unique_key.is_some()) {
            return self.submit_keyed(tasks, actor).await;
        }
        Ok(self
            .submit_plain(tasks, actor)
            .await?
            .into_iter()
            .map(|id| Submitted {
                id,
                duplicate: false,
            })
            .collect())
    }

    /// A batch with unique keys: its keys locked, then one statement (see SUBMIT_KEYED).
    async fn submit_keyed(&self, tasks: &[NewTask], actor: &str) -> Result<Vec<Submitted>> {
        let c = Columns::of(tasks)?;
        let unique_keys: Vec<Option<&str>> =
            tasks.iter().map(|t| t.unique_key.as_deref()).collect();
        let windows: Vec<Option<f64>> = tasks
            .iter()
            .map(|t| t.unique_for.map(|d| d.as_secs_f64()))
            .collect();
        // One round trip: begin, the locks, the submissions, commit.
        let client = Tx::new(self.bb.client().await?);
        let (begun, locked, rows) = futures_util::future::join3(
            client.begin(),
            client.query(LOCK_KEYS, &[&unique_keys]),
            client.query(
                SUBMIT_KEYED,
                &[
                    &actor,
                    &"submitted",
                    &c.kinds,
                    &c.payloads,
                    &c.priorities,
                    &c.run_ats,
                    &c.max_retries,
                    &c.timeouts,
                    &c.shard_keys,
                    &unique_keys,
                    &windows,
                    &c.tags,
                    &c.limit_keys,
                ],
            ),
        )
        .await;
        begun?;
        locked?;
        let rows = rows?;
        if rows.len() != tasks.len() {
            // Nothing is committed: the transaction is abandoned with `client`.
            return Err(Error::Invalid(format!(
                "a batch of {} tasks with unique keys was answered with {} rows",
                tasks.len(),
                rows.len()
            )));
        }
        client.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(Submitted {
                    id: r.try_get(0)?,
                    duplicate: r.try_get(1)?,
                })
            })
            .collect()
    }

    /// A batch without unique keys: one insert.
    async fn submit_plain(&self, tasks: &[NewTask], actor: &str) -> Result<Vec<Uuid>> {
        let c = Columns::of(tasks)?;
        // Time-ordered ids keep the primary key's inserts on the rightmost pages.
        let ids: Vec<Uuid> = tasks.iter().map(|_| Uuid::now_v7()).collect();
        let client = self.bb.client().await?;
        client
            .execute(
                SUBMIT,
                &[
                    &actor,
                    &"submitted",
                    &ids,
                    &c.kinds,
                    &c.payloads,
                    &c.priorities,
                    &c.run_ats,
                    &c.max_retries,
                    &c.timeouts,
                    &c.shard_keys,
                    &c.tags,
                    &c.limit_keys,
                ],
            )
            .await?;
        Ok(ids)
    }

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
        let bounds = filter.bounds();
        let mut params: Vec<&dyn Param> = vec![&cut];
        params.extend(filter.page_params(&status, &bounds));
        let rows = client.query(&filter.page_sql(), &params).await?;
        rows.iter().map(preview_from_row).collect()
    }

    /// Applies `action` to every task `filter` matches (its `after` and `limit` aside),
    /// in batches of [`BULK_BATCH`], each its own short transaction, recording `actor`
    /// and `reason` for each task; with `dry_run`, only counts the matches.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &TaskFilter,
        actor: &str,
        reason: Option<&str>,
        dry_run: bool,
    ) -> Result<BulkReport> {
        let status = filter.status.map(TaskStatus::as_str);
        let bounds = filter.bounds();
        let mut report = BulkReport {
            action,
            matched: 0,
            changed: 0,
            batches: 0,
            dry_run,
        };
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        let conds = filter.conditions(&mut next);
        let filter_sql = if conds.is_empty() {
            "true".to_string()
        } else {
            conds.join(" and ")
        };
        let client = self.bb.client().await?;
        if dry_run {
            let sql = format!("select count(*) from artex.tasks where {filter_sql}");
            let row = client
                .query_one(&sql, &filter.params(&status, &bounds))
                .await?;
            report.matched = row.try_get::<_, i64>(0)? as u64;
            return Ok(report);
        }
        let (below, limit) = (next(), next());
        let page = format!(
            "select id from artex.tasks where {filter_sql} and (${below}::uuid is null or id < ${below})
             order by id desc limit ${limit}"
        );
        let write = match action {
            BulkAction::Retry => BULK_RETRY,
            BulkAction::Cancel => BULK_CANCEL,
            BulkAction::Delete => BULK_DELETE,
        };
        let default_reason = format!("bulk {} by operator", action.as_str());
        let reason = reason.unwrap_or(&default_reason);
        let mut cursor: Option<Uuid> = None;
        loop {
            let mut params = filter.params(&status, &bounds);
            params.push(&cursor);
            params.push(&BULK_BATCH);
            let ids: Vec<Uuid> = client
                .query(&page, &params)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<std::result::Result<_, _>>()?;
            let Some(&last) = ids.last() else {
                break;
            };
            report.matched += ids.len() as u64;
            report.batches += 1;
            report.changed += client.query(write, &[&actor, &reason, &ids]).await?.len() as u64;
            if (ids.len() as i64) < BULK_BATCH {
                break;
            }
            cursor = Some(last);
        }
        Ok(report)
    }

    /// PostgreSQL's plan for [`OperatorBoard::tasks_page`] with `filter`, one line per
    /// node: how a listing finds its rows (the tests show each walks an index).
    pub async fn explain_tasks_page(&self, filter: &TaskFilter) -> Result<Vec<String>> {
        let client = self.bb.client().await?;
        let sql = format!("explain {}", filter.page_sql());
        let status = filter.status.map(TaskStatus::as_str);
        let cut = 0i32;
        let bounds = filter.bounds();
        let mut params: Vec<&dyn Param> = vec![&cut];
        params.extend(filter.page_params(&status, &bounds));
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

//! An operator's submissions: one task or a batch in one statement (`submit_many`), all
//! or nothing; with unique keys, each task's key locked and an existing task returned in
//! its place (`submit_all`); and one task inside the caller's transaction (`submit_in`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::OperatorBoard;
use crate::blackboard::sql::Tx;
use crate::error::{Error, Result};
use crate::submission::NewTask;

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
    traceparents: Vec<Option<&'a str>>,
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
            traceparents: tasks.iter().map(|t| t.traceparent.as_deref()).collect(),
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
                             $12::jsonb[], $13::text[], $14::text[])
            with ordinality as v(kind, payload, priority, run_at, max_retries, timeout_ms,
                                 shard_key, unique_key, unique_for_secs, tags, limit_key,
                                 traceparent, n)
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
             tags, limit_key, traceparent)
        select f.new_id, f.kind, f.payload, f.priority, coalesce(f.run_at, now()),
               coalesce(f.max_retries, artex.default_max_retries(f.kind)), f.timeout_ms,
               f.shard_key, f.unique_key, artex.tags_of(f.tags), f.limit_key, f.traceparent
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
    $10::bool, $11::text, 'submitted', $12::text[], $13::text, $14::text)";

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
                &task.traceparent,
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
         limit_key, traceparent)
    select v.id, v.kind, v.payload, v.priority, coalesce(v.run_at, now()),
           coalesce(v.max_retries, artex.default_max_retries(v.kind)), v.timeout_ms,
           v.shard_key, artex.tags_of(v.tags), v.limit_key, v.traceparent
    from artex.set_context($1, $2) ctx,
         unnest($3::uuid[], $4::text[], $5::jsonb[], $6::int4[], $7::timestamptz[],
                $8::int4[], $9::int4[], $10::text[], $11::jsonb[], $12::text[], $13::text[])
           as v(id, kind, payload, priority, run_at, max_retries, timeout_ms, shard_key,
                tags, limit_key, traceparent)
    where ctx";

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
                    &c.traceparents,
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
                    &c.traceparents,
                ],
            )
            .await?;
        Ok(ids)
    }
}

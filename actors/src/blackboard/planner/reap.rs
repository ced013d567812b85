//! The Reaper's SQL: a sweep marks silent workers gone, takes back their tasks and every
//! task whose lease expired (counting a retry, or ending it), deletes rows of workers gone
//! long ago, and fails pending tasks whose uploaded file lies on a host gone for good.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::PlannerBoard;
use crate::error::Result;

/// What one reaper sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Workers newly marked `gone`.
    pub workers_gone: Vec<String>,
    /// Tasks taken back from expired leases or gone workers, now pending again.
    pub requeued: usize,
    /// Tasks that ran out of retries and ended (`timeout`).
    pub ended: usize,
    /// Rows of workers gone long ago that were deleted.
    pub workers_pruned: u64,
}

// Takes back held tasks whose lease ran out. Running tasks count a failed attempt (and
// end as `timeout` past their budget); assigned tasks never started, so they go back
// without one. A worker declared gone keeps its tasks until their leases run out all
// the same: gone may mean cut off, not dead, and a cut-off worker stops its handlers
// only just before its leases end (it fences itself); taking a task back earlier would
// run it in two places at once. The held set is walked through `tasks_holder` and each
// lease's end read from its row: an index on `lease_until` would make every renewal
// write an index entry (migrations/V15__hot_task_rows.sql). The retry waits as its
// kind's retry policy says, else the reaper's default backoff (migrations/V18).
const RECLAIM: &str = "with stale as materialized (
        select id from artex.tasks
        where assigned_to is not null and status in ('assigned', 'running')
          and lease_until < coalesce($1::timestamptz, now())
        order by lease_until
        limit $3
        for update skip locked
    )
    update artex.tasks t
    set status = case when t.status = 'running' and t.retries + 1 > t.max_retries
                      then 'timeout'::artex.task_status else 'pending' end,
        retries = t.retries + (t.status = 'running')::int,
        run_at = coalesce($1::timestamptz, now())
                 + artex.kind_retry_delay(t.kind, t.retries, $5::float8, $6::float8),
        error = case when t.status = 'running'
                     then 'lease lost by worker ' || t.assigned_to else t.error end
    from artex.set_context($4, case when cardinality($2::text[]) > 0
                               then 'worker gone or lease expired' else 'lease expired' end) ctx,
         stale
    where ctx and t.id = stale.id
    returning t.status::text";

// Worker rows are locked in id order, as assignments lock them.
const MARK_GONE: &str = "with silent as materialized (
        select id from artex.workers
        where state <> 'gone'
          and last_seen < coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8)
        order by id
        for update
    )
    update artex.workers w set state = 'gone'
    from silent where w.id = silent.id
    returning w.id";

const PRUNE_WORKERS: &str = "delete from artex.workers
    where state = 'gone'
      and last_seen < coalesce($1::timestamptz, now()) - make_interval(secs => $2::float8)
      and not exists (select 1 from artex.tasks t
                      where t.assigned_to = workers.id and t.status in ('assigned', 'running'))";

/// Limits of one reaper sweep.
#[derive(Debug, Clone)]
pub struct ReapParams {
    /// "Now" for the sweep (tests move the clock); the database's clock when `None`.
    pub now: Option<DateTime<Utc>>,
    /// A worker silent for longer is gone.
    pub worker_timeout_secs: f64,
    /// Rows of gone workers older than this are deleted.
    pub prune_after_secs: f64,
    /// At most this many tasks taken back per sweep.
    pub batch: i64,
    /// Retry backoff base and cap, milliseconds.
    pub retry_base_ms: f64,
    /// Cap of the backoff.
    pub retry_cap_ms: f64,
    /// Whether to judge liveness in this sweep: mark silent workers gone and take back
    /// expired leases. A reaper that could not see the database lately must not count
    /// its own blindness as the workers' silence (see `reaper::Sight`): it passes `false`
    /// until it has seen them long enough again.
    pub judge_liveness: bool,
    /// A pending task bound to a host whose workers are all gone and silent this long
    /// fails: its file is on that host only (see `upload_guard`).
    pub upload_host_deadline_secs: f64,
}

/// A task failed because the only host holding its file is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StrandedTask {
    /// The task.
    pub id: Uuid,
    /// The host it was bound to.
    pub host: String,
    /// The error it failed with.
    pub error: String,
}

// Pending tasks bound to a host none of whose workers is live, nor was heard from within
// $3 seconds of $4 (the database's clock when null): the file they name lies on that
// host's disk only, so they can never run, and fail with the reason (migrations/V11).
// A worker marked gone is the reaper's judgement, made only with its eyes open; the
// deadline on top lets a host come back from a reboot first. `skip locked`: two
// planners' reapers never fight, and a task an assigner holds waits for the next sweep.
// The partial index `tasks_pending_on_host` finds the few rows bound to a host.
const FAIL_STRANDED: &str = "with stranded as (
        select t.id,
               (select max(w.last_seen) from artex.workers w where w.host = t.host) as seen
        from artex.tasks t
        where t.listed = 'pending' and t.host is not null
          and not exists (
              select 1 from artex.workers w
              where w.host = t.host
                and (w.state <> 'gone'
                     or w.last_seen > coalesce($4, now()) - make_interval(secs => $3)))
        order by t.id
        limit $5
        for update of t skip locked
    )
    update artex.tasks t
    set status = 'failed',
        error = format('%s is on host %s, %s; no other worker can read it (uploads on '
                       'storage the whole fleet sees: run the workers with --upload-shared)',
                       coalesce('upload ' || (t.payload->'upload'->>'id'), 'its file'),
                       t.host,
                       coalesce('gone since '
                                || to_char(s.seen at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS')
                                || ' UTC',
                                'gone (none of its workers is on record)'))
    from stranded s, artex.set_context($1, $2) ctx
    where t.id = s.id and ctx and t.status = 'pending'
    returning t.id, t.host, t.error";

impl PlannerBoard {
    /// One reaper sweep: mark silent workers gone, take back their tasks and every task
    /// whose lease expired, and delete rows of workers gone long ago.
    pub async fn reap(&self, actor: &str, p: &ReapParams) -> Result<ReapReport> {
        if p.batch < 1 {
            return Err(crate::Error::Invalid(format!(
                "reap batch: {}; expected at least 1",
                p.batch
            )));
        }
        let client = self.bb.client().await?;
        let mut report = ReapReport {
            workers_pruned: client
                .execute(PRUNE_WORKERS, &[&p.now, &p.prune_after_secs])
                .await?,
            ..ReapReport::default()
        };
        if !p.judge_liveness {
            return Ok(report);
        }
        for row in client
            .query(MARK_GONE, &[&p.now, &p.worker_timeout_secs])
            .await?
        {
            report.workers_gone.push(row.try_get(0)?);
        }
        loop {
            let rows = client
                .query(
                    RECLAIM,
                    &[
                        &p.now,
                        &report.workers_gone,
                        &p.batch,
                        &actor,
                        &p.retry_base_ms,
                        &p.retry_cap_ms,
                    ],
                )
                .await?;
            for r in &rows {
                if r.try_get::<_, String>(0)? == "pending" {
                    report.requeued += 1;
                } else {
                    report.ended += 1;
                }
            }
            if (rows.len() as i64) < p.batch {
                break;
            }
        }
        Ok(report)
    }

    /// Fails (at most `batch`) pending tasks bound to a host whose workers are all gone
    /// and silent for `deadline_secs` (at `now`, or the database's clock): nothing but
    /// that host can read their file. Returns them.
    pub async fn fail_stranded(
        &self,
        actor: &str,
        deadline_secs: f64,
        now: Option<DateTime<Utc>>,
        batch: i64,
    ) -> Result<Vec<StrandedTask>> {
        let client = self.bb.client().await?;
        client
            .query(
                FAIL_STRANDED,
                &[
                    &actor,
                    &"its upload's host is gone past the deadline",
                    &deadline_secs,
                    &now,
                    &batch,
                ],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(StrandedTask {
                    id: r.try_get(0)?,
                    host: r.try_get(1)?,
                    error: r.try_get(2)?,
                })
            })
            .collect()
    }
}

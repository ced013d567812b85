//! A worker's hot path: read what was assigned to it, record starts and outcomes in
//! batches (a start after the fact, or together with the outcome: see
//! migrations/V3__batched_hot_path.sql), release what it will not run, and read a flow
//! task's upstream results (its leases and checkpoints: `leases.rs`). Every write to a
//! task names the lease epoch the worker holds: a worker that lost its lease changes
//! nothing.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::WorkerBoard;
use crate::blackboard::carried::ReadSnapshot;
use crate::blackboard::{due_at, EVENTS_CHANNEL, TASKS_CHANNEL};
use crate::error::{Error, Result};

/// A task assigned to a worker, as the worker reads it (or takes it over in a hot
/// upgrade): with what its handler needs, and the epoch to name in every write.
#[derive(Debug, Clone)]
pub struct AssignedTask {
    /// Task id.
    pub id: Uuid,
    /// Its kind.
    pub kind: String,
    /// Its input.
    pub payload: serde_json::Value,
    /// The fencing token to name in every write.
    pub epoch: i64,
    /// Failed attempts before this one.
    pub retries: i32,
    /// Retry budget.
    pub max_retries: i32,
    /// Per-attempt timeout, if the task sets one.
    pub timeout_ms: Option<i32>,
    /// Saved progress from an earlier attempt or process.
    pub checkpoint: Option<serde_json::Value>,
    /// Its flow, if any.
    pub flow_id: Option<Uuid>,
    /// Its payload's size as JSON text, bytes: what holding it costs, roughly, counted
    /// against the worker's queue memory budget.
    pub payload_bytes: i64,
    /// How long its lease had left when it was read, milliseconds (by the database's
    /// clock): the worker stops the task before that runs out unless it renews it.
    pub lease_left_ms: f64,
    /// Its priority: higher starts first.
    pub priority: i32,
    /// Its limit key, if it has one: what a fair kind's turns go by (`worker::turns`).
    pub limit_key: Option<String>,
    /// The W3C context it was submitted in, if any (migrations/V45).
    pub traceparent: Option<crate::trace::TraceParent>,
}

/// One read of a worker's assignments: the tasks, and what the read saw.
#[derive(Debug, Clone)]
pub struct AssignedRead {
    /// The tasks, in start order.
    pub tasks: Vec<AssignedTask>,
    /// The snapshot the read saw.
    pub snapshot: ReadSnapshot,
    /// The database's clock while the read ran (Unix milliseconds).
    pub db_clock_ms: f64,
    /// How many runnable tasks the read claimed for the worker before it read
    /// ([`WorkerBoard::claim_and_read`]; 0 for a plain read).
    pub claimed: i64,
    /// The claim found tasks it may run waiting, but the blackboard counted every slot of
    /// the worker taken: its outcomes were not written yet (V47; false for a plain read).
    pub no_room: bool,
    /// The tasks the claim took that carry a trace context, each with when it became
    /// runnable (V53): the worker makes their queue and assignment spans.
    pub traced_claims: Vec<(Uuid, SystemTime)>,
}

/// How an attempt ended: what its finish writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done, with a result.
    Succeeded(serde_json::Value),
    /// Failed; retried after `retry_in_ms` if the budget allows, else failed for good.
    Failed {
        /// What went wrong.
        error: String,
        /// Backoff before the retry.
        retry_in_ms: i64,
    },
    /// The handler ran past its timeout; retried like a failure, ends as `timeout`.
    TimedOut {
        /// What ran out.
        error: String,
        /// Backoff before the retry.
        retry_in_ms: i64,
    },
    /// Not run to its end here (drain, task transfer): back to pending, no attempt counted.
    Released,
    /// The handler said no retry can mend it: `failed` now.
    Discarded {
        /// Why (`discarded: …`).
        error: String,
    },
    /// The handler put it off: back to pending after `delay_ms`, no attempt counted.
    Snoozed {
        /// What the history says (`snoozed for N ms`).
        note: String,
        /// How long.
        delay_ms: i64,
    },
}

/// Which step of an attempt a record writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The handler started (`assigned → running`), recorded after the fact.
    Start,
    /// The attempt ended so (from `running`, or from `assigned` with its start).
    Finish(Outcome),
}

impl Step {
    /// Whether this is the start of the attempt, not its end.
    pub fn is_start(&self) -> bool {
        matches!(self, Step::Start)
    }
}

/// One start or finish of an attempt to record, fenced by the epoch the worker held.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Task id.
    pub id: Uuid,
    /// The fencing token the worker held.
    pub epoch: i64,
    /// Failed attempts before this one (as read when the task started).
    pub retries: i32,
    /// Retry budget (as read when the task started).
    pub max_retries: i32,
    /// What to record.
    pub step: Step,
    /// How long ago its handler started here (milliseconds), if it did: a task whose
    /// start is not recorded yet goes from `assigned` straight to its outcome, with this
    /// start time.
    pub started_ago_ms: Option<f64>,
    /// When `started_ago_ms` was measured, if not at the write: the write adds the time
    /// since, so that a record that waited in the worker's outbox (a lingering batch, a
    /// write in flight) still dates its start when the handler began, not that much
    /// later. (Not one `Instant` for both: with `None`, the start is exactly
    /// `started_ago_ms` before the write's time, which the status machine's model
    /// checks to the microsecond.)
    pub measured: Option<std::time::Instant>,
}

impl AttemptRecord {
    /// (status, result, error, counted failure, delay) as written.
    fn row(
        &self,
    ) -> (
        &'static str,
        Option<&serde_json::Value>,
        Option<&str>,
        bool,
        i64,
    ) {
        let exhausted = self.retries + 1 > self.max_retries;
        let outcome = match &self.step {
            Step::Start => return ("running", None, None, false, 0),
            Step::Finish(outcome) => outcome,
        };
        match outcome {
            Outcome::Succeeded(v) => ("succeeded", Some(v), None, false, 0),
            Outcome::Failed { error, retry_in_ms } => {
                let status = if exhausted { "failed" } else { "pending" };
                (status, None, Some(error), true, *retry_in_ms)
            }
            Outcome::TimedOut { error, retry_in_ms } => {
                let status = if exhausted { "timeout" } else { "pending" };
                (status, None, Some(error), true, *retry_in_ms)
            }
            Outcome::Released => ("pending", None, None, false, 0),
            Outcome::Discarded { error } => ("failed", None, Some(error), true, 0),
            Outcome::Snoozed { note, delay_ms } => ("pending", None, Some(note), false, *delay_ms),
        }
    }
}

/// Payloads (as JSON text) above which a read's tasks are decoded on a blocking thread.
const DECODE_ASIDE_BYTES: i64 = 1 << 20;

/// The traced tasks a claim took, with when each became runnable, from its snapshot
/// row (V53); none on an older schema, whose claim does not say.
fn traced_claims(snapshot: &tokio_postgres::Row) -> Result<Vec<(Uuid, SystemTime)>> {
    if snapshot
        .columns()
        .iter()
        .all(|c| c.name() != "traced_claims")
    {
        return Ok(Vec::new());
    }
    let ids: Option<Vec<Uuid>> = snapshot.try_get("traced_claims")?;
    let at: Option<Vec<SystemTime>> = snapshot.try_get("traced_runnable_at")?;
    let (ids, at) = (ids.unwrap_or_default(), at.unwrap_or_default());
    if ids.len() != at.len() {
        return Err(Error::Invalid(format!(
            "a claim named {} traced tasks and {} times they became runnable",
            ids.len(),
            at.len()
        )));
    }
    Ok(ids.into_iter().zip(at).collect())
}

/// The tasks of `rows` (as [`assigned_from_row`]). Large payloads are decoded on a blocking
/// thread: the worker's actor runs its lease renewals and its fence on the thread its
/// reads come back on, and a 50 MB payload is a long decode (longer in a debug build on
/// a loaded host) that would hold them all back.
pub(super) async fn decode_assigned(rows: Vec<tokio_postgres::Row>) -> Result<Vec<AssignedTask>> {
    let mut bytes = 0i64;
    for r in &rows {
        bytes += r.try_get::<_, i64>(9)?;
    }
    let decode = move || {
        rows.iter()
            .map(assigned_from_row)
            .collect::<Result<Vec<_>>>()
    };
    if bytes <= DECODE_ASIDE_BYTES {
        return decode();
    }
    tokio::task::spawn_blocking(decode)
        .await
        .map_err(|e| Error::Invalid(format!("decoding a read's payloads failed: {e}")))?
}

/// An assigned task from a row of `artex.read_assigned`'s or `TAKE_OVER`'s result.
pub(super) fn assigned_from_row(r: &tokio_postgres::Row) -> Result<AssignedTask> {
    Ok(AssignedTask {
        id: r.try_get(0)?,
        kind: r.try_get(1)?,
        payload: r.try_get(2)?,
        epoch: r.try_get(3)?,
        retries: r.try_get(4)?,
        max_retries: r.try_get(5)?,
        timeout_ms: r.try_get(6)?,
        checkpoint: r.try_get(7)?,
        flow_id: r.try_get(8)?,
        payload_bytes: r.try_get(9)?,
        lease_left_ms: r.try_get(10)?,
        // By name: the read has them after its snapshot's columns, a take-over after its
        // lease's.
        priority: r.try_get("priority")?,
        limit_key: r.try_get("limit_key")?,
        traceparent: r
            .try_get::<_, Option<&str>>("traceparent")?
            .and_then(|tp| crate::trace::TraceParent::parse(tp).ok()),
    })
}

// By primary key; `canceled` is final, so a task found canceled stays so.
const CANCELED_AMONG: &str =
    "select id from artex.tasks where id = any($1::uuid[]) and status::text = 'canceled'";

// Gives back what is assigned to the worker, except the tasks it is running (their start
// may not be written yet).
const RELEASE_ASSIGNED: &str = "update artex.tasks t set status = 'pending'
    from artex.set_context($1, $2) ctx
    where ctx and t.assigned_to = $1 and t.status = 'assigned' and t.id <> all($3::uuid[])
    returning t.id";

// Before that release, the slot it offered to new tasks (migrations/V62) goes back, so
// that no task is born assigned to it after it; an insert that holds the offer now gives
// it a task all the same, which the drain's last release gives back (`worker::drain`).
// A statement of its own: a function called in the release's FROM ran only when the
// release found a row to join it with.
const WITHDRAW_OFFERS: &str = "select artex.withdraw_offers($1)";

// A worker that found nothing waiting offers a slot to new tasks (migrations/V62): the
// next task submitted is born assigned to it, and it only reads it.
const OFFER_SLOT: &str = "select artex.offer_slot($1)";

const UPSTREAM_RESULTS: &str = "select u.flow_task, u.result
    from artex.task_dependencies d join artex.tasks u on u.id = d.depends_on
    where d.task_id = $1 and u.status = 'succeeded'";

// The worker's two hot statements are the bodies of plan-cached functions
// (migrations/V16), each written once, there: read them in migrations/schema.sql. Tests
// EXPLAIN them through the functions' own source.
//
// `artex.read_assigned_unknown` (`read_assigned` before V71):
// What is assigned to the worker and it has not read yet is what it reads: no write, no
// lock (the tasks are its own, fenced by their epoch). It reads up to its capacity in
// start order, leaving out the tasks at the epochs it knows ($5, $6: its ledger's; a
// claim after each written outcome would otherwise send back its whole queue).
// The worker reads what it may hold in memory: in order, while the payloads read so far
// ($3: bytes it may still take) fit, and always the first when it holds nothing ($4), so
// a task larger than the whole budget still runs, alone. The sizes (kept per row, see
// migrations/V5__fleet_capacity_and_liveness.sql) are summed over at most `limit` rows
// ($2); only the rows that fit are read whole.
// One row more, sorted first, says the snapshot the read saw and the database's clock
// (see blackboard/carried.rs); its task columns are null.
const FETCH_CALL: &str = "select * from artex.read_assigned_unknown($1, $2, $3, $4, $5, $6)";
// `artex.claim_and_read_unknown` (V46 as `claim_and_read`; V71):
// The worker's own read: it first claims the runnable tasks it may run, up to its free
// slots (those of the kinds it runs but the paused and the limited, not bound to another
// host), under its row lock and only while it is online, then reads as
// `read_assigned_unknown`. It looks before it locks: a read of an idle queue writes
// nothing. Its read is `read_assigned_unknown` itself, the snapshot's row also saying
// how many it claimed (`claimed`) and whether tasks waited that it had no free slot for
// (`no_room`).
const CLAIM_CALL: &str = "select * from artex.claim_and_read_unknown($1, $2, $3, $4, $5, $6)";
// `artex.record_attempts`:
// Statements that name their rows by id find each through the primary key. Their
// `status` test is written `status::text = …` on purpose: as a plain enum test it lets
// PostgreSQL drive the join from a partial index (`tasks_held`) that statistics show
// nearly empty, and with hundreds of tasks held it compares every held row with every
// listed one (seen: 250,000 comparisons for one batch of 500). `record_attempts` goes
// further (V73): its plan, made once a session on whatever statistics there were, reads
// only the batch's rows by their keys, never the tasks the worker holds.
//
// Starts and outcomes, one statement per batch. A task still `assigned` whose handler
// ran (`started_ago_ms` given) gets its start time with its outcome (or with `running`);
// one that did not run can only be given back (`pending`). Each row also says whether
// the planners must hear of the write beyond the places the worker's claims refill
// (V74).
const RECORD_CALL: &str = "select * from artex.record_attempts($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// A batch of starts and outcomes written ([`WorkerBoard::record_batch`]).
#[derive(Debug, Default)]
pub struct Recorded {
    /// The ids written; a missing one was fenced off (its lease was lost).
    pub ids: Vec<Uuid>,
    /// Whether the planners were woken.
    pub planners: bool,
}

/// The functions a worker's intake and outcomes call, with the calls it sends.
pub(crate) const HOT_CALLS: [(&str, &str); 3] = [
    ("read_assigned_unknown", FETCH_CALL),
    ("claim_and_read_unknown", CLAIM_CALL),
    ("record_attempts", RECORD_CALL),
];

impl WorkerBoard {
    /// Up to `limit` tasks assigned to `worker` and not started, in start order, as many as
    /// fit in `max_bytes` of payload (JSON text; with `holds_nothing`, the first one comes
    /// even if it alone is larger), with the snapshot the read saw and the database's clock
    /// while it ran (what a worker needs to take the tasks its wake-ups
    /// carry: see [`carried`](crate::blackboard::carried)). `None` when there is nothing to read.
    pub async fn read_assigned(
        &self,
        worker: &str,
        limit: i64,
        max_bytes: i64,
        holds_nothing: bool,
    ) -> Result<Option<AssignedRead>> {
        self.read(false, worker, limit, max_bytes, holds_nothing, &[])
            .await
    }

    /// As [`read_assigned`](Self::read_assigned), after claiming for `worker` the
    /// runnable tasks it may run, up to its free slots (migrations/V46): what a worker
    /// reads with, so that a task reaches it in one statement, without a planner's round.
    /// The tasks at the (id, epoch) in `known` (the ones it holds) are not read again.
    pub async fn claim_and_read(
        &self,
        worker: &str,
        limit: i64,
        max_bytes: i64,
        holds_nothing: bool,
        known: &[(Uuid, i64)],
    ) -> Result<Option<AssignedRead>> {
        self.read(true, worker, limit, max_bytes, holds_nothing, known)
            .await
    }

    /// The read, after the claim when `claim` (see [`claim_and_read`](Self::claim_and_read)),
    /// leaving out the tasks at the epochs `known`.
    async fn read(
        &self,
        claim: bool,
        worker: &str,
        limit: i64,
        max_bytes: i64,
        holds_nothing: bool,
        known: &[(Uuid, i64)],
    ) -> Result<Option<AssignedRead>> {
        if limit <= 0 || (max_bytes <= 0 && !holds_nothing) {
            return Ok(None);
        }
        let call = if claim { CLAIM_CALL } else { FETCH_CALL };
        let (known_ids, known_epochs): (Vec<Uuid>, Vec<i64>) = known.iter().copied().unzip();
        let client = self.bb.client().await?;
        let rows = client
            .query(
                call,
                &[
                    &worker,
                    &limit,
                    &max_bytes,
                    &holds_nothing,
                    &known_ids,
                    &known_epochs,
                ],
            )
            .await?;
        // The snapshot's row sorts first; the tasks follow in start order.
        let mut rows = rows.into_iter();
        let Some(first) = rows.next() else {
            return Err(Error::Invalid(
                "a read of assignments returned no snapshot row".into(),
            ));
        };
        let snapshot = ReadSnapshot::parse(first.try_get(11)?)?;
        let db_clock_ms = first.try_get(12)?;
        let (claimed, no_room) = if claim {
            (
                first.try_get::<_, Option<i64>>("claimed")?.unwrap_or(0),
                first
                    .try_get::<_, Option<bool>>("no_room")?
                    .unwrap_or(false),
            )
        } else {
            (0, false)
        };
        let traced_claims = if claim {
            traced_claims(&first)?
        } else {
            Vec::new()
        };
        let tasks = rows.collect();
        Ok(Some(AssignedRead {
            snapshot,
            db_clock_ms,
            claimed,
            no_room,
            traced_claims,
            tasks: decode_assigned(tasks).await?,
        }))
    }

    /// Records a batch of starts and outcomes in one statement (one audit insert, one
    /// commit), then wakes the planners (capacity freed, retries pending) and the feed's
    /// readers. Returns the ids actually written: a missing id was fenced off (its lease
    /// was lost).
    pub async fn record(&self, worker: &str, batch: &[AttemptRecord]) -> Result<Vec<Uuid>> {
        Ok(self.record_batch(worker, batch, false).await?.ids)
    }

    /// [`record`](Self::record) for a worker that refills what it gives back by its own
    /// claims when `refills_itself` (it has a backlog): the planners are woken only when
    /// the write asks for a round (V74: a limited kind's place given back or a limited
    /// task waiting for its kinds, a task sent back to pending, dependents to promote),
    /// the feed's readers always.
    pub async fn record_batch(
        &self,
        worker: &str,
        batch: &[AttemptRecord],
        refills_itself: bool,
    ) -> Result<Recorded> {
        if batch.is_empty() {
            return Ok(Recorded::default());
        }
        let mut ids = Vec::with_capacity(batch.len());
        let mut epochs = Vec::with_capacity(batch.len());
        let mut statuses = Vec::with_capacity(batch.len());
        let mut results = Vec::with_capacity(batch.len());
        let mut errors = Vec::with_capacity(batch.len());
        let mut failed = Vec::with_capacity(batch.len());
        let mut delays = Vec::with_capacity(batch.len());
        let mut started_ago = Vec::with_capacity(batch.len());
        for c in batch {
            let (status, result, error, counted, delay) = c.row();
            ids.push(c.id);
            epochs.push(c.epoch);
            statuses.push(status);
            results.push(result);
            errors.push(error);
            failed.push(counted);
            delays.push(delay as f64);
            started_ago.push(c.started_ago_ms.map(|ms| {
                ms + c
                    .measured
                    .map_or(0.0, |at| at.elapsed().as_secs_f64() * 1000.0)
            }));
        }
        let client = self.bb.client().await?;
        let rows = client
            .query(
                RECORD_CALL,
                &[
                    &worker,
                    &ids,
                    &epochs,
                    &statuses,
                    &results,
                    &errors,
                    &failed,
                    &delays,
                    &started_ago,
                ],
            )
            .await?;
        // Every row gives the batch's answer; no row, nothing written and no one woken.
        let mut planners = false;
        if let Some(first) = rows.first() {
            planners = first.try_get::<_, bool>(1)? || !refills_itself;
            if planners {
                self.bb.wake(&[TASKS_CHANNEL, EVENTS_CHANNEL]);
            } else {
                self.bb.wake(&[EVENTS_CHANNEL]);
            }
            // Retries and snoozes due later: the planners wake when the soonest is due.
            let soonest = statuses
                .iter()
                .zip(&delays)
                .filter(|(status, ms)| **status == "pending" && **ms > 0.0)
                .map(|(_, ms)| *ms)
                .reduce(f64::min);
            if let Some(ms) = soonest {
                let at = SystemTime::now() + Duration::from_secs_f64(ms / 1000.0);
                self.bb.notify(&[TASKS_CHANNEL], &due_at(at));
            }
        }
        let ids = rows
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect::<Result<Vec<Uuid>>>()?;
        Ok(Recorded { ids, planners })
    }

    /// Which of `ids` (tasks whose lease this worker lost) ended `canceled`: their
    /// handlers are told and given a grace, the others are stopped at once.
    pub async fn canceled_among(&self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.bb.client().await?;
        let rows = client.query(CANCELED_AMONG, &[&ids]).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Gives back the slot `worker` offered to new tasks (migrations/V62), then every task
    /// assigned to it except the ones in `running` (whose handlers run, their start
    /// perhaps not written yet).
    pub async fn release_assigned(
        &self,
        worker: &str,
        reason: &str,
        running: &[Uuid],
    ) -> Result<Vec<Uuid>> {
        let client = self.bb.client().await?;
        client.execute(WITHDRAW_OFFERS, &[&worker]).await?;
        let rows = client
            .query(RELEASE_ASSIGNED, &[&worker, &reason, &running])
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Offers one slot of `worker` to new tasks (`artex.offer_slot`, migrations/V62): at
    /// most one out, never its last free slot, only while it is online. Whether an offer
    /// of it is out.
    pub async fn offer_slot(&self, worker: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(client.query_one(OFFER_SLOT, &[&worker]).await?.try_get(0)?)
    }

    /// The results of task `id`'s upstream tasks, by their names in the flow (empty for
    /// a task without upstream tasks). Read when asked rather than copied into the
    /// payload at promotion: the payload stays the user's input, a handler that needs no
    /// upstream results pays nothing, and a wide fan-in does not copy every upstream
    /// result into one row.
    pub async fn upstream_results(&self, id: Uuid) -> Result<BTreeMap<String, serde_json::Value>> {
        let client = self.bb.client().await?;
        client
            .query(UPSTREAM_RESULTS, &[&id])
            .await?
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
                    r.try_get::<_, Option<serde_json::Value>>(1)?
                        .unwrap_or(serde_json::Value::Null),
                ))
            })
            .collect()
    }
}

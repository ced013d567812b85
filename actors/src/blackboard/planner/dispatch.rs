//! The planner's SQL: the roster of workers with spare capacity, the batched claim and
//! assignment (one transaction: the roster and the claim in one statement, `for update
//! skip locked`, then one compare-and-set update that also writes the chosen workers'
//! wake-ups, notified at the commit and pushed right after it), and the reaper's sweeps.
//! The rounds right behind a round cut at its batch claim by the roster it kept, without
//! reading it again ([`KeptRoster`], migrations/V55).

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{PlannerBoard, Push};
use crate::blackboard::Tx;
use crate::error::Result;

/// An online, live worker as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterEntry {
    /// Worker id.
    pub id: String,
    /// The kinds it runs.
    pub kinds: Vec<String>,
    /// How many tasks it may hold at once.
    pub capacity: i32,
    /// How many it holds now (assigned or running).
    pub held: i32,
    /// The host it runs on (tasks bound to a host go only to workers there).
    pub host: String,
    /// How many handlers it runs at once (`None`: it did not say; older builds and
    /// simulated workers): its capacity beyond that is its local queue.
    pub slots: Option<i32>,
}

impl RosterEntry {
    /// Free slots.
    pub fn free(&self) -> i32 {
        (self.capacity - self.held).max(0)
    }

    /// Free places it keeps for a fair kind's key that holds no task (migrations/V48):
    /// one, if it keeps a local queue (a place there, never a handler slot), else none.
    pub fn kept(&self) -> i32 {
        i32::from(self.slots.is_some_and(|s| self.capacity > s))
    }
}

/// The roster a round read, with what the rounds since gave its workers: kept by the
/// Assigner behind a round cut at its batch, so that the rounds right after it, a
/// backlog's drain, claim without reading every worker again (migrations/V55).
///
/// A kept roster is never emptier than the truth but by what others gave its workers
/// since its read (another planner's rounds, a worker's own claims): the workers'
/// releases since only make them look fuller, and its own assignments are counted in.
/// The round's write checks each chosen worker's state and free slots under its row
/// lock as always, so a worker gone or filled since the read is given nothing, or no
/// more than fits. A worker that joined since the read
/// is seen at the next one, within [`ROSTER_KEPT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRoster {
    /// The workers as the read saw them, each held count raised by what the rounds
    /// since assigned it.
    pub entries: Vec<RosterEntry>,
    /// When the roster was read.
    pub read_at: Instant,
}

/// How long a round's roster is kept for the rounds behind it: a worker that joins
/// during a backlog's drain is offered work this much later at most.
pub const ROSTER_KEPT: Duration = Duration::from_millis(250);

impl KeptRoster {
    /// Whether the rounds may still plan by it at `now`.
    pub fn fresh(&self, now: Instant) -> bool {
        now.duration_since(self.read_at) < ROSTER_KEPT
    }

    /// The roster `entries` read at `read_at`, with `plan`'s assignments counted into
    /// the workers' held tasks.
    fn after(mut entries: Vec<RosterEntry>, read_at: Instant, plan: &[Assignment]) -> Self {
        let mut given: std::collections::HashMap<&str, i32> = std::collections::HashMap::new();
        for a in plan {
            *given.entry(a.worker.as_str()).or_default() += 1;
        }
        for e in &mut entries {
            if let Some(n) = given.get(e.id.as_str()) {
                e.held = e.held.saturating_add(*n);
            }
        }
        KeptRoster { entries, read_at }
    }
}

/// A task the planner locked for assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Task id.
    pub id: Uuid,
    /// Its kind.
    pub kind: String,
    /// The host it is bound to (its upload is there), if any.
    pub host: Option<String>,
    /// Its kind has limits (migrations/V18): the round's write checks them under lock.
    pub limited: bool,
    /// Of a fair kind (migrations/V43): `Some(true)` for the first task of a key that
    /// holds no task in the fleet, `Some(false)` for the others; `None` for other kinds.
    pub fresh: Option<bool>,
}

impl Claimed {
    /// It may take the place a worker keeps for a fair kind's key that holds no task
    /// ([`RosterEntry::kept`]): every task but a fair kind's of a key that holds some.
    pub fn may_take_kept(&self) -> bool {
        self.fresh != Some(false)
    }
}

/// One decision of the assigner: this task to that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Task id.
    pub task: Uuid,
    /// Worker id.
    pub worker: String,
}

/// What one claim-and-assign cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignReport {
    /// The wake-ups to push to workers that take them over HTTP (see `waker`): the
    /// round's write notified the others itself.
    pub pushes: Vec<Push>,
    /// The roster's workers that take pushes, with their addresses (id, `host:port`);
    /// none for a round by a kept roster (the read that made it named them).
    pub reachable: Vec<(String, String)>,
    /// Those of them with a free handler slot before the round: a task they claim
    /// starts at once.
    pub idle: Vec<(String, String)>,
    /// Runnable tasks locked by the claim.
    pub claimed: usize,
    /// Tasks assigned (written and committed).
    pub assigned: usize,
    /// Workers woken.
    pub workers_notified: usize,
    /// Free capacity the roster showed before the cycle.
    pub free_capacity: i64,
    /// The most this cycle could assign (free capacity, batch size).
    pub limit: i64,
    /// With tracing on only: the traced tasks assigned, with what the planner's spans
    /// say of them (the round's write returns their contexts: migrations/V45).
    pub given: Vec<crate::trace::Assigned>,
    /// The roster the round planned by, its assignments counted in: the next round may
    /// keep it ([`PlannerBoard::dispatch_kept`]).
    pub roster: Option<KeptRoster>,
    /// A kept roster's claim found a kind limited or a limited task waiting, and the
    /// round was read whole: the next rounds had better read it whole at once.
    pub limits_in_play: bool,
}

impl AssignReport {
    /// The cycle assigned all it could while workers still had free slots: more may be
    /// runnable right now.
    pub fn more_may_fit(&self) -> bool {
        self.assigned > 0 && self.assigned as i64 >= self.limit && self.limit < self.free_capacity
    }
}

// The roster is a read of the workers table: what a worker holds is kept by the
// database as two counters that only grow, `workers.taken` and `worker_released.released`
// (see migrations/V12__held_released_apart.sql; a `released` read from an older snapshot
// only makes a worker look fuller than it is). A worker is offered work while it is
// online, heard from within $1 seconds (past that it is suspect: not yet gone, but given
// nothing), and its LISTEN session's backend exists: a killed worker, or one cut off,
// loses that backend long before it misses its heartbeats.
//
// One planner round's read in one statement: the roster and the claim ride together, so
// a round costs one round trip before its write instead of two. The claim locks runnable
// tasks through the partial index `tasks_runnable` (`for update skip locked`; it names
// `listed`, not `status`, so that a task's later updates stay HOT: see
// migrations/V15__hot_task_rows.sql), of the
// kinds of workers with a free slot, at most $2 or the free slots in all. A task of a
// kind with limits (`artex.kind_limits`, migrations/V18) is marked `limited` and waits
// in `tasks_limited_waiting` instead; it is claimed only if, by this snapshot, its
// kind's and its key's held tasks and the kind's rate leave it room (`fits`), so that a
// backlog of one kind or one key neither takes the claim's places nor is walked by the
// claim of the others; the write checks again under lock. Roster rows come first (task
// columns null), then the claimed tasks of both kinds in claim order (roster columns
// null). A roster row says the worker's handler slots, and a fair kind's task whether it
// may take the place a worker's local queue keeps for a key that holds no task (V48).

// The assignment takes each worker's slots under its row lock (workers locked in id
// order: two planners wait for each other, never deadlock): a planner whose roster was
// stale assigns only what still fits, and the rest of its plan stays pending. The
// tasks' trigger then adds them to `taken` in the same statement. `released` is read
// without a lock (the worker raises it as it finishes tasks, never waiting for this
// lock): older, it is only smaller, so `free` is never more than the true free slots. The lease is the one
// the worker renews ($4, the planner's, for a worker that states none).
// Limits: the function running this statement first turns $5, the tasks of limited
// kinds among $2, into those of them `artex.over_limits` refuses (counted under the
// kinds' row locks: see migrations/V18); those stay pending. An assigned task of a
// limited kind is marked `limited`, which puts it in the index the limits count.

// Each chosen worker's wake-up carries what it was given (see blackboard/carried.rs),
// written by the assignment's own statement from the rows it wrote (migrations/V35): the
// tasks as the worker's own read would return them, with the `xmin` of the row version
// written and the lease's end. In start order, in notifications of at most ~7,500 bytes
// (NOTIFY takes < 8,000); a task longer than 1,000 bytes as JSON is not carried: its
// worker also gets a plain wake-up and reads it. A chosen worker given nothing gets a
// plain wake-up too. A worker woken over HTTP (its `wake_addr`, migrations/V14) is not
// notified here: its payloads come back as rows, which the planner pushes after the
// commit (`waker`); the others are notified on their channels, at the commit.

// The two statements described above are the bodies of plan-cached functions
// (migrations/V16: a function keeps its statement's plan for the server session, where an
// unnamed statement is planned at every call), each written once, there: read them in
// migrations/schema.sql. Tests EXPLAIN them through the functions' own source.
const DISPATCH_CALL: &str = "select * from artex.dispatch_round($1, $2, $3, $4, $5, $6)";
const ASSIGN_CALL: &str = "select * from artex.assign_and_wake($1, $2, $3, $4, $5)";
// The claim of a round planned by a kept roster (migrations/V55): one row of nulls when
// limits are in play, and the round is read whole instead.
const CLAIM_KEPT_CALL: &str = "select * from artex.claim_head($1, $2, $3, $4)";

/// The functions a planner round calls, with the calls it sends: (function, call).
pub(crate) const HOT_CALLS: [(&str, &str); 3] = [
    ("dispatch_round", DISPATCH_CALL),
    ("assign_and_wake", ASSIGN_CALL),
    ("claim_head", CLAIM_KEPT_CALL),
];

/// The write half of a round, in the transaction `client` holds with `claimed` locked:
/// `plan` matches them to workers; the assignments are written (compare-and-set on
/// `pending`, each worker's slots under its row lock) and committed, and the chosen
/// workers woken, in one round trip. Gives the report and the plan.
async fn assign_and_wake<F>(
    client: Tx,
    actor: &str,
    lease_secs: f64,
    claimed: &[Claimed],
    plan: F,
) -> Result<(AssignReport, Vec<Assignment>)>
where
    F: FnOnce(&[Claimed]) -> Vec<Assignment>,
{
    let mut report = AssignReport {
        claimed: claimed.len(),
        ..AssignReport::default()
    };
    let plan = if claimed.is_empty() {
        Vec::new()
    } else {
        plan(claimed)
    };
    if plan.is_empty() {
        client.commit().await?;
        return Ok((report, plan));
    }
    let ids: Vec<Uuid> = plan.iter().map(|a| a.task).collect();
    let workers: Vec<&str> = plan.iter().map(|a| a.worker.as_str()).collect();
    let limited: Vec<Uuid> = {
        let of_limited_kinds: std::collections::HashSet<Uuid> =
            claimed.iter().filter(|c| c.limited).map(|c| c.id).collect();
        ids.iter()
            .copied()
            .filter(|id| of_limited_kinds.contains(id))
            .collect()
    };
    // One round trip: the assignments with the chosen workers' wake-ups (one
    // statement: the notifications leave at the commit), then the commit (a failed
    // assignment makes it a rollback).
    let (rows, committed) = futures_util::future::join(
        client.query(
            ASSIGN_CALL,
            &[&actor, &ids, &workers, &lease_secs, &limited],
        ),
        client.batch("commit"),
    )
    .await;
    if committed.is_ok() {
        client.ended();
    }
    let rows = rows?;
    committed?;
    let (assigned, mut pushes, notified) = assigned_and_pushes(&rows)?;
    report.assigned = assigned;
    // Each push names the tasks it announces: given back if it cannot be sent.
    for p in &mut pushes {
        p.tasks = plan
            .iter()
            .filter(|a| a.worker == p.worker)
            .map(|a| a.task)
            .collect();
    }
    report.workers_notified = notified + pushes.len();
    report.pushes = pushes;
    if crate::trace::enabled() {
        report.given = traced(&rows, &plan, claimed)?;
    }
    Ok((report, plan))
}

/// What a dispatch round is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Round<'a> {
    /// The planner's name in the history.
    pub actor: &'a str,
    /// At most this many tasks.
    pub batch: i64,
    /// `(count, mine)`: the planner shards it claims from; `(1, [])` for all.
    pub shards: (i32, &'a [i32]),
    /// The lease given with an assignment to a worker that states none, seconds.
    pub lease_secs: f64,
    /// Workers heard from within this many seconds are offered work.
    pub alive_secs: f64,
    /// Workers whose last push failed: offered nothing.
    pub unreachable: &'a [String],
    /// Whether the round may walk the keys of limited kinds when the head of their queue
    /// does not fill it (migrations/V37): the Assigner lets it every [`WALK_EVERY`].
    pub walk: bool,
}

/// How often an Assigner's round may walk the keys of limited kinds (migrations/V37). A
/// walk costs an index probe and a lookup per key with a task waiting (15-25 ms with
/// 1,000 keys); between walks a round takes what fits of the head of the limited queue,
/// so a task whose key is not in that head waits at most this long, or until the
/// planner's next round when none comes sooner.
pub const WALK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Of the rows of `artex.assign_and_wake`, the tasks assigned that carry a trace
/// context (its 6th column; the 7th, when they became runnable), with their kinds and
/// workers.
fn traced(
    rows: &[tokio_postgres::Row],
    plan: &[Assignment],
    claimed: &[Claimed],
) -> Result<Vec<crate::trace::Assigned>> {
    let workers: std::collections::HashMap<Uuid, &str> =
        plan.iter().map(|a| (a.task, a.worker.as_str())).collect();
    let kinds: std::collections::HashMap<Uuid, &str> =
        claimed.iter().map(|c| (c.id, c.kind.as_str())).collect();
    let mut out = Vec::new();
    for r in rows {
        let Some(task) = r.try_get::<_, Option<Uuid>>(0)? else {
            continue;
        };
        let Some(tp) = r.try_get::<_, Option<&str>>(5)? else {
            continue;
        };
        let (Ok(traceparent), Some(worker), Some(kind)) = (
            crate::trace::TraceParent::parse(tp),
            workers.get(&task),
            kinds.get(&task),
        ) else {
            continue;
        };
        let run_at: chrono::DateTime<chrono::Utc> = r.try_get(6)?;
        out.push(crate::trace::Assigned {
            task,
            kind: kind.to_string(),
            traceparent,
            runnable_at: run_at.into(),
            worker: worker.to_string(),
        });
    }
    Ok(out)
}

/// The rows of `artex.assign_and_wake`: how many tasks it assigned (the rows naming a
/// task), the pushes (one per worker woken over HTTP, its payloads in order) and how
/// many workers the statement notified itself.
fn assigned_and_pushes(rows: &[tokio_postgres::Row]) -> Result<(usize, Vec<Push>, usize)> {
    let mut assigned = 0;
    let mut pushes: Vec<Push> = Vec::new();
    let mut notified = std::collections::BTreeSet::new();
    for r in rows {
        if r.try_get::<_, Option<Uuid>>(0)?.is_some() {
            assigned += 1;
            continue;
        }
        let worker: String = r.try_get(1)?;
        let Some(addr) = r.try_get::<_, Option<String>>(2)? else {
            notified.insert(worker);
            continue;
        };
        let payload: String = r.try_get(3)?;
        match pushes.last_mut() {
            Some(p) if p.worker == worker => p.payloads.push(payload),
            _ => pushes.push(Push {
                worker,
                addr,
                payloads: vec![payload],
                tasks: Vec::new(),
            }),
        }
    }
    Ok((assigned, pushes, notified.len()))
}

/// What a round's read gives: the roster and the tasks claimed.
struct RoundRead {
    roster: Vec<RosterEntry>,
    claimed: Vec<Claimed>,
    reachable: Vec<(String, String)>,
    idle: Vec<(String, String)>,
}

/// The rows of `artex.dispatch_round`: roster rows first (worker id set), then the
/// tasks claimed.
fn round_read(rows: &[tokio_postgres::Row]) -> Result<RoundRead> {
    let mut read = RoundRead {
        roster: Vec::new(),
        claimed: Vec::new(),
        reachable: Vec::new(),
        idle: Vec::new(),
    };
    for r in rows {
        match r.try_get::<_, Option<String>>(0)? {
            Some(id) => {
                let entry = RosterEntry {
                    id,
                    kinds: r.try_get(1)?,
                    capacity: r.try_get(2)?,
                    held: r.try_get(3)?,
                    host: r.try_get(4)?,
                    slots: r.try_get(10)?,
                };
                if let Some(addr) = r.try_get::<_, Option<String>>(8)? {
                    if entry.held < entry.slots.unwrap_or(entry.capacity) {
                        read.idle.push((entry.id.clone(), addr.clone()));
                    }
                    read.reachable.push((entry.id.clone(), addr));
                }
                read.roster.push(entry)
            }
            None => read.claimed.push(Claimed {
                id: r.try_get(5)?,
                kind: r.try_get(6)?,
                host: r.try_get(7)?,
                limited: r.try_get(9)?,
                fresh: r.try_get(11)?,
            }),
        }
    }
    Ok(read)
}

/// The rows of `artex.claim_head`: the tasks claimed, or `None` for its one row of
/// nulls (limits are in play: the round must be read whole).
fn kept_claim(rows: &[tokio_postgres::Row]) -> Result<Option<Vec<Claimed>>> {
    let mut claimed = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(id) = r.try_get::<_, Option<Uuid>>(0)? else {
            return Ok(None);
        };
        claimed.push(Claimed {
            id,
            kind: r.try_get(1)?,
            host: r.try_get(2)?,
            limited: false,
            fresh: None,
        });
    }
    Ok(Some(claimed))
}

/// The round's read (`artex.dispatch_round`) in `client`'s transaction.
async fn read_round(client: &Tx, round: &Round<'_>) -> Result<Vec<tokio_postgres::Row>> {
    client
        .query(
            DISPATCH_CALL,
            &[
                &round.alive_secs,
                &round.batch,
                &round.shards.0,
                &round.shards.1,
                &round.unreachable,
                &round.walk,
            ],
        )
        .await
}

/// The rest of a round read whole: `rows` (the read begun at `read_at`, or why it
/// failed) planned, written and committed.
async fn plan_and_assign<F>(
    client: Tx,
    round: &Round<'_>,
    read_at: Instant,
    rows: Result<Vec<tokio_postgres::Row>>,
    plan: F,
) -> Result<AssignReport>
where
    F: FnOnce(&[Claimed], &[RosterEntry]) -> Vec<Assignment>,
{
    let read = match rows.and_then(|rows| round_read(&rows)) {
        Ok(read) => read,
        Err(e) => {
            // The connection goes back to the pool only if the rollback went through.
            client.rollback().await;
            return Err(e);
        }
    };
    let RoundRead {
        roster,
        claimed,
        reachable,
        idle,
    } = read;
    let free: i64 = roster.iter().map(|w| i64::from(w.free())).sum();
    let (mut report, planned) =
        assign_and_wake(client, round.actor, round.lease_secs, &claimed, |c| {
            plan(c, &roster)
        })
        .await?;
    report.free_capacity = free;
    report.limit = free.min(round.batch);
    report.reachable = reachable;
    report.idle = idle;
    report.roster = Some(KeptRoster::after(roster, read_at, &planned));
    Ok(report)
}

impl PlannerBoard {
    /// One planner round whose roster rides with its claim (one statement, one round
    /// trip, one snapshot): reads the workers alive within `alive_secs` with what they
    /// hold (but none of `unreachable`, whose last push failed), locks up to `batch`
    /// runnable tasks of the kinds the ones with a free slot run (never more than the
    /// free slots), lets `plan` match them, then writes the
    /// assignments and wakes the chosen workers. The report says the roster's free
    /// capacity and the limit the claim had, and gives the roster with its assignments
    /// counted in.
    pub async fn dispatch<F>(&self, round: &Round<'_>, plan: F) -> Result<AssignReport>
    where
        F: FnOnce(&[Claimed], &[RosterEntry]) -> Vec<Assignment>,
    {
        let client = Tx::new(self.bb.client().await?);
        let read_at = Instant::now();
        let (begun, rows) =
            futures_util::future::join(client.begin(), read_round(&client, round)).await;
        plan_and_assign(client, round, read_at, begun.and(rows), plan).await
    }

    /// [`Self::dispatch`] by a roster a round before kept (migrations/V55): the claim
    /// takes the kinds and the free slots `kept` counts (but its workers now
    /// `unreachable`), without the roster's read. When limits are in play, or the claim
    /// finds no task (a quiet fleet's report names its idle workers, which only a read
    /// knows), the round is read whole in the same transaction, as `dispatch` reads it.
    pub async fn dispatch_kept<F>(
        &self,
        round: &Round<'_>,
        kept: KeptRoster,
        plan: F,
    ) -> Result<AssignReport>
    where
        F: FnOnce(&[Claimed], &[RosterEntry]) -> Vec<Assignment>,
    {
        let KeptRoster {
            mut entries,
            read_at,
        } = kept;
        entries.retain(|e| !round.unreachable.contains(&e.id));
        let free: i64 = entries.iter().map(|w| i64::from(w.free())).sum();
        let mut kinds: Vec<&str> = entries
            .iter()
            .filter(|e| e.free() > 0)
            .flat_map(|e| e.kinds.iter().map(String::as_str))
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        let limit = free.min(round.batch);
        if limit == 0 {
            return self.dispatch(round, plan).await;
        }
        let client = Tx::new(self.bb.client().await?);
        let (begun, rows) = futures_util::future::join(
            client.begin(),
            client.query(
                CLAIM_KEPT_CALL,
                &[&kinds, &limit, &round.shards.0, &round.shards.1],
            ),
        )
        .await;
        let claimed = match begun.and(rows).and_then(|rows| kept_claim(&rows)) {
            Ok(Some(claimed)) if !claimed.is_empty() => claimed,
            Ok(limits) => {
                // Limits in play, or nothing to claim: the round read whole. The claim
                // locked nothing.
                let read_at = Instant::now();
                let rows = read_round(&client, round).await;
                let mut report = plan_and_assign(client, round, read_at, rows, plan).await?;
                report.limits_in_play = limits.is_none();
                return Ok(report);
            }
            Err(e) => {
                client.rollback().await;
                return Err(e);
            }
        };
        let (mut report, planned) =
            assign_and_wake(client, round.actor, round.lease_secs, &claimed, |c| {
                plan(c, &entries)
            })
            .await?;
        report.free_capacity = free;
        report.limit = limit;
        // No `reachable`: the read that made the roster named them, and the waker greets
        // a worker once.
        report.roster = Some(KeptRoster::after(entries, read_at, &planned));
        Ok(report)
    }
}

//! The Assigner: gives runnable tasks to online workers that run their kind and have
//! spare capacity. One `run_once` is one transaction: read the roster and lock a batch of
//! runnable tasks (`for update skip locked`) in one statement, match them, write the
//! assignments with a compare-and-set, and wake each chosen worker (a NOTIFY, or a push
//! over HTTP by the [`Waker`] after the commit). With leased planner
//! shards (`--shards auto`) the shards it claims are re-read from the
//! [`ShardView`] each round; owning none (or no longer sure of its leases) it claims
//! nothing. A round cut at its batch keeps its roster: the rounds right behind it, a
//! backlog's drain, claim by it without reading every worker again (see
//! [`KeptRoster`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use actix::prelude::*;

use crate::blackboard::{
    AssignReport, Assignment, Claimed, KeptRoster, PlannerBoard, RosterEntry, Round, ROSTER_KEPT,
    WALK_EVERY,
};
use crate::error::Result;
use crate::metrics::planner::PlannerMetrics;
use crate::shard_keeper::ShardView;
use crate::supervisor::{guarded, ActorStats};
use crate::waker::Waker;

/// How the planner assigns.
#[derive(Debug, Clone)]
pub struct AssignerConfig {
    /// This planner's name in the audit trail.
    pub actor: String,
    /// At most this many tasks per transaction.
    pub batch: i64,
    /// Lease given with an assignment, seconds.
    pub lease_secs: f64,
    /// A worker not heard from for this long is suspect and gets nothing (it is gone,
    /// and its tasks taken back, only after the reaper's longer timeout).
    pub suspect_after_secs: f64,
    /// `(count, mine)`: which planner shards this planner serves; `(1, [])` for all. An
    /// Assigner given a [`ShardView`] takes it from there each round instead.
    pub shards: (i32, Vec<i32>),
}

/// Matches claimed tasks to workers so that load spreads evenly: each worker's share of
/// the round is proportional to its free slots, and it gets its share as one run of
/// consecutive tasks (claimed in dispatch order, so mostly neighbours in the table):
/// two workers writing interleaved rows would contend for the same pages. A task whose
/// kind the current worker does not run goes to the eligible worker with the most free
/// slots (ties by id). A task bound to a host (its uploaded file is there) is eligible
/// only for workers on that host. A fair kind's task of a key that already holds tasks
/// does not take the place a worker keeps for a key that holds none
/// ([`RosterEntry::kept`], migrations/V48): a late key's first task finds room in the
/// next round however busy the fleet. Pure, so it is tested directly.
pub fn plan(claimed: &[Claimed], roster: &[RosterEntry]) -> Vec<Assignment> {
    plan_with_runs(claimed, roster, 1)
}

/// The shortest run a worker is given in a round cut at its batch (see [`plan_round`]).
pub const MIN_RUN: i64 = 8;

/// [`plan`] for a round of at most `batch` tasks. A round that took its whole batch
/// while the roster had more free slots was cut short: more runnable tasks wait behind
/// it, and the next rounds, milliseconds apart, fill the slots this one leaves. Spreading
/// such a round one task per worker buys no parallelism the next rounds would not give,
/// while every worker touched costs the round's write a row lock, a counter and a
/// wake-up (~10 µs each: 2,000 workers of one task each made a round of 2,000 a third
/// slower than 10 workers of 200). So in a cut round each chosen worker takes a run of at
/// least [`MIN_RUN`] tasks (or its free slots, if fewer): no more than it asked for (its
/// concurrency and the local queue it sized), and a worker touched costs each of its
/// tasks ~1 µs instead of ~10. A run that would leave a worker fewer than [`MIN_RUN`]
/// free slots takes those too: 2,000 workers of 10 slots took runs of 8, then runs of
/// 2 in rounds that touched 1,000 workers each. A round that was not cut (every runnable task fits) is
/// spread as [`plan`] spreads it, so that an idle fleet starts a small burst on as many
/// hosts as it can.
pub fn plan_round(claimed: &[Claimed], roster: &[RosterEntry], batch: i64) -> Vec<Assignment> {
    let free: i64 = roster.iter().map(|w| i64::from(w.free())).sum();
    let cut = claimed.len() as i64 >= batch && batch < free;
    plan_with_runs(claimed, roster, if cut { MIN_RUN } else { 1 })
}

/// [`plan`], each worker's share at least `min_run` tasks (or its free slots).
pub(crate) fn plan_with_runs(
    claimed: &[Claimed],
    roster: &[RosterEntry],
    min_run: i64,
) -> Vec<Assignment> {
    let mut free: Vec<i32> = roster.iter().map(RosterEntry::free).collect();
    let total: i64 = free.iter().map(|&f| i64::from(f)).sum();
    let n = claimed.len() as i64;
    // This round's share of each worker (at least one task, or `min_run`, when it has a
    // free slot).
    let mut share: Vec<i64> = free
        .iter()
        .map(|&f| {
            let s = if total == 0 {
                0
            } else {
                ((n * i64::from(f) + total - 1) / total).max(min_run)
            };
            // A run that would leave fewer than `min_run` free slots takes them too.
            if i64::from(f) - s < min_run {
                i64::from(f)
            } else {
                s
            }
        })
        .collect();
    // Per kind, the workers that run it, best first: (has a share left, free slots, the
    // smaller id). Keys only go down as tasks are placed, so an entry is checked when it
    // comes to the top and pushed back with its current key if it went stale: a round
    // costs O(tasks · log workers), not O(tasks · workers) (2,000 workers: 5× faster).
    type Entry<'a> = (bool, i32, Reverse<&'a str>, usize);
    // Keyed by kind and host: `None` holds every worker of the kind, `Some(h)` those on
    // host h (for tasks bound to it).
    let mut by_kind: HashMap<(&str, Option<&str>), BinaryHeap<Entry>> = HashMap::new();
    for (i, w) in roster.iter().enumerate() {
        if free[i] > 0 {
            for k in &w.kinds {
                for host in [None, Some(w.host.as_str())] {
                    by_kind.entry((k.as_str(), host)).or_default().push((
                        share[i] > 0,
                        free[i],
                        Reverse(w.id.as_str()),
                        i,
                    ));
                }
            }
        }
    }
    let kept: Vec<i32> = roster.iter().map(RosterEntry::kept).collect();
    // The (kind, host) pairs whose workers have only kept places left: the tasks that may
    // not take those skip the heap (free places only go down within a round).
    let mut only_kept: HashSet<(&str, Option<&str>)> = HashSet::new();
    let mut out = Vec::with_capacity(claimed.len());
    let mut current: Option<usize> = None;
    for task in claimed {
        let host = task.host.as_deref();
        let open = task.may_take_kept();
        let runs = |i: usize| {
            roster[i].kinds.iter().any(|k| k == &task.kind)
                && host.is_none_or(|h| roster[i].host == h)
        };
        let room = |i: usize| free[i] > if open { 0 } else { kept[i] };
        let keep = current.filter(|&i| runs(i) && room(i) && share[i] > 0);
        let key = (task.kind.as_str(), host);
        let chosen = keep.or_else(|| {
            if !open && only_kept.contains(&key) {
                return None;
            }
            let heap = by_kind.get_mut(&key)?;
            // Workers with only kept places, set aside for this task and put back after.
            let mut passed = Vec::new();
            let found = loop {
                let Some(&(has_share, slots, id, i)) = heap.peek() else {
                    break None;
                };
                heap.pop();
                if free[i] <= 0 {
                    continue;
                }
                let now = (share[i] > 0, free[i]);
                if (has_share, slots) != now {
                    heap.push((now.0, now.1, id, i));
                    continue;
                }
                if !room(i) {
                    passed.push((has_share, slots, id, i));
                    continue;
                }
                // Still the best; it stays in the heap for the tasks after this one.
                heap.push((has_share, slots, id, i));
                break Some(i);
            };
            heap.extend(passed);
            if found.is_none() && !open {
                only_kept.insert(key);
            }
            found
        });
        let Some(i) = chosen else {
            continue;
        };
        current = Some(i);
        free[i] -= 1;
        share[i] -= 1;
        out.push(Assignment {
            task: task.id,
            worker: roster[i].id.clone(),
        });
    }
    out
}

/// The Assigner actor.
pub struct Assigner {
    bb: PlannerBoard,
    config: AssignerConfig,
    stats: ActorStats,
    /// This round's batch: small after idle, the full `config.batch` once a round filled
    /// it. A first round of 2,000 rows takes ~90 ms to write, during which the workers
    /// wait; a first round of 128 lets them start within a few. The ramp is for trickles:
    /// a round that filled its 128 met a backlog, and the next takes all that fits.
    ramp: i64,
    /// Leased shards (`--shards auto`), kept by the ShardKeeper; `None`: `config.shards`.
    leased: Option<ShardView>,
    /// Pushes the wake-ups of workers woken over HTTP; `None`: they find their tasks by
    /// polling (tests that drive rounds by hand).
    waker: Option<Waker>,
    /// When a round last could walk the keys of limited kinds: the next may once
    /// [`WALK_EVERY`] has passed (`None`: the first round may).
    walked_at: Option<Instant>,
    /// Rounds' times and assignments, for `/metrics`.
    metrics: Option<Arc<PlannerMetrics>>,
    /// Rounds run, to name each in its assignments' trace spans.
    rounds: u64,
    /// The roster of the last round, if it was cut at its batch: the next rounds plan by
    /// it for [`ROSTER_KEPT`] instead of reading it again (migrations/V55).
    kept: Option<KeptRoster>,
    /// When a kept roster's claim last found limits in play: for as long again, the
    /// rounds read whole at once rather than try the claim first.
    limits_seen: Option<Instant>,
}

/// The first round's batch after idle.
const RAMP_START: i64 = 128;

impl Assigner {
    /// A new Assigner (start it under a `Supervisor`).
    pub fn new(bb: PlannerBoard, config: AssignerConfig, stats: ActorStats) -> Self {
        let ramp = RAMP_START.min(config.batch);
        Assigner {
            bb,
            config,
            stats,
            ramp,
            leased: None,
            waker: None,
            walked_at: None,
            metrics: None,
            rounds: 0,
            kept: None,
            limits_seen: None,
        }
    }

    /// Pushes each round's wake-ups with `waker`, and gives its unreachable workers
    /// nothing.
    pub fn with_waker(mut self, waker: Waker) -> Self {
        self.waker = Some(waker);
        self
    }

    /// Counts its rounds into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<PlannerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Serves the shards `view` holds at the start of each round, not `config.shards`.
    pub fn with_leased_shards(mut self, view: ShardView) -> Self {
        self.leased = Some(view);
        self
    }

    /// One assignment round; see the module doc. It walks the keys of limited kinds if
    /// the head of their queue does not fill it.
    pub async fn run_once(bb: &PlannerBoard, config: &AssignerConfig) -> Result<AssignReport> {
        Assigner::run_excluding(bb, config, &[], true, None).await
    }

    /// One assignment round that gives `unreachable` workers nothing, and walks the keys
    /// of limited kinds only if `walk`; planned by the `kept` roster if there is one.
    async fn run_excluding(
        bb: &PlannerBoard,
        config: &AssignerConfig,
        unreachable: &[String],
        walk: bool,
        kept: Option<KeptRoster>,
    ) -> Result<AssignReport> {
        crate::supervisor::failpoint("assigner");
        let round = Round {
            actor: &config.actor,
            batch: config.batch,
            shards: (config.shards.0, &config.shards.1),
            lease_secs: config.lease_secs,
            alive_secs: config.suspect_after_secs,
            unreachable,
            walk,
        };
        let batch = config.batch;
        let plan = |claimed: &[Claimed], roster: &[RosterEntry]| plan_round(claimed, roster, batch);
        match kept {
            Some(kept) => bb.dispatch_kept(&round, kept, plan).await,
            None => bb.dispatch(&round, plan).await,
        }
    }
}

impl Actor for Assigner {
    type Context = Context<Self>;
}

impl Supervised for Assigner {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("assigner");
    }
}

/// Run one assignment round now; answers with its report.
#[derive(Message)]
#[rtype(result = "Result<AssignReport>")]
pub struct AssignNow;

impl Handler<AssignNow> for Assigner {
    type Result = ResponseActFuture<Self, Result<AssignReport>>;

    fn handle(&mut self, _msg: AssignNow, _ctx: &mut Context<Self>) -> Self::Result {
        let bb = self.bb.clone();
        let shards = match &self.leased {
            None => self.config.shards.clone(),
            Some(view) => match view.scope() {
                Some(scope) => scope,
                // No shard, or its leases may be running out: not a claim (nor a
                // roster read) until the keeper renews or takes some.
                None => return Box::pin(actix::fut::ready(Ok(AssignReport::default()))),
            },
        };
        let config = AssignerConfig {
            batch: self.ramp,
            shards,
            ..self.config.clone()
        };
        let waker = self.waker.clone();
        let unreachable = waker.as_ref().map(Waker::unreachable).unwrap_or_default();
        let now = Instant::now();
        let started = SystemTime::now();
        self.rounds += 1;
        let round = self.rounds;
        let walk = self
            .walked_at
            .is_none_or(|at| now.duration_since(at) >= WALK_EVERY);
        if walk {
            self.walked_at = Some(now);
        }
        let limits = self
            .limits_seen
            .is_some_and(|at| now.duration_since(at) < ROSTER_KEPT);
        let kept = self.kept.take().filter(|k| k.fresh(now) && !limits);
        Box::pin(
            async move {
                guarded(
                    "assigner",
                    Assigner::run_excluding(&bb, &config, &unreachable, walk, kept),
                )
                .await
            }
            .into_actor(self)
            .map(move |res, act, ctx| match res {
                Ok(Ok(mut report)) => {
                    act.stats.ran("assigner");
                    // A round cut at its batch: a backlog, whose next rounds follow
                    // within milliseconds and keep its roster.
                    let roster = report.roster.take();
                    act.kept = roster.filter(|_| report.more_may_fit());
                    if report.limits_in_play {
                        act.limits_seen = Some(now);
                    }
                    if !report.given.is_empty() {
                        let given = std::mem::take(&mut report.given);
                        trace_round(&act.config.actor, round, started, given);
                    }
                    if let Some(m) = &act.metrics {
                        m.round(now.elapsed(), report.assigned);
                    }
                    if let Some(waker) = &waker {
                        waker.deliver(report.pushes.clone());
                        waker.greet(&report.reachable);
                    }
                    if report.claimed == 0 {
                        act.ramp = RAMP_START.min(act.config.batch);
                    } else if report.assigned as i64 >= act.ramp {
                        act.ramp = act.config.batch;
                    }
                    Ok(report)
                }
                Ok(Err(e)) => {
                    act.stats.failed("assigner");
                    Err(e)
                }
                Err(panic) => {
                    ctx.stop();
                    Err(crate::Error::Invalid(format!("assigner panicked: {panic}")))
                }
            }),
        )
    }
}

/// The spans of a round's assignments (tracing on only: `given` is empty otherwise),
/// made on a blocking thread: a round of 2,000 tasks is 4,000 spans, which the
/// Assigner's next round does not wait for.
fn trace_round(planner: &str, round: u64, started: SystemTime, given: Vec<crate::trace::Assigned>) {
    let ended = SystemTime::now();
    let planner = planner.to_string();
    tokio::task::spawn_blocking(move || {
        let by = crate::trace::AssignedBy::Round {
            planner: &planner,
            round,
        };
        crate::trace::assignments(by, started, ended, &given);
    });
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::{plan, plan_round, MIN_RUN};
    use crate::blackboard::{Claimed, RosterEntry};

    #[test]
    fn plan_spreads_tasks_over_workers_that_run_their_kind() {
        let roster = vec![
            RosterEntry {
                id: "a".into(),
                kinds: vec!["echo".into()],
                capacity: 2,
                held: 0,
                host: "h".into(),
                slots: None,
            },
            RosterEntry {
                id: "b".into(),
                kinds: vec!["echo".into(), "sleep".into()],
                capacity: 3,
                held: 1,
                host: "h".into(),
                slots: None,
            },
        ];
        let claimed: Vec<Claimed> = ["echo", "sleep", "echo", "echo", "sleep", "fail"]
            .iter()
            .map(|k| Claimed {
                id: Uuid::new_v4(),
                kind: k.to_string(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect();
        let out = plan(&claimed, &roster);
        // 4 free slots in all (a: 2, b: 2); `fail` has no worker; sleep only on b.
        assert_eq!(out.len(), 4);
        let on = |w: &str| out.iter().filter(|a| a.worker == w).count();
        assert_eq!((on("a"), on("b")), (2, 2));
        for a in &out {
            let kind = &claimed.iter().find(|c| c.id == a.task).unwrap().kind;
            assert_ne!(kind, "fail");
            if kind == "sleep" {
                assert_eq!(a.worker, "b");
            }
        }
    }

    fn fleet(workers: usize, free: i32) -> Vec<RosterEntry> {
        (0..workers)
            .map(|i| RosterEntry {
                id: format!("w{i:03}"),
                kinds: vec!["echo".into()],
                capacity: free,
                held: 0,
                host: "h".into(),
                slots: None,
            })
            .collect()
    }

    fn echoes(n: usize) -> Vec<Claimed> {
        (0..n)
            .map(|_| Claimed {
                id: Uuid::new_v4(),
                kind: "echo".into(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect()
    }

    /// Tasks per worker, in the order the workers got them.
    fn runs(out: &[crate::blackboard::Assignment]) -> Vec<(String, usize)> {
        let mut runs: Vec<(String, usize)> = Vec::new();
        for a in out {
            match runs.last_mut() {
                Some((w, n)) if *w == a.worker => *n += 1,
                _ => runs.push((a.worker.clone(), 1)),
            }
        }
        runs
    }

    #[test]
    fn a_round_cut_at_its_batch_gives_runs_of_min_run_tasks() {
        // 64 tasks, the whole batch, while 100 workers have 3,200 slots free: more wait.
        let out = plan_round(&echoes(64), &fleet(100, 32), 64);
        let got = runs(&out);
        assert_eq!(out.len(), 64);
        assert_eq!(got.len(), 64 / MIN_RUN as usize, "{got:?}");
        assert!(got.iter().all(|(_, n)| *n as i64 == MIN_RUN), "{got:?}");
    }

    #[test]
    fn a_cut_round_leaves_a_worker_no_stub_of_free_slots() {
        // Runs of 8 would leave each worker of 10 free slots 2, for later rounds to
        // touch it again for two tasks: each takes its 10.
        let out = plan_round(&echoes(64), &fleet(100, 10), 64);
        let got: Vec<usize> = runs(&out).into_iter().map(|(_, n)| n).collect();
        assert_eq!(got, [10, 10, 10, 10, 10, 10, 4]);
    }

    #[test]
    fn a_round_not_cut_spreads_one_task_per_worker() {
        // Fewer tasks than the batch: every runnable task is in this round.
        let out = plan_round(&echoes(40), &fleet(100, 10), 2000);
        assert_eq!(runs(&out).len(), 40);
        // A batch that the free slots bound, not the backlog: not cut either.
        let out = plan_round(&echoes(40), &fleet(4, 10), 40);
        assert_eq!(
            runs(&out),
            [("w000", 10), ("w001", 10), ("w002", 10), ("w003", 10)]
                .map(|(w, n)| (w.to_string(), n))
        );
    }

    #[test]
    fn a_cut_round_gives_a_worker_no_more_than_its_free_slots() {
        let out = plan_round(&echoes(30), &fleet(100, 3), 30);
        let got = runs(&out);
        assert_eq!(out.len(), 30);
        assert_eq!(got.len(), 10, "{got:?}");
        assert!(got.iter().all(|(_, n)| *n == 3), "{got:?}");
    }

    #[test]
    fn plan_gives_each_worker_one_run_of_neighbouring_tasks() {
        let worker = |id: &str, free: i32| RosterEntry {
            id: id.into(),
            kinds: vec!["echo".into()],
            capacity: free,
            held: 0,
            host: "h".into(),
            slots: None,
        };
        let roster = vec![worker("a", 100), worker("b", 100), worker("c", 50)];
        let claimed: Vec<Claimed> = (0..10)
            .map(|_| Claimed {
                id: Uuid::new_v4(),
                kind: "echo".into(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect();
        let out: Vec<String> = plan(&claimed, &roster)
            .into_iter()
            .map(|a| a.worker)
            .collect();
        // Shares 4 / 4 / 2 of the 10 (proportional to free slots, rounded up), each as one
        // run in claim order: interleaved rows would have two workers write the same pages.
        assert_eq!(out, ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"]);
    }

    #[test]
    fn plan_gives_a_large_fleet_its_shares_and_never_more_than_free_slots() {
        let roster: Vec<RosterEntry> = (0..2000)
            .map(|i| RosterEntry {
                id: format!("w{i:04}"),
                kinds: vec![if i % 2 == 0 { "a" } else { "b" }.into()],
                capacity: 10,
                held: if i % 10 == 0 { 10 } else { 3 },
                host: format!("h{}", i % 7),
                slots: None,
            })
            .collect();
        let claimed: Vec<Claimed> = (0..6000u128)
            .map(|i| Claimed {
                id: Uuid::from_u128(i),
                kind: if i % 3 == 0 { "b" } else { "a" }.into(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect();
        let out = plan(&claimed, &roster);
        let mut per: std::collections::HashMap<&str, i32> = Default::default();
        for a in &out {
            *per.entry(a.worker.as_str()).or_default() += 1;
        }
        for w in &roster {
            let got = per.get(w.id.as_str()).copied().unwrap_or(0);
            assert!(got <= w.free(), "{} got {got}, free {}", w.id, w.free());
        }
        // Every task placed, on a worker of its kind: kind a has 1,000 workers, 200 of
        // them full, the others 7 free slots each (5,600 for 4,000 tasks); kind b 7,000
        // slots for 2,000.
        assert_eq!(out.len(), 6000);
        for a in &out {
            let kind = &claimed[a.task.as_u128() as usize].kind;
            let w: usize = a.worker[1..].parse().unwrap();
            assert_eq!(
                kind == "a",
                w.is_multiple_of(2),
                "{} went to {}",
                a.task,
                a.worker
            );
        }
    }

    /// A worker with a local queue keeps its last free place for a fair kind's key that
    /// holds no task (migrations/V48): the fair kind's other tasks leave it, the fresh
    /// key's task and other kinds' take it; a worker without a queue (its slots all its
    /// capacity) or that did not say its slots keeps nothing.
    #[test]
    fn plan_keeps_a_queue_place_for_a_fair_kinds_idle_key() {
        let worker = |id: &str, capacity: i32, slots: Option<i32>| RosterEntry {
            id: id.into(),
            kinds: vec!["fair".into(), "plain".into()],
            capacity,
            held: 0,
            host: "h".into(),
            slots,
        };
        let task = |kind: &str, fresh: Option<bool>| Claimed {
            id: Uuid::new_v4(),
            kind: kind.into(),
            host: None,
            limited: true,
            fresh,
        };
        let placed = |claimed: &[Claimed], roster: &[RosterEntry]| -> Vec<(usize, String)> {
            plan(claimed, roster)
                .into_iter()
                .map(|a| {
                    let i = claimed.iter().position(|t| t.id == a.task).unwrap();
                    (i, a.worker)
                })
                .collect()
        };
        let held_key = |n: usize| {
            (0..n)
                .map(|_| task("fair", Some(false)))
                .collect::<Vec<_>>()
        };

        // Queue: 4 places, 2 slots, so one kept. The held key takes three; the fresh
        // key's task, claimed after them, the fourth.
        let mut claimed = held_key(5);
        claimed.push(task("fair", Some(true)));
        let out = placed(&claimed, &[worker("q", 4, Some(2))]);
        let got: Vec<usize> = out.iter().map(|(i, _)| *i).collect();
        assert_eq!(got, [0, 1, 2, 5], "{out:?}");

        // Another kind's task takes the kept place: the place is kept from the fair
        // kind's backlog, not from the worker.
        let mut claimed = held_key(5);
        claimed.push(task("plain", None));
        let got: Vec<usize> = placed(&claimed, &[worker("q", 4, Some(2))])
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(got, [0, 1, 2, 5]);

        // No queue (slots = capacity), or slots not said: every place is the backlog's.
        for w in [worker("n", 4, Some(4)), worker("s", 4, None)] {
            assert_eq!(placed(&held_key(5), &[w]).len(), 4);
        }

        // Two workers: the held key fills both but their kept places (two and four of
        // its seven), skipping a worker with only its kept place left for one with more;
        // its seventh stays pending, and the fresh task takes a kept place.
        let mut claimed = held_key(7);
        claimed.push(task("fair", Some(true)));
        let roster = [worker("a", 3, Some(1)), worker("b", 5, Some(1))];
        let out = placed(&claimed, &roster);
        let held_on = |w: &str| out.iter().filter(|(i, x)| x == w && *i < 7).count();
        assert_eq!((held_on("a"), held_on("b")), (2, 4), "{out:?}");
        assert!(out.iter().any(|(i, _)| *i == 7), "{out:?}");
        assert_eq!(out.len(), 7, "{out:?}");
    }

    #[test]
    fn plan_gives_a_task_bound_to_a_host_only_to_workers_there() {
        let worker = |id: &str, host: &str| RosterEntry {
            id: id.into(),
            kinds: vec!["digest".into()],
            capacity: 10,
            held: 0,
            host: host.into(),
            slots: None,
        };
        let roster = vec![worker("a", "h1"), worker("b", "h2"), worker("c", "h2")];
        let task = |host: Option<&str>| Claimed {
            id: Uuid::new_v4(),
            kind: "digest".into(),
            host: host.map(String::from),
            limited: false,
            fresh: None,
        };
        let claimed = vec![
            task(Some("h2")),
            task(None),
            task(Some("h1")),
            task(Some("h3")),
            task(Some("h2")),
            task(Some("h1")),
        ];
        let out = plan(&claimed, &roster);
        let to = |t: &Claimed| {
            out.iter()
                .find(|a| a.task == t.id)
                .map(|a| a.worker.as_str())
        };
        for c in &claimed {
            let t = c;
            match c.host.as_deref() {
                Some("h1") => assert_eq!(to(t), Some("a")),
                Some("h2") => assert!(matches!(to(t), Some("b" | "c")), "{:?}", to(t)),
                // No worker on h3: it waits.
                Some(_) => assert_eq!(to(t), None),
                None => assert!(to(t).is_some()),
            }
        }
        assert_eq!(out.len(), 5);
    }
}

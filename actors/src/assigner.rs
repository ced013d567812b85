//! The Assigner: gives runnable tasks to online workers that run their kind and have
//! spare capacity. One `run_once` is one transaction: read the roster and lock a batch of
//! runnable tasks (`for update skip locked`) in one statement, match them, write the
//! assignments with a compare-and-set, and wake each chosen worker (a NOTIFY, or a push
//! over HTTP by the [`Waker`] after the commit). With leased planner
//! shards (`--shards auto`) the shards it claims are re-read from the
//! [`ShardView`] each round; owning none (or no longer sure of its leases) it claims
//! nothing. A round cut at its batch keeps its roster: the rounds right behind it, a
//! backlog's drain, claim by it without reading every worker again (see
//! [`KeptRoster`]). How a round's tasks are matched to workers is the pure rule in
//! `assigner/plan.rs` ([`plan`], [`plan_round`]).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use actix::prelude::*;

use crate::blackboard::{
    AssignReport, Claimed, KeptRoster, PlannerBoard, RosterEntry, Round, ROSTER_KEPT, WALK_EVERY,
};
use crate::error::Result;
use crate::metrics::planner::PlannerMetrics;
use crate::shard_keeper::ShardView;
use crate::supervisor::{guarded, ActorStats};
use crate::waker::Waker;

mod plan;
#[cfg(test)]
use plan::plan_with_runs;
pub use plan::{plan, plan_round, MIN_RUN};

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

//! The Assigner: gives runnable tasks to online workers that run their kind and have
//! spare capacity. One `run_once` is one transaction: read the roster, lock a batch of
//! runnable tasks (`for update skip locked`), match them, write the assignments with a
//! compare-and-set, and wake each chosen worker with one NOTIFY.

use std::collections::{BTreeSet, HashMap};

use actix::prelude::*;

use crate::blackboard::{AssignReport, Assignment, Blackboard, Claimed, RosterEntry};
use crate::error::Result;
use crate::supervisor::{guarded, ActorStats};

/// How the planner assigns.
#[derive(Debug, Clone)]
pub struct AssignerConfig {
    /// This planner's name in the audit trail.
    pub actor: String,
    /// At most this many tasks per transaction.
    pub batch: i64,
    /// Lease given with an assignment, seconds.
    pub lease_secs: f64,
    /// A worker not heard from for this long gets nothing.
    pub worker_timeout_secs: f64,
    /// `(count, mine)`: which planner shards this planner serves; `(1, [])` for all.
    pub shards: (i32, Vec<i32>),
}

/// Matches claimed tasks to workers: each task goes to the eligible worker with the most
/// free slots (ties by id), so load spreads evenly. Pure, so it is tested directly.
pub fn plan(claimed: &[Claimed], roster: &[RosterEntry]) -> Vec<Assignment> {
    let mut free: HashMap<&str, i32> = roster.iter().map(|w| (w.id.as_str(), w.free())).collect();
    let mut out = Vec::with_capacity(claimed.len());
    for task in claimed {
        let best = roster
            .iter()
            .filter(|w| w.kinds.iter().any(|k| k == &task.kind))
            .filter(|w| free[w.id.as_str()] > 0)
            .max_by(|a, b| {
                free[a.id.as_str()]
                    .cmp(&free[b.id.as_str()])
                    .then_with(|| b.id.cmp(&a.id))
            });
        if let Some(w) = best {
            if let Some(slots) = free.get_mut(w.id.as_str()) {
                *slots -= 1;
            }
            out.push(Assignment {
                task: task.id,
                worker: w.id.clone(),
            });
        }
    }
    out
}

/// The Assigner actor.
pub struct Assigner {
    bb: Blackboard,
    config: AssignerConfig,
    stats: ActorStats,
}

impl Assigner {
    /// A new Assigner (start it under a `Supervisor`).
    pub fn new(bb: Blackboard, config: AssignerConfig, stats: ActorStats) -> Self {
        Assigner { bb, config, stats }
    }

    /// One assignment round; see the module doc.
    pub async fn run_once(bb: &Blackboard, config: &AssignerConfig) -> Result<AssignReport> {
        crate::supervisor::failpoint("assigner");
        let roster = bb.roster(None, config.worker_timeout_secs).await?;
        let free: i64 = roster.iter().map(|w| i64::from(w.free())).sum();
        let kinds: Vec<String> = roster
            .iter()
            .filter(|w| w.free() > 0)
            .flat_map(|w| w.kinds.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let limit = free.min(config.batch);
        let mut report = bb
            .claim_and_assign(
                &config.actor,
                &kinds,
                limit,
                (config.shards.0, &config.shards.1),
                config.lease_secs,
                |claimed| plan(claimed, &roster),
            )
            .await?;
        report.free_capacity = free;
        Ok(report)
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
        let config = self.config.clone();
        Box::pin(
            async move { guarded("assigner", Assigner::run_once(&bb, &config)).await }
                .into_actor(self)
                .map(|res, act, ctx| match res {
                    Ok(Ok(report)) => {
                        act.stats.ran("assigner");
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

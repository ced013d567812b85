//! The Assigner: gives runnable tasks to online workers that run their kind and have
//! spare capacity. One `run_once` is one transaction: read the roster, lock a batch of
//! runnable tasks (`for update skip locked`), match them, write the assignments with a
//! compare-and-set, and wake each chosen worker with one NOTIFY. With leased planner
//! shards (`--shards auto`) the shards it claims are re-read from the
//! [`ShardView`] each round; owning none (or no longer sure of its leases) it claims
//! nothing.

use std::collections::{BTreeSet, HashMap};

use actix::prelude::*;

use crate::blackboard::{AssignReport, Assignment, Blackboard, Claimed, RosterEntry};
use crate::error::Result;
use crate::shard_keeper::ShardView;
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
/// slots (ties by id). Pure, so it is tested directly.
pub fn plan(claimed: &[Claimed], roster: &[RosterEntry]) -> Vec<Assignment> {
    let mut free: HashMap<&str, i32> = roster.iter().map(|w| (w.id.as_str(), w.free())).collect();
    let total: i64 = free.values().map(|&f| i64::from(f)).sum();
    let n = claimed.len() as i64;
    // This round's share of each worker (at least one task when it has a free slot).
    let mut share: HashMap<&str, i64> = free
        .iter()
        .map(|(&w, &f)| {
            let s = if total == 0 {
                0
            } else {
                (n * i64::from(f) + total - 1) / total
            };
            (w, s.min(i64::from(f)))
        })
        .collect();
    let mut out = Vec::with_capacity(claimed.len());
    let mut current: Option<&RosterEntry> = None;
    for task in claimed {
        let runs = |w: &RosterEntry| w.kinds.iter().any(|k| k == &task.kind);
        let keep =
            current.filter(|w| runs(w) && free[w.id.as_str()] > 0 && share[w.id.as_str()] > 0);
        let chosen = keep.or_else(|| {
            roster
                .iter()
                .filter(|w| runs(w) && free[w.id.as_str()] > 0)
                .max_by(|a, b| {
                    (share[a.id.as_str()] > 0, free[a.id.as_str()])
                        .cmp(&(share[b.id.as_str()] > 0, free[b.id.as_str()]))
                        .then_with(|| b.id.cmp(&a.id))
                })
        });
        let Some(w) = chosen else {
            continue;
        };
        current = Some(w);
        if let Some(slots) = free.get_mut(w.id.as_str()) {
            *slots -= 1;
        }
        if let Some(s) = share.get_mut(w.id.as_str()) {
            *s -= 1;
        }
        out.push(Assignment {
            task: task.id,
            worker: w.id.clone(),
        });
    }
    out
}

/// The Assigner actor.
pub struct Assigner {
    bb: Blackboard,
    config: AssignerConfig,
    stats: ActorStats,
    /// This round's batch: small after idle, growing ×4 per round that filled it, up to
    /// `config.batch`. A first round of 2,000 rows takes ~90 ms to write, during which
    /// the workers wait; a first round of 128 lets them start within a few.
    ramp: i64,
    /// Leased shards (`--shards auto`), kept by the ShardKeeper; `None`: `config.shards`.
    leased: Option<ShardView>,
}

/// The first round's batch after idle.
const RAMP_START: i64 = 128;

impl Assigner {
    /// A new Assigner (start it under a `Supervisor`).
    pub fn new(bb: Blackboard, config: AssignerConfig, stats: ActorStats) -> Self {
        let ramp = RAMP_START.min(config.batch);
        Assigner {
            bb,
            config,
            stats,
            ramp,
            leased: None,
        }
    }

    /// Serves the shards `view` holds at the start of each round, not `config.shards`.
    pub fn with_leased_shards(mut self, view: ShardView) -> Self {
        self.leased = Some(view);
        self
    }

    /// One assignment round; see the module doc.
    pub async fn run_once(bb: &Blackboard, config: &AssignerConfig) -> Result<AssignReport> {
        crate::supervisor::failpoint("assigner");
        let roster = bb.roster(None, config.suspect_after_secs).await?;
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
        report.limit = limit;
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
        Box::pin(
            async move { guarded("assigner", Assigner::run_once(&bb, &config)).await }
                .into_actor(self)
                .map(|res, act, ctx| match res {
                    Ok(Ok(report)) => {
                        act.stats.ran("assigner");
                        if report.claimed == 0 {
                            act.ramp = RAMP_START.min(act.config.batch);
                        } else if report.assigned as i64 >= act.ramp {
                            act.ramp = (act.ramp * 4).min(act.config.batch);
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

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::plan;
    use crate::blackboard::{Claimed, RosterEntry};

    #[test]
    fn plan_spreads_tasks_over_workers_that_run_their_kind() {
        let roster = vec![
            RosterEntry {
                id: "a".into(),
                kinds: vec!["echo".into()],
                capacity: 2,
                held: 0,
            },
            RosterEntry {
                id: "b".into(),
                kinds: vec!["echo".into(), "sleep".into()],
                capacity: 3,
                held: 1,
            },
        ];
        let claimed: Vec<Claimed> = ["echo", "sleep", "echo", "echo", "sleep", "fail"]
            .iter()
            .map(|k| Claimed {
                id: Uuid::new_v4(),
                kind: k.to_string(),
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

    #[test]
    fn plan_gives_each_worker_one_run_of_neighbouring_tasks() {
        let worker = |id: &str, free: i32| RosterEntry {
            id: id.into(),
            kinds: vec!["echo".into()],
            capacity: free,
            held: 0,
        };
        let roster = vec![worker("a", 100), worker("b", 100), worker("c", 50)];
        let claimed: Vec<Claimed> = (0..10)
            .map(|_| Claimed {
                id: Uuid::new_v4(),
                kind: "echo".into(),
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
}

//! The Reaper: every few seconds takes back tasks whose lease expired (counting a retry
//! for those that were running, ending them past their budget), marks workers silent past
//! the threshold `gone` and takes back their tasks, prunes long-gone worker rows, and
//! prunes task events past their retention (never those a live consumer still needs).

use std::time::Duration;

use actix::prelude::*;

use crate::blackboard::{Blackboard, ReapParams, ReapReport};
use crate::error::Result;
use crate::supervisor::{guarded, ActorStats};

/// Task events pruned per statement.
const PRUNE_BATCH: i64 = 5_000;

/// The Reaper actor.
pub struct Reaper {
    bb: Blackboard,
    interval: Duration,
    actor: String,
    params: ReapParams,
    stats: ActorStats,
}

impl Reaper {
    /// A reaper that sweeps every `interval` with `params`.
    pub fn new(
        bb: Blackboard,
        interval: Duration,
        actor: String,
        params: ReapParams,
        stats: ActorStats,
    ) -> Self {
        Reaper {
            bb,
            interval,
            actor,
            params,
            stats,
        }
    }

    /// One sweep; see the module doc.
    pub async fn run_once(bb: &Blackboard, actor: &str, params: &ReapParams) -> Result<ReapReport> {
        crate::supervisor::failpoint("reaper");
        let report = bb.reap(actor, params).await?;
        for w in &report.workers_gone {
            tracing::warn!(worker = %w, "worker silent past the threshold: marked gone, its tasks taken back");
        }
        if report.requeued + report.ended > 0 {
            tracing::info!(
                requeued = report.requeued,
                ended = report.ended,
                "reaper took back tasks with lost leases"
            );
        }
        // The outbox's retention (a setting kept in the blackboard, so every planner
        // agrees): a few bounded batches per sweep.
        let mut pruned = 0;
        for _ in 0..10 {
            let n = bb.prune_events(params.now, PRUNE_BATCH).await?;
            pruned += n;
            if n < PRUNE_BATCH as u64 {
                break;
            }
        }
        if pruned > 0 {
            tracing::info!(pruned, "pruned task events past their retention");
        }
        Ok(report)
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let bb = self.bb.clone();
        let actor = self.actor.clone();
        let params = self.params.clone();
        async move { guarded("reaper", Reaper::run_once(&bb, &actor, &params)).await }
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Ok(Ok(_)) => act.stats.ran("reaper"),
                Ok(Err(e)) => {
                    act.stats.failed("reaper");
                    tracing::warn!(error = %e, "reaper sweep failed; retrying next interval");
                }
                Err(_) => ctx.stop(),
            })
            .wait(ctx);
    }
}

impl Actor for Reaper {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.sweep(ctx);
        ctx.run_interval(self.interval, |act, ctx| act.sweep(ctx));
    }
}

impl Supervised for Reaper {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("reaper");
    }
}

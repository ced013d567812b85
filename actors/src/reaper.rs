//! The Reaper: every few seconds takes back tasks whose lease expired (counting a retry
//! for those that were running, ending them past their budget), marks workers silent past
//! the threshold `gone` and takes back their tasks, prunes long-gone worker rows, and
//! fails pending tasks whose uploaded file's host is gone for good ([`upload_guard`]).
//! (History and finished tasks past their retention: the Maintenance actor.)
//!
//! [`upload_guard`]: crate::upload_guard
//!
//! It judges liveness only with its eyes open: after it could not see the database (an
//! outage, its own host cut off, its process frozen) or when it starts, the workers' last
//! heartbeats and the leases are stale because nobody could write them, not because the
//! workers died. [`Sight`] says when it may judge again: a worker timeout after it sees
//! the database again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::blackboard::{PlannerBoard, ReapParams, ReapReport};
use crate::error::Result;
use crate::metrics::planner::PlannerMetrics;
use crate::supervisor::{guarded, ActorStats};

/// What the reaper has seen of the blackboard lately, and so whether it may judge the
/// workers' liveness now. Pure, so its rules are tested directly.
#[derive(Debug, Clone)]
pub struct Sight {
    /// How long it must see again before judging: the worker timeout, so that every
    /// live worker had the time to heartbeat and renew its leases.
    grace: Duration,
    /// Sweeps further apart than this mean it was not looking in between (a frozen
    /// process, a hung call).
    gap: Duration,
    last_seen: Option<Instant>,
    blind: bool,
    judge_from: Option<Instant>,
}

impl Sight {
    /// A reaper that has seen nothing yet.
    pub fn new(grace: Duration, gap: Duration) -> Sight {
        Sight {
            grace,
            gap,
            last_seen: None,
            blind: true,
            judge_from: None,
        }
    }

    /// Whether a sweep starting at `now` may mark workers gone and take back leases: not
    /// while blind (the sweep that gets through first must not judge what it could not
    /// see), not after a gap, and only once the grace since it saw again has passed.
    pub fn may_judge(&self, now: Instant) -> bool {
        let recent = self
            .last_seen
            .is_some_and(|t| now.saturating_duration_since(t) <= self.gap);
        !self.blind && recent && matches!(self.judge_from, Some(t) if now >= t)
    }

    /// A sweep reached the database at `now`. After blindness (a failed sweep, a gap, the
    /// start) the grace starts over.
    pub fn saw(&mut self, now: Instant) {
        let gap = self
            .last_seen
            .is_none_or(|t| now.saturating_duration_since(t) > self.gap);
        if self.blind || gap {
            self.judge_from = Some(now + self.grace);
        }
        self.last_seen = Some(now);
        self.blind = false;
    }

    /// A sweep could not reach the database.
    pub fn lost(&mut self) {
        self.blind = true;
    }
}

/// The Reaper actor.
pub struct Reaper {
    bb: PlannerBoard,
    interval: Duration,
    actor: String,
    params: ReapParams,
    stats: ActorStats,
    sight: Sight,
    /// Rescues, for `/metrics`.
    metrics: Option<Arc<PlannerMetrics>>,
}

impl Reaper {
    /// A reaper that sweeps every `interval` with `params`.
    pub fn new(
        bb: PlannerBoard,
        interval: Duration,
        actor: String,
        params: ReapParams,
        stats: ActorStats,
    ) -> Self {
        let grace = Duration::from_secs_f64(params.worker_timeout_secs.max(0.0));
        Reaper {
            bb,
            interval,
            actor,
            params,
            stats,
            sight: Sight::new(grace, interval * 3),
            metrics: None,
        }
    }

    /// Counts its rescues into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<PlannerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One sweep; see the module doc.
    pub async fn run_once(
        bb: &PlannerBoard,
        actor: &str,
        params: &ReapParams,
    ) -> Result<ReapReport> {
        crate::supervisor::failpoint("reaper");
        let report = bb.reap(actor, params).await?;
        crate::upload_guard::run_once(bb, actor, params).await?;
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
        Ok(report)
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let bb = self.bb.clone();
        let actor = self.actor.clone();
        let started = Instant::now();
        let params = ReapParams {
            judge_liveness: self.params.judge_liveness && self.sight.may_judge(started),
            ..self.params.clone()
        };
        if self.params.judge_liveness && !params.judge_liveness {
            tracing::debug!(
                "reaper: not judging liveness until it has seen the database long enough"
            );
        }
        async move { guarded("reaper", Reaper::run_once(&bb, &actor, &params)).await }
            .into_actor(self)
            .map(move |res, act, ctx| match res {
                Ok(Ok(report)) => {
                    act.stats.ran("reaper");
                    if let Some(m) = &act.metrics {
                        m.rescued.add(report.requeued as u64);
                        m.rescued_ended.add(report.ended as u64);
                    }
                    act.sight.saw(started);
                }
                Ok(Err(e)) => {
                    act.stats.failed("reaper");
                    if e.is_connection() {
                        act.sight.lost();
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);
    const GAP: Duration = Duration::from_secs(6);
    const EVERY: Duration = Duration::from_secs(2);

    /// Regular sweeps that reach the database, from `from` to `to`; returns `to`.
    fn sweeps(sight: &mut Sight, from: Instant, to: Instant) -> Instant {
        let mut t = from;
        while t < to {
            sight.saw(t);
            t += EVERY;
        }
        sight.saw(to);
        to
    }

    #[test]
    fn a_new_reaper_judges_only_a_grace_after_it_first_saw_the_database() {
        let t0 = Instant::now();
        let mut sight = Sight::new(GRACE, GAP);
        assert!(!sight.may_judge(t0));
        sight.saw(t0);
        assert!(!sight.may_judge(t0 + EVERY));
        let t = sweeps(&mut sight, t0, t0 + GRACE - Duration::from_secs(1));
        assert!(!sight.may_judge(t));
        assert!(sight.may_judge(t0 + GRACE));
    }

    #[test]
    fn after_failed_sweeps_the_grace_starts_over_when_it_sees_again() {
        let t0 = Instant::now();
        let mut sight = Sight::new(GRACE, GAP);
        let t1 = sweeps(&mut sight, t0, t0 + GRACE);
        assert!(sight.may_judge(t1));
        // An outage: the sweeps fail…
        sight.lost();
        assert!(!sight.may_judge(t1 + EVERY));
        sight.lost();
        // …and the first one that gets through does not judge, nor the next ones for a
        // grace: live workers need that long to heartbeat and renew.
        let back = t1 + Duration::from_secs(4);
        assert!(!sight.may_judge(back));
        sight.saw(back);
        assert!(!sight.may_judge(back));
        let t = sweeps(&mut sight, back, back + GRACE - Duration::from_millis(1));
        assert!(!sight.may_judge(t));
        assert!(sight.may_judge(back + GRACE));
    }

    #[test]
    fn a_gap_between_sweeps_counts_as_blindness() {
        let t0 = Instant::now();
        let mut sight = Sight::new(GRACE, GAP);
        let t1 = sweeps(&mut sight, t0, t0 + GRACE);
        assert!(sight.may_judge(t1));
        // The process was frozen (or a call hung) for longer than the gap: the sweep that
        // runs then does not judge…
        let resumed = t1 + GAP + Duration::from_secs(1);
        assert!(!sight.may_judge(resumed));
        sight.saw(resumed);
        assert!(!sight.may_judge(resumed));
        // Regular sweeps give the right to judge back, a grace later.
        let later = sweeps(&mut sight, resumed, resumed + GRACE);
        assert!(sight.may_judge(later));
    }
}

//! The Scheduler actor: fires cron schedules (`artex.schedules`, migrations/V18). Every
//! second it takes the due schedules one at a time, each in a transaction of its own that
//! locks the schedule's row (`for update skip locked`), submits a task per due slot
//! through `artex.submit` with the slot's unique key, and moves the schedule past them
//! (see `blackboard/planner/schedules.rs`). Every planner runs one: the row lock shares
//! the schedules out, and the unique key makes a slot fire once whatever the number of
//! planners, across their restarts and failovers. What a slot is, and the catch-up
//! rules, are `crate::schedule`'s.
//!
//! The same pass ends flows' due waits (migrations/V40): timers that reached their time
//! succeed, signal waits past their timeout time out (or succeed, as the wait says), in
//! one statement that locks them `for update skip locked`, so each ends once.
//!
//! Each pass ends by reading when the next slot or wait is due. When that is before the
//! next pass, a timer runs a pass then (1 ms after it): a slot or a timer is met within
//! milliseconds of its time, not up to a second after it. A flow's wait reached since
//! (a `for` timer of 200 ms after its upstream task) is announced by the database
//! (`wait-at:`, migrations/V61), and the planner's Scanner hands it here ([`WaitDue`]):
//! a pass is timed for it too.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use chrono::{DateTime, Utc};

use crate::blackboard::{PlannerBoard, ScheduleTurn, WaitEnded};
use crate::error::Result;
use crate::metrics::planner::PlannerMetrics;
use crate::scanner::DUE_MARGIN;
use crate::supervisor::{guarded, ActorStats};

/// At most this many schedules are dealt with in one pass; the rest in the next one, a
/// second later.
const SCHEDULES_PER_PASS: usize = 500;

/// At most this many due waits are ended in one pass; the rest in the next one.
const WAITS_PER_PASS: i32 = 1000;

/// What one pass did: each schedule's turn (the slots it fired, or why it failed), and
/// the flows' waits it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerReport {
    /// The schedules taken, in order.
    pub turns: Vec<ScheduleTurn>,
    /// The due waits ended.
    pub waits: Vec<WaitEnded>,
    /// Milliseconds from the pass's end to the soonest slot or wait due (negative when
    /// one is past due); `None` when nothing is scheduled or waiting.
    pub next_due_ms: Option<i64>,
}

impl SchedulerReport {
    /// Slots fired with a new task.
    pub fn fired(&self) -> usize {
        self.turns
            .iter()
            .flat_map(|t| &t.fired)
            .filter(|f| !f.duplicate)
            .count()
    }
}

/// The Scheduler actor.
pub struct Scheduler {
    bb: PlannerBoard,
    actor: String,
    interval: Duration,
    stats: ActorStats,
    /// Slots fired, for `/metrics`.
    metrics: Option<Arc<PlannerMetrics>>,
    /// The pass timed for the next slot or wait due, if one is before the next pass, and
    /// when it runs.
    due_pass: Option<(SpawnHandle, Instant)>,
}

impl Scheduler {
    /// A Scheduler that looks for due schedules every `interval`, firing them as `actor`
    /// (the planner's name, recorded in each task's history).
    pub fn new(bb: PlannerBoard, actor: String, interval: Duration, stats: ActorStats) -> Self {
        Scheduler {
            bb,
            actor,
            interval,
            stats,
            metrics: None,
            due_pass: None,
        }
    }

    /// Counts the slots it fires into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<PlannerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One pass: every due schedule no other planner holds, one transaction each; `now`
    /// moves the clock for tests (the database's by default). A schedule whose turn
    /// failed is logged and left due for the next pass.
    pub async fn run_once(
        bb: &PlannerBoard,
        actor: &str,
        now: Option<DateTime<Utc>>,
    ) -> Result<SchedulerReport> {
        crate::supervisor::failpoint("scheduler");
        let mut report = SchedulerReport::default();
        let mut passed: Vec<String> = Vec::new();
        while passed.len() < SCHEDULES_PER_PASS {
            let Some(turn) = bb.fire_due_schedule(now, &passed, actor).await? else {
                break;
            };
            log_turn(&turn);
            passed.push(turn.name.clone());
            report.turns.push(turn);
        }
        report.waits = bb.fire_due_waits(now, actor, WAITS_PER_PASS).await?;
        for w in &report.waits {
            tracing::info!(task_id = %w.task, flow_id = %w.flow, outcome = %w.outcome,
                "flow wait ended");
        }
        report.next_due_ms = bb.next_due_ms().await?;
        Ok(report)
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        let (bb, actor) = (self.bb.clone(), self.actor.clone());
        async move { guarded("scheduler", Scheduler::run_once(&bb, &actor, None)).await }
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Ok(Ok(report)) => {
                    act.stats.ran("scheduler");
                    if let Some(m) = &act.metrics {
                        m.schedule_slots.add(report.fired() as u64);
                    }
                    if let Some(after) = timed_pass_after(report.next_due_ms, act.interval) {
                        act.time_pass(after, ctx);
                    }
                }
                Ok(Err(e)) => {
                    act.stats.failed("scheduler");
                    tracing::warn!(error = %e, "scheduler: pass failed; retrying next interval");
                }
                Err(_) => ctx.stop(),
            })
            .wait(ctx);
    }

    /// Runs a pass `after` from now, unless one is timed already for that time or sooner.
    fn time_pass(&mut self, after: Duration, ctx: &mut Context<Self>) {
        let at = Instant::now() + after;
        if let Some((timed, when)) = self.due_pass {
            if when <= at {
                return;
            }
            ctx.cancel_future(timed);
        }
        let timed = ctx.run_later(after, |act, ctx| {
            act.due_pass = None;
            act.run(ctx);
        });
        self.due_pass = Some((timed, at));
    }
}

/// When to run a pass for what is due in `next_due_ms`: only when that is ahead and
/// before the next pass (`interval`). Something past due is left to the next pass: it is
/// held by another planner or its fire failed, and a pass at once would spin on it.
fn timed_pass_after(next_due_ms: Option<i64>, interval: Duration) -> Option<Duration> {
    let ms = u64::try_from(next_due_ms?).ok().filter(|ms| *ms > 0)?;
    let after = Duration::from_millis(ms) + DUE_MARGIN;
    (after < interval).then_some(after)
}

/// A flow's wait just reached falls due at this time (migrations/V61, handed on by the
/// planner's Scanner): a pass then, 1 ms after; at once if it is past.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct WaitDue(pub SystemTime);

impl Handler<WaitDue> for Scheduler {
    type Result = ();
    fn handle(&mut self, msg: WaitDue, ctx: &mut Context<Self>) {
        let ahead = msg.0.duration_since(SystemTime::now()).unwrap_or_default();
        if ahead < self.interval {
            self.time_pass(ahead + DUE_MARGIN, ctx);
        }
    }
}

fn log_turn(turn: &ScheduleTurn) {
    if let Some(e) = &turn.error {
        tracing::warn!(schedule = %turn.name, error = %e, "schedule: slots not fired");
        return;
    }
    for f in &turn.fired {
        if f.duplicate {
            tracing::info!(schedule = %turn.name, slot = %f.slot, task_id = %f.task,
                "schedule: slot already had its task");
        } else {
            tracing::info!(schedule = %turn.name, slot = %f.slot, task_id = %f.task,
                "schedule: slot fired");
        }
    }
    if turn.skipped {
        tracing::info!(schedule = %turn.name, next = ?turn.next_slot,
            "schedule: missed slots skipped (its catch-up rule)");
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.run(ctx);
        ctx.run_interval(self.interval, |act, ctx| act.run(ctx));
    }
}

impl Supervised for Scheduler {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.due_pass = None;
        self.stats.restarted("scheduler");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_timed_only_for_what_is_due_ahead_and_before_the_next_pass() {
        let second = Duration::from_secs(1);
        assert_eq!(
            timed_pass_after(Some(400), second),
            Some(Duration::from_millis(401))
        );
        assert_eq!(
            timed_pass_after(Some(1), second),
            Some(Duration::from_millis(2))
        );
        // At or after the next pass: that pass will see it coming.
        assert_eq!(timed_pass_after(Some(999), second), None);
        assert_eq!(timed_pass_after(Some(5_000), second), None);
        assert_eq!(
            timed_pass_after(Some(5_000), Duration::from_secs(600)),
            Some(Duration::from_millis(5_001))
        );
        // Past due, now, or nothing: no timed pass.
        for none in [Some(-30), Some(0), None] {
            assert_eq!(timed_pass_after(none, second), None, "{none:?}");
        }
    }
}

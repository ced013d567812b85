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

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use crate::blackboard::{PlannerBoard, ScheduleTurn, WaitEnded};
use crate::error::Result;
use crate::metrics::planner::PlannerMetrics;
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
                }
                Ok(Err(e)) => {
                    act.stats.failed("scheduler");
                    tracing::warn!(error = %e, "scheduler: pass failed; retrying next interval");
                }
                Err(_) => ctx.stop(),
            })
            .wait(ctx);
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
        self.stats.restarted("scheduler");
    }
}

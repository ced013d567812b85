//! What a planner counts for its `/metrics` (`artex planner --metrics ADDR`): its
//! assignment rounds' times, the tasks they gave out, the reaper's rescues, the wake-up
//! pushes that failed, the schedule slots fired. Shared by its actors (each bumps an
//! atomic) and its HTTP server.

use std::time::Duration;

use super::{Counter, Exposition, Histogram, Type, ROUND_BUCKETS};

/// A planner's counters.
#[derive(Debug)]
pub struct PlannerMetrics {
    round: Histogram,
    /// Tasks assigned by its rounds.
    pub assignments: Counter,
    /// Tasks its reaper took back from expired leases (pending again).
    pub rescued: Counter,
    /// Tasks its reaper ended for good (out of retries after their leases expired).
    pub rescued_ended: Counter,
    /// Schedule slots it fired with a new task.
    pub schedule_slots: Counter,
}

impl Default for PlannerMetrics {
    fn default() -> Self {
        PlannerMetrics {
            round: Histogram::new(ROUND_BUCKETS),
            assignments: Counter::default(),
            rescued: Counter::default(),
            rescued_ended: Counter::default(),
            schedule_slots: Counter::default(),
        }
    }
}

impl PlannerMetrics {
    /// An assignment round took `took` and gave out `assigned` tasks.
    pub fn round(&self, took: Duration, assigned: usize) {
        self.round.observe(took);
        self.assignments.add(assigned as u64);
    }

    /// Writes its families.
    pub fn write(&self, out: &mut Exposition) {
        let round = "artex_planner_round_seconds";
        out.family(
            round,
            Type::Histogram,
            "How long the planner's assignment rounds took (its _count: rounds run).",
        );
        out.histogram(round, &[], &self.round.snapshot());
        for (name, help, c) in [
            (
                "artex_planner_assignments_total",
                "Tasks assigned to workers by this planner.",
                &self.assignments,
            ),
            (
                "artex_planner_rescues_total",
                "Tasks this planner's reaper took back from expired leases, pending again.",
                &self.rescued,
            ),
            (
                "artex_planner_rescues_ended_total",
                "Tasks this planner's reaper ended for good after their leases expired (out of retries).",
                &self.rescued_ended,
            ),
            (
                "artex_planner_schedule_slots_total",
                "Schedule slots this planner fired with a new task.",
                &self.schedule_slots,
            ),
        ] {
            out.single(name, Type::Counter, help, c.get() as f64);
        }
    }
}

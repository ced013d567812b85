//! What a worker counts for its `/metrics`, shared with its HTTP server: per kind, how
//! long tasks waited before their first attempt and how long attempts ran, and their
//! outcomes; lease renewals and losses; hot upgrades' task transfers and drains; the
//! tasks it claimed itself (migrations/V46). Each event is an atomic add (a read lock to
//! find its kind's instruments).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use crate::metrics::{ByKind, Counter, Exposition, Histogram, Type, SECONDS_BUCKETS};

/// An attempt's outcome, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Succeeded.
    Succeeded,
    /// Failed (retried while its budget lasts).
    Failed,
    /// Ran past its timeout.
    Timeout,
    /// Failed for good at the handler's word.
    Discarded,
    /// Put off by the handler, no attempt counted.
    Snoozed,
}

impl AttemptOutcome {
    /// Every outcome, in the order of `/metrics`.
    pub const ALL: [AttemptOutcome; 5] = [
        AttemptOutcome::Succeeded,
        AttemptOutcome::Failed,
        AttemptOutcome::Timeout,
        AttemptOutcome::Discarded,
        AttemptOutcome::Snoozed,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Timeout => "timeout",
            AttemptOutcome::Discarded => "discarded",
            AttemptOutcome::Snoozed => "snoozed",
        }
    }
}

/// One kind's instruments.
#[derive(Debug)]
pub struct KindMetrics {
    wait: Histogram,
    run: Histogram,
    outcomes: [Counter; 5],
}

impl KindMetrics {
    fn new() -> Self {
        KindMetrics {
            wait: Histogram::new(SECONDS_BUCKETS),
            run: Histogram::new(SECONDS_BUCKETS),
            outcomes: Default::default(),
        }
    }
}

/// A worker's counters (one per process, shared by its actor and its HTTP server).
#[derive(Debug)]
pub struct WorkerMetrics {
    kinds: ByKind<KindMetrics>,
    /// Leases extended by a renewal.
    pub lease_renewals: Counter,
    /// Leases found lost at a renewal (taken back or transferred; not operators' cancels).
    pub leases_lost: Counter,
    /// Tasks handed to a successor in a hot upgrade's task transfer.
    pub transferred_out: Counter,
    /// Tasks taken over from a predecessor in a hot upgrade's task transfer.
    pub transferred_in: Counter,
    /// Drains begun (SIGTERM, or the old side of a hot upgrade).
    pub drains: Counter,
    /// Tasks it claimed itself in its reads (migrations/V46).
    pub claimed: Counter,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        WorkerMetrics {
            kinds: ByKind::new(KindMetrics::new),
            lease_renewals: Counter::default(),
            leases_lost: Counter::default(),
            transferred_out: Counter::default(),
            transferred_in: Counter::default(),
            drains: Counter::default(),
            claimed: Counter::default(),
        }
    }
}

/// When a task was made, from its id (a UUIDv7's first 48 bits are Unix milliseconds, by
/// the clock of the database that made it); `None` for another version of UUID.
pub fn made_at(id: Uuid) -> Option<SystemTime> {
    if id.get_version_num() != 7 {
        return None;
    }
    let b = id.as_bytes();
    let ms = b[..6]
        .iter()
        .fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

impl WorkerMetrics {
    /// A task's first attempt started now: its wait since it was made (nothing for a
    /// retry, whose wait since then holds its earlier attempts).
    pub fn first_start(&self, kind: &str, id: Uuid) {
        if let Some(made) = made_at(id) {
            let waited = SystemTime::now().duration_since(made).unwrap_or_default();
            self.kinds.of(kind).wait.observe(waited);
        }
    }

    /// An attempt of `kind` ran `ran` and ended with `outcome`.
    pub fn ended(&self, kind: &str, ran: Duration, outcome: AttemptOutcome) {
        let k = self.kinds.of(kind);
        k.run.observe(ran);
        let i = AttemptOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        k.outcomes[i].inc();
    }

    /// Writes its families.
    pub fn write(&self, out: &mut Exposition) {
        let kinds = self.kinds.all();
        let wait = "artex_worker_task_wait_seconds";
        out.family(
            wait,
            Type::Histogram,
            "From a task's submission to the start of its first attempt here (delayed tasks include their delay).",
        );
        for (kind, k) in &kinds {
            out.histogram(wait, &[("kind", kind)], &k.wait.snapshot());
        }
        let run = "artex_worker_task_run_seconds";
        out.family(run, Type::Histogram, "How long attempts ran here, by kind.");
        for (kind, k) in &kinds {
            out.histogram(run, &[("kind", kind)], &k.run.snapshot());
        }
        let tasks = "artex_worker_attempts_total";
        out.family(
            tasks,
            Type::Counter,
            "Attempts ended here, by kind and outcome.",
        );
        for (kind, k) in &kinds {
            for (o, c) in AttemptOutcome::ALL.iter().zip(&k.outcomes) {
                out.sample(
                    tasks,
                    &[("kind", kind), ("outcome", o.label())],
                    c.get() as f64,
                );
            }
        }
        for (name, help, c) in [
            (
                "artex_worker_lease_renewals_total",
                "Leases extended by a renewal.",
                &self.lease_renewals,
            ),
            (
                "artex_worker_leases_lost_total",
                "Leases found lost (taken back or transferred); their handlers were stopped.",
                &self.leases_lost,
            ),
            (
                "artex_worker_drains_total",
                "Drains begun (SIGTERM, or the old side of a hot upgrade).",
                &self.drains,
            ),
            (
                "artex_worker_tasks_claimed_total",
                "Tasks this worker claimed itself in its reads; the others reached it through a planner's round.",
                &self.claimed,
            ),
        ] {
            out.single(name, Type::Counter, help, c.get() as f64);
        }
        let moved = "artex_worker_tasks_transferred_total";
        out.family(
            moved,
            Type::Counter,
            "Running tasks moved by a hot upgrade's task transfer: out to a successor, in from a predecessor.",
        );
        out.sample(
            moved,
            &[("direction", "out")],
            self.transferred_out.get() as f64,
        );
        out.sample(
            moved,
            &[("direction", "in")],
            self.transferred_in.get() as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v7_id_says_when_it_was_made() {
        let id = Uuid::parse_str("018f4b2e-7c00-7000-8000-000000000000").unwrap();
        let ms = made_at(id)
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(ms, 0x018f4b2e7c00);
        assert_eq!(made_at(Uuid::nil()), None);
    }

    #[test]
    fn outcomes_and_runs_are_counted_per_kind() {
        let m = WorkerMetrics::default();
        m.ended("echo", Duration::from_millis(3), AttemptOutcome::Succeeded);
        m.ended("echo", Duration::from_millis(3), AttemptOutcome::Failed);
        let mut out = Exposition::new();
        m.write(&mut out);
        let text = out.finish();
        assert!(text.contains(r#"artex_worker_attempts_total{kind="echo",outcome="failed"} 1"#));
        assert!(text.contains(r#"artex_worker_task_run_seconds_count{kind="echo"} 2"#));
        crate::metrics::parse::parse(&text).unwrap();
    }
}

//! What a worker holds: the tasks whose handlers run ([`Running`]), the local queue of
//! tasks read and not started, the ledger that keeps a read from taking a task twice,
//! and when each held task's lease surely still runs (`fence::LeaseClock`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::AbortHandle;
use uuid::Uuid;

use super::fence::LeaseClock;
use super::handlers::Cancel;
use super::ledger::Ledger;
use super::turns::Turns;
use crate::blackboard::{AssignedTask, AttemptRecord, Step};

/// A task whose handler runs here.
pub(super) struct Running {
    pub kind: String,
    pub epoch: i64,
    pub retries: i32,
    pub max_retries: i32,
    pub started: Instant,
    /// Its start is in a batch written or being written.
    pub start_sent: bool,
    pub abort: AbortHandle,
    /// Tells the handler its task was canceled (`TaskContext::cancelled`).
    pub cancel: Cancel,
    /// When the worker learned the task was canceled: its handler is stopped if it has
    /// not ended `cancel_grace` later, and what it returns is not recorded.
    pub canceled: Option<Instant>,
    pub resumable: bool,
    pub suspend: Arc<AtomicBool>,
    /// Its payload's size, counted against the queue memory budget while it runs.
    pub payload_bytes: i64,
}

impl Running {
    /// What to write for this attempt: its start or its outcome, fenced by its epoch and
    /// carrying when its handler started here.
    pub fn record(&self, id: Uuid, step: Step) -> AttemptRecord {
        AttemptRecord {
            id,
            epoch: self.epoch,
            retries: self.retries,
            max_retries: self.max_retries,
            step,
            started_ago_ms: Some(self.started.elapsed().as_secs_f64() * 1000.0),
            measured: Some(std::time::Instant::now()),
        }
    }
}

/// The tasks a worker holds, running or queued, and what it knows of them.
#[derive(Default)]
pub(super) struct Held {
    pub running: HashMap<Uuid, Running>,
    /// Assigned to this worker (leased) and read, not yet handed to a handler: the local
    /// queue, at most `prefetch` beyond the free slots.
    pub queue: VecDeque<AssignedTask>,
    /// Which queued task of a fair kind starts next (see `turns`).
    pub turns: Turns,
    /// Every (task, epoch) this worker took, so that a read never takes one twice: a task
    /// it ran stays `assigned` in the blackboard until its outcome is written.
    pub ledger: Ledger,
    /// When the leases of what it holds end at the latest (see `fence`).
    pub leases: LeaseClock,
}

impl Held {
    /// Tasks it holds: running or queued.
    pub fn count(&self) -> usize {
        self.running.len() + self.queue.len()
    }

    /// Payload bytes of the tasks it holds, running or queued.
    pub fn bytes(&self) -> i64 {
        let running: i64 = self.running.values().map(|r| r.payload_bytes).sum();
        let queued: i64 = self.queue.iter().map(|t| t.payload_bytes).sum();
        running + queued
    }

    /// (task, epoch) of everything it holds, running first.
    pub fn keys(&self) -> Vec<(Uuid, i64)> {
        self.running
            .iter()
            .map(|(id, r)| (*id, r.epoch))
            .chain(self.queue.iter().map(|t| (t.id, t.epoch)))
            .collect()
    }

    /// Remembers when the lease of `task`, read by a request sent at `sent`, ends.
    pub fn hold_until(&mut self, task: &AssignedTask, sent: Instant) {
        let left = Duration::from_secs_f64(task.lease_left_ms.max(0.0) / 1000.0);
        self.leases.read((task.id, task.epoch), sent, left);
    }

    /// The running task `id` at attempt `epoch`, if it runs here.
    pub fn running_at(&mut self, id: &Uuid, epoch: i64) -> Option<&mut Running> {
        self.running.get_mut(id).filter(|r| r.epoch == epoch)
    }
}

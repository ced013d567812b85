//! What the worker shows of itself: the [`WorkerStatus`] snapshot that `/status` and
//! `/health` serve, answered to [`GetStatus`].

use actix::prelude::*;
use serde::Serialize;
use uuid::Uuid;

use super::Worker;
use crate::blackboard::WorkerState;

/// A task running in this worker, as `/status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RunningTask {
    /// Task id.
    pub id: Uuid,
    /// Kind.
    pub kind: String,
    /// Fencing token.
    pub epoch: i64,
    /// Milliseconds since it started here.
    pub running_ms: u64,
}

/// How a worker whose planners' pushes fail gets its wake-ups, as `/health`, `/status`,
/// the roster and the dashboard say it.
pub const WAKE_UPS_POLLING: &str = "unreachable, polling";

/// A snapshot of the worker for `/status` and `/health`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    /// Worker id.
    pub id: String,
    /// [`WorkerState::Online`] or [`WorkerState::Draining`].
    pub state: WorkerState,
    /// Whether the last database call succeeded.
    pub database_ok: bool,
    /// The last database error, if the last call failed.
    pub database_error: Option<String>,
    /// Tasks running now.
    pub running: Vec<RunningTask>,
    /// Tasks read from the blackboard and waiting here for a free slot.
    pub queued: usize,
    /// How many it may queue now: `--prefetch`, or the depth sized from its pace.
    pub prefetch: usize,
    /// Whether that depth follows the completion rate (no `--prefetch`).
    pub prefetch_auto: bool,
    /// Tasks finished per second, a moving average (what an automatic depth follows).
    pub finished_per_s: f64,
    /// Milliseconds from slots given back to their refill, a moving average (an
    /// automatic depth covers two refills when that is longer than its 100 ms).
    pub refill_ms: f64,
    /// Payload bytes of the tasks it holds, running and queued (its memory budget is
    /// `queue_max_bytes`).
    pub payload_bytes: i64,
    /// Outcomes waiting to be written.
    pub unwritten_outcomes: usize,
    /// Tasks finished by this process.
    pub finished: u64,
    /// Outcomes discarded because the lease had been lost.
    pub fenced_off: u64,
    /// Tasks it stopped itself, unable to renew their lease before it ran out.
    pub self_fenced: u64,
    /// How wake-ups reach it: `pushed` (planners push to its `wake_addr`),
    /// `unreachable, polling` (their pushes fail; it polls for its tasks), or `notify`
    /// (it LISTENs: no push address).
    pub wake_ups: &'static str,
    /// Where planners push its wake-ups.
    pub wake_addr: Option<String>,
}

/// Ask for a status snapshot.
#[derive(Message)]
#[rtype(result = "WorkerStatus")]
pub struct GetStatus;

impl Handler<GetStatus> for Worker {
    type Result = MessageResult<GetStatus>;
    fn handle(&mut self, _msg: GetStatus, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status())
    }
}

impl Worker {
    /// A snapshot for `/status`.
    pub(super) fn status(&self) -> WorkerStatus {
        let mut running: Vec<RunningTask> = self
            .held
            .running
            .iter()
            .map(|(id, r)| RunningTask {
                id: *id,
                kind: r.kind.clone(),
                epoch: r.epoch,
                running_ms: r.started.elapsed().as_millis() as u64,
            })
            .collect();
        running.sort_by_key(|r| std::cmp::Reverse(r.running_ms));
        WorkerStatus {
            id: self.config.id.clone(),
            state: if self.stopping.draining {
                WorkerState::Draining
            } else {
                WorkerState::Online
            },
            database_ok: self.liveness.db_error.is_none(),
            database_error: self.liveness.db_error.clone(),
            running,
            queued: self.held.queue.len(),
            prefetch: self.depth.current(),
            prefetch_auto: self.depth.is_auto(),
            finished_per_s: self.depth.rate(),
            refill_ms: self.depth.refill().as_secs_f64() * 1000.0,
            payload_bytes: self.held.bytes(),
            unwritten_outcomes: self.outcomes.outbox.len(),
            finished: self.outcomes.finished,
            fenced_off: self.outcomes.fenced_off,
            self_fenced: self.liveness.self_fenced,
            wake_ups: match (&self.config.wake_addr, self.intake.wake_unreachable) {
                (None, _) => "notify",
                (Some(_), true) => WAKE_UPS_POLLING,
                (Some(_), false) => "pushed",
            },
            wake_addr: self.config.wake_addr.clone(),
        }
    }
}

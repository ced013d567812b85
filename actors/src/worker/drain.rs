//! Graceful stop: [`Drain`] stops the worker taking work, gives back what it has not
//! started, lets running tasks finish within a deadline, writes every outcome and marks
//! the worker gone, then answers with a [`DrainReport`].

use std::time::Duration;

use actix::prelude::*;
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::Worker;
use crate::blackboard::{AttemptRecord, Outcome, Step, WorkerBoard, WorkerState};
use crate::error::retry_unreachable;

/// A drain or a task transfer under way, and who waits for its end.
#[derive(Debug, Default)]
pub(super) struct Stopping {
    /// It takes no new work (a drain, or a task transfer).
    pub draining: bool,
    /// Drains waiting for nothing to run and every outcome to be written.
    pub drain_waiters: Vec<oneshot::Sender<()>>,
    /// Tasks stopped at a checkpoint for a task transfer: (task id, epoch held). Kept,
    /// and renewed with what this process holds, until the new process takes them (the
    /// renewal finds them gone, or `TransferDone`), or given back (a drain, a rollback).
    pub suspended: Vec<(Uuid, i64)>,
    /// Task transfers waiting for resumable tasks to reach a checkpoint.
    pub suspend_waiters: Vec<oneshot::Sender<()>>,
}

/// Stop taking work, give back what was assigned but not started, let running tasks
/// finish within `deadline`, give back what is still running then, write every outcome,
/// and mark the worker gone. Answers when all of that is done.
#[derive(Message)]
#[rtype(result = "DrainReport")]
pub struct Drain {
    /// How long running tasks may take to finish.
    pub deadline: Duration,
}

/// What a drain did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainReport {
    /// Tasks that finished during the drain.
    pub finished_during_drain: u64,
    /// Tasks given back unstarted.
    pub released_unstarted: usize,
    /// Tasks still running at the deadline, stopped and given back.
    pub released_running: usize,
}

impl Handler<Drain> for Worker {
    type Result = ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        self.stopping.draining = true;
        self.metrics.drains.inc();
        self.release_suspended();
        self.pump(ctx);
        self.flush(ctx);
        let finished_before = self.outcomes.finished;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let lease = self.config.lease;
        // The queue is empty now: what is left ran here, its outcome not written yet.
        let running = self.held.ledger.outcome_unwritten();
        Box::pin(
            async move { release_unstarted(&bb, &id, &running, lease).await }
                .into_actor(self)
                .then(move |released, act, _ctx| {
                    let (tx, rx) = oneshot::channel();
                    act.stopping.drain_waiters.push(tx);
                    act.check_drained();
                    async move {
                        let in_time = tokio::time::timeout(msg.deadline, rx).await.is_ok();
                        (released, in_time)
                    }
                    .into_actor(act)
                })
                .then(move |(released, in_time), act, _ctx| {
                    act.end_drain(released, in_time)
                        .map(move |mut report, act, _| {
                            report.finished_during_drain = act.outcomes.finished - finished_before;
                            report
                        })
                }),
        )
    }
}

impl Worker {
    /// Tasks stopped for a task transfer that did not take them: back to the planner (a
    /// release counts no attempt, so the retry figures play no part). One the new
    /// process took is fenced off by its epoch: its release writes nothing.
    pub(super) fn release_suspended(&mut self) {
        for (id, epoch) in std::mem::take(&mut self.stopping.suspended) {
            self.outcomes.outbox.push(AttemptRecord {
                id,
                epoch,
                retries: 0,
                max_retries: 0,
                step: Step::Finish(Outcome::Released),
                started_ago_ms: None,
                measured: None,
            });
        }
    }

    /// The drain's end: what still runs past the deadline (`in_time` false) is stopped
    /// and given back, every outcome is written, and the worker is marked gone.
    fn end_drain(
        &mut self,
        released: usize,
        in_time: bool,
    ) -> impl ActorFuture<Self, Output = DrainReport> {
        let mut late = Vec::new();
        if !in_time {
            for (id, r) in self.held.running.drain() {
                r.abort.abort();
                late.push(r.record(id, Step::Finish(Outcome::Released)));
            }
        }
        let report = DrainReport {
            released_unstarted: released,
            released_running: late.len(),
            ..Default::default()
        };
        let mut outcomes = std::mem::take(&mut self.outcomes.outbox);
        outcomes.extend(late);
        let (bb, id) = (self.bb.clone(), self.config.id.clone());
        async move {
            write_last(&bb, &id, &outcomes).await;
            report
        }
        .into_actor(self)
    }
}

/// Marks the worker draining, then gives back what is assigned to it but not `running`
/// here; how many. Draining first: a task given back while the roster still shows this
/// worker online could be assigned to it again. Running ones finish here, and finished
/// ones whose outcome is on its way stay for it. Each waits up to `patience` for a
/// database that is away (a failover): what it cannot give back is the reaper's, a
/// lease later.
async fn release_unstarted(
    bb: &WorkerBoard,
    id: &str,
    running: &[Uuid],
    patience: Duration,
) -> usize {
    let marked = retry_unreachable(Some(patience), "marking the worker draining", || {
        bb.set_worker_state(id, WorkerState::Draining)
    })
    .await;
    if let Err(e) = marked {
        tracing::warn!(error = %e, "cannot mark the worker draining");
    }
    retry_unreachable(Some(patience), "giving back unstarted tasks", || {
        bb.release_assigned(id, "released by a draining worker", running)
    })
    .await
    .map(|v| v.len())
    .unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot give back unstarted tasks; the reaper will");
        0
    })
}

/// The last writes of this process: its outcomes, retried for a while if the database is
/// restarting (then what is left is the reaper's), what is still assigned to it and not
/// started given back, and its state, gone.
async fn write_last(bb: &WorkerBoard, id: &str, outcomes: &[AttemptRecord]) {
    let mut written = false;
    for attempt in 0..50 {
        match bb.record(id, outcomes).await {
            Ok(_) => {
                written = true;
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, attempt, "cannot record final outcomes");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // Every outcome is written: a task still assigned here and not started is one born
    // assigned to it (migrations/V62) by an insert that held its offer while the drain
    // began. Given back now, it waits for no lease. Not when an outcome is unwritten: a
    // task that ran here is `assigned` until its start is written with its end.
    if written {
        match bb
            .release_assigned(id, "released by a draining worker", &[])
            .await
        {
            Ok(late) if !late.is_empty() => {
                tracing::info!(
                    tasks = late.len(),
                    "gave back tasks given to it while it drained"
                )
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot give back tasks given to it while it drained; the reaper will")
            }
        }
    }
    if let Err(e) = bb.set_worker_state(id, WorkerState::Gone).await {
        tracing::warn!(error = %e, "cannot deregister; the reaper will mark it gone");
    }
}

impl Worker {
    /// Answers a waiting drain once it is done.
    pub(super) fn check_drained(&mut self) {
        // Drained: nothing runs, every outcome is written, and no read is in flight (what
        // it brings is dropped, but only once it has come back).
        if self.stopping.draining
            && self.held.running.is_empty()
            && self.held.queue.is_empty()
            && self.outcomes.outbox.is_empty()
            && !self.outcomes.flight.busy()
            && !self.intake.flight.busy()
        {
            for w in self.stopping.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

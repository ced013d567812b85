//! Graceful stop: [`Drain`] stops the worker taking work, gives back what it has not
//! started, lets running tasks finish within a deadline, writes every outcome and marks
//! the worker gone, then answers with a [`DrainReport`].

use std::time::Duration;

use actix::prelude::*;
use serde::Serialize;
use tokio::sync::oneshot;

use super::Worker;
use crate::blackboard::{AttemptRecord, Outcome, Step, WorkerState};

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
        self.draining = true;
        // Tasks stopped for a task transfer that did not take them: back to the planner (a
        // release counts no attempt, so the retry figures play no part).
        for (id, epoch) in std::mem::take(&mut self.suspended) {
            self.outbox.push(AttemptRecord {
                id,
                epoch,
                retries: 0,
                max_retries: 0,
                step: Step::Finish(Outcome::Released),
                started_ago_ms: None,
            });
        }
        self.pump(ctx);
        self.flush(ctx);
        let finished_before = self.finished;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        // The queue is empty now: what is left ran here, its outcome not written yet.
        let running = self.ledger.outcome_unwritten();
        Box::pin(
            async move {
                // Draining first: a task given back while the roster still shows this
                // worker online could be assigned to it again.
                if let Err(e) = bb.set_worker_state(&id, WorkerState::Draining).await {
                    tracing::warn!(error = %e, "cannot mark the worker draining");
                }
                // Queued and unread tasks go back; running ones finish here, and finished
                // ones whose outcome is on its way stay for it.
                bb.release_assigned(&id, "released by a draining worker", &running)
                    .await
                    .map(|v| v.len())
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "cannot give back unstarted tasks; the reaper will");
                        0
                    })
            }
            .into_actor(self)
            .then(move |released, act, _ctx| {
                let (tx, rx) = oneshot::channel();
                act.drain_waiters.push(tx);
                act.check_drained();
                async move {
                    let finished_in_time = tokio::time::timeout(msg.deadline, rx).await.is_ok();
                    (released, finished_in_time)
                }
                .into_actor(act)
            })
            .then(move |(released, finished_in_time), act, _ctx| {
                let mut report = DrainReport {
                    released_unstarted: released,
                    ..Default::default()
                };
                let mut late = Vec::new();
                if !finished_in_time {
                    for (id, r) in act.running.drain() {
                        r.abort.abort();
                        late.push(r.record(id, Step::Finish(Outcome::Released)));
                    }
                }
                report.released_running = late.len();
                let mut outcomes = std::mem::take(&mut act.outbox);
                outcomes.extend(late);
                let bb = act.bb.clone();
                let id = act.config.id.clone();
                async move {
                    // The last writes of this process: retry for a while if the database
                    // is restarting, then leave what is left to the reaper.
                    for attempt in 0..50 {
                        match bb.record(&id, &outcomes).await {
                            Ok(_) => break,
                            Err(e) => {
                                tracing::warn!(error = %e, attempt, "cannot record final outcomes");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                    if let Err(e) = bb.set_worker_state(&id, WorkerState::Gone).await {
                        tracing::warn!(error = %e, "cannot deregister; the reaper will mark it gone");
                    }
                    report
                }
                .into_actor(act)
                .map(move |mut report, act, _| {
                    report.finished_during_drain = act.finished - finished_before;
                    report
                })
            }),
        )
    }
}

impl Worker {
    /// Answers a waiting drain once it is done.
    pub(super) fn check_drained(&mut self) {
        // Drained: nothing runs, every outcome is written, and no read is in flight (what
        // it brings is dropped, but only once it has come back).
        if self.draining
            && self.running.is_empty()
            && self.queue.is_empty()
            && self.outbox.is_empty()
            && !self.flushing
            && !self.fetching
        {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

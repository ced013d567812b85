//! Starts and outcomes on their way to the blackboard, in batches — a group commit: what
//! arrives while one batch is being written forms the next. A start is recorded after
//! the handler began, or with the outcome when the task finished first; every record
//! names the lease epoch, so a worker that lost a task changes nothing.
//!
//! While the local queue holds a task for every slot, a batch waits up to [`LINGER`]
//! for more: each write is a statement and a commit whatever its size, and short tasks
//! arriving one by one made batches of a few dozen (programs: ~25, the
//! write's fixed cost two thirds of PostgreSQL's per task). No slot waits meanwhile (the
//! queue feeds them); a worker whose queue runs low, or that drains, writes at once.
//! Starts with no outcome waiting wait [`START_LINGER`] for their handlers' outcomes, so
//! a short task run alone is one write, not two.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::Worker;
use crate::blackboard::{AttemptRecord, Recorded, Step, WorkerBoard};
use crate::flight::SingleFlight;

/// How soon a batch that could not be written is tried again.
const FLUSH_RETRY: Duration = Duration::from_millis(100);
/// How long a batch may wait for more while the local queue feeds every slot.
pub const LINGER: Duration = Duration::from_millis(20);
/// A batch this large is written without waiting.
const LINGER_UNTIL: usize = 500;
/// How long the starts of handlers just begun wait for their outcomes when nothing else
/// is waiting to be written (see [`Worker::flush_starts`]).
pub const START_LINGER: Duration = Duration::from_millis(2);

/// The outcomes waiting to be written, the batch in flight, and what came of the
/// batches written.
#[derive(Debug, Default)]
pub(super) struct Outcomes {
    /// Outcomes waiting for the next batch.
    pub outbox: Vec<AttemptRecord>,
    /// A batch is being written.
    pub flight: SingleFlight,
    /// A batch waits for more (a timer of [`LINGER`] or [`START_LINGER`] is set).
    pub lingering: bool,
    /// Tasks finished by this process (outcomes written).
    pub finished: u64,
    /// Records refused because the lease had been lost.
    pub fenced_off: u64,
}

/// What writing a batch came to: the ids written, and the refused starts whose task an
/// operator canceled meanwhile.
type Written = (crate::Result<Recorded>, HashSet<Uuid>);

impl Worker {
    /// Writes the waiting outcomes and the starts not written yet, in one statement.
    pub(super) fn flush(&mut self, ctx: &mut Context<Self>) {
        self.flush_now(ctx, false);
    }

    /// Handlers just began: their starts are written [`START_LINGER`] later, with the
    /// outcomes of those that ended by then, when no outcome waits to be written (with
    /// one waiting, [`Worker::flush`]'s rule holds). A short task's start then rides
    /// with its end, one write and one history row, where writing the starts at once made
    /// two writes a task whenever the handlers had run dry: a burst after idle, its
    /// first refills each a write of starts, then one of outcomes, on the way to the
    /// next; one task at a time, two writes each. A long task's start is in the
    /// blackboard two milliseconds later.
    pub(super) fn flush_starts(&mut self, ctx: &mut Context<Self>) {
        if !self.outcomes.outbox.is_empty() || self.stopping.draining {
            self.flush(ctx);
        } else if !self.outcomes.flight.busy() && !self.outcomes.lingering {
            self.linger(ctx, START_LINGER);
        }
    }

    /// The next batch waits `wait` for more, then is written.
    fn linger(&mut self, ctx: &mut Context<Self>, wait: Duration) {
        self.outcomes.lingering = true;
        ctx.run_later(wait, |act, ctx| {
            act.outcomes.lingering = false;
            act.flush_now(ctx, true);
        });
    }

    /// [`Worker::flush`]; `lingered`: the batch has waited its [`LINGER`] already.
    fn flush_now(&mut self, ctx: &mut Context<Self>, lingered: bool) {
        // A batch in flight calls again when it is written; a lingering one, when its
        // timer ends.
        if self.outcomes.flight.busy() || self.outcomes.lingering {
            return;
        }
        let fed = self.held.queue.len() >= self.config.concurrency.max(1);
        if !lingered
            && fed
            && !self.stopping.draining
            && !self.outcomes.outbox.is_empty()
            && self.outcomes.outbox.len() < LINGER_UNTIL
        {
            self.linger(ctx, LINGER);
            return;
        }
        let mut batch = std::mem::take(&mut self.outcomes.outbox);
        for (id, r) in self.held.running.iter_mut().filter(|(_, r)| !r.start_sent) {
            r.start_sent = true;
            batch.push(r.record(*id, Step::Start));
        }
        if batch.is_empty() {
            return;
        }
        // A finished task's last progress, written just before its outcome (which the
        // fence of the progress write would refuse once written).
        let last_progress: Vec<_> = batch
            .iter()
            .filter(|c| !c.step.is_start())
            .filter_map(|c| self.progress.slots.take(c.id, c.epoch))
            .collect();
        self.outcomes.flight.start();
        let (bb, id, sent) = (self.bb.clone(), self.config.id.clone(), Instant::now());
        // With a backlog it claims the places it gives back itself (below): the planners
        // hear of the write only for what a claim cannot take (migrations/V74).
        let refills_itself = self.intake.backlog;
        async move {
            if let Err(e) = bb.save_progress(&id, &last_progress, true).await {
                tracing::debug!(error = %e, "cannot write the last progress of finished tasks");
            }
            let written = write(&bb, &id, &batch, refills_itself).await;
            (written, batch)
        }
        .into_actor(self)
        .map(move |((res, canceled), batch), act, ctx| {
            act.outcomes.flight.end();
            act.liveness.db_result(&res);
            match res {
                Ok(recorded) => {
                    if act.written(&batch, &recorded.ids, &canceled, sent) {
                        // A handler stopped, its slot free, and no handler left to
                        // report it: start what waits in the queue.
                        act.pump(ctx);
                    }
                }
                Err(e) => {
                    act.unwritten(batch, &e);
                    ctx.run_later(FLUSH_RETRY, |act, ctx| act.flush(ctx));
                    return;
                }
            }
            // Slots given back while tasks wait: it claims them itself, once enough are
            // free for the claim's read (`CLAIM_FREE_SHARE`).
            if act.intake.backlog
                && batch.iter().any(|c| !c.step.is_start())
                && act.claim_worth_it()
            {
                act.fetch(ctx);
            }
            act.flush(ctx);
            act.check_suspended();
            act.check_drained();
        })
        .spawn(ctx);
    }

    /// A batch (sent at `sent`) was written: `written` are the records the blackboard
    /// took; the others were fenced off (the lease was lost), or, for starts in
    /// `canceled`, refused because an operator canceled the task. Whether it stopped a
    /// running handler (a start fenced off).
    fn written(
        &mut self,
        batch: &[AttemptRecord],
        written: &[Uuid],
        canceled: &HashSet<Uuid>,
        sent: Instant,
    ) -> bool {
        let mut stopped = false;
        if self.intake.gave_back.is_none() && batch.iter().any(|c| !c.step.is_start()) {
            self.intake.gave_back = Some(sent);
        }
        let written: HashSet<Uuid> = written.iter().copied().collect();
        for c in batch {
            // A written start leaves the task held; anything else (an outcome, or a
            // record fenced off) lets it go.
            if !c.step.is_start() || !written.contains(&c.id) {
                self.held.ledger.let_go((c.id, c.epoch));
            }
        }
        for c in batch.iter().filter(|c| !written.contains(&c.id)) {
            self.outcomes.fenced_off += 1;
            if c.step.is_start() && canceled.contains(&c.id) {
                self.tell_canceled(c.id, c.epoch);
            } else if c.step.is_start() {
                // Taken back or transferred before its start was written: stop the
                // handler; whatever it would write is fenced off.
                if let Some(r) = self.held.running_at(&c.id, c.epoch) {
                    tracing::warn!(task = %c.id, epoch = c.epoch, "lease lost before the start was written; stopping the handler");
                    r.abort.abort();
                    self.held.running.remove(&c.id);
                    stopped = true;
                }
            } else {
                tracing::warn!(task = %c.id, epoch = c.epoch,
                    "outcome discarded: the lease was lost before it was written");
            }
        }
        self.outcomes.finished += batch
            .iter()
            .filter(|c| !c.step.is_start() && written.contains(&c.id))
            .count() as u64;
        self.stats.ran("worker");
        stopped
    }

    /// A batch could not be written. Nothing is dropped while the process lives:
    /// outcomes go back to the outbox, starts are sent again with the next batch (the
    /// database may be restarting).
    fn unwritten(&mut self, batch: Vec<AttemptRecord>, e: &crate::Error) {
        self.stats.failed("worker");
        tracing::warn!(error = %e, count = batch.len(), "cannot record starts and outcomes; retrying");
        for c in batch.iter().filter(|c| c.step.is_start()) {
            if let Some(r) = self.held.running_at(&c.id, c.epoch) {
                r.start_sent = false;
            }
        }
        let mut again: Vec<AttemptRecord> =
            batch.into_iter().filter(|c| !c.step.is_start()).collect();
        again.append(&mut self.outcomes.outbox);
        self.outcomes.outbox = again;
    }
}

/// Writes `batch` (see [`WorkerBoard::record_batch`] for `refills_itself`); with it,
/// which of its refused starts belong to tasks an operator canceled meanwhile (their
/// handlers are told, as at a renewal, not stopped at once).
async fn write(
    bb: &WorkerBoard,
    worker: &str,
    batch: &[AttemptRecord],
    refills_itself: bool,
) -> Written {
    let res = bb.record_batch(worker, batch, refills_itself).await;
    let mut canceled = HashSet::new();
    if let Ok(written) = &res {
        let refused: Vec<Uuid> = batch
            .iter()
            .filter(|c| c.step.is_start() && !written.ids.contains(&c.id))
            .map(|c| c.id)
            .collect();
        if !refused.is_empty() {
            if let Ok(ids) = bb.canceled_among(&refused).await {
                canceled.extend(ids);
            }
        }
    }
    (res, canceled)
}

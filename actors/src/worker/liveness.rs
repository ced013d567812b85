//! Staying alive in the blackboard: lease renewals (every third of the lease, sooner
//! after a failure or a row found locked; see `fence` for what happens when they keep
//! failing) and heartbeats (`last_seen`, and the capacity the self-sized queue asks for;
//! a worker declared gone registers again, once).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use actix::prelude::*;
use uuid::Uuid;

use super::{fence, Worker};
use crate::blackboard::WorkerState;

impl Worker {
    /// Tells the handler of task `id` (attempt `epoch`), if it runs here, that an
    /// operator canceled it; `fence` stops it if it runs on past the grace. False if it
    /// does not run here.
    pub(super) fn tell_canceled(&mut self, id: Uuid, epoch: i64) -> bool {
        let (grace, lease) = (self.config.cancel_grace, self.config.lease);
        let Some(r) = self.running.get_mut(&id).filter(|r| r.epoch == epoch) else {
            return false;
        };
        if r.canceled.is_none() {
            tracing::info!(task = %id, epoch, kind = %r.kind, ?grace,
                "task canceled: its handler is told, and stopped if it runs on past the grace");
            r.canceled = Some(Instant::now());
            r.cancel.raise();
            self.leases
                .read((id, epoch), Instant::now(), grace + fence::margin(lease));
        }
        true
    }

    pub(super) fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.held() == 0 {
            return;
        }
        // Not beside a write of progress either: each skips the rows the other locks
        // (see `progress`), so the renewal follows it at once instead.
        if self.renewing || self.progress_writing {
            self.renew_again = true;
            return;
        }
        self.renewing = true;
        let held: Vec<(Uuid, i64)> = self
            .running
            .iter()
            .map(|(id, r)| (*id, r.epoch))
            .chain(self.queue.iter().map(|t| (t.id, t.epoch)))
            .collect();
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let lease = self.config.lease;
        let running: HashSet<Uuid> = self.running.keys().copied().collect();
        let sent = Instant::now();
        // A renewal that does not come back within a third of the lease is as good as
        // failed (the host may be cut off: the call can hang until TCP gives up).
        async move {
            let res = tokio::time::timeout(
                lease / 3,
                bb.renew_leases(&id, &held, lease.as_secs_f64()),
            )
            .await
            .unwrap_or(Err(crate::Error::Timeout {
                what: "renewing leases",
                after: lease / 3,
            }));
            // Running tasks whose lease is gone: an operator's cancel is told to the
            // handler, anything else (taken back, transferred) stops it at once.
            let mut canceled = HashSet::new();
            if let Ok(kept) = &res {
                let kept: HashSet<Uuid> = kept.iter().map(|(id, _)| *id).collect();
                let lost_running: Vec<Uuid> = held
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| !kept.contains(id) && running.contains(id))
                    .collect();
                if let Ok(ids) = bb.canceled_among(&lost_running).await {
                    canceled.extend(ids);
                }
            }
            (res, held, canceled)
        }
        .into_actor(self)
        .map(move |(res, held, canceled), act, ctx| {
            act.renewing = false;
            act.db_result(&res);
            match res {
                Ok(kept) => {
                    let epochs: HashMap<Uuid, i64> = held.iter().copied().collect();
                    let mut skipped = false;
                    for (id, renewed) in &kept {
                        if let (true, Some(epoch)) = (*renewed, epochs.get(id)) {
                            act.leases.renewed((*id, *epoch), sent, lease);
                        }
                        skipped |= !*renewed;
                    }
                    if skipped {
                        // A row was locked by a write of this worker's own (a handler's
                        // checkpoint, a batch of starts and outcomes): held, not renewed.
                        // Those locks last milliseconds, so the renewal goes again a tick
                        // later rather than a third of the lease later: a task that
                        // checkpoints often had its row locked at two renewals in a row
                        // under load, and was stopped by its own fence (a re-run).
                        ctx.run_later(fence::RENEW_LOCKED_RETRY, |act, ctx| act.renew(ctx));
                    }
                    let kept: HashSet<Uuid> = kept.into_iter().map(|(id, _)| id).collect();
                    let lost: HashSet<(Uuid, i64)> = held
                        .iter()
                        .filter(|(id, _)| !kept.contains(id))
                        .copied()
                        .collect();
                    for key in &lost {
                        act.ledger.let_go(*key);
                    }
                    act.queue.retain(|t| {
                        let gone = lost.contains(&(t.id, t.epoch));
                        if gone {
                            tracing::warn!(task = %t.id, epoch = t.epoch, "lease lost before the task left the queue");
                        }
                        !gone
                    });
                    for (id, epoch) in &lost {
                        if canceled.contains(id) && act.tell_canceled(*id, *epoch) {
                            continue;
                        }
                        // The task was taken back (reaper) or transferred: stop running it
                        // here; whatever it would write would be fenced off anyway.
                        if let Some(r) = act.running.get(id) {
                            if r.epoch == *epoch {
                                tracing::warn!(task = %id, epoch, "lease lost; stopping the handler");
                                r.abort.abort();
                                act.running.remove(id);
                                act.fenced_off += 1;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew leases; retrying");
                    // Soon, not a third of the lease later: the database may be back in
                    // a moment, and the tasks are stopped if it is not (see `fence`).
                    ctx.run_later(fence::RENEW_RETRY, |act, ctx| act.renew(ctx));
                }
            }
            act.check_suspended();
            act.check_drained();
            if std::mem::take(&mut act.renew_again) {
                act.renew(ctx);
            }
        })
        .spawn(ctx);
    }

    pub(super) fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        // One at a time: after a stop (SIGSTOP, a stall) the timer's missed ticks come
        // at once, and each would register again.
        if self.heartbeating {
            return;
        }
        self.heartbeating = true;
        let bb = self.bb.clone();
        let config = self.config.clone();
        let registry = self.registry.clone();
        let inflight = self.held() as i32;
        let capacity = self.capacity() as i32;
        let draining = self.draining;
        async move {
            let beat = bb.heartbeat(&config.id, inflight, capacity).await?;
            let unreachable = beat.is_some_and(|b| b.wake_unreachable);
            match beat.map(|b| b.state) {
                Some(WorkerState::Online | WorkerState::Draining | WorkerState::Upgrading) => {
                    Ok((false, unreachable))
                }
                _ if draining => Ok((false, unreachable)),
                // Declared gone (e.g. this process was stopped past the threshold) or
                // deleted: come back as a new registration; the tasks it held were taken
                // back and its stale writes are fenced off.
                _ => {
                    let mut registration = Worker::registration(&config, &registry);
                    registration.capacity = capacity;
                    bb.register_worker(&registration).await.map(|_| (true, false))
                }
            }
        }
        .into_actor(self)
        .map(|res: crate::Result<(bool, bool)>, act, ctx| {
            act.heartbeating = false;
            act.db_result(&res);
            match res {
                Ok((registered, unreachable)) => {
                    if registered {
                        tracing::warn!(worker = %act.config.id, "this worker had been declared gone; registered again");
                        act.fetch(ctx);
                    }
                    act.wake_unreachable(unreachable);
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
            if std::mem::take(&mut act.beat_again) {
                act.heartbeat(ctx);
            }
        })
        .spawn(ctx);
    }

    /// What the last heartbeat read of the planners' pushes: when they stop reaching
    /// this worker it says so, once, naming the address they try, and polls for its
    /// tasks as a worker no push has reached does (see [`super::PUSHED_POLL`]).
    fn wake_unreachable(&mut self, unreachable: bool) {
        if unreachable == self.wake_unreachable {
            return;
        }
        self.wake_unreachable = unreachable;
        let addr = self.config.wake_addr.as_deref().unwrap_or("-");
        if unreachable {
            tracing::warn!(worker = %self.config.id, wake_addr = %addr,
                poll_ms = self.config.poll.as_millis() as u64,
                max_poll_ms = super::PUSHED_POLL.max(self.config.poll).as_millis() as u64,
                "planners cannot push wake-ups to {addr}: give --wake-addr an address they \
                 reach (or --http one that listens where they are); until then this worker \
                 takes its tasks by polling");
            self.pushed = false;
            self.poll_every = self.config.poll;
        } else {
            tracing::info!(worker = %self.config.id, wake_addr = %addr,
                "planners reach this worker's wake-up address again");
        }
    }
}

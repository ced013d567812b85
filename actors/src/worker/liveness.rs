//! Staying alive in the blackboard: lease renewals (every third of the lease, sooner
//! after a failure or a row found locked; see `fence` for what happens when they keep
//! failing) and heartbeats (`last_seen`, and the capacity the self-sized queue asks for;
//! a worker declared gone registers again, once; what the planners record of their
//! pushes to it comes back with each).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use actix::prelude::*;
use uuid::Uuid;

use super::{fence, Worker};
use crate::blackboard::{Renewal, WorkerBoard, WorkerState};
use crate::flight::SingleFlight;

/// The renewal and the heartbeat in flight, and what they tell of the database.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// A renewal is in flight; another is owed after it (a cancel asked for a lease
    /// check) or after a write of progress (the two skip each other's rows).
    pub renew: SingleFlight,
    /// A heartbeat is in flight; another is owed after it when the capacity changed
    /// meanwhile, so that the latest capacity is the one written.
    pub beat: SingleFlight,
    /// Tasks it stopped itself because it could not renew their lease in time.
    pub self_fenced: u64,
    /// The last database error, if its last call failed for want of a connection.
    pub db_error: Option<String>,
}

impl Liveness {
    /// Remembers whether a call reached the database.
    pub fn db_result<T>(&mut self, r: &crate::Result<T>) {
        match r {
            Ok(_) => self.db_error = None,
            Err(e) if e.is_connection() => self.db_error = Some(e.to_string()),
            Err(_) => {}
        }
    }
}

/// What a renewal came back with: the tasks still held (and what became of each lease),
/// and among the running ones lost, those an operator canceled.
type Renewed = (crate::Result<Vec<(Uuid, Renewal)>>, HashSet<Uuid>);

impl Worker {
    /// Tells the handler of task `id` (attempt `epoch`), if it runs here, that an
    /// operator canceled it; `fence` stops it if it runs on past the grace. False if it
    /// does not run here.
    pub(super) fn tell_canceled(&mut self, id: Uuid, epoch: i64) -> bool {
        let (grace, lease) = (self.config.cancel_grace, self.config.lease);
        let Some(r) = self.held.running_at(&id, epoch) else {
            return false;
        };
        if r.canceled.is_none() {
            tracing::info!(task = %id, epoch, kind = %r.kind, ?grace,
                "task canceled: its handler is told, and stopped if it runs on past the grace");
            r.canceled = Some(Instant::now());
            r.cancel.raise();
            self.held
                .leases
                .read((id, epoch), Instant::now(), grace + fence::margin(lease));
        }
        true
    }

    /// Renews the leases of everything it holds, and of what is assigned to it and not
    /// read yet, in one statement. Not beside a write of progress: each skips the rows
    /// the other locks (see `progress`), so the renewal follows it at once instead.
    pub(super) fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.held.count() == 0 && !self.intake.unread && self.stopping.suspended.is_empty() {
            return;
        }
        if self.progress.flight.busy() {
            self.liveness.renew.defer();
            return;
        }
        if !self.liveness.renew.start() {
            return;
        }
        // Tasks suspended for a task transfer are this process's until the new one takes
        // them (bumping their epoch): renewed meanwhile, or a take-over slowed by a
        // failover would find them given to the reaper.
        let mut held = self.held.keys();
        held.extend(self.stopping.suspended.iter().copied());
        let running: HashSet<Uuid> = self.held.running.keys().copied().collect();
        let (bb, id, lease) = (self.bb.clone(), self.config.id.clone(), self.config.lease);
        let sent = Instant::now();
        let asked = held.clone();
        async move { renew_leases(&bb, &id, &asked, &running, lease).await }
            .into_actor(self)
            .map(move |(res, canceled), act, ctx| {
                let again = act.liveness.renew.end();
                act.liveness.db_result(&res);
                match res {
                    Ok(kept) => act.renewed(&held, &kept, &canceled, sent, ctx),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot renew leases; retrying");
                        // Soon, not a third of the lease later: the database may be back
                        // in a moment, and the tasks are stopped if it is not (see `fence`).
                        ctx.run_later(fence::RENEW_RETRY, |act, ctx| act.renew(ctx));
                    }
                }
                act.check_suspended();
                act.check_drained();
                if again {
                    act.renew(ctx);
                }
            })
            .spawn(ctx);
    }

    /// A renewal sent at `sent` for `held` came back: `kept` are the tasks still held
    /// (renewed, not due, or held but skipped: their row was locked by a write of its
    /// own); whatever else it held is lost.
    fn renewed(
        &mut self,
        held: &[(Uuid, i64)],
        kept: &[(Uuid, Renewal)],
        canceled: &HashSet<Uuid>,
        sent: Instant,
        ctx: &mut Context<Self>,
    ) {
        let lease = self.config.lease;
        let epochs: HashMap<Uuid, i64> = held.iter().copied().collect();
        let mut skipped = false;
        for (id, renewal) in kept {
            let Some(epoch) = epochs.get(id) else {
                continue;
            };
            // Counted from `sent`, before the statement's `now()`: the end it knows is
            // never later than the database's.
            if *renewal == Renewal::Renewed {
                self.metrics.lease_renewals.inc();
            }
            match renewal.left(lease) {
                Some(left) => self.held.leases.renewed((*id, *epoch), sent, left),
                None => skipped = true,
            }
        }
        if skipped {
            // A row was locked by a write of this worker's own (a handler's checkpoint,
            // a batch of starts and outcomes): held, not renewed. Those locks last
            // milliseconds, so the renewal goes again a tick later rather than a third of
            // the lease later: a task that checkpoints often had its row locked at two
            // renewals in a row under load, and was stopped by its own fence (a re-run).
            ctx.run_later(fence::RENEW_LOCKED_RETRY, |act, ctx| act.renew(ctx));
        }
        let kept: HashSet<Uuid> = kept.iter().map(|(id, _)| *id).collect();
        let lost: HashSet<(Uuid, i64)> = held
            .iter()
            .filter(|(id, _)| !kept.contains(id))
            .copied()
            .collect();
        // A suspended task no longer held here was taken over (or taken back).
        self.stopping.suspended.retain(|k| !lost.contains(k));
        self.lost(&lost, canceled);
        if !lost.is_empty() {
            // Handlers stopped, their slots free, and no handler left to report it: start
            // what waits in the queue.
            self.pump(ctx);
        }
    }

    /// Tasks whose lease it no longer holds: an operator's cancel is told to the
    /// handler; anything else (taken back by the reaper, transferred) stops running here
    /// (whatever it would write would be fenced off anyway).
    pub(super) fn lost(&mut self, lost: &HashSet<(Uuid, i64)>, canceled: &HashSet<Uuid>) {
        for key in lost {
            self.held.ledger.let_go(*key);
        }
        self.held.queue.retain(|t| {
            let gone = lost.contains(&(t.id, t.epoch));
            if gone {
                tracing::warn!(task = %t.id, epoch = t.epoch, "lease lost before the task left the queue");
            }
            !gone
        });
        for (id, epoch) in lost {
            if canceled.contains(id) && self.tell_canceled(*id, *epoch) {
                continue;
            }
            self.metrics.leases_lost.inc();
            if let Some(r) = self.held.running_at(id, *epoch) {
                tracing::warn!(task = %id, epoch, "lease lost; stopping the handler");
                r.abort.abort();
                self.held.running.remove(id);
                self.outcomes.fenced_off += 1;
            }
        }
    }

    /// A heartbeat: `last_seen`, the capacity, and what the row says back. One at a
    /// time: after a stop (SIGSTOP, a stall) the timer's missed ticks come at once, and
    /// each would register again.
    pub(super) fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if !self.liveness.beat.try_start() {
            return;
        }
        let bb = self.bb.clone();
        let registration = Worker::registration(&self.config, &self.registry);
        let (inflight, capacity) = (self.held.count() as i32, self.capacity() as i32);
        let draining = self.stopping.draining;
        async move { beat(&bb, registration, inflight, capacity, draining).await }
            .into_actor(self)
            .map(|res: crate::Result<(bool, bool)>, act, ctx| {
                let again = act.liveness.beat.end();
                act.liveness.db_result(&res);
                match res {
                    Ok((registered, unreachable)) => {
                        if registered {
                            tracing::warn!(worker = %act.config.id, "this worker had been declared gone; registered again");
                            act.fetch(ctx);
                        }
                        act.heard_wake_ups(unreachable);
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
                if again {
                    act.heartbeat(ctx);
                }
            })
            .spawn(ctx);
    }

    /// A heartbeat now, its capacity having changed: after the one in flight if there
    /// is one, so that the latest capacity is the one written.
    pub(super) fn beat_now(&mut self, ctx: &mut Context<Self>) {
        if !self.liveness.beat.owe() {
            self.heartbeat(ctx);
        }
    }

    /// What the last heartbeat read of the planners' pushes: when they stop reaching
    /// this worker it says so, once, naming the address they try, and polls for its
    /// tasks as a worker no push has reached does (see [`super::PUSHED_POLL`]).
    fn heard_wake_ups(&mut self, unreachable: bool) {
        if unreachable == self.intake.wake_unreachable {
            return;
        }
        self.intake.wake_unreachable = unreachable;
        let addr = self.config.wake_addr.as_deref().unwrap_or("-");
        if unreachable {
            tracing::warn!(worker = %self.config.id, wake_addr = %addr,
                poll_ms = self.config.poll.as_millis() as u64,
                max_poll_ms = super::PUSHED_POLL.max(self.config.poll).as_millis() as u64,
                "planners cannot push wake-ups to {addr}: give --wake-addr an address they \
                 reach (or --http one that listens where they are); until then this worker \
                 takes its tasks by polling");
            self.intake.pushed = false;
            self.intake.poll_every = self.config.poll;
        } else {
            tracing::info!(worker = %self.config.id, wake_addr = %addr,
                "planners reach this worker's wake-up address again");
        }
    }
}

/// Renews the leases of `held`; a renewal that does not come back within a third of the
/// lease is as good as failed (the host may be cut off: the call can hang until TCP gives
/// up). Among the running tasks lost, which an operator canceled.
async fn renew_leases(
    bb: &WorkerBoard,
    worker: &str,
    held: &[(Uuid, i64)],
    running: &HashSet<Uuid>,
    lease: std::time::Duration,
) -> Renewed {
    let res = tokio::time::timeout(
        lease / 3,
        bb.renew_leases(worker, held, lease.as_secs_f64()),
    )
    .await
    .unwrap_or(Err(crate::Error::Timeout {
        what: "renewing leases",
        after: lease / 3,
    }));
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
    (res, canceled)
}

/// One heartbeat; a worker found gone (this process was stopped past the threshold) or
/// deleted comes back as a new registration — the tasks it held were taken back and its
/// stale writes are fenced off — unless it is draining. (registered again, pushes
/// unreachable).
async fn beat(
    bb: &WorkerBoard,
    mut registration: crate::blackboard::Registration,
    inflight: i32,
    capacity: i32,
    draining: bool,
) -> crate::Result<(bool, bool)> {
    let beat = bb.heartbeat(&registration.id, inflight, capacity).await?;
    let unreachable = beat.is_some_and(|b| b.wake_unreachable);
    match beat.map(|b| b.state) {
        Some(WorkerState::Online | WorkerState::Draining | WorkerState::Upgrading) => {
            Ok((false, unreachable))
        }
        _ if draining => Ok((false, unreachable)),
        _ => {
            registration.capacity = capacity;
            bb.register_worker(&registration)
                .await
                .map(|_| (true, false))
        }
    }
}

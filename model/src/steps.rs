//! What each step does to the state: the statement's effect on the blackboard's rows
//! (its `where` clause is the guard), and what the process learns or does with the
//! answer. Read beside the SQL that `Action::statement` names.

use crate::actions::Action;
use crate::model::{Protocol, Recall};
use crate::state::{
    transition_allowed, Doing, Held, Phase, Role, Seen, State, Status, WorkerState,
};

impl Protocol {
    /// `last` after `action`; `None` if the action changes nothing there.
    pub fn step(&self, last: &State, action: &Action) -> Option<State> {
        let mut s = last.clone();
        match *action {
            Action::Tick => s.now += 1,
            Action::Claim { p, t, w } => s.claims[p as usize] = Some((t, w)),
            Action::Assign { p } => self.assign(&mut s, p),
            Action::Push { p } => push(&mut s, p, self.guards.recall),
            Action::Probe { p, w } => s.unreachable[p as usize] &= !(1 << w),
            Action::Reclaim { t } => self.reclaim(&mut s, t),
            Action::MarkGone { w } => s.procs[w as usize].state = WorkerState::Gone,
            Action::WorkerClaim { w, t } => self.worker_claim(&mut s, w, t),
            Action::Born { w, t } => self.born(&mut s, w, t),
            Action::Read { w, t } => read(&mut s, w, t),
            Action::Work { w, t } => self.work(&mut s, w, t),
            Action::Checkpoint { w, t } => self.checkpoint(&mut s, w, t, false),
            Action::RecordStart { w, t } => self.record_start(&mut s, w, t),
            Action::RecordOutcome { w, t } => self.record_outcome(&mut s, w, t),
            Action::Renew { w } => return self.renewed(last, w as usize),
            Action::Fence { w, t } => {
                let proc = &mut s.procs[w as usize];
                if !proc.connected {
                    s.ghost.seen |= Seen::SELF_FENCED;
                }
                if let Some(h) = proc.held[t as usize].as_mut() {
                    h.what = Doing::Done { succeeded: false };
                }
            }
            Action::Crash { w } => {
                s.crashes_left -= 1;
                let proc = &mut s.procs[w as usize];
                proc.alive = false;
                proc.held.iter_mut().for_each(|h| *h = None);
            }
            Action::Partition { w } => {
                s.partitions_left -= 1;
                s.procs[w as usize].connected = false;
            }
            Action::Heal { w } => {
                let proc = &mut s.procs[w as usize];
                proc.connected = true;
                // Its heartbeat finds it gone: it registers again, unless it drains.
                if proc.state == WorkerState::Gone && !proc.draining {
                    proc.state = WorkerState::Online;
                }
            }
            Action::Spawn => {
                let n = s.proc_of(Role::New)?;
                let new = &mut s.procs[n];
                new.alive = true;
                new.state = WorkerState::Online;
                s.phase = Phase::Spawned;
            }
            Action::MarkUpgrading => {
                let o = s.proc_of(Role::Old)?;
                s.procs[o].state = WorkerState::Upgrading;
                s.procs[o].draining = true;
                s.phase = Phase::Suspending;
            }
            Action::Suspend { t } => self.suspend(&mut s, t),
            Action::MoveAssigned => self.move_assigned(&mut s),
            Action::TakeOver => self.take_over(&mut s),
            Action::DrainRelease => drain_release(&mut s),
            Action::DrainEnd => {
                let o = s.proc_of(Role::Old)?;
                // Its outcomes all written, what is still assigned to it is a task born
                // assigned to it after its release (V62): given back (`RELEASE_ASSIGNED`).
                for row in s.tasks.iter_mut() {
                    if row.holder == Some(o as u8) && row.status == Status::Assigned {
                        row.status = Status::Pending;
                        row.holder = None;
                    }
                }
                s.procs[o].state = WorkerState::Gone;
                s.procs[o].alive = false;
                s.phase = Phase::Done;
            }
        }
        for (before, after) in last.tasks.iter().zip(&s.tasks) {
            // An outcome written with its start: two transitions in one write.
            let with_start = matches!(action, Action::RecordOutcome { .. })
                && before.status == Status::Assigned
                && after.status != Status::Assigned
                && transition_allowed(Status::Assigned, Status::Running)
                && transition_allowed(Status::Running, after.status);
            if !with_start && !transition_allowed(before.status, after.status) {
                s.ghost.illegal_transition = true;
            }
        }
        if !self.witness {
            s.ghost.seen = 0;
        }
        (s != *last).then_some(s)
    }

    /// `assign_and_wake`: the claimed task, pending, to the chosen worker at the next
    /// epoch if the worker's row is still `online` under its lock; the push follows (a
    /// push only matters where a failed one recalls: without the recall, leaving it out
    /// offers work to workers a real planner would skip, which only adds behaviours).
    fn assign(&self, s: &mut State, p: u8) {
        let Some((t, w)) = s.claims[p as usize].take() else {
            return;
        };
        if self.assign_to(s, t, w) && self.guards.recall != Recall::Never {
            s.pushes[p as usize] = Some((w, t));
        }
    }

    /// `claim_and_read`'s claim: task `t` to worker `w` itself, as [`Self::assign_to`]
    /// (the enabling condition keeps out a row a planner's claim holds).
    fn worker_claim(&self, s: &mut State, w: u8, t: u8) {
        self.assign_to(s, t, w);
    }

    /// An insert takes `w`'s offer (V62): no lock on `w`'s row, so whatever its state.
    fn born(&self, s: &mut State, w: u8, t: u8) {
        let row = &mut s.tasks[t as usize];
        if row.status != Status::Pending || row.epoch != 0 {
            return;
        }
        row.status = Status::Assigned;
        row.holder = Some(w);
        row.epoch += 1;
        row.lease_until = s.now + self.bound.lease;
    }

    /// The compare-and-set both assignments make: task `t`, pending, to worker `w` at the
    /// next epoch with a fresh lease, if `w`'s row is `online` under its lock. Whether it
    /// was made.
    fn assign_to(&self, s: &mut State, t: u8, w: u8) -> bool {
        let row = &mut s.tasks[t as usize];
        if row.status != Status::Pending || s.procs[w as usize].state != WorkerState::Online {
            return false;
        }
        row.status = Status::Assigned;
        row.holder = Some(w);
        row.epoch += 1;
        row.lease_until = s.now + self.bound.lease;
        true
    }

    /// `RECLAIM`: an expired lease back to pending (a running one counts a retry, and
    /// ends past the budget).
    fn reclaim(&self, s: &mut State, t: u8) {
        let row = &mut s.tasks[t as usize];
        if row.status == Status::Running {
            row.retries += 1;
        }
        row.status = if row.retries > self.bound.max_retries {
            Status::Failed
        } else {
            Status::Pending
        };
        row.holder = None;
        s.ghost.seen |= Seen::RESCUE;
    }

    /// The handler does the rest of its work and ends; its outcome waits for the batch.
    fn work(&self, s: &mut State, w: u8, t: u8) {
        if let Some(h) = s.procs[w as usize].held[t as usize].as_mut() {
            h.what = Doing::Done { succeeded: true };
        }
    }

    /// Whether a write by `w` at `epoch` to task `t` passes the fence (`lease_epoch` and,
    /// where the statement names it, `assigned_to`); notes a stale write the broken guard
    /// let through.
    fn fenced_ok(&self, s: &mut State, w: u8, t: u8, epoch: u8, names_holder: bool) -> bool {
        let row = &s.tasks[t as usize];
        let current = row.epoch == epoch && (!names_holder || row.holder == Some(w));
        if current {
            return true;
        }
        if self.guards.writes_name_epoch {
            s.ghost.seen |= Seen::FENCED_OFF;
            return false;
        }
        s.ghost.stale_write = true;
        true
    }

    /// The handler does a unit of its work and saves it (`CHECKPOINT`, the start with it);
    /// a refused one stops the handler (its lease is lost). With `suspend`, no unit is
    /// done: the progress is saved and the handler stops.
    fn checkpoint(&self, s: &mut State, w: u8, t: u8, suspend: bool) {
        let Some(h) = s.procs[w as usize].held[t as usize].clone() else {
            return;
        };
        let Doing::Running { from, progress, .. } = h.what else {
            return;
        };
        let progress = if suspend { progress } else { progress + 1 };
        let row = &s.tasks[t as usize];
        let written = row.status.held() && self.fenced_ok(s, w, t, h.epoch, false);
        let slot = &mut s.procs[w as usize].held[t as usize];
        if !written {
            *slot = None;
            return;
        }
        let row = &mut s.tasks[t as usize];
        row.checkpoint = row.checkpoint.max(progress);
        row.status = Status::Running;
        *slot = Some(Held {
            what: if suspend {
                Doing::Suspended
            } else {
                Doing::Running {
                    from,
                    progress,
                    start_written: true,
                }
            },
            ..h
        });
    }

    /// `record_attempts`, a start: assigned → running; refused, the handler stops.
    fn record_start(&self, s: &mut State, w: u8, t: u8) {
        let Some(h) = s.procs[w as usize].held[t as usize].clone() else {
            return;
        };
        let ok = s.tasks[t as usize].status.held() && self.fenced_ok(s, w, t, h.epoch, true);
        let slot = &mut s.procs[w as usize].held[t as usize];
        if !ok {
            *slot = None;
            return;
        }
        s.tasks[t as usize].status = Status::Running;
        if let Some(Held {
            what: Doing::Running { start_written, .. },
            ..
        }) = slot
        {
            *start_written = true;
        }
    }

    /// `record_attempts`, an outcome (with its start if not written): succeeded, or a
    /// failed attempt (retried while the budget lasts); refused, it is dropped.
    fn record_outcome(&self, s: &mut State, w: u8, t: u8) {
        let Some(h) = s.procs[w as usize].held[t as usize].take() else {
            return;
        };
        let Doing::Done { succeeded } = h.what else {
            return;
        };
        if !(s.tasks[t as usize].status.held() && self.fenced_ok(s, w, t, h.epoch, true)) {
            return;
        }
        let row = &mut s.tasks[t as usize];
        row.holder = None;
        row.status = if succeeded {
            Status::Succeeded
        } else {
            row.retries += 1;
            if row.retries > self.bound.max_retries {
                Status::Failed
            } else {
                Status::Pending
            }
        };
    }

    /// `RENEW` by worker `w`: the leases it holds at their epochs, and the ones assigned to
    /// it that it has not read, extended where due; what it lost is stopped and forgotten.
    /// `None` when the renewal would change nothing.
    pub fn renewed(&self, last: &State, w: usize) -> Option<State> {
        let mut s = last.clone();
        let due_before = s.now + self.bound.lease * 3 / 4;
        let fresh = s.now + self.bound.lease;
        let wu = w as u8;
        for t in 0..s.tasks.len() {
            let row = &mut s.tasks[t];
            let slot = &mut s.procs[w].held[t];
            let mine = row.holder == Some(wu) && row.status.held();
            match slot {
                Some(h) if mine && row.epoch == h.epoch => {
                    if row.lease_until < due_before {
                        row.lease_until = fresh;
                    }
                    h.known_end = row.lease_until;
                }
                Some(_) => *slot = None,
                None if mine && row.status == Status::Assigned && row.lease_until < due_before => {
                    row.lease_until = fresh;
                }
                None => {}
            }
        }
        (s != *last).then_some(s)
    }

    /// Upgrade: the old process stops `t` at a checkpoint (written if it reaches the
    /// blackboard; else the last one saved stands).
    fn suspend(&self, s: &mut State, t: u8) {
        let Some(o) = s.proc_of(Role::Old) else {
            return;
        };
        let Some(h) = s.procs[o].held[t as usize].clone() else {
            return;
        };
        if s.procs[o].connected {
            self.checkpoint(s, o as u8, t, true);
        } else {
            s.procs[o].held[t as usize] = Some(Held {
                what: Doing::Suspended,
                ..h.clone()
            });
        }
        let row = &s.tasks[t as usize];
        if row.epoch == h.epoch && row.status.held() {
            s.ghost.suspended_at[t as usize] = Some(row.checkpoint);
        }
    }

    /// `MOVE_ASSIGNED`: what is assigned to the old process and not held there goes to
    /// the new one at the next epoch.
    fn move_assigned(&self, s: &mut State) {
        let (Some(o), Some(n)) = (s.proc_of(Role::Old), s.proc_of(Role::New)) else {
            return;
        };
        for t in 0..s.tasks.len() {
            let row = &mut s.tasks[t];
            let kept = s.procs[o].held[t].is_some();
            if row.holder == Some(o as u8) && row.status == Status::Assigned && !kept {
                row.holder = Some(n as u8);
                row.epoch += 1;
                row.lease_until = s.now + self.bound.lease;
            }
        }
        s.phase = Phase::Moved;
    }

    /// `TAKE_OVER`: the suspended tasks, at the epochs the old process held them, to the
    /// new one (epoch bumped), resumed there from their checkpoints; the old one forgets
    /// them (`TransferDone`). A conflict (taken back meanwhile) stays where it is.
    fn take_over(&self, s: &mut State) {
        let (Some(o), Some(n)) = (s.proc_of(Role::Old), s.proc_of(Role::New)) else {
            return;
        };
        for t in 0..s.tasks.len() {
            let Some(Held {
                epoch,
                what: Doing::Suspended,
                ..
            }) = s.procs[o].held[t].clone()
            else {
                continue;
            };
            s.procs[o].held[t] = None;
            let row = &mut s.tasks[t];
            let bumped = epoch + 1;
            let from_old = row.holder == Some(o as u8) && row.epoch == epoch;
            if !(from_old && row.status.held()) {
                continue;
            }
            row.holder = Some(n as u8);
            row.epoch = bumped;
            row.lease_until = s.now + self.bound.lease;
            let from = if self.guards.resume_from_checkpoint {
                row.checkpoint
            } else {
                0
            };
            if from > 0 {
                s.ghost.seen |= Seen::RESUMED;
            }
            s.procs[n].held[t] = Some(Held {
                epoch: bumped,
                known_end: row.lease_until,
                what: Doing::Running {
                    from,
                    progress: from,
                    start_written: row.status == Status::Running,
                },
            });
        }
        s.phase = Phase::TakenOver;
    }
}

/// A planner's push after its round: delivered to a worker that is up and reachable;
/// else the worker is unreachable for this planner and the task, if still `assigned`
/// there (not started: compare-and-set), goes back to pending (`RECALL`).
fn push(s: &mut State, p: u8, recall: Recall) {
    let Some((w, t)) = s.pushes[p as usize].take() else {
        return;
    };
    if s.procs[w as usize].reaches_db() {
        return;
    }
    s.unreachable[p as usize] |= 1 << w;
    // Refused: the worker's process is gone (a cut-off one times out instead).
    let refused = !s.procs[w as usize].alive;
    let recalls = match recall {
        Recall::Never => false,
        Recall::WhenRefused => refused,
        Recall::Always => true,
    };
    if !recalls {
        return;
    }
    let row = &mut s.tasks[t as usize];
    if row.status == Status::Assigned && row.holder == Some(w) {
        row.status = Status::Pending;
        row.holder = None;
        s.ghost.seen |= Seen::RECALLED;
    }
}

/// `read_assigned`: the task, assigned to `w` at an epoch it does not hold, starts there
/// from the checkpoint read (an older attempt of it still running there is stopped).
fn read(s: &mut State, w: u8, t: u8) {
    let row = &s.tasks[t as usize];
    s.procs[w as usize].held[t as usize] = Some(Held {
        epoch: row.epoch,
        known_end: row.lease_until,
        what: Doing::Running {
            from: row.checkpoint,
            progress: row.checkpoint,
            start_written: false,
        },
    });
}

/// The old process's drain: `draining`, and what is assigned to it and not held there
/// back to pending (`RELEASE_ASSIGNED`).
fn drain_release(s: &mut State) {
    let Some(o) = s.proc_of(Role::Old) else {
        return;
    };
    s.procs[o].state = WorkerState::Draining;
    for t in 0..s.tasks.len() {
        let row = &mut s.tasks[t];
        let running_here = s.procs[o].held[t].is_some();
        if row.holder == Some(o as u8) && row.status == Status::Assigned && !running_here {
            row.status = Status::Pending;
            row.holder = None;
        }
    }
    s.phase = Phase::Draining;
}

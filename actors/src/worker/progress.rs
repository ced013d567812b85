//! Handlers' progress, throttled: [`TaskContext::progress`](super::TaskContext::progress)
//! only keeps the latest value of its task here (a handler may call it thousands of times
//! a second), and the worker writes what changed for all its tasks in one statement at
//! most every [`PROGRESS_EVERY`], and a task's last value just before its outcome
//! (`WorkerBoard::save_progress`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::Worker;
use crate::blackboard::{ProgressNote, MAX_PROGRESS_MESSAGE_CHARS};
use crate::flight::SingleFlight;

/// How often, at most, a worker writes its tasks' progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Handlers' progress on its way to the blackboard: what they reported, the write in
/// flight, and when the last one was sent.
pub(super) struct Progress {
    pub slots: ProgressSlots,
    pub flight: SingleFlight,
    pub sent: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            slots: ProgressSlots::default(),
            flight: SingleFlight::default(),
            sent: Instant::now(),
        }
    }
}

impl Worker {
    /// Writes the progress its running tasks reported since the last write, all in one
    /// statement (none when nothing was reported). A value of a task that no longer runs
    /// here is dropped; one whose row the worker's own batch in flight locked is kept for
    /// the next write, unless a newer one came.
    ///
    /// Never while a renewal is in flight, nor a renewal during it: both skip the rows
    /// the other locks, and with leases renewed about every second too they would meet
    /// again and again (the next tick, a tenth of a second later, tries again).
    pub(super) fn write_progress(&mut self, ctx: &mut Context<Self>) {
        if self.progress.flight.busy() || self.liveness.renew.busy() {
            return;
        }
        let notes: Vec<_> = self
            .progress
            .slots
            .take_all()
            .into_iter()
            .filter(|n| {
                self.held
                    .running
                    .get(&n.id)
                    .is_some_and(|r| r.epoch == n.epoch)
            })
            .collect();
        self.progress.sent = Instant::now();
        if notes.is_empty() {
            return;
        }
        self.progress.flight.start();
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        async move {
            let res = bb.save_progress(&id, &notes, false).await;
            (res, notes)
        }
        .into_actor(self)
        .map(|(res, notes), act, ctx| {
            act.progress.flight.end();
            // A renewal waited for this write (see above).
            if act.liveness.renew.take_owed() {
                act.renew(ctx);
            }
            act.liveness.db_result(&res);
            let written: HashSet<Uuid> = match res {
                Ok(ids) => ids.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(error = %e, count = notes.len(), "cannot write progress; retrying");
                    HashSet::new()
                }
            };
            for n in notes.into_iter().filter(|n| !written.contains(&n.id)) {
                if act.held.running.get(&n.id).is_some_and(|r| r.epoch == n.epoch) {
                    act.progress.slots.put_back(n);
                }
            }
        })
        .spawn(ctx);
    }
}

/// The latest progress each running task reported and the worker has not written yet,
/// shared by the worker and its handlers' contexts.
#[derive(Clone, Default)]
pub(super) struct ProgressSlots(Arc<Mutex<HashMap<Uuid, ProgressNote>>>);

impl ProgressSlots {
    /// Keeps `fraction` and `message` as `id`'s latest progress (replacing an unwritten
    /// one); see [`clean`] for what is kept.
    pub(super) fn report(&self, id: Uuid, epoch: i64, fraction: f64, message: Option<&str>) {
        let Some((fraction, message)) = clean(fraction, message) else {
            return;
        };
        let note = ProgressNote {
            id,
            epoch,
            fraction,
            message,
        };
        self.lock().insert(id, note);
    }

    /// Every unwritten value, emptying the slots.
    pub(super) fn take_all(&self) -> Vec<ProgressNote> {
        self.lock().drain().map(|(_, n)| n).collect()
    }

    /// `id`'s unwritten value of the attempt `epoch`, if any (any other is dropped).
    pub(super) fn take(&self, id: Uuid, epoch: i64) -> Option<ProgressNote> {
        self.lock().remove(&id).filter(|n| n.epoch == epoch)
    }

    /// Puts back a value that could not be written, unless a newer one came meanwhile.
    pub(super) fn put_back(&self, note: ProgressNote) {
        self.lock().entry(note.id).or_insert(note);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, ProgressNote>> {
        // A handler that panicked while holding the lock left a map that is still whole
        // (inserts and removals do not unwind halfway).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What is kept of a report: the fraction within 0 to 1 (a value outside is clamped), the
/// message cut to [`MAX_PROGRESS_MESSAGE_CHARS`] characters; nothing for a fraction that
/// is not a number (NaN or infinite), a handler's bug that would otherwise hide the last
/// good value.
pub(super) fn clean(fraction: f64, message: Option<&str>) -> Option<(f32, Option<String>)> {
    if !fraction.is_finite() {
        return None;
    }
    let message = message.map(|m| m.chars().take(MAX_PROGRESS_MESSAGE_CHARS).collect());
    Some((fraction.clamp(0.0, 1.0) as f32, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_are_clamped_messages_cut_and_non_numbers_dropped() {
        assert_eq!(clean(0.25, Some("a")), Some((0.25, Some("a".into()))));
        assert_eq!(clean(-1.0, None), Some((0.0, None)));
        assert_eq!(clean(7.0, None), Some((1.0, None)));
        assert_eq!(clean(f64::NAN, Some("x")), None);
        assert_eq!(clean(f64::INFINITY, None), None);
        let long = "é".repeat(MAX_PROGRESS_MESSAGE_CHARS + 5);
        let (_, cut) = clean(0.5, Some(&long)).unwrap();
        assert_eq!(cut.unwrap().chars().count(), MAX_PROGRESS_MESSAGE_CHARS);
    }

    #[test]
    fn the_latest_value_wins_and_a_put_back_never_hides_a_newer_one() {
        let slots = ProgressSlots::default();
        let id = Uuid::nil();
        for i in 0..1000 {
            slots.report(id, 3, i as f64 / 1000.0, Some("going"));
        }
        let all = slots.take_all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].fraction, 0.999);
        slots.report(id, 3, 0.5, None);
        slots.put_back(all[0].clone());
        assert_eq!(slots.take(id, 3).map(|n| n.fraction), Some(0.5));
        slots.report(id, 3, 0.5, None);
        assert_eq!(
            slots.take(id, 4),
            None,
            "another attempt's value is not this one's"
        );
        assert!(slots.take_all().is_empty());
    }
}

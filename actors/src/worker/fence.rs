//! Self-fencing: a worker that cannot renew a lease stops the task before the lease can
//! expire, so that no task runs in two places at once, even when this host is cut off
//! from PostgreSQL and the reaper gives the task to another worker. Fencing tokens stop
//! a stale write; only this stops a stale handler's side effects.
//!
//! The worker knows, for every task it holds, the latest moment its lease surely still
//! runs: the time the read or renewal was *sent* plus the lease the database gave (the
//! database's clock started later, so the estimate errs on the early side). A task whose
//! moment comes within [`margin`] is stopped: its handler is aborted and its attempt
//! recorded as failed (written when the database is back, if the lease is still its own);
//! a queued task is dropped unrun.
//!
//! The tick that stops a task comes every [`FENCE_TICK`]; a process that was frozen
//! (SIGSTOP, a VM paused) past that moment wakes with the handler's timers due as well,
//! and would run it until the tick. So each handler is also polled through [`Fenced`],
//! which looks at the lease's end before every poll: past it, the handler's code does not
//! run again, whatever woke it, and the tick's abort follows.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskCx, Poll};
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::Worker;
use crate::blackboard::{Outcome, Step};

/// How often the worker looks at its leases' deadlines.
pub(super) const FENCE_TICK: Duration = Duration::from_millis(100);

/// After a failed renewal, how soon the next attempt goes.
pub(super) const RENEW_RETRY: Duration = Duration::from_millis(500);

/// After a renewal that found a held row locked by a write of the worker's own (which
/// lasts milliseconds), how soon the next attempt goes.
pub(super) const RENEW_LOCKED_RETRY: Duration = FENCE_TICK;

/// How long before a lease's end the task is stopped: a fifth of the lease, at most 2 s
/// (a process that is late by more than that, is late by a scheduling stall).
pub fn margin(lease: Duration) -> Duration {
    (lease / 5).min(Duration::from_secs(2))
}

/// When each held (task, epoch)'s lease ends at the latest, as far as this process knows.
#[derive(Debug, Default)]
pub struct LeaseClock {
    ends: HashMap<(Uuid, i64), Instant>,
    /// The ends shared with running handlers' [`Fenced`] futures.
    watched: HashMap<(Uuid, i64), LeaseEnd>,
}

impl LeaseClock {
    /// A task read (or taken over) by a request sent at `sent`, its lease then `left`.
    pub fn read(&mut self, key: (Uuid, i64), sent: Instant, left: Duration) {
        self.ends.insert(key, sent + left);
        self.publish(key);
    }

    /// A renewal sent at `sent` found the lease `left` long (extended, or not due).
    pub fn renewed(&mut self, key: (Uuid, i64), sent: Instant, left: Duration) {
        let end = sent + left;
        let e = self.ends.entry(key).or_insert(end);
        *e = (*e).max(end);
        self.publish(key);
    }

    /// The end of `key`'s lease as a handler's [`Fenced`] future sees it, kept up to date
    /// by reads and renewals.
    pub fn watch(&mut self, key: (Uuid, i64)) -> LeaseEnd {
        let end = self.watched.entry(key).or_default().clone();
        self.publish(key);
        end
    }

    fn publish(&self, key: (Uuid, i64)) {
        if let (Some(w), Some(end)) = (self.watched.get(&key), self.ends.get(&key)) {
            w.set(*end);
        }
    }

    /// Whether `key`'s lease ends within `margin` of `now` (or its end is unknown: a
    /// task the worker never read it has no business running).
    pub fn due(&self, key: (Uuid, i64), now: Instant, margin: Duration) -> bool {
        self.ends.get(&key).is_none_or(|end| now + margin >= *end)
    }

    /// Forgets every key but `held`.
    pub fn keep_only(&mut self, held: &HashSet<(Uuid, i64)>) {
        self.ends.retain(|k, _| held.contains(k));
        self.watched.retain(|k, _| held.contains(k));
    }
}

/// The instant lease ends are counted from, in a [`LeaseEnd`].
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A lease's end shared between the worker and a running handler: microseconds after
/// [`base`], plus one; 0 while unknown (a task with no known lease has no business
/// running).
#[derive(Debug, Clone, Default)]
pub struct LeaseEnd(Arc<AtomicU64>);

impl LeaseEnd {
    fn set(&self, end: Instant) {
        let micros = end.saturating_duration_since(base()).as_micros();
        self.0.store(
            u64::try_from(micros).unwrap_or(u64::MAX - 1) + 1,
            Ordering::Release,
        );
    }

    /// How long after `now` the lease surely still runs, as this worker knows it (zero
    /// once past); `None` while unknown.
    pub fn left(&self, now: Instant) -> Option<Duration> {
        match self.0.load(Ordering::Acquire) {
            0 => None,
            v => Some((base() + Duration::from_micros(v - 1)).saturating_duration_since(now)),
        }
    }

    /// Whether the lease ends within `margin` of `now` (the fence's own test, [`LeaseClock::due`]).
    fn due(&self, now: Instant, margin: Duration) -> bool {
        match self.0.load(Ordering::Acquire) {
            0 => true,
            v => now + margin >= base() + Duration::from_micros(v - 1),
        }
    }
}

/// A handler's future, polled only while its lease holds (see the module doc). Past the
/// lease's end less the margin it stays pending, looking again every [`FENCE_TICK`] (a
/// renewal that raced the look lets it go on); the fence's tick aborts it.
pub struct Fenced<F> {
    inner: Pin<Box<F>>,
    end: LeaseEnd,
    margin: Duration,
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<F: Future> Fenced<F> {
    /// `inner`, fenced by `end` with the fence's `margin`.
    pub fn new(inner: F, end: LeaseEnd, margin: Duration) -> Self {
        Fenced {
            inner: Box::pin(inner),
            end,
            margin,
            recheck: None,
        }
    }
}

impl<F: Future> Future for Fenced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        if self.end.due(Instant::now(), self.margin) {
            let recheck = self
                .recheck
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(FENCE_TICK)));
            if recheck.as_mut().poll(cx).is_ready() {
                self.recheck = None;
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
        self.recheck = None;
        self.inner.as_mut().poll(cx)
    }
}

impl Worker {
    /// Stops what it holds whose lease it could not renew in time; see the module doc.
    pub(super) fn fence(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let margin = margin(self.config.lease);
        let stopped = self.stop_due_running(now, margin);
        let dropped = self.drop_due_queued(now, margin);
        let held: HashSet<(Uuid, i64)> = self.held.keys().into_iter().collect();
        self.held.leases.keep_only(&held);
        if stopped {
            // Slots freed with no handler left to report: start what waits in the queue
            // (nothing else would, while the queue fills the worker's capacity).
            self.pump(ctx);
            self.flush(ctx);
        }
        if stopped || dropped {
            self.check_suspended();
            self.check_drained();
        }
    }

    /// Stops the handlers whose lease ends within `margin` of `now`, recording each
    /// attempt failed (to be retried) unless its task was canceled; whether any was.
    fn stop_due_running(&mut self, now: Instant, margin: Duration) -> bool {
        let due: Vec<Uuid> = self
            .held
            .running
            .iter()
            .filter(|(id, r)| self.held.leases.due((**id, r.epoch), now, margin))
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            let Some(r) = self.held.running.remove(id) else {
                continue;
            };
            r.abort.abort();
            if let Some(at) = r.canceled {
                // Canceled, told, and still running past the grace: stopped, and nothing
                // recorded (the task ended `canceled` already).
                tracing::warn!(task = %id, epoch = r.epoch, kind = %r.kind,
                    told_ms_ago = at.elapsed().as_millis() as u64,
                    "a canceled task's handler ran past the grace: stopped");
                continue;
            }
            self.liveness.self_fenced += 1;
            tracing::warn!(task = %id, epoch = r.epoch, kind = %r.kind,
                "lease not renewed in time: handler stopped before the lease could expire");
            let outcome = Outcome::Failed {
                error: "stopped by its worker: the lease could not be renewed in time \
                        (database unreachable)"
                    .into(),
                retry_in_ms: self.backoff_ms(&r.kind, r.retries),
            };
            self.outcomes
                .outbox
                .push(r.record(*id, Step::Finish(outcome)));
        }
        !due.is_empty()
    }

    /// Drops unrun the queued tasks whose lease ends within `margin` of `now`; whether
    /// any was.
    fn drop_due_queued(&mut self, now: Instant, margin: Duration) -> bool {
        let mut dropped = Vec::new();
        self.held.queue.retain(|t| {
            let due = self.held.leases.due((t.id, t.epoch), now, margin);
            if due {
                dropped.push((t.id, t.epoch));
            }
            !due
        });
        for key in &dropped {
            tracing::warn!(task = %key.0, epoch = key.1, "lease not renewed in time: queued task dropped unrun");
            self.held.ledger.dropped_unrun(*key);
        }
        !dropped.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u128) -> (Uuid, i64) {
        (Uuid::from_u128(n), 1)
    }

    #[test]
    fn a_lease_is_due_a_margin_before_it_ends() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::default();
        clock.read(key(1), t0, Duration::from_secs(10));
        let m = margin(Duration::from_secs(10));
        assert_eq!(m, Duration::from_secs(2));
        assert!(!clock.due(key(1), t0 + Duration::from_secs(7), m));
        assert!(clock.due(key(1), t0 + Duration::from_secs(8), m));
    }

    #[test]
    fn a_renewal_moves_the_end_and_never_back() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(5);
        let mut clock = LeaseClock::default();
        clock.read(key(1), t0, lease);
        clock.renewed(key(1), t0 + Duration::from_secs(3), lease);
        let m = margin(lease);
        assert!(!clock.due(key(1), t0 + Duration::from_secs(6), m));
        assert!(clock.due(key(1), t0 + Duration::from_secs(7), m));
        // A late answer to an older renewal does not shorten it.
        clock.renewed(key(1), t0 + Duration::from_secs(1), lease);
        assert!(!clock.due(key(1), t0 + Duration::from_secs(6), m));
    }

    #[test]
    fn an_unknown_lease_is_due_and_forgotten_keys_go() {
        let t0 = Instant::now();
        let mut clock = LeaseClock::default();
        assert!(clock.due(key(9), t0, Duration::ZERO));
        clock.read(key(1), t0, Duration::from_secs(30));
        clock.read(key(2), t0, Duration::from_secs(30));
        clock.keep_only(&[key(2)].into_iter().collect());
        assert!(clock.due(key(1), t0, Duration::ZERO));
        assert!(!clock.due(key(2), t0, Duration::ZERO));
    }

    #[test]
    fn the_margin_is_a_fifth_of_the_lease_at_most_two_seconds() {
        assert_eq!(margin(Duration::from_secs(5)), Duration::from_secs(1));
        assert_eq!(margin(Duration::from_secs(60)), Duration::from_secs(2));
    }

    /// A future that counts its polls and never ends.
    struct Polls(Arc<AtomicU64>);

    impl Future for Polls {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    // Found by the soak: a worker frozen past its lease ran a handler for ~90 ms after it
    // was thawed, alongside the worker the task had moved to, until the fence's tick.
    #[tokio::test]
    async fn a_handler_is_not_polled_past_its_lease_even_before_the_tick() {
        let lease = Duration::from_secs(5);
        let m = margin(lease);
        let mut clock = LeaseClock::default();
        let end = clock.watch(key(1));
        let polls = Arc::new(AtomicU64::new(0));
        let mut fenced = Box::pin(Fenced::new(Polls(polls.clone()), end, m));
        let waker = futures_util::task::noop_waker();
        let mut cx = TaskCx::from_waker(&waker);
        // Unknown lease: not polled.
        assert!(fenced.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 0);
        // Read with 5 s left: polled.
        clock.read(key(1), Instant::now(), lease);
        assert!(fenced.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // A lease read 200 ms ago with 100 ms more than the margin left (the process was
        // frozen since): no poll.
        let frozen_since = Instant::now() - Duration::from_millis(200);
        clock.read(key(1), frozen_since, m + Duration::from_millis(100));
        assert!(fenced.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // A renewal that raced the look: polled again.
        clock.renewed(key(1), Instant::now(), lease);
        assert!(fenced.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }
}

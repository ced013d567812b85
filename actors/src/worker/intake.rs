//! How tasks reach the worker: its reads of what is assigned to it, and the tasks the
//! planner's wake-up carries (see `blackboard::carried`), which it starts as they
//! arrive, without reading them first. Which it may take, and how long their
//! leases surely run, it judges from what its latest finished read saw: a task whose row
//! version that read could see is left to the reads (never taken twice), and a lease's
//! end is placed on the local clock through that read (sent at a known instant, the
//! database's clock read during it), erring early as every lease estimate here does.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use uuid::Uuid;

use super::{Worker, WorkerConfig, PUSHED_POLL};
use crate::blackboard::carried::{parse_carried, ReadSnapshot};
use crate::blackboard::{AssignedRead, AssignedTask};
use crate::flight::SingleFlight;

/// How tasks reach the worker: its reads (one in flight at a time, a repeat asked for
/// meanwhile following it), the poll's pace, and what it knows of the planners' pushes.
#[derive(Debug)]
pub(super) struct Intake {
    /// A read of its assignments is in flight.
    pub flight: SingleFlight,
    /// Its offer of a slot to new tasks is on its way (migrations/V62).
    pub offer: SingleFlight,
    /// An offer of its slot to new tasks is out, as far as it knows: set by the offer's
    /// answer, cleared by a read that found tasks waiting (its claim gives the offer back
    /// first). The blackboard counts that slot taken, so a planner's round, which cannot
    /// fill it, fills every other free slot: without it counted, a worker fed by rounds
    /// never saw its queue starved (a burst after idle ran on its shallowest queue).
    pub offered: bool,
    /// The last read returned as many tasks as it asked for, or stopped at the memory
    /// budget: there may be more.
    pub maybe_more: bool,
    /// Tasks may be assigned to it that it has not read: its latest read came back with
    /// tasks, or was made while it held some (and may have left one out for want of
    /// room). Its renewals then keep their leases even while it holds nothing: a task
    /// is assigned with the worker's lease, and eight 50 MB tasks read one at a time
    /// waited longer than that between two renewals of a worker holding nothing at the
    /// renewal's tick (taken back, read again, failed at last).
    pub unread: bool,
    /// What its latest finished read saw: which carried tasks it may take, and how long
    /// their leases surely run (see `blackboard::carried`).
    pub last_read: Option<LastRead>,
    /// Its latest read claimed tasks (migrations/V46): more may wait, and it claims
    /// again as soon as an outcome written gives slots back, without waiting for a
    /// planner's round.
    pub backlog: bool,
    /// A planner's push reached it (see [`PUSHED_POLL`]).
    pub pushed: bool,
    /// Planners record that their pushes fail to reach it (read with its heartbeat): it
    /// polls for its tasks.
    pub wake_unreachable: bool,
    /// When its last read was sent.
    pub read_at: Instant,
    /// When the poll last came due.
    pub polled_at: Instant,
    /// The poll's period now (see [`PUSHED_POLL`]).
    pub poll_every: Duration,
    /// When it last gave slots back (sent outcomes to be written) and has not read new
    /// tasks since: how long the planner takes to refill it is part of the depth.
    pub gave_back: Option<Instant>,
    /// A handler slot went idle with the queue empty since the last refill: the queue,
    /// not the handlers, held the pace back (see `QueueDepth::starved`). True at start:
    /// a new worker's slots are idle, as an idle one's are.
    pub ran_dry: bool,
}

impl Intake {
    /// Polling every `poll` until a push reaches it.
    pub fn new(poll: Duration) -> Self {
        Intake {
            flight: SingleFlight::default(),
            offer: SingleFlight::default(),
            offered: false,
            maybe_more: false,
            unread: false,
            last_read: None,
            backlog: false,
            pushed: false,
            wake_unreachable: false,
            read_at: Instant::now(),
            polled_at: Instant::now(),
            poll_every: poll,
            gave_back: None,
            ran_dry: true,
        }
    }

    /// A read of its assignments found `found` new tasks: a worker woken by pushes that
    /// none has reached yet polls every [`WorkerConfig::poll`] while reads find tasks, and
    /// backs off (doubling) to [`PUSHED_POLL`] while they find none.
    pub fn read_found(&mut self, found: usize, config: &WorkerConfig) {
        let most = PUSHED_POLL.max(config.poll);
        self.poll_every = if config.wake_addr.is_none() {
            config.poll
        } else if self.pushed {
            most
        } else if found > 0 {
            config.poll
        } else {
            (self.poll_every * 2).clamp(config.poll, most)
        };
    }

    /// Whether the safety-net poll is due now (it then counts from now).
    pub fn poll_due(&mut self) -> bool {
        let due = self.polled_at.elapsed() >= self.poll_every;
        if due {
            self.polled_at = Instant::now();
        }
        due
    }

    /// A planner's push reached it: once, it slows its poll down to [`PUSHED_POLL`]
    /// (unless the planners record that pushes fail: then it keeps polling).
    pub fn pushed(&mut self, config: &WorkerConfig) {
        if self.pushed || self.wake_unreachable {
            return;
        }
        tracing::info!(worker = %config.id, "planners reach this worker: it polls every {PUSHED_POLL:?} now");
        self.pushed = true;
        self.poll_every = PUSHED_POLL.max(config.poll);
    }
}

/// What the worker's latest finished read of its assignments saw.
#[derive(Debug, Clone)]
pub(super) struct LastRead {
    /// The snapshot it saw.
    pub snapshot: ReadSnapshot,
    /// When it was sent (local clock).
    pub sent: Instant,
    /// The database's clock while it ran (Unix milliseconds): at or after `sent`.
    pub db_clock_ms: f64,
}

/// Wake-ups that carry tasks: their payloads, in the order received.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Carried(pub Vec<String>);

impl Handler<Carried> for Worker {
    type Result = ();

    fn handle(&mut self, msg: Carried, ctx: &mut Context<Self>) {
        if self.stopping.draining {
            // Still `assigned` in the blackboard: the drain gives them back, a task
            // transfer moves them.
            return;
        }
        let Some(last) = self.intake.last_read.clone() else {
            // No read has finished yet (the first is under way): it finds them.
            self.fetch(ctx);
            return;
        };
        let free_slots = self.capacity().saturating_sub(self.held.count());
        // The planner gave what the blackboard saw free: a starved queue is one that push
        // filled, as for a claim's refill (d2be17f).
        let free_seen = self.free_seen();
        let mut room = self.config.queue_max_bytes as i64 - self.held.bytes();
        let mut holds_nothing = self.held.count() == 0;
        let mut left_over = false;
        let mut new = Vec::new();
        for payload in &msg.0 {
            let carried = match parse_carried(payload) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "a wake-up's tasks cannot be read; reading them from the blackboard");
                    left_over = true;
                    continue;
                }
            };
            for c in carried {
                if last.snapshot.sees(c.xid) {
                    // The latest read saw this version: it took the task, or found it
                    // gone, or left it for the next read.
                    continue;
                }
                let fits = new.len() < free_slots
                    && (c.task.payload_bytes <= room || (holds_nothing && new.is_empty()));
                if !fits {
                    // Still assigned here: a read takes it once there is room.
                    left_over = true;
                    continue;
                }
                if !self.held.ledger.take_carried((c.task.id, c.task.epoch)) {
                    continue;
                }
                let mut task = c.task;
                task.lease_left_ms = c.lease_until_ms - last.db_clock_ms;
                self.held.hold_until(&task, last.sent);
                room -= task.payload_bytes;
                holds_nothing = false;
                new.push(task);
            }
        }
        if left_over {
            self.intake.maybe_more = true;
            self.intake.unread = true;
        }
        // The round filled every slot the blackboard saw free: more may wait. Its next
        // written outcome claims again, as after a claim that took tasks, rather than
        // waiting for a round (whose roster, kept through a backlog, may not see the
        // slots freed meanwhile): in a burst after idle, the workers fed by rounds
        // trickled at their first refill's size while the one that claimed ran deep.
        if !new.is_empty() && new.len() >= free_seen {
            self.intake.backlog = true;
        }
        self.refill(new, free_seen, ctx);
        if left_over {
            self.fetch(ctx);
        } else {
            // A task born assigned to its offered slot (migrations/V62) came this way: it
            // offers again for the next, as after a read.
            self.offer(ctx);
        }
    }
}

/// A worker with a backlog claims again after a written outcome once this share of its
/// capacity is free (a quarter), or sooner when its queue runs short (see
/// [`claim_after_outcome`]).
pub const CLAIM_FREE_SHARE: usize = 4;

/// Whether a worker with a backlog claims after a written outcome, with `free_seen` of
/// its `capacity` free as the blackboard counts them, `queued` tasks in its queue and
/// `concurrency` handlers: once a [`CLAIM_FREE_SHARE`] of its capacity is free, or when
/// its queue holds less than two turns of its handlers. Each claim's read visits every
/// task the worker holds (~2,000 at full depth) to leave out the ones it knows, so a
/// claim after every outcome (~290 tasks a claim in W1 from idle's burst) paid that
/// visit 69 times a burst where 51 do; the queue keeps three quarters of its depth
/// meanwhile, so the handlers never wait on the claim. A small worker (a queue shorter
/// than two turns) claims after every outcome, as before.
pub fn claim_after_outcome(
    free_seen: usize,
    capacity: usize,
    queued: usize,
    concurrency: usize,
) -> bool {
    free_seen * CLAIM_FREE_SHARE >= capacity || queued < 2 * concurrency
}

/// What a claim and read asked for, for what its answer does.
#[derive(Debug, Clone, Copy)]
struct Asked {
    /// Tasks at most.
    limit: usize,
    /// The worker's free slots, by its own count.
    free_slots: usize,
    /// Its free slots as the blackboard counts them (the claim's view).
    free_seen: usize,
    /// Bytes of payload at most.
    budget: i64,
    /// Tasks it told the read it knows, which the read left out (migrations/V71).
    known: usize,
}

impl Worker {
    /// Claims the runnable tasks it may run, up to its free slots, and reads the tasks
    /// assigned to it (up to its capacity) into the queue, in one statement; starts what
    /// fits.
    pub(super) fn fetch(&mut self, ctx: &mut Context<Self>) {
        if self.stopping.draining {
            return;
        }
        // A read in flight: one more follows it (the capacity is looked at then).
        if self.intake.flight.owe() || self.held.count() >= self.capacity() {
            return;
        }
        self.intake.flight.start();
        self.intake.read_at = Instant::now();
        let read = self.held.ledger.start_read();
        let known = self.held.ledger.known();
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let limit = self.capacity();
        // Payloads are held in memory from the read until the handler ends: read only
        // what fits in the budget (one task at least, when nothing is held).
        let room = self.config.queue_max_bytes as i64 - self.held.bytes();
        let holds_nothing = self.held.count() == 0;
        let asked = Asked {
            limit,
            free_slots: limit - self.held.count(),
            free_seen: self.free_seen(),
            budget: room.max(0),
            known: known.len(),
        };
        let sent = Instant::now();
        async move {
            bb.claim_and_read(&id, limit as i64, room, holds_nothing, &known)
                .await
        }
        .into_actor(self)
        .map(move |res, act, ctx| {
            let again = act.intake.flight.end();
            act.liveness.db_result(&res);
            match res {
                Ok(Some(read_back)) => act.read_back(read, read_back, asked, sent, ctx),
                Ok(None) => {}
                Err(e) => {
                    act.stats.failed("worker");
                    tracing::warn!(error = %e, "cannot read assigned tasks; retrying on the next poll");
                }
            }
            if again {
                act.fetch(ctx);
            }
            act.check_drained();
        })
        .spawn(ctx);
    }

    /// The spans of the traced tasks its claim, sent at `sent`, took: the time each was
    /// in queue and its assignment, as a planner's round makes them for the tasks it
    /// assigns. A task the read did not return (past its byte budget) gets none.
    fn trace_claims(&self, read_back: &AssignedRead, sent: Instant) {
        let read: HashMap<Uuid, &AssignedTask> =
            read_back.tasks.iter().map(|t| (t.id, t)).collect();
        let given: Vec<crate::trace::Assigned> = read_back
            .traced_claims
            .iter()
            .filter_map(|(id, runnable_at)| {
                let task = read.get(id)?;
                Some(crate::trace::Assigned {
                    task: *id,
                    kind: task.kind.clone(),
                    traceparent: task.traceparent?,
                    runnable_at: *runnable_at,
                    worker: self.config.id.clone(),
                })
            })
            .collect();
        let ended = SystemTime::now();
        let started = ended.checked_sub(sent.elapsed()).unwrap_or(ended);
        tokio::task::spawn_blocking(move || {
            crate::trace::assignments(crate::trace::AssignedBy::Claim, started, ended, &given);
        });
    }

    /// A read (the ledger's `read`, sent at `sent`, as `asked`) came back: what it did
    /// not have yet goes to the queue.
    fn read_back(
        &mut self,
        read: super::ledger::Read,
        read_back: AssignedRead,
        Asked {
            limit,
            free_slots,
            free_seen,
            budget,
            known,
        }: Asked,
        sent: Instant,
        ctx: &mut Context<Self>,
    ) {
        // Tasks wait: it took some, or the blackboard still counted its slots taken by
        // tasks whose outcomes were not written yet. Either way its next written outcome
        // claims again.
        self.intake.backlog = read_back.claimed > 0 || read_back.no_room;
        if self.intake.backlog {
            self.intake.offered = false;
        }
        self.metrics
            .claimed
            .add(u64::try_from(read_back.claimed).unwrap_or(0));
        if !read_back.traced_claims.is_empty() && crate::trace::enabled() {
            self.trace_claims(&read_back, sent);
        }
        let tasks = read_back.tasks;
        let bytes: i64 = tasks.iter().map(|t| t.payload_bytes).sum();
        // As many as it asked for, counting the ones it knows, which the read left out
        // (V71): a read of them all would have returned those still assigned here, and
        // counting the rest too errs toward one read more. A full queue's worth: more
        // may wait once the queue empties. Near the budget, the next task may not have
        // fitted.
        self.intake.maybe_more = tasks.len() + known >= limit || bytes * 2 > budget;
        self.intake.unread = !tasks.is_empty() || free_slots < limit;
        let new = self
            .held
            .ledger
            .read_returned(read, tasks, |t| (t.id, t.epoch));
        self.intake.read_found(new.len(), &self.config);
        for t in &new {
            self.held.hold_until(t, sent);
        }
        self.intake.last_read = Some(LastRead {
            snapshot: read_back.snapshot,
            sent,
            db_clock_ms: read_back.db_clock_ms,
        });
        self.refill(new, free_seen, ctx);
        self.offer(ctx);
    }

    /// Offers one slot to new tasks (`artex.offer_slot`, migrations/V62), so that the next
    /// task submitted is born assigned to it and comes carried in its wake-up: when nothing
    /// waited for it at its last read (no backlog) and what it took started at once (its
    /// queue is empty; a backlog's rounds fill it). Not while it drains, nor while planners
    /// cannot reach it (a task given to it would wait for its poll), nor with fewer than
    /// two free slots (the blackboard checks that too, and that no task waits for it).
    /// One call at a time; one that finds an offer out writes nothing.
    fn offer(&mut self, ctx: &mut Context<Self>) {
        let free = self.capacity().saturating_sub(self.held.ledger.held());
        if self.intake.backlog
            || !self.held.queue.is_empty()
            || self.stopping.draining
            || self.intake.wake_unreachable
            || free < 2
            || !self.intake.offer.try_start()
        {
            return;
        }
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        async move { bb.offer_slot(&id).await }
            .into_actor(self)
            .map(|res, act, _ctx| {
                act.intake.offer.end();
                match res {
                    Ok(out) => act.intake.offered = out,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot offer a slot to new tasks; the next read offers again");
                    }
                }
            })
            .spawn(ctx);
    }

    /// The safety-net poll: a read of its assignments, unless it read less than a poll
    /// period ago.
    pub(super) fn poll(&mut self, ctx: &mut Context<Self>) {
        if self.intake.read_at.elapsed() < self.intake.poll_every {
            return;
        }
        self.fetch(ctx);
    }

    /// New tasks it took (read, or carried by a wake-up) into the queue, and started
    /// what fits. `free_seen`: its free slots when they were asked for or given, as the
    /// blackboard counted them ([`Worker::free_seen`]).
    pub(super) fn refill(
        &mut self,
        new: Vec<AssignedTask>,
        free_seen: usize,
        ctx: &mut Context<Self>,
    ) {
        if new.is_empty() {
            return;
        }
        if let Some(at) = self.intake.gave_back.take() {
            self.depth.refilled(at.elapsed());
        }
        // Every free slot filled after the handlers ran dry: a backlog larger than the
        // queue. Deepen it now.
        if std::mem::take(&mut self.intake.ran_dry) && new.len() >= free_seen {
            if let Some(depth) = self.depth.starved() {
                tracing::debug!(worker = %self.config.id, depth,
                    "local queue deepened: refills run dry");
                self.beat_now(ctx);
            }
        }
        if self.held.turns.any() {
            for t in &new {
                self.held.turns.arrived(t);
            }
        }
        self.held.queue.extend(new);
        self.pump(ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{claim_after_outcome, Intake, WorkerConfig, PUSHED_POLL};

    fn config(wake_addr: Option<&str>) -> WorkerConfig {
        let ms = Duration::from_millis;
        WorkerConfig {
            id: "h:1:a".into(),
            host: "h".into(),
            version: "test".into(),
            http_addr: None,
            wake_addr: wake_addr.map(str::to_string),
            concurrency: 1,
            prefetch: None,
            queue_max_bytes: 1 << 20,
            lease: ms(30_000),
            heartbeat: ms(2_000),
            poll: ms(200),
            default_timeout: ms(1_000),
            cancel_grace: ms(1_000),
            retry_base: ms(100),
            retry_cap: ms(1_000),
        }
    }

    #[test]
    fn a_worker_no_push_has_reached_backs_off_while_reads_find_nothing() {
        let c = config(Some("h:8080"));
        let mut intake = Intake::new(c.poll);
        let mut seen = Vec::new();
        for _ in 0..6 {
            intake.read_found(0, &c);
            seen.push(intake.poll_every.as_millis());
        }
        assert_eq!(seen, [400, 800, 1600, 2000, 2000, 2000]);
        intake.read_found(3, &c);
        assert_eq!(
            intake.poll_every, c.poll,
            "reads that find tasks poll fast again"
        );
    }

    #[test]
    fn pushes_slow_the_poll_unless_the_planners_say_they_fail() {
        let c = config(Some("h:8080"));
        let mut intake = Intake::new(c.poll);
        intake.pushed(&c);
        intake.read_found(5, &c);
        assert_eq!(intake.poll_every, PUSHED_POLL);
        let mut unreachable = Intake::new(c.poll);
        unreachable.wake_unreachable = true;
        unreachable.pushed(&c);
        unreachable.read_found(5, &c);
        assert_eq!(
            unreachable.poll_every, c.poll,
            "a worker pushes fail to reach polls on"
        );
        let listening = config(None);
        let mut intake = Intake::new(listening.poll);
        intake.read_found(0, &listening);
        assert_eq!(
            intake.poll_every, listening.poll,
            "a LISTEN worker's poll is the net"
        );
    }

    #[test]
    fn a_busy_worker_claims_once_a_quarter_of_its_capacity_is_free() {
        // A default worker at full depth: 10 handlers, 2,010 slots.
        assert!(!claim_after_outcome(290, 2010, 1700, 10));
        assert!(!claim_after_outcome(502, 2010, 1490, 10));
        assert!(claim_after_outcome(503, 2010, 1490, 10));
        // Its queue short of two turns of its handlers: it claims whatever is free.
        assert!(claim_after_outcome(1, 2010, 19, 10));
        assert!(!claim_after_outcome(1, 2010, 20, 10));
        // A small worker (no local queue to speak of) claims after every outcome.
        assert!(claim_after_outcome(1, 4, 0, 4));
        assert!(claim_after_outcome(1, 40, 7, 4));
    }
}

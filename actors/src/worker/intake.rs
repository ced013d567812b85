//! How tasks reach the worker: its reads of what is assigned to it, and the tasks the
//! planner's wake-up carries (see `blackboard::carried`), which it starts as they
//! arrive, without reading them first. Which it may take, and how long their
//! leases surely run, it judges from what its latest finished read saw: a task whose row
//! version that read could see is left to the reads (never taken twice), and a lease's
//! end is placed on the local clock through that read (sent at a known instant, the
//! database's clock read during it), erring early as every lease estimate here does.

use std::time::Instant;

use actix::prelude::*;

use super::Worker;
use crate::blackboard::carried::{parse_carried, ReadSnapshot};
use crate::blackboard::AssignedTask;

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
        if self.draining {
            // Still `assigned` in the blackboard: the drain gives them back, a task
            // transfer moves them.
            return;
        }
        let Some(last) = self.last_read.clone() else {
            // No read has finished yet (the first is under way): it finds them.
            self.fetch(ctx);
            return;
        };
        let free_slots = self.capacity().saturating_sub(self.held());
        let mut room = self.config.queue_max_bytes as i64 - self.held_bytes();
        let mut holds_nothing = self.held() == 0;
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
                if !self.ledger.take_carried((c.task.id, c.task.epoch)) {
                    continue;
                }
                let mut task = c.task;
                task.lease_left_ms = c.lease_until_ms - last.db_clock_ms;
                self.hold_until(&task, last.sent);
                room -= task.payload_bytes;
                holds_nothing = false;
                new.push(task);
            }
        }
        if left_over {
            self.maybe_more = true;
        }
        self.refill(new, free_slots, ctx);
        if left_over {
            self.fetch(ctx);
        }
    }
}

impl Worker {
    /// Reads the tasks assigned to it (up to its capacity) into the queue and starts
    /// what fits.
    pub(super) fn fetch(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            return;
        }
        if self.fetching {
            self.fetch_again = true;
            return;
        }
        if self.held() >= self.capacity() {
            return;
        }
        self.fetching = true;
        self.read_at = Instant::now();
        self.fetch_again = false;
        let read = self.ledger.start_read();
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let limit = self.capacity();
        // Payloads are held in memory from the read until the handler ends: read only
        // what fits in the budget (one task at least, when nothing is held).
        let room = self.config.queue_max_bytes as i64 - self.held_bytes();
        let holds_nothing = self.held() == 0;
        let budget = room.max(0);
        let free_slots = limit - self.held();
        let sent = Instant::now();
        async move {
            bb.read_assigned(&id, limit as i64, room, holds_nothing)
                .await
        }
        .into_actor(self)
        .map(move |res, act, ctx| {
            act.fetching = false;
            act.db_result(&res);
            match res {
                Ok(Some(read_back)) => {
                    let tasks = read_back.tasks;
                    let bytes: i64 = tasks.iter().map(|t| t.payload_bytes).sum();
                    // Near the budget, the next task may not have fitted.
                    act.maybe_more = tasks.len() == limit || bytes * 2 > budget;
                    let new = act.ledger.read_returned(read, tasks, |t| (t.id, t.epoch));
                    act.read_found(new.len());
                    for t in &new {
                        act.hold_until(t, sent);
                    }
                    act.last_read = Some(LastRead {
                        snapshot: read_back.snapshot,
                        sent,
                        db_clock_ms: read_back.db_clock_ms,
                    });
                    act.refill(new, free_slots, ctx);
                }
                Ok(None) => {}
                Err(e) => {
                    act.stats.failed("worker");
                    tracing::warn!(error = %e, "cannot read assigned tasks; retrying on the next poll");
                }
            }
            if act.fetch_again {
                act.fetch(ctx);
            }
            act.check_drained();
        })
        .spawn(ctx);
    }

    /// New tasks it took (read, or carried by a wake-up) into the queue, and started
    /// what fits. `free_slots`: its free slots when they were asked for.
    pub(super) fn refill(
        &mut self,
        new: Vec<AssignedTask>,
        free_slots: usize,
        ctx: &mut Context<Self>,
    ) {
        if new.is_empty() {
            return;
        }
        if let Some(at) = self.gave_back.take() {
            self.depth.refilled(at.elapsed());
        }
        // Every free slot filled after the handlers ran dry: a backlog larger than the
        // queue. Deepen it now.
        if std::mem::take(&mut self.ran_dry) && new.len() >= free_slots {
            if let Some(depth) = self.depth.starved() {
                tracing::debug!(worker = %self.config.id, depth,
                    "local queue deepened: refills run dry");
                self.beat_again = self.heartbeating;
                self.heartbeat(ctx);
            }
        }
        self.queue.extend(new);
        self.pump(ctx);
    }
}

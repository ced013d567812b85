//! Tasks carried by the planner's wake-up (see `blackboard::carried`): the worker starts
//! them as they arrive, without reading them first. Which it may take, and how long their
//! leases surely run, it judges from what its latest finished read saw: a task whose row
//! version that read could see is left to the reads (never taken twice), and a lease's
//! end is placed on the local clock through that read (sent at a known instant, the
//! database's clock read during it), erring early as every lease estimate here does.

use std::time::Instant;

use actix::prelude::*;

use super::Worker;
use crate::blackboard::carried::{parse_carried, ReadSnapshot};

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
            // Still `assigned` in the blackboard: the drain gives them back, a handover
            // moves them.
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

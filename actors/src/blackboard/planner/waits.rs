//! The Scheduler's statement on flows' waits: end the due ones (timers succeed, signal
//! timeouts time out or succeed as the wait says) in one call of `artex.fire_due_waits`
//! (migrations/V40), which locks them `for update skip locked` and requires each still
//! blocked: with several planners, each wait ends once. And when the next thing the
//! Scheduler has to do is due: the soonest of the schedules' next slots and the waits'
//! due times.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PlannerBoard;
use crate::error::Result;

const FIRE_DUE_WAITS: &str =
    "select task_id, flow_id, outcome from artex.fire_due_waits($1::timestamptz, $2, $3)";

// Whole milliseconds (rounded up) from now (the database's clock, read as the statement
// runs) to the soonest slot of a schedule that is not paused, or due time of a wait not
// ended (`flow_waits_due` holds exactly those); NULL when there is none. Negative when
// one is past due: another planner holds it, or its fire failed.
const NEXT_DUE_MS: &str = "select ceil((extract(epoch from least(
        (select min(next_slot) from artex.schedules where not paused),
        (select min(due_at) from artex.flow_waits where due_at is not null and ended_at is null)
    ) - clock_timestamp()) * 1000))::int8";

/// A wait the Scheduler ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitEnded {
    /// The wait's task.
    pub task: Uuid,
    /// Its flow.
    pub flow: Uuid,
    /// `timer` (succeeded at its time), `timeout` (ended timeout) or `timeout: succeeded`
    /// (timed out, and its flow goes on).
    pub outcome: String,
}

impl PlannerBoard {
    /// How long until the soonest schedule slot or wait is due, in milliseconds (negative
    /// when one is past due); `None` when nothing is scheduled or waiting.
    pub async fn next_due_ms(&self) -> Result<Option<i64>> {
        let client = self.bb.client().await?;
        Ok(client.query_one(NEXT_DUE_MS, &[]).await?.try_get(0)?)
    }

    /// Ends at most `limit` due waits, as `actor`, in one transaction; `now` moves the
    /// clock for tests (the database's by default).
    pub async fn fire_due_waits(
        &self,
        now: Option<DateTime<Utc>>,
        actor: &str,
        limit: i32,
    ) -> Result<Vec<WaitEnded>> {
        let client = self.bb.client().await?;
        client
            .query(FIRE_DUE_WAITS, &[&now, &actor, &limit])
            .await?
            .iter()
            .map(|r| {
                Ok(WaitEnded {
                    task: r.try_get(0)?,
                    flow: r.try_get(1)?,
                    outcome: r.try_get(2)?,
                })
            })
            .collect()
    }
}

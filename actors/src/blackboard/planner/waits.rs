//! The Scheduler's statement on flows' waits: end the due ones (timers succeed, signal
//! timeouts time out or succeed as the wait says) in one call of `artex.fire_due_waits`
//! (migrations/V40), which locks them `for update skip locked` and requires each still
//! blocked: with several planners, each wait ends once.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PlannerBoard;
use crate::error::Result;

const FIRE_DUE_WAITS: &str =
    "select task_id, flow_id, outcome from artex.fire_due_waits($1::timestamptz, $2, $3)";

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

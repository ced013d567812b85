//! What the planner's spans need of the tasks a round assigned (docs/tracing.md): read
//! only when tracing is on, after the round's commit, so the round's own statements
//! and their plans are the same with tracing on or off.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PlannerBoard;
use crate::error::Result;

// By primary key; the tasks without a context (not traced) are left out.
const TRACED: &str = "select id, kind, traceparent, run_at from artex.tasks
    where id = any($1::uuid[]) and traceparent is not null";

/// A traced task a round assigned: (id, kind, traceparent, runnable since).
pub type TracedTask = (Uuid, String, String, DateTime<Utc>);

impl PlannerBoard {
    /// Of `ids`, the tasks that carry a trace context, with their kind and the time they
    /// became runnable (`run_at`).
    pub async fn traced(&self, ids: &[Uuid]) -> Result<Vec<TracedTask>> {
        let client = self.bb.client().await?;
        client
            .query(TRACED, &[&ids])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
            .collect()
    }
}

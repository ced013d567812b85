//! What a worker's attempt spans need of the tasks it took: their trace contexts, read
//! only with tracing on (see `trace/lookup.rs`).

use uuid::Uuid;

use super::WorkerBoard;
use crate::error::Result;

// By primary key; the tasks without a context (not traced) are left out.
const CONTEXTS: &str =
    "select id, traceparent from artex.tasks where id = any($1::uuid[]) and traceparent is not null";

impl WorkerBoard {
    /// Of `ids`, the tasks that carry a trace context, with it.
    pub async fn trace_contexts(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, String)>> {
        let client = self.bb.client().await?;
        client
            .query(CONTEXTS, &[&ids])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}

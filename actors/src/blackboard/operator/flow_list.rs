//! A page of flows, newest first, each with its state and its tasks' counts by status
//! (`artex flow list`): the flows' own rows walked down the primary key (flow ids are
//! time-ordered UUIDv7s), each flow's tasks counted through `tasks_flow_id`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::OperatorBoard;
use crate::blackboard::flows::FlowState;
use crate::blackboard::TaskStatus;
use crate::error::{Error, Result};

/// One flow of a page: what `flow show` says of it, without its tasks.
#[derive(Debug, Clone, Serialize)]
pub struct FlowSummary {
    /// Flow id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Submitted.
    pub created_at: DateTime<Utc>,
    /// Overall state.
    pub state: FlowState,
    /// How many tasks are in each status.
    pub counts: BTreeMap<String, usize>,
}

// Keyset pagination: ids below `$1` (the last of the previous page; the largest uuid when
// none, so one plan serves both), newest first, at most `$2`; then each flow's counts.
pub(super) const FLOWS_PAGE: &str = "with page as materialized (
        select id, name, created_at from artex.flows
        where id < coalesce($1::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
        order by id desc limit $2
    )
    select p.id, p.name, p.created_at,
        coalesce((select jsonb_object_agg(s, n) from (
            select t.status::text s, count(*) n from artex.tasks t
            where t.flow_id = p.id group by 1) c), '{}')
    from page p order by p.id desc";

impl OperatorBoard {
    /// At most `limit` flows with ids below `after` (all when `None`), newest first.
    pub async fn flows_page(&self, after: Option<Uuid>, limit: i64) -> Result<Vec<FlowSummary>> {
        let client = self.bb.client().await?;
        let rows = client.query(FLOWS_PAGE, &[&after, &limit]).await?;
        rows.iter()
            .map(|r| {
                let counts: BTreeMap<String, usize> =
                    serde_json::from_value(r.try_get::<_, serde_json::Value>(3)?).map_err(|e| {
                        Error::Invalid(format!("unexpected flow counts from the database: {e}"))
                    })?;
                let statuses = counts
                    .iter()
                    .filter_map(|(s, n)| Some((s.parse::<TaskStatus>().ok()?, *n)))
                    .flat_map(|(s, n)| std::iter::repeat_n(s, n));
                Ok(FlowSummary {
                    id: r.try_get(0)?,
                    name: r.try_get(1)?,
                    created_at: r.try_get(2)?,
                    state: FlowState::of(statuses),
                    counts,
                })
            })
            .collect()
    }
}

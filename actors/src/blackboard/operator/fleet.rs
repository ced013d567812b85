//! The fleet as `artex serve`'s `/metrics` shows it: one call of `artex.fleet_metrics`
//! (migrations/V42__fleet_metrics.sql), which first folds the tasks ended since the last
//! call into the per-kind outcome counters, then reads tasks by kind and status, the
//! oldest runnable task's age per kind, workers, pauses and limits.

use super::OperatorBoard;
use crate::error::Result;

/// Waiting tasks (pending, blocked, paused) are counted up to this many per status, as
/// the statistics are ([`super::STATUS_COUNT_CAP`]): the walk costs ~0.1 s at the cap.
pub const FLEET_COUNT_CAP: i64 = super::STATUS_COUNT_CAP;

/// History rows folded into the outcome counters per call, at most: a first call on a
/// long kept history catches up over several.
pub const FOLD_BATCH: i32 = 200_000;

const FLEET: &str = "select metric, kind, label, value from artex.fleet_metrics($1, $2)";

/// One sample of the fleet: what it measures (`tasks`, `oldest_runnable_age_seconds`,
/// `ended`, `workers`, `kind_workers`, `kind_paused`, `counts_capped`, `limit_*`), for
/// which kind, with which other label (a status, a worker state, an outcome).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSample {
    /// What it measures.
    pub metric: String,
    /// Its kind, if it is per kind.
    pub kind: Option<String>,
    /// Its status, state or outcome, if it has one.
    pub label: Option<String>,
    /// Its value.
    pub value: f64,
}

impl OperatorBoard {
    /// The fleet's samples (one statement; it writes only the outcome counters).
    pub async fn fleet_metrics(&self) -> Result<Vec<FleetSample>> {
        let client = self.bb.client().await?;
        let rows = client
            .query(FLEET, &[&FLEET_COUNT_CAP, &FOLD_BATCH])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(FleetSample {
                    metric: r.try_get(0)?,
                    kind: r.try_get(1)?,
                    label: r.try_get(2)?,
                    value: r.try_get(3)?,
                })
            })
            .collect()
    }
}

//! A schedule as the blackboard holds it (`artex.schedules`, migrations/V18), read by the
//! operator's statements (`operator/schedules.rs`) and the Scheduler's
//! (`planner/schedules.rs`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::schedule::CatchUp;

/// The columns [`schedule_from_row`] reads, in its order: a macro, so that each
/// statement naming them is one `const` (`concat!`).
macro_rules! schedule_columns {
    () => {
        "name, cron, timezone, kind, payload, priority, max_retries, timeout_ms, shard_key,
         catch_up, paused, next_slot, last_slot, last_task, fired, created_at, created_by,
         updated_at, updated_by"
    };
}
pub(crate) use schedule_columns;

/// How many columns `schedule_columns!` names: what a statement selects after them
/// starts at this index.
pub(crate) const SCHEDULE_COLUMN_COUNT: usize = 19;

/// A schedule: its cron expression and time zone, the task each slot submits, and where
/// it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleRow {
    /// Its name (unique).
    pub name: String,
    /// The cron expression (five fields, or a nickname such as `@hourly`).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// The kind of the task each slot submits.
    pub kind: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// Its priority.
    pub priority: i32,
    /// Its retries (the table's default, 3, when `None`).
    pub max_retries: Option<i32>,
    /// Its per-attempt timeout, ms.
    pub timeout_ms: Option<i32>,
    /// Its shard key.
    pub shard_key: Option<String>,
    /// What happens to slots missed while no planner ran.
    pub catch_up: CatchUp,
    /// Paused: no slot fires; on resume, the slots of the pause are skipped.
    pub paused: bool,
    /// The next slot to fire (the first not yet fired or skipped); `None` when the
    /// expression has no slot left.
    pub next_slot: Option<DateTime<Utc>>,
    /// The last slot fired.
    pub last_slot: Option<DateTime<Utc>>,
    /// The task the last slot submitted.
    pub last_task: Option<Uuid>,
    /// How many slots fired.
    pub fired: i64,
    /// When it was added, and by whom.
    pub created_at: DateTime<Utc>,
    /// Who added it.
    pub created_by: String,
    /// When an operator last changed it (paused, resumed).
    pub updated_at: DateTime<Utc>,
    /// Who did.
    pub updated_by: String,
}

/// A row of `schedule_columns!`.
pub(crate) fn schedule_from_row(r: &Row) -> Result<ScheduleRow> {
    let catch_up: String = r.try_get(9)?;
    Ok(ScheduleRow {
        name: r.try_get(0)?,
        cron: r.try_get(1)?,
        timezone: r.try_get(2)?,
        kind: r.try_get(3)?,
        payload: r.try_get(4)?,
        priority: r.try_get(5)?,
        max_retries: r.try_get(6)?,
        timeout_ms: r.try_get(7)?,
        shard_key: r.try_get(8)?,
        catch_up: catch_up.parse().map_err(Error::Invalid)?,
        paused: r.try_get(10)?,
        next_slot: r.try_get(11)?,
        last_slot: r.try_get(12)?,
        last_task: r.try_get(13)?,
        fired: r.try_get(14)?,
        created_at: r.try_get(15)?,
        created_by: r.try_get(16)?,
        updated_at: r.try_get(17)?,
        updated_by: r.try_get(18)?,
    })
}

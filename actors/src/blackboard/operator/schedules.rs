//! An operator's statements on schedules (migrations/V18): add one, list them, read one,
//! pause, resume, remove. Each write names its actor and reason (if one is given) through
//! `artex.set_context` in the same statement, and the table's trigger records it in
//! `artex.schedule_changes`.

use chrono::{DateTime, Utc};

use super::OperatorBoard;
use crate::blackboard::schedules::{schedule_columns, schedule_from_row, ScheduleRow};
use crate::error::{Error, Result};
use crate::schedule::{Cadence, NewSchedule};

/// At most this many schedules are listed: far more than a fleet keeps, and a bound on
/// what one answer holds.
pub const SCHEDULES_LISTED: i64 = 10_000;

// The database's clock: a schedule's first slot is the first after the moment it is
// added (or resumed) as every planner reads it.
const NOW: &str = "select now()";

// Added with its first slot (`$13`, computed by the caller from the clock above); a name
// taken writes nothing (the caller says so), the actor recorded by the audit trigger.
const INSERT: &str = concat!(
    "insert into artex.schedules (name, cron, timezone, kind, payload, priority,
         max_retries, timeout_ms, shard_key, catch_up, next_slot, created_by, updated_by)
     select $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $1, $1
     from artex.set_context($1, $2) ctx
     where ctx
     on conflict (name) do nothing
     returning ",
    schedule_columns!()
);

// Every schedule by name (the primary key's order), bounded.
const LIST: &str = concat!(
    "select ",
    schedule_columns!(),
    " from artex.schedules order by name limit $1"
);

const ONE: &str = concat!(
    "select ",
    schedule_columns!(),
    " from artex.schedules where name = $1"
);

// Paused: no slot fires. Pausing a paused schedule changes nothing (nor who changed it
// last). (`ctx`, the context's one column, is the only name the `from` adds: the
// columns need no qualifying.)
const PAUSE: &str = concat!(
    "update artex.schedules s
     set paused = true,
         updated_at = case when s.paused then s.updated_at else now() end,
         updated_by = case when s.paused then s.updated_by else $1 end
     from artex.set_context($1, $2) ctx
     where ctx and s.name = $3
     returning ",
    schedule_columns!()
);

// Resumed: its next slot is the first after now (`$4`, computed from the clock read with
// the row): the slots of the pause are skipped, whatever its catch-up rule, which is for
// slots missed while no planner ran. Resuming a running schedule changes nothing.
const RESUME_READ: &str = "select cron, timezone, now() from artex.schedules
    where name = $1";

const RESUME: &str = concat!(
    "update artex.schedules s
     set paused = false,
         next_slot = case when s.paused then $4 else s.next_slot end,
         updated_at = case when s.paused then now() else s.updated_at end,
         updated_by = case when s.paused then $1 else s.updated_by end
     from artex.set_context($1, $2) ctx
     where ctx and s.name = $3
     returning ",
    schedule_columns!()
);

const REMOVE: &str = "delete from artex.schedules s
    using artex.set_context($1, $2) ctx
    where ctx and s.name = $3
    returning s.name";

impl OperatorBoard {
    /// Adds `schedule` as `actor`; its first slot is the first after now. Checks its
    /// rules first ([`NewSchedule::check`]: `Invalid` naming the field); the task's
    /// rules against the blackboard (known kinds, payload limit) are the caller's, as
    /// for a submission. `Refused` if a schedule has the name already.
    pub async fn add_schedule(&self, schedule: &NewSchedule, actor: &str) -> Result<ScheduleRow> {
        let cadence = schedule
            .check()
            .map_err(|r| Error::Invalid(format!("{}: {}", r.field, r.why)))?;
        schedule.task.validate()?;
        let client = self.bb.client().await?;
        let now: DateTime<Utc> = client.query_one(NOW, &[]).await?.try_get(0)?;
        let next = cadence.next_after(now);
        let t = &schedule.task;
        let row = client
            .query_opt(
                INSERT,
                &[
                    &actor,
                    &None::<&str>,
                    &schedule.name,
                    &schedule.cron,
                    &cadence.time_zone(),
                    &t.kind,
                    &t.payload,
                    &t.priority,
                    &t.max_retries,
                    &t.timeout_ms,
                    &t.shard_key,
                    &schedule.catch_up.as_str(),
                    &next,
                ],
            )
            .await?;
        match row {
            Some(row) => schedule_from_row(&row),
            None => Err(Error::Refused(format!(
                "a schedule named {:?} exists already; remove it first (artex schedule \
                 remove {}) or choose another name",
                schedule.name, schedule.name
            ))),
        }
    }

    /// Every schedule (at most [`SCHEDULES_LISTED`]), by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        let client = self.bb.client().await?;
        let rows = client.query(LIST, &[&SCHEDULES_LISTED]).await?;
        rows.iter().map(schedule_from_row).collect()
    }

    /// One schedule, or `ScheduleNotFound`.
    pub async fn schedule(&self, name: &str) -> Result<ScheduleRow> {
        let client = self.bb.client().await?;
        match client.query_opt(ONE, &[&name]).await? {
            Some(row) => schedule_from_row(&row),
            None => Err(Error::ScheduleNotFound(name.to_string())),
        }
    }

    /// Pauses a schedule (no slot fires until it is resumed); `ScheduleNotFound` for an
    /// unknown name. Returns it as it is now.
    pub async fn pause_schedule(
        &self,
        name: &str,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<ScheduleRow> {
        let client = self.bb.client().await?;
        match client.query_opt(PAUSE, &[&actor, &reason, &name]).await? {
            Some(row) => schedule_from_row(&row),
            None => Err(Error::ScheduleNotFound(name.to_string())),
        }
    }

    /// Resumes a paused schedule: its next slot is the first after now (the slots of the
    /// pause are skipped); `ScheduleNotFound` for an unknown name. Returns it as it is
    /// now.
    pub async fn resume_schedule(
        &self,
        name: &str,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<ScheduleRow> {
        let client = self.bb.client().await?;
        let Some(row) = client.query_opt(RESUME_READ, &[&name]).await? else {
            return Err(Error::ScheduleNotFound(name.to_string()));
        };
        let (cron, timezone): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let now: DateTime<Utc> = row.try_get(2)?;
        let next = Cadence::read(&cron, &timezone)
            .map_err(|(field, why)| {
                Error::Invalid(format!(
                    "schedule {name:?} cannot be resumed: its {field}: {why}"
                ))
            })?
            .next_after(now);
        match client
            .query_opt(RESUME, &[&actor, &reason, &name, &next])
            .await?
        {
            Some(row) => schedule_from_row(&row),
            None => Err(Error::ScheduleNotFound(name.to_string())),
        }
    }

    /// Removes a schedule (the tasks it submitted stay); `ScheduleNotFound` for an
    /// unknown name.
    pub async fn remove_schedule(&self, name: &str, actor: &str, reason: Option<&str>) -> Result {
        let client = self.bb.client().await?;
        match client.query_opt(REMOVE, &[&actor, &reason, &name]).await? {
            Some(_) => Ok(()),
            None => Err(Error::ScheduleNotFound(name.to_string())),
        }
    }
}

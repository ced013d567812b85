//! The Scheduler's statements: take one due schedule (`for update skip locked`: of
//! several planners, one takes it, the others pass it by), fire its due slots through
//! `artex.submit` with each slot's unique key, move it past them, commit. One transaction
//! per schedule on a pooled connection; see migrations/V20__schedules.sql.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PlannerBoard;
use crate::blackboard::schedules::{schedule_columns, schedule_from_row, SCHEDULE_COLUMN_COUNT};
use crate::blackboard::sql::Tx;
use crate::error::Result;
use crate::schedule::{slot_key, Cadence, SLOT_KEY_WINDOW};

// The due schedule first due, locked, that this pass has not dealt with yet (`$2`: a
// schedule whose fire failed is not taken again in the same pass); with the clock
// (`$1`, the database's by default) every planner reads the same.
const CLAIM_DUE: &str = concat!(
    "select ",
    schedule_columns!(),
    ", coalesce($1::timestamptz, now())
    from artex.schedules
    where not paused and next_slot <= coalesce($1::timestamptz, now())
      and name <> all($2::text[])
    order by next_slot
    limit 1
    for update skip locked"
);

// One slot's task, through the one submission path (`artex.submit`, V17): the kind need
// not be declared yet (the task waits for its workers); the slot's unique key makes a
// second submission of the slot return the first task instead.
const FIRE: &str = "select id, duplicate from artex.submit($1::text, $2::jsonb, $3::int4, null,
    $4::int4, $5::int4, $6::text, $7::text, make_interval(secs => $8::float8), true,
    $9::text, $10::text)";

// The schedule moved past the slots dealt with. Not an operator's change: no audit row
// (the trigger watches `paused`), `updated_at` unchanged.
const ADVANCE: &str = "update artex.schedules
    set next_slot = $2, last_slot = coalesce($3, last_slot),
        last_task = coalesce($4, last_task), fired = fired + $5
    where name = $1";

/// One slot fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredSlot {
    /// The slot.
    pub slot: DateTime<Utc>,
    /// Its task.
    pub task: Uuid,
    /// The slot's task existed already (its unique key was taken): nothing was written.
    pub duplicate: bool,
}

/// What one schedule's turn did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleTurn {
    /// The schedule.
    pub name: String,
    /// The slots fired, oldest first.
    pub fired: Vec<FiredSlot>,
    /// Due slots skipped by its catch-up rule.
    pub skipped: bool,
    /// Where it stands now: its next slot.
    pub next_slot: Option<DateTime<Utc>>,
    /// Its turn failed (the transaction was rolled back: nothing fired, it stays due):
    /// why. Or its stored expression or time zone could not be read: then it is moved
    /// to no next slot, so that it stops coming back.
    pub error: Option<String>,
}

impl PlannerBoard {
    /// Takes the first due schedule not in `passed` that no other planner holds, fires
    /// its due slots (as `actor`) and moves it past them, in one transaction; `None`
    /// when no such schedule is due. `now` moves the clock for tests.
    pub async fn fire_due_schedule(
        &self,
        now: Option<DateTime<Utc>>,
        passed: &[String],
        actor: &str,
    ) -> Result<Option<ScheduleTurn>> {
        let tx = Tx::new(self.bb.client().await?);
        let (begun, row) =
            futures_util::future::join(tx.begin(), tx.query_opt(CLAIM_DUE, &[&now, &passed])).await;
        begun?;
        let Some(row) = row? else {
            tx.commit().await?;
            return Ok(None);
        };
        let schedule = schedule_from_row(&row)?;
        let now: DateTime<Utc> = row.try_get(SCHEDULE_COLUMN_COUNT)?;
        let name = schedule.name.clone();
        let mut turn = ScheduleTurn {
            name: name.clone(),
            fired: Vec::new(),
            skipped: false,
            next_slot: None,
            error: None,
        };
        let cadence = match Cadence::read(&schedule.cron, &schedule.timezone) {
            Ok(c) => c,
            Err((field, why)) => {
                turn.error = Some(format!("its {field}: {why}; it fires no more"));
                let none = None::<DateTime<Utc>>;
                tx.execute(ADVANCE, &[&name, &none, &none, &None::<Uuid>, &0i64])
                    .await?;
                tx.commit().await?;
                return Ok(Some(turn));
            }
        };
        let Some(first) = schedule.next_slot else {
            tx.commit().await?;
            return Ok(Some(turn));
        };
        let due = cadence.due(first, now, schedule.catch_up);
        turn.skipped = due.skipped;
        turn.next_slot = due.next;
        let window = SLOT_KEY_WINDOW.as_secs_f64();
        let keys: Vec<String> = due.fire.iter().map(|s| slot_key(&name, *s)).collect();
        let reasons: Vec<String> = due
            .fire
            .iter()
            .map(|s| format!("schedule {name}: slot {}", s.to_rfc3339()))
            .collect();
        // Pipelined on the one connection: the answers come back in order.
        let (conn, schedule, window) = (&tx, &schedule, &window);
        let fires = keys.iter().zip(&reasons).map(|(key, reason)| async move {
            conn.query_one(
                FIRE,
                &[
                    &schedule.kind,
                    &schedule.payload,
                    &schedule.priority,
                    &schedule.max_retries,
                    &schedule.timeout_ms,
                    &schedule.shard_key,
                    key,
                    window,
                    &actor,
                    reason,
                ],
            )
            .await
        });
        let answers = futures_util::future::join_all(fires).await;
        for (slot, answer) in due.fire.iter().zip(answers) {
            let fired = answer.and_then(|r| {
                Ok(FiredSlot {
                    slot: *slot,
                    task: r.try_get(0)?,
                    duplicate: r.try_get(1)?,
                })
            });
            match fired {
                Ok(f) => turn.fired.push(f),
                Err(e) => {
                    tx.rollback().await;
                    turn.fired.clear();
                    turn.next_slot = schedule.next_slot;
                    turn.error = Some(format!("slot {}: {e}", slot.to_rfc3339()));
                    return Ok(Some(turn));
                }
            }
        }
        let last = turn.fired.last();
        let (last_slot, last_task) = (last.map(|f| f.slot), last.map(|f| f.task));
        let count = turn.fired.iter().filter(|f| !f.duplicate).count() as i64;
        tx.execute(ADVANCE, &[&name, &due.next, &last_slot, &last_task, &count])
            .await?;
        tx.commit().await?;
        Ok(Some(turn))
    }
}

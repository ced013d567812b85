//! The change feed: the one history `task_transitions` read in a final order from a
//! durable per-consumer cursor, woken by NOTIFY with a poll as safety net; and the
//! history's upkeep (partitions made ahead and dropped past the retention, finished tasks
//! pruned), which the planner's Maintenance actor runs.
//!
//! Order and completeness: a row's position is `(xid, id)`, the transaction that wrote
//! it and its id. Readers only take rows whose transaction is older than every
//! transaction still in flight (`pg_snapshot_xmin`); no transaction below that horizon
//! can ever commit again, so what was delivered is a final prefix, and a cursor on
//! `(xid, id)` never skips a row that commits late nor delivers one twice. (A cursor on
//! `id` alone would: ids are drawn at insert, rows appear at commit, in another order.)
//! The feed shows real status changes only: not assignments, not task transfers, not history
//! from before V10 that the outbox no longer had (`xid = 1`). See migrations/V2__flows.sql
//! and V10__one_history.sql.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::FeedBoard;
use crate::blackboard::TaskStatus;
use crate::error::{Error, Result};

/// The NOTIFY channel on which new events are announced (a wake-up hint only).
pub const EVENTS_CHANNEL: &str = "artex_events";

/// Where an event sits in the feed: its transaction id and its event id. Written
/// `XID-ID` (e.g. `7431-12`); `0-0` is before the first event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    /// The id of the transaction that wrote the event (`xid8`).
    pub xid: u64,
    /// The event's id.
    pub id: i64,
}

impl std::fmt::Display for EventPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.xid, self.id)
    }
}

impl std::str::FromStr for EventPosition {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "event position '{s}': expected XID-ID as printed with each event, e.g. 7431-12"
            ))
        };
        let (xid, id) = s.trim().split_once('-').ok_or_else(bad)?;
        Ok(EventPosition {
            xid: xid.parse().map_err(|_| bad())?,
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

impl Serialize for EventPosition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One meaningful change of a task.
#[derive(Debug, Clone, Serialize)]
pub struct TaskEvent {
    /// Its place in the feed; what a consumer acknowledges and resumes after.
    pub position: EventPosition,
    /// The event id.
    pub id: i64,
    /// The task.
    pub task_id: Uuid,
    /// The task's flow, if any.
    pub flow_id: Option<Uuid>,
    /// The task's kind.
    pub kind: String,
    /// The status before (none when the task was created).
    pub from: Option<TaskStatus>,
    /// The status after.
    pub to: TaskStatus,
    /// Why, when known.
    pub reason: Option<String>,
    /// When (the writing transaction's start).
    pub at: DateTime<Utc>,
}

/// A read of the feed.
#[derive(Debug, Clone, Default)]
pub struct EventBatch {
    /// Events after the position asked for, in feed order.
    pub events: Vec<TaskEvent>,
    /// Whether more events exist that cannot be delivered yet because an older
    /// transaction is still in flight (worth asking again shortly).
    pub held_back: bool,
}

/// A consumer's durable cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerCursor {
    /// The consumer's name.
    pub consumer: String,
    /// The last event it acknowledged.
    pub position: EventPosition,
    /// When it last acknowledged (or said it is alive).
    pub updated_at: DateTime<Utc>,
}

/// The history's retention setting and how far the feed was pruned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Retention {
    /// History older than this many seconds leaves (a live consumer that still needs it
    /// holds it back for up to one more retention).
    pub keep_secs: f64,
    /// The largest position pruned so far.
    pub pruned_through: EventPosition,
    /// When the last pruning happened.
    pub pruned_at: Option<DateTime<Utc>>,
}

// The feed's rows are real status changes at a position: `xid > 1` (see V10), not an
// assignment nor a task transfer (audit-only rows). The (xid, id) index of each partition
// serves the row comparison and the order (a merge of the partitions' indexes); the
// horizon is an init-plan computed once from the statement's own snapshot.
//
// A stored row holding a start and an end (V25) is two events: the start at the row's
// id, the end at its `end_id`, drawn right after it. So the read starts at the row whose
// id is the position (its end may not have been delivered yet), takes one row more than
// the events it may return (that row may give none), and orders the events it expands.
const READ: &str = "select r.xid::text, ev.id, r.task_id, r.flow_id, coalesce(r.kind, ''),
        ev.from_status::text, ev.to_status::text, ev.reason, ev.at
    from (select e.* from artex.task_history e
          where (e.xid, e.id) >= ($1::text::xid8, $2::int8)
            and e.xid < (select pg_snapshot_xmin(pg_current_snapshot()))
            and e.xid > '1' and e.to_status <> 'assigned'
            and e.from_status is distinct from e.to_status
          order by e.xid, e.id
          limit $3 + 1) r
    cross join lateral (
        select r.id, r.from_status,
               case when r.end_id is null then r.to_status else 'running' end as to_status,
               case when r.end_id is null then r.reason else 'started' end as reason,
               case when r.end_id is null then r.at else r.started_at end as at
        union all
        select r.end_id, 'running', r.to_status, r.reason, r.at where r.end_id is not null
    ) ev
    where (r.xid, ev.id) > ($1::text::xid8, $2::int8)
    order by r.xid, ev.id
    limit $3";

const HELD_BACK: &str = "select exists (select 1 from artex.task_history e
    where (e.xid, e.id) >= ($1::text::xid8, $2::int8)
      and (e.xid, coalesce(e.end_id, e.id)) > ($1::text::xid8, $2::int8)
      and e.xid >= pg_snapshot_xmin(pg_current_snapshot())
      and e.to_status <> 'assigned' and e.from_status is distinct from e.to_status)";

const CURSOR: &str = "select last_xid::text, last_event, updated_at from artex.event_cursors
    where consumer = $1";

// Monotonic: an acknowledgment never moves a cursor back (a stale second process with
// the same consumer name cannot rewind it); it always says the consumer is alive.
const ACK: &str =
    "insert into artex.event_cursors as c (consumer, last_xid, last_event, updated_at)
    values ($1, $2::text::xid8, $3, now())
    on conflict (consumer) do update set
        last_xid = case when (excluded.last_xid, excluded.last_event) > (c.last_xid, c.last_event)
                        then excluded.last_xid else c.last_xid end,
        last_event = case when (excluded.last_xid, excluded.last_event) > (c.last_xid, c.last_event)
                          then excluded.last_event else c.last_event end,
        updated_at = now()";

const FORGET: &str = "delete from artex.event_cursors where consumer = $1";

const RETENTION: &str = "select extract(epoch from keep)::float8, pruned_xid::text, pruned_id,
        pruned_at
    from artex.event_retention";

pub(crate) fn parse_xid(s: &str) -> Result<u64> {
    s.parse()
        .map_err(|_| Error::Invalid(format!("unexpected transaction id '{s}' from the database")))
}

fn event_from_row(r: &tokio_postgres::Row) -> Result<TaskEvent> {
    let xid = parse_xid(&r.try_get::<_, String>(0)?)?;
    let id: i64 = r.try_get(1)?;
    Ok(TaskEvent {
        position: EventPosition { xid, id },
        id,
        task_id: r.try_get(2)?,
        flow_id: r.try_get(3)?,
        kind: r.try_get(4)?,
        from: r
            .try_get::<_, Option<String>>(5)?
            .map(|s| s.parse())
            .transpose()?,
        to: r.try_get::<_, String>(6)?.parse()?,
        reason: r.try_get(7)?,
        at: r.try_get(8)?,
    })
}

impl FeedBoard {
    /// Up to `limit` deliverable events after `after`, in feed order.
    pub async fn events_after(&self, after: EventPosition, limit: i64) -> Result<EventBatch> {
        let client = self.bb.client().await?;
        let xid = after.xid.to_string();
        let rows = client.query(READ, &[&xid, &after.id, &limit]).await?;
        let events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>>>()?;
        let mut held_back = false;
        if (events.len() as i64) < limit {
            let last = events.last().map(|e| e.position).unwrap_or(after);
            let xid = last.xid.to_string();
            held_back = client
                .query_one(HELD_BACK, &[&xid, &last.id])
                .await?
                .try_get(0)?;
        }
        Ok(EventBatch { events, held_back })
    }

    /// A consumer's cursor, if it ever acknowledged anything.
    pub async fn consumer_cursor(&self, consumer: &str) -> Result<Option<ConsumerCursor>> {
        let client = self.bb.client().await?;
        client
            .query_opt(CURSOR, &[&consumer])
            .await?
            .map(|r| {
                Ok(ConsumerCursor {
                    consumer: consumer.to_string(),
                    position: EventPosition {
                        xid: parse_xid(&r.try_get::<_, String>(0)?)?,
                        id: r.try_get(1)?,
                    },
                    updated_at: r.try_get(2)?,
                })
            })
            .transpose()
    }

    /// Records that `consumer` has everything up to `position` (durably: the next start
    /// resumes right after it). Never moves a cursor back; also marks the consumer alive.
    pub async fn ack_events(&self, consumer: &str, position: EventPosition) -> Result {
        if consumer.is_empty() {
            return Err(Error::Invalid("consumer: must not be empty".into()));
        }
        let client = self.bb.client().await?;
        let xid = position.xid.to_string();
        client
            .execute(ACK, &[&consumer, &xid, &position.id])
            .await?;
        Ok(())
    }

    /// Deletes a consumer's cursor; returns whether it existed.
    pub async fn forget_consumer(&self, consumer: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(client.execute(FORGET, &[&consumer]).await? > 0)
    }

    /// The retention setting and how far pruning went.
    pub async fn event_retention(&self) -> Result<Retention> {
        let client = self.bb.client().await?;
        let r = client.query_one(RETENTION, &[]).await?;
        Ok(Retention {
            keep_secs: r.try_get(0)?,
            pruned_through: EventPosition {
                xid: parse_xid(&r.try_get::<_, String>(1)?)?,
                id: r.try_get(2)?,
            },
            pruned_at: r.try_get(3)?,
        })
    }
}

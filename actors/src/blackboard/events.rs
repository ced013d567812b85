//! The change feed: the `task_events` outbox read in a final order from a durable
//! per-consumer cursor, woken by NOTIFY with a poll as safety net, and pruned by age
//! without ever pruning what a live consumer has not acknowledged.
//!
//! Order and completeness: an event's position is `(xid, id)`, the transaction that wrote
//! it and its identity id. Readers only take events whose transaction is older than every
//! transaction still in flight (`pg_snapshot_xmin`); no transaction below that horizon
//! can ever commit again, so what was delivered is a final prefix, and a cursor on
//! `(xid, id)` never skips an event that commits late nor delivers one twice. (A cursor on
//! `id` alone would: ids are drawn at insert, rows appear at commit, in another order.)
//! See migrations/V2__flows.sql.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Blackboard, Listener, TaskStatus};
use crate::error::{Error, Result};

/// The NOTIFY channel on which new events are announced (a wake-up hint only).
pub const EVENTS_CHANNEL: &str = "artex_events";

/// While events are held back behind an older transaction still in flight, how soon a
/// follower reads again: they come free the moment it ends, which nothing announces.
const HELD_BACK_RETRY: Duration = Duration::from_millis(5);

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

/// The outbox's retention setting and how far it pruned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Retention {
    /// Events older than this many seconds are pruned (unless a live consumer still
    /// needs them).
    pub keep_secs: f64,
    /// The largest position pruned so far.
    pub pruned_through: EventPosition,
    /// When the last pruning happened.
    pub pruned_at: Option<DateTime<Utc>>,
}

// The index on (xid, id) serves the row comparison and the order; the horizon is an
// init-plan computed once from the statement's own snapshot.
const READ: &str = "select e.xid::text, e.id, e.task_id, e.flow_id, e.kind,
        e.from_status::text, e.to_status::text, e.reason, e.at
    from artex.task_events e
    where (e.xid, e.id) > ($1::text::xid8, $2::int8)
      and e.xid < (select pg_snapshot_xmin(pg_current_snapshot()))
    order by e.xid, e.id
    limit $3";

const HELD_BACK: &str = "select exists (select 1 from artex.task_events e
    where (e.xid, e.id) > ($1::text::xid8, $2::int8)
      and e.xid >= pg_snapshot_xmin(pg_current_snapshot()))";

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

const SET_RETENTION: &str = "update artex.event_retention
    set keep = make_interval(secs => $1::float8)";

// Deletes the head of the feed, in feed order, as far as every event in it may go: older
// than the retention, written by a finished transaction, and acknowledged by every live
// consumer (one heard from within the retention). Pruning a prefix keeps one number
// exact: everything at or below `pruned_*` is gone, nothing above it is, so a consumer
// whose cursor is below it missed events and is told so instead of skipping them
// silently. Walks the (xid, id) index from the oldest event, at most `$2` rows, and not
// at all when the oldest event is younger than the retention.
const PRUNE: &str = "with cfg as materialized (
        select coalesce($1::timestamptz, now()) - keep as cutoff,
               pg_snapshot_xmin(pg_current_snapshot()) as horizon
        from artex.event_retention
    ),
    slowest as materialized (
        select c.last_xid, c.last_event from artex.event_cursors c, cfg
        where c.updated_at >= cfg.cutoff
        order by c.last_xid, c.last_event limit 1
    ),
    head as materialized (
        select e.id, e.xid,
               e.at < cfg.cutoff and e.xid < cfg.horizon
               and not exists (select 1 from slowest s
                               where (e.xid, e.id) > (s.last_xid, s.last_event)) as may_go
        from (select id, xid, at from artex.task_events order by xid, id limit $2) e, cfg
        where exists (select 1
                      from (select at from artex.task_events order by xid, id limit 1) o
                      where o.at < (select cutoff from cfg))
    ),
    doomed as materialized (
        select id, xid from (
            select id, xid, bool_and(may_go) over (order by xid, id) as prefix from head
        ) h where prefix
    ),
    gone as (
        delete from artex.task_events e using doomed where e.id = doomed.id
        returning e.xid, e.id
    ),
    mark as (
        update artex.event_retention r
        set pruned_xid = g.xid, pruned_id = g.id, pruned_at = now()
        from (select xid, id from gone order by xid desc, id desc limit 1) g
        where (g.xid, g.id) > (r.pruned_xid, r.pruned_id)
    )
    select count(*) from gone";

fn parse_xid(s: &str) -> Result<u64> {
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

impl Blackboard {
    /// Up to `limit` deliverable events after `after`, in feed order.
    pub async fn events_after(&self, after: EventPosition, limit: i64) -> Result<EventBatch> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(READ).await?;
        let xid = after.xid.to_string();
        let rows = client.query(&stmt, &[&xid, &after.id, &limit]).await?;
        let events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>>>()?;
        let mut held_back = false;
        if (events.len() as i64) < limit {
            let last = events.last().map(|e| e.position).unwrap_or(after);
            let stmt = client.prepare_cached(HELD_BACK).await?;
            let xid = last.xid.to_string();
            held_back = client
                .query_one(&stmt, &[&xid, &last.id])
                .await?
                .try_get(0)?;
        }
        Ok(EventBatch { events, held_back })
    }

    /// A consumer's cursor, if it ever acknowledged anything.
    pub async fn consumer_cursor(&self, consumer: &str) -> Result<Option<ConsumerCursor>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(CURSOR).await?;
        client
            .query_opt(&stmt, &[&consumer])
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
        let client = self.client().await?;
        let stmt = client.prepare_cached(ACK).await?;
        let xid = position.xid.to_string();
        client
            .execute(&stmt, &[&consumer, &xid, &position.id])
            .await?;
        Ok(())
    }

    /// Deletes a consumer's cursor; returns whether it existed.
    pub async fn forget_consumer(&self, consumer: &str) -> Result<bool> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(FORGET).await?;
        Ok(client.execute(&stmt, &[&consumer]).await? > 0)
    }

    /// The retention setting and how far pruning went.
    pub async fn event_retention(&self) -> Result<Retention> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(RETENTION).await?;
        let r = client.query_one(&stmt, &[]).await?;
        Ok(Retention {
            keep_secs: r.try_get(0)?,
            pruned_through: EventPosition {
                xid: parse_xid(&r.try_get::<_, String>(1)?)?,
                id: r.try_get(2)?,
            },
            pruned_at: r.try_get(3)?,
        })
    }

    /// Sets how long events are kept (and how long a silent consumer counts as live).
    pub async fn set_event_retention(&self, keep: Duration) -> Result {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SET_RETENTION).await?;
        client.execute(&stmt, &[&keep.as_secs_f64()]).await?;
        Ok(())
    }

    /// Prunes up to `batch` events past the retention (see the module doc); `now` lets
    /// tests move the clock. Returns how many were deleted.
    pub async fn prune_events(&self, now: Option<DateTime<Utc>>, batch: i64) -> Result<u64> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(PRUNE).await?;
        let n: i64 = client.query_one(&stmt, &[&now, &batch]).await?.try_get(0)?;
        Ok(n as u64)
    }
}

/// What a follower does after a read.
#[derive(Debug, PartialEq, Eq)]
enum AfterRead {
    /// Return the batch: it has events, or the deadline passed.
    Deliver,
    /// Wait this long (or until a wake-up), then read again.
    Wait(Duration),
}

/// The follower's rule: deliver events as soon as there are any; with none, wait for a
/// wake-up or the poll — only a few milliseconds while events are held back, since the
/// transaction holding them back ends unannounced — and never past `until`.
fn after_read(batch: &EventBatch, now: Instant, until: Instant, poll: Duration) -> AfterRead {
    if !batch.events.is_empty() || now >= until {
        return AfterRead::Deliver;
    }
    let pause = if batch.held_back {
        HELD_BACK_RETRY.min(poll)
    } else {
        poll
    };
    AfterRead::Wait(pause.min(until - now))
}

/// Where a feed reader starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedStart {
    /// After this consumer's acknowledged cursor (the oldest kept event for a new one).
    Consumer(String),
    /// After this position (e.g. an SSE client's `Last-Event-ID`).
    After(EventPosition),
    /// From the oldest event kept.
    Beginning,
}

/// A reader of the feed: reads batches after its position, waits for more (NOTIFY, with
/// a poll as the safety net), and acknowledges to a durable cursor when it has one.
pub struct EventFeed {
    bb: Blackboard,
    consumer: Option<String>,
    position: EventPosition,
    wakeups: Wakeups,
    poll: Duration,
}

/// What wakes a feed reader when new events are announced.
enum Wakeups {
    /// Nothing yet: a LISTEN session of its own is opened when it first waits.
    Unset,
    /// A LISTEN session of its own (a connection: fine for one CLI consumer).
    Own(Box<Listener>),
    /// A counter bumped by one LISTEN session the whole process shares (see
    /// [`EventFeed::share_wakeups`]): any number of readers, one connection.
    Shared(tokio::sync::watch::Receiver<u64>),
}

impl EventFeed {
    /// Opens a reader at `start`. A start before events that were already pruned is
    /// refused (`Refused`: the reader would miss events) unless `accept_gap`, which
    /// moves it to the oldest kept event; a consumer seen for the first time starts
    /// there without complaint.
    pub async fn open(
        bb: Blackboard,
        start: FeedStart,
        accept_gap: bool,
        poll: Duration,
    ) -> Result<EventFeed> {
        let pruned = bb.event_retention().await?.pruned_through;
        let (consumer, position, explicit) = match start {
            FeedStart::Consumer(name) => {
                if name.is_empty() {
                    return Err(Error::Invalid("consumer: must not be empty".into()));
                }
                match bb.consumer_cursor(&name).await? {
                    Some(c) => (Some(name), c.position, true),
                    None => (Some(name), EventPosition::default(), false),
                }
            }
            FeedStart::After(p) => (None, p, true),
            FeedStart::Beginning => (None, EventPosition::default(), false),
        };
        let position = if position >= pruned {
            position
        } else if !explicit || accept_gap {
            pruned
        } else {
            return Err(Error::Refused(format!(
                "{} is at event {position}, but events up to {pruned} were pruned by the \
                 retention setting: it missed events. Start again from the oldest kept \
                 event with --accept-gap (or from scratch with a new consumer name)",
                match &consumer {
                    Some(c) => format!("consumer '{c}'"),
                    None => "this reader".to_string(),
                }
            )));
        };
        Ok(EventFeed {
            bb,
            consumer,
            position,
            wakeups: Wakeups::Unset,
            poll,
        })
    }

    /// The position after which the next read starts.
    pub fn position(&self) -> EventPosition {
        self.position
    }

    /// The consumer name, if the reader has a durable cursor.
    pub fn consumer(&self) -> Option<&str> {
        self.consumer.as_deref()
    }

    /// Starts listening for new events (do it before the first read when following,
    /// so that nothing committed between a read and the wait goes unnoticed).
    pub async fn listen(&mut self) -> Result {
        if matches!(self.wakeups, Wakeups::Unset) {
            self.wakeups = Wakeups::Own(Box::new(
                self.bb.listen(&[EVENTS_CHANNEL.to_string()]).await?,
            ));
        }
        Ok(())
    }

    /// Wakes this reader from a counter that the process's one LISTEN session on
    /// [`EVENTS_CHANNEL`] bumps at every notification (and whenever that session was
    /// lost, since notifications may have been missed meanwhile), instead of a session of
    /// its own: a server with many readers then holds one connection for all of them.
    pub fn share_wakeups(&mut self, wakeups: tokio::sync::watch::Receiver<u64>) {
        self.wakeups = Wakeups::Shared(wakeups);
    }

    /// The next deliverable events (up to `limit`) after the reader's position, which
    /// moves past them. Does not wait and does not acknowledge.
    pub async fn next_batch(&mut self, limit: i64) -> Result<EventBatch> {
        let batch = self.bb.events_after(self.position, limit).await?;
        if let Some(last) = batch.events.last() {
            self.position = last.position;
        }
        Ok(batch)
    }

    /// Waits until new events may be there: a notification, or `timeout` (the poll;
    /// also when the listening session dropped, which is reopened on the next call).
    async fn wait(&mut self, timeout: Duration) {
        if matches!(self.wakeups, Wakeups::Unset) {
            if let Err(e) = self.listen().await {
                tracing::debug!(error = %e, "cannot LISTEN for events; polling");
                tokio::time::sleep(timeout.min(self.poll)).await;
                return;
            }
        }
        match &mut self.wakeups {
            Wakeups::Own(l) => {
                tokio::select! {
                    got = l.recv() => {
                        if got.is_none() {
                            self.wakeups = Wakeups::Unset;
                        } else {
                            l.drain_pending();
                        }
                    }
                    _ = tokio::time::sleep(timeout) => {}
                }
            }
            Wakeups::Shared(rx) => {
                tokio::select! {
                    changed = rx.changed() => {
                        // The sharing session is gone for good: polling is all that is left.
                        if changed.is_err() {
                            tokio::time::sleep(timeout).await;
                        }
                    }
                    _ = tokio::time::sleep(timeout) => {}
                }
            }
            Wakeups::Unset => tokio::time::sleep(timeout).await,
        }
    }

    /// The next events after the reader's position, waiting for them until `until`:
    /// reads, and while nothing is there waits for a wake-up (NOTIFY), the safety poll,
    /// or — while events are held back behind a transaction in flight — a short backoff,
    /// then reads again. An empty batch means `until` passed. Listens before its first
    /// read, so nothing committed between a read and a wait goes unnoticed. Errors are
    /// the reads': the position only moves on success, so a caller may retry.
    pub async fn follow(&mut self, limit: i64, until: Instant) -> Result<EventBatch> {
        if matches!(self.wakeups, Wakeups::Unset) {
            if let Err(e) = self.listen().await {
                tracing::debug!(error = %e, "cannot LISTEN for events; polling");
            }
        }
        loop {
            let batch = self.next_batch(limit).await?;
            match after_read(&batch, Instant::now(), until, self.poll) {
                AfterRead::Deliver => return Ok(batch),
                AfterRead::Wait(pause) => self.wait(pause).await,
            }
        }
    }

    /// Durably acknowledges everything up to the reader's position (no-op without a
    /// consumer name). Also marks the consumer alive, which protects its unread events
    /// from pruning.
    pub async fn ack(&self) -> Result {
        match &self.consumer {
            Some(c) => self.bb.ack_events(c, self.position).await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(events: usize, held_back: bool) -> EventBatch {
        let event = |i: usize| TaskEvent {
            position: EventPosition {
                xid: 7,
                id: i as i64,
            },
            id: i as i64,
            task_id: Uuid::nil(),
            flow_id: None,
            kind: "echo".into(),
            from: None,
            to: TaskStatus::Pending,
            reason: None,
            at: DateTime::<Utc>::UNIX_EPOCH,
        };
        EventBatch {
            events: (0..events).map(event).collect(),
            held_back,
        }
    }

    const POLL: Duration = Duration::from_millis(200);

    #[test]
    fn a_follower_delivers_events_at_once() {
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        assert_eq!(
            after_read(&batch(3, false), now, until, POLL),
            AfterRead::Deliver
        );
        // Even when more are held back behind a transaction in flight.
        assert_eq!(
            after_read(&batch(1, true), now, until, POLL),
            AfterRead::Deliver
        );
    }

    #[test]
    fn a_follower_with_nothing_waits_for_the_poll_and_never_past_its_deadline() {
        let now = Instant::now();
        let far = now + Duration::from_secs(10);
        assert_eq!(
            after_read(&batch(0, false), now, far, POLL),
            AfterRead::Wait(POLL)
        );
        let near = now + Duration::from_millis(30);
        assert_eq!(
            after_read(&batch(0, false), now, near, POLL),
            AfterRead::Wait(Duration::from_millis(30))
        );
        // At or past the deadline: an empty batch goes back to the caller.
        assert_eq!(
            after_read(&batch(0, false), near, near, POLL),
            AfterRead::Deliver
        );
        assert_eq!(
            after_read(&batch(0, true), far, near, POLL),
            AfterRead::Deliver
        );
    }

    #[test]
    fn a_follower_looks_again_soon_while_events_are_held_back() {
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        assert_eq!(
            after_read(&batch(0, true), now, until, POLL),
            AfterRead::Wait(HELD_BACK_RETRY)
        );
        // A poll shorter than the backoff wins.
        let fast = Duration::from_millis(1);
        assert_eq!(
            after_read(&batch(0, true), now, until, fast),
            AfterRead::Wait(fast)
        );
    }
}

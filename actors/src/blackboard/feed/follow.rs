//! A reader of the change feed ([`EventFeed`]): batches after a position, in the feed's
//! final order, waiting for more (NOTIFY — its own session or one the process shares —
//! with a poll as the safety net), acknowledging to a durable cursor when it has one.
//! The SQL it runs lives in `events.rs`.

use std::time::{Duration, Instant};

use super::events::{EventBatch, EventPosition, EVENTS_CHANNEL};
use super::FeedBoard;
use crate::blackboard::Listener;
use crate::error::{Error, Result};

/// While events are held back behind an older transaction still in flight, how soon a
/// follower reads again: they come free the moment it ends, which nothing announces.
const HELD_BACK_RETRY: Duration = Duration::from_millis(5);

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
    bb: FeedBoard,
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
        bb: FeedBoard,
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
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    use super::super::events::TaskEvent;
    use super::*;
    use crate::blackboard::TaskStatus;

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

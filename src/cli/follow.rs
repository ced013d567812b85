//! A task or flow watched until it ends: `artex submit --wait` here, and the pieces `artex
//! flow show --follow` (in `flows`) is made of. The change feed ([`EventFeed`], woken by
//! NOTIFY) says when something happened; the tables say what is true: each event about
//! it (or, as a safety net, a quiet [`RECHECK`]) leads to a fresh read. The feed is
//! joined at its head, read before the state, so nothing that happens after the first
//! read is missed and the kept history is not read at all. The wait ends early, with
//! [`Error::OutputClosed`], when the reader of standard output goes away.

use std::time::{Duration, Instant};

use artex_actors::blackboard::{EventFeed, FeedStart, TaskEvent, TaskRow, TaskStatus};
use artex_actors::Blackboard;
use uuid::Uuid;

use super::progress::step;
use super::stdout::Reader;
use crate::error::{Error, Result};

/// The feed's safety-net poll when no notification comes.
const POLL: Duration = Duration::from_millis(200);

/// Without any event about what is followed, its state is read again this often.
const RECHECK: Duration = Duration::from_secs(5);

/// Events per read of the feed.
const BATCH: i64 = 500;

/// A reader of the feed from its head (now), listening before the caller's first read.
pub(super) async fn feed_from_now(bb: &Blackboard) -> Result<EventFeed> {
    let start = match bb.feed().feed_head().await? {
        Some(head) => FeedStart::After(head),
        None => FeedStart::Beginning,
    };
    let mut feed = EventFeed::open(bb.feed(), start, true, POLL).await?;
    feed.listen().await?;
    Ok(feed)
}

/// The next events `mine` selects, waiting for them up to [`RECHECK`] (then none), or
/// until `reader` goes away ([`Error::OutputClosed`]). Connection failures are waited
/// out: the feed's position only moves on success.
pub(super) async fn next_events(
    feed: &mut EventFeed,
    reader: &Reader,
    mine: impl Fn(&TaskEvent) -> bool,
) -> Result<Vec<TaskEvent>> {
    let until = Instant::now() + RECHECK;
    loop {
        match reader.unless_gone(feed.follow(BATCH, until)).await? {
            Ok(batch) => {
                let events: Vec<TaskEvent> = batch.events.into_iter().filter(&mine).collect();
                if !events.is_empty() || Instant::now() >= until {
                    return Ok(events);
                }
            }
            Err(e) if e.is_connection() => {
                tracing::warn!(error = %e, "cannot read the change feed; retrying");
                if Instant::now() >= until {
                    return Ok(Vec::new());
                }
                reader.unless_gone(tokio::time::sleep(POLL)).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A change as the followers tell it: `running -> pending: why`.
pub(super) fn transition(from: Option<TaskStatus>, to: TaskStatus, reason: Option<&str>) -> String {
    format!(
        "{} -> {to}{}",
        from.map(|s| s.as_str()).unwrap_or("(new)"),
        reason.map(|r| format!(": {r}")).unwrap_or_default()
    )
}

/// Waits until task `id` has ended, telling each change on standard error; returns the
/// task as it ended. Standard output has the task's id: if its reader goes away, so does
/// the wait ([`Error::OutputClosed`]).
pub(crate) async fn wait_task(bb: &Blackboard, id: Uuid) -> Result<TaskRow> {
    let started = Instant::now();
    let reader = Reader::watch();
    let mut feed = feed_from_now(bb).await?;
    let mut task = bb.operator().task(id).await?;
    let holder = |t: &TaskRow| {
        t.assigned_to
            .as_deref()
            .map(|w| format!(" on {w}"))
            .unwrap_or_default()
    };
    step(format!("task {id}: {}{}", task.status, holder(&task)));
    // The status the feed has told so far: the wait ends once the table says the task
    // has ended and the feed has told that too (every change shown, in order) — or the
    // feed stayed quiet for a [`RECHECK`] after it ended (the table has the last word).
    let mut told = task.status;
    let mut first = true;
    while !(task.status.is_terminal() && told == task.status) {
        let events = next_events(&mut feed, &reader, |e| e.task_id == id).await?;
        for e in &events {
            // The first event may be the change the first read already showed.
            if !(first && e.to == told) {
                step(format!(
                    "task {id}: {}",
                    transition(e.from, e.to, e.reason.as_deref())
                ));
            }
            first = false;
            told = e.to;
        }
        task = bb.operator().task(id).await?;
        if events.is_empty() && task.status.is_terminal() {
            break;
        }
    }
    step(format!(
        "task {id}: {} after {:.1} s",
        task.status,
        started.elapsed().as_secs_f64()
    ));
    Ok(task)
}

/// Ok for a task that succeeded; the exit code of its outcome otherwise
/// (docs/command-line.md, "Exit codes").
pub(crate) fn task_outcome(task: &TaskRow) -> Result {
    let error = task
        .error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    match task.status {
        TaskStatus::Failed | TaskStatus::Timeout => Err(Error::EndedFailed(format!(
            "task {} {}{error}",
            task.id, task.status
        ))),
        TaskStatus::Canceled => Err(Error::EndedCanceled(format!(
            "task {} canceled{error}",
            task.id
        ))),
        _ => Ok(()),
    }
}

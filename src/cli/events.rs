//! `artex events tail|retention|prune|forget|drop-slot`: the change feed from a durable
//! cursor (or a logical replication slot) as JSON lines (with `--progress`, running
//! tasks' progress too, not durable), and its retention.

use std::io::Write;
use std::time::{Duration, Instant};

use artex_actors::blackboard::{
    DecodedTransaction, EventFeed, EventPosition, FeedStart, ListenEvent, ProgressEvent, RowChange,
    PROGRESS_CHANNEL,
};
use artex_actors::maintenance::Maintenance;
use artex_actors::Blackboard;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::stdout::{outln, write_error, Reader};
use super::{connect_one_shot, print_json, time_text};
use crate::config::{parse_duration, DbConfig};
use crate::error::{Error, Result};

/// `artex events …`
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Print task events as JSON lines, in a final order, from a durable cursor.
    ///
    /// With --consumer NAME each batch is acknowledged once written and flushed to
    /// standard output: a restarted consumer resumes right after the last acknowledged
    /// event, none skipped, none acknowledged twice. (Events written but not yet
    /// acknowledged when the process was killed — at most one batch — are written
    /// again.)
    Tail(TailArgs),
    /// Show, or with --set change, how long history (events, finished tasks) is kept.
    Retention {
        /// Keep history this long, e.g. 14d, 12h, 90m, 3600s (a consumer silent longer
        /// than this no longer protects its unread events). The same setting as the
        /// planner's --history-retention.
        #[arg(long, value_parser = parse_duration)]
        set: Option<Duration>,
        /// Print `{"keep_secs", "pruned_through", "pruned_at"}`.
        #[arg(long)]
        json: bool,
    },
    /// Drop history partitions and finished tasks past the retention now (the planners'
    /// Maintenance actors do it every run).
    Prune {
        /// Print `{"partitions_dropped": [...], "history_rows_pruned": N, "tasks_pruned": N}`.
        #[arg(long)]
        json: bool,
    },
    /// Delete a consumer's cursor (it starts from the oldest kept event next time).
    Forget {
        /// The consumer.
        #[arg(long)]
        consumer: String,
    },
    /// Drop a logical decoding slot (it stops holding WAL on the server).
    DropSlot {
        /// The slot.
        #[arg(long)]
        slot: String,
    },
}

/// The arguments of `artex events tail`.
#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// Durable cursor: resume after this consumer's last acknowledged event. Without it,
    /// read from the oldest kept event (or --after) and remember nothing.
    #[arg(long)]
    consumer: Option<String>,
    /// Start after this position (XID-ID, as printed in each event's "position").
    #[arg(long, value_parser = parse_position, conflicts_with_all = ["consumer", "logical"])]
    after: Option<EventPosition>,
    /// Keep waiting for new events (woken by NOTIFY, polling as a safety net).
    #[arg(long)]
    follow: bool,
    /// Events per read, and per acknowledgment.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    batch: i64,
    /// Poll interval in milliseconds when no notification comes (the logical feed has
    /// no notification: it polls at this interval).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    poll_ms: u64,
    /// If the consumer's cursor fell behind pruned events, go on from the oldest kept
    /// event instead of refusing.
    #[arg(long)]
    accept_gap: bool,
    /// Read task changes from a logical replication slot (test_decoding) instead of the
    /// history table; resumes from the slot's confirmed LSN. Needs wal_level=logical.
    #[arg(long, requires = "slot")]
    logical: bool,
    /// The logical slot's name (created on first use).
    #[arg(long, requires = "logical")]
    slot: Option<String>,
    /// With --logical: every row change of artex.tasks (lease renewals included) instead
    /// of the task events.
    #[arg(long, requires = "logical")]
    raw: bool,
    /// With --follow: also print running tasks' progress as it is written (at most once
    /// a second per task), as lines `{"event": "progress", "task_id", "kind",
    /// "progress", "message", "at"}` without a position. Not durable: neither
    /// acknowledged nor replayed (a restarted consumer gets only new progress).
    #[arg(long, requires = "follow", conflicts_with = "logical")]
    progress: bool,
}

/// With --progress, how long a follower waits on the feed at most before it prints the
/// progress that came meanwhile.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

fn parse_position(s: &str) -> std::result::Result<EventPosition, String> {
    s.parse().map_err(|e: artex_actors::Error| e.to_string())
}

/// Runs `artex events …`.
pub(crate) async fn events(db: &DbConfig, command: EventsCommand) -> Result {
    let bb = connect_one_shot(db).await?;
    match command {
        EventsCommand::Tail(args) if args.logical => tail_logical(bb, args).await,
        EventsCommand::Tail(args) => tail(bb, args).await,
        EventsCommand::Retention { set, json } => {
            if let Some(keep) = set {
                bb.maintenance().set_event_retention(keep).await?;
            }
            let r = bb.feed().event_retention().await?;
            if json {
                return print_json(&r);
            }
            outln!(
                "keep history {}s; feed pruned through {}{}",
                r.keep_secs,
                r.pruned_through,
                r.pruned_at
                    .map(|t| format!(" (last pruned {})", time_text(Some(t))))
                    .unwrap_or_default()
            )
        }
        EventsCommand::Prune { json } => {
            // What the planners' Maintenance actors do every run, now.
            let r = Maintenance::run_once(&bb.maintenance(), None).await?;
            if json {
                return print_json(&json!({
                    "partitions_dropped": r.partitions_dropped,
                    "history_rows_pruned": r.history_rows_pruned,
                    "tasks_pruned": r.tasks_pruned,
                }));
            }
            outln!(
                "dropped {} history partition(s){}; deleted {} history row(s) past a shortened \
                 retention and {} finished task(s)",
                r.partitions_dropped.len(),
                if r.partitions_dropped.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.partitions_dropped.join(", "))
                },
                r.history_rows_pruned,
                r.tasks_pruned
            )
        }
        EventsCommand::Forget { consumer } => {
            if bb.feed().forget_consumer(&consumer).await? {
                outln!("forgot consumer '{consumer}'")
            } else {
                Err(Error::Invalid(format!("no consumer named '{consumer}'")))
            }
        }
        EventsCommand::DropSlot { slot } => {
            if bb.feed().drop_logical_slot(&slot).await? {
                outln!("dropped slot '{slot}'")
            } else {
                Err(Error::Invalid(format!(
                    "no replication slot named '{slot}'"
                )))
            }
        }
    }
}

/// How long a following consumer may stay silent before it says it is alive (which
/// protects its unread events from pruning).
const ALIVE_EVERY: Duration = Duration::from_secs(30);

/// How soon a follower retries an acknowledgment that failed.
const ACK_RETRY: Duration = Duration::from_millis(5);

/// Without --follow, how long to wait for events held back behind a transaction in flight.
const HOLD_MAX: Duration = Duration::from_secs(5);

fn write_line(out: &mut impl Write, v: &impl serde::Serialize) -> Result {
    // A failed write comes back as the io::Error it was (a closed pipe stays one).
    serde_json::to_writer(&mut *out, v).map_err(|e| write_error(e.into()))?;
    out.write_all(b"\n").map_err(write_error)
}

async fn tail(bb: Blackboard, args: TailArgs) -> Result {
    let start = match (&args.consumer, args.after) {
        (Some(c), _) => FeedStart::Consumer(c.clone()),
        (None, Some(p)) => FeedStart::After(p),
        (None, None) => FeedStart::Beginning,
    };
    let poll = Duration::from_millis(args.poll_ms);
    let mut feed = EventFeed::open(bb.feed(), start, args.accept_gap, poll).await?;
    if args.follow {
        feed.listen().await?;
    }
    let mut progress = args.progress.then(|| progress_notes(&bb));
    let reader = Reader::watch();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut said_alive = Instant::now();
    let mut unacked = false;
    let mut held_since: Option<Instant> = None;
    loop {
        let read = if args.follow {
            // Back soon to retry an acknowledgment that failed; otherwise in time to say
            // the consumer is alive (and not sooner than a poll when that failed too).
            let mut until = if unacked {
                Instant::now() + ACK_RETRY.min(poll)
            } else {
                (said_alive + ALIVE_EVERY).max(Instant::now() + poll)
            };
            if progress.is_some() {
                until = until.min(Instant::now() + PROGRESS_EVERY);
            }
            // Stopped as soon as nobody reads: the next event may be hours away.
            reader.unless_gone(feed.follow(args.batch, until)).await?
        } else {
            feed.next_batch(args.batch).await
        };
        let batch = match read {
            Ok(b) => b,
            // Following through a database restart: the position only moves on success.
            Err(e) if args.follow && e.is_connection() => {
                tracing::warn!(error = %e, "cannot read events; retrying");
                reader.unless_gone(tokio::time::sleep(poll)).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if !batch.events.is_empty() {
            for e in &batch.events {
                write_line(&mut out, e)?;
            }
            // Acknowledged only once handed to the reader of our output.
            out.flush().map_err(write_error)?;
            unacked = true;
            held_since = None;
        }
        if let Some(notes) = progress.as_mut() {
            let mut wrote = false;
            while let Ok(line) = notes.try_recv() {
                write_line(&mut out, &line)?;
                wrote = true;
            }
            if wrote {
                out.flush().map_err(write_error)?;
            }
        }
        if unacked || (args.follow && said_alive.elapsed() >= ALIVE_EVERY) {
            match feed.ack().await {
                Ok(()) => {
                    unacked = false;
                    said_alive = Instant::now();
                }
                Err(e) if args.follow && e.is_connection() => {
                    tracing::warn!(error = %e, "cannot acknowledge events; retrying");
                }
                Err(e) => return Err(e.into()),
            }
        }
        if args.follow || !batch.events.is_empty() {
            continue;
        }
        // Without --follow: what is there now, including events held back for a moment
        // behind an older transaction still in flight (any transaction of the cluster),
        // but not waiting on a long one for more than a while.
        if batch.held_back && held_since.get_or_insert_with(Instant::now).elapsed() < HOLD_MAX {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        return Ok(());
    }
}

/// The progress written from now on, as the lines `--progress` prints: heard on a LISTEN
/// session of its own (reconnecting by itself; what is written while it is away is
/// missed, as progress is not durable), at most [`PROGRESS_BUFFER`] waiting.
fn progress_notes(bb: &Blackboard) -> tokio::sync::mpsc::Receiver<Value> {
    let (tx, rx) = tokio::sync::mpsc::channel(PROGRESS_BUFFER);
    let mut session = bb.feed().listen_session("progress", &[PROGRESS_CHANNEL]);
    actix::spawn(async move {
        loop {
            tokio::select! {
                event = session.next() => {
                    let ListenEvent::Notified(batch) = event else { continue };
                    for n in batch {
                        let Ok(p) = serde_json::from_str::<ProgressEvent>(&n.payload) else {
                            continue;
                        };
                        let mut line = json!({ "event": "progress" });
                        if let (Some(line), Value::Object(p)) = (line.as_object_mut(), json!(p)) {
                            line.extend(p);
                        }
                        // Full: the output does not keep up; progress is only ever the
                        // latest value, so this one is dropped.
                        let _ = tx.try_send(line);
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

/// Progress lines waiting to be printed, at most.
const PROGRESS_BUFFER: usize = 1024;

/// A history row the feed shows: inserted into the stored history `artex.task_history`
/// (decoded under its partition's name, `artex.task_transitions_…`), a real status change
/// (not an assignment nor a task transfer), as the table feed shows.
fn is_feed_row(c: &RowChange) -> bool {
    let from = c.row.get("from_status").and_then(Value::as_str);
    let to = c.row.get("to_status").and_then(Value::as_str);
    c.op == "INSERT"
        && c.table.starts_with("artex.task_transitions")
        && to.is_some_and(|t| t != "assigned")
        && from != to
}

fn logical_line(tx: &DecodedTransaction, raw: bool) -> Vec<Value> {
    let mut lines = Vec::new();
    for c in &tx.changes {
        if raw {
            if c.table == "artex.tasks" {
                lines.push(json!({
                    "lsn": tx.commit_lsn,
                    "xid": tx.xid,
                    "committed_at": tx.commit_time,
                    "op": c.op,
                    "table": c.table,
                    "row": c.row,
                }));
            }
        } else if is_feed_row(c) {
            for event in row_events(&c.row) {
                let mut line = json!({
                    "lsn": tx.commit_lsn,
                    "xid": tx.xid,
                    "committed_at": tx.commit_time,
                });
                if let (Some(line), Value::Object(event)) = (line.as_object_mut(), event) {
                    line.extend(event);
                }
                lines.push(line);
            }
        }
    }
    lines
}

/// The feed events of one history row: one, or two for a row holding a start and an end
/// (`end_id` set, V25): the start at the row's id and `started_at`, then the end.
fn row_events(r: &serde_json::Map<String, Value>) -> Vec<Value> {
    let event = |id, from, to, reason, at| {
        json!({
            "id": id,
            "task_id": r.get("task_id"),
            "flow_id": r.get("flow_id"),
            "kind": r.get("kind"),
            "from": from,
            "to": to,
            "reason": reason,
            "at": at,
        })
    };
    match r.get("end_id").filter(|v| !v.is_null()) {
        None => vec![event(
            r.get("id"),
            r.get("from_status"),
            r.get("to_status"),
            r.get("reason"),
            r.get("at"),
        )],
        Some(end_id) => {
            let running = json!("running");
            let started = json!("started");
            vec![
                event(
                    r.get("id"),
                    r.get("from_status"),
                    Some(&running),
                    Some(&started),
                    r.get("started_at"),
                ),
                event(
                    Some(end_id),
                    Some(&running),
                    r.get("to_status"),
                    r.get("reason"),
                    r.get("at"),
                ),
            ]
        }
    }
}

async fn tail_logical(bb: Blackboard, args: TailArgs) -> Result {
    let slot = args
        .slot
        .clone()
        .ok_or_else(|| Error::Invalid("--logical needs --slot NAME".into()))?;
    if bb.feed().ensure_logical_slot(&slot).await? {
        tracing::info!(%slot, "created the logical replication slot");
    }
    let poll = Duration::from_millis(args.poll_ms);
    let reader = Reader::watch();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let max = i32::try_from(args.batch).unwrap_or(i32::MAX);
    loop {
        let txs = match bb.feed().peek_logical(&slot, max).await {
            Ok(t) => t,
            Err(e) if args.follow && e.is_connection() => {
                tracing::warn!(error = %e, "cannot read the slot; retrying");
                reader.unless_gone(tokio::time::sleep(poll)).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Some(last) = txs.last() else {
            if !args.follow {
                return Ok(());
            }
            reader.unless_gone(tokio::time::sleep(poll)).await?;
            continue;
        };
        for tx in &txs {
            for line in logical_line(tx, args.raw) {
                write_line(&mut out, &line)?;
            }
        }
        out.flush().map_err(write_error)?;
        // Confirmed only once written out: a consumer killed before this line reads these
        // transactions again. Retried rather than re-read, which would print them twice.
        loop {
            match bb
                .feed()
                .advance_logical_slot(&slot, &last.commit_lsn)
                .await
            {
                Ok(()) => break,
                Err(e) if args.follow && e.is_connection() => {
                    tracing::warn!(error = %e, "cannot confirm the slot's position; retrying");
                    reader.unless_gone(tokio::time::sleep(poll)).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert!(parse_duration("3w")
            .unwrap_err()
            .contains("unknown unit 'w'"));
        assert!(parse_duration("h").is_err());
    }
}

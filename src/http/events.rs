//! `GET /events`: the change feed as Server-Sent Events. Each task event is one SSE
//! event (`event: task`, `id:` its feed position, `data:` the JSON that `artex events
//! tail` prints), in the feed's final order. A client that reconnects sends the last id
//! it saw in `Last-Event-ID` (browsers' EventSource does it by itself) and resumes right
//! after it; `?after=XID-ID` does the same for a first connection. Without either, the
//! stream starts at the oldest kept event. A position older than the pruned events is
//! answered 410 Gone rather than with a silent gap. When the worker drains (after a
//! hot upgrade's listener pass too), the stream ends and the client's reconnection
//! lands on whoever serves the port then: an open stream never holds a shutdown back.
//!
//! Progress (`ctx.progress` in a handler) is not in the feed, which is the history: a
//! worker writes a running task's latest progress at most once a second and NOTIFYs it,
//! and each open stream passes it on as `event: progress` (no `id:`; `data:` a
//! [`ProgressEvent`]) within half a second. Not durable: a reconnecting client gets no
//! progress it missed, only the next one (the task's row keeps the latest value).
//!
//! Bounded whatever clients do: it needs the read scope; at most `--max-event-streams`
//! streams are open (503 beyond); every stream is woken by the process's one LISTEN
//! session (a connection for all of them, see [`EventsState::start`]) and reads through
//! the pool, so streams add no database connection; a stream buffers at most one batch,
//! and a client that takes longer than [`SLOW_CLIENT`] to take a chunk is dropped. Routes
//! hold no SQL: the feed reader lives in the blackboard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderValue, CACHE_CONTROL};
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use std::sync::Arc;

use artex_actors::blackboard::FeedBoard;
use artex_actors::blackboard::{
    EventFeed, EventPosition, FeedStart, ListenEvent, ProgressEvent, EVENTS_CHANNEL,
    PROGRESS_CHANNEL,
};
use artex_actors::worker::GetStatus;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};

use super::auth::CanRead;
use super::{ApiError, AppState};

/// What `/events` needs: the blackboard to read the feed from, the process's shared
/// wake-ups, and the open-stream budget.
#[derive(Clone)]
pub struct EventsState {
    bb: FeedBoard,
    wakeups: watch::Receiver<u64>,
    /// Progress notifications (their JSON payloads), for every open stream.
    progress: broadcast::Sender<Arc<str>>,
    streams: Arc<Semaphore>,
    max_streams: usize,
    /// Set when the process stops serving (`artex serve`'s shutdown): streams end.
    stopping: Arc<AtomicBool>,
}

impl EventsState {
    /// Serves the feed of `bb` to at most `max_streams` streams at once, and starts the
    /// process's one LISTEN session for them: it bumps a counter at every notification,
    /// at every (re)connection (notifications are lost while disconnected) and every
    /// [`SAFETY_POLL`]; it ends when every `EventsState` is gone. The same session hears
    /// progress ([`PROGRESS_CHANNEL`]), which it hands to every open stream.
    pub fn start(bb: FeedBoard, max_streams: usize) -> Self {
        let (tx, wakeups) = watch::channel(0u64);
        let (progress, _) = broadcast::channel(PROGRESS_BUFFER);
        let mut session = bb.listen_session("event feed", &[EVENTS_CHANNEL, PROGRESS_CHANNEL]);
        let to_streams = progress.clone();
        actix::spawn(async move {
            let bump = |tx: &watch::Sender<u64>| tx.send_modify(|n| *n = n.wrapping_add(1));
            loop {
                tokio::select! {
                    event = session.next() => match event {
                        // Progress only: the feed has nothing new to read.
                        ListenEvent::Notified(batch) => {
                            let mut events = false;
                            for n in batch {
                                if n.channel == PROGRESS_CHANNEL {
                                    // No stream open: nobody to tell.
                                    let _ = to_streams.send(Arc::from(n.payload));
                                } else {
                                    events = true;
                                }
                            }
                            if events {
                                bump(&tx);
                            }
                        }
                        // Connected: notifications may have been missed. Lost: streams
                        // poll until it is back. Either way, everyone looks now.
                        _ => bump(&tx),
                    },
                    _ = tokio::time::sleep(SAFETY_POLL) => bump(&tx),
                    _ = tx.closed() => return,
                }
            }
        });
        EventsState {
            bb,
            wakeups,
            progress,
            streams: Arc::new(Semaphore::new(max_streams)),
            max_streams,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Ends every open stream at its next poll (within `POLL`, half a second), telling the
    /// client to reconnect: for a process without a worker that would say it is leaving.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }
}

/// The `after` query parameter (start after this position, `XID-ID`; `Last-Event-ID`
/// takes precedence), the only one: another, or `after` twice, is refused with the API's
/// error body (actix's query extractor answered those in plain text).
fn after_param(req: &HttpRequest) -> Result<Option<String>, ApiError> {
    let bad = |message: String| ApiError {
        status: StatusCode::BAD_REQUEST,
        message,
    };
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| bad(format!("query string: {e}")))?
        .into_inner();
    let mut after = None;
    for (k, v) in pairs {
        if k != "after" {
            return Err(bad(format!(
                "{k}: unknown query parameter; expected only after"
            )));
        }
        if after.replace(v).is_some() {
            return Err(bad("after: given twice; expected it once".into()));
        }
    }
    Ok(after)
}

/// How often a stream looks whether this process is leaving (and reads, with no wake-up).
const POLL: Duration = Duration::from_millis(500);
/// How often the shared session wakes every stream with no notification: the safety
/// net for events that were held back behind a transaction in flight when announced.
pub const SAFETY_POLL: Duration = Duration::from_secs(2);
/// A client that takes longer than this to take one chunk is dropped, not buffered for.
pub const SLOW_CLIENT: Duration = Duration::from_secs(30);
/// A comment line at least this often, so proxies and clients see the stream is alive.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Events per read: at most this many are buffered for one stream.
const BATCH: i64 = 100;
/// Progress notifications kept for a stream that has not sent them yet; a stream that
/// falls further behind skips the oldest (progress is only ever the latest value).
const PROGRESS_BUFFER: usize = 1024;

enum Phase {
    Start,
    Live,
    Done,
}

/// The SSE stream of task events. Served by workers (`app`: it ends when the worker
/// drains, after a listener pass too) and by `artex serve` (no worker: it ends at
/// [`EventsState::stop`]).
pub async fn events(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<EventsState>,
    app: Option<web::Data<AppState>>,
) -> Result<HttpResponse, ApiError> {
    // Both are checked, whichever is used: a malformed one is refused, not ignored.
    let position = |field: &str, value: &str| {
        value.trim().parse::<EventPosition>().map_err(|e| ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("{field}: {e}"),
        })
    };
    let after = after_param(&req)?
        .map(|v| position("after", &v))
        .transpose()?;
    let last_id = match req.headers().get("Last-Event-ID") {
        None => None,
        // Not text: no position either (it was taken for no header at all).
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError {
                status: StatusCode::BAD_REQUEST,
                message: "Last-Event-ID: not a feed position (visible ASCII); expected XID-ID \
                      as printed with each event, e.g. 7431-12"
                    .into(),
            }
        })?),
    };
    // An empty Last-Event-ID is as none (an EventSource that saw no id yet).
    let last_id = last_id
        .filter(|v| !v.trim().is_empty())
        .map(|v| position("Last-Event-ID", v))
        .transpose()?;
    let permit = state.streams.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable(format!(
            "too many event streams: {} are open, the most this process serves \
             (--max-event-streams); retry later",
            state.max_streams
        ))
    })?;
    let start = match last_id.or(after) {
        Some(p) => FeedStart::After(p),
        None => FeedStart::Beginning,
    };
    let mut feed = EventFeed::open(state.bb.clone(), start, false, POLL)
        .await
        .map_err(|e| match e {
            artex_actors::Error::Refused(m) => ApiError {
                status: StatusCode::GONE,
                message: m,
            },
            e => ApiError::unavailable(format!("reading the event feed: {e}")),
        })?;
    // Subscribed before the first read: nothing committed in between goes unnoticed.
    feed.share_wakeups(state.wakeups.clone());
    let progress = state.progress.subscribe();
    let stream = futures_util::stream::unfold(
        Stream {
            feed,
            progress,
            phase: Phase::Start,
            app,
            stopping: state.stopping.clone(),
            yielded: Instant::now(),
            _permit: permit,
        },
        |mut s| async move {
            // The body is polled again only once the client took the last chunk.
            if s.yielded.elapsed() > SLOW_CLIENT {
                tracing::info!("dropping an event stream whose client does not keep up");
                return None;
            }
            let chunk = match s.phase {
                Phase::Done => return None,
                // Reconnect after a second if the stream breaks.
                Phase::Start => {
                    s.phase = Phase::Live;
                    Bytes::from_static(b"retry: 1000\n\n")
                }
                Phase::Live => {
                    let (chunk, next) = next_chunk(
                        &mut s.feed,
                        &mut s.progress,
                        s.app.as_ref().map(|a| a.get_ref()),
                        &s.stopping,
                    )
                    .await;
                    s.phase = next;
                    chunk
                }
            };
            s.yielded = Instant::now();
            Some((Ok::<_, std::convert::Infallible>(chunk), s))
        },
    );
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, HeaderValue::from_static("no-cache")))
        // nginx and friends: do not buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream))
}

/// One open stream: its reader, where it is, and its place in the stream budget
/// (given back when the stream is dropped).
struct Stream {
    feed: EventFeed,
    progress: broadcast::Receiver<Arc<str>>,
    phase: Phase,
    app: Option<web::Data<AppState>>,
    stopping: Arc<AtomicBool>,
    /// When the last chunk was handed to the HTTP layer.
    yielded: Instant,
    _permit: OwnedSemaphorePermit,
}

/// The next piece of the stream: a batch of events, a keep-alive comment, or (when the
/// database fails) an error event that ends the stream; the client reconnects with its
/// `Last-Event-ID` and loses nothing. Whether this process is leaving is looked at
/// every poll, so an open stream never holds a drain or an upgrade back for longer.
async fn next_chunk(
    feed: &mut EventFeed,
    progress: &mut broadcast::Receiver<Arc<str>>,
    app: Option<&AppState>,
    stopping: &AtomicBool,
) -> (Bytes, Phase) {
    let keepalive = Instant::now() + KEEPALIVE;
    loop {
        if stopping.load(Ordering::Acquire) || leaving(app).await {
            return (
                Bytes::from_static(b": this process is stopping; reconnect\n\n"),
                Phase::Done,
            );
        }
        // Looked at between the feed's reads (at most `POLL` apart), not raced with
        // them: a read given up halfway would be read again, for nothing.
        let progressed = progress_chunk(progress);
        if !progressed.is_empty() {
            return (Bytes::from(progressed), Phase::Live);
        }
        match feed
            .follow(BATCH, keepalive.min(Instant::now() + POLL))
            .await
        {
            Ok(batch) if !batch.events.is_empty() => {
                let mut out = String::new();
                for e in &batch.events {
                    let data = serde_json::to_string(e).unwrap_or_default();
                    out.push_str(&format!(
                        "id: {}\nevent: task\ndata: {data}\n\n",
                        e.position
                    ));
                }
                return (Bytes::from(out), Phase::Live);
            }
            Ok(_) if Instant::now() >= keepalive => {
                return (Bytes::from_static(b": keep-alive\n\n"), Phase::Live);
            }
            Ok(_) => {}
            Err(e) => {
                let data = serde_json::json!({ "error": e.to_string() });
                return (
                    Bytes::from(format!("event: error\ndata: {data}\n\n")),
                    Phase::Done,
                );
            }
        }
    }
}

/// The progress notifications waiting for this stream, as `event: progress` lines
/// (empty when none). A payload that is not a [`ProgressEvent`] is skipped.
fn progress_chunk(progress: &mut broadcast::Receiver<Arc<str>>) -> String {
    let mut out = String::new();
    loop {
        match progress.try_recv() {
            Ok(payload) => {
                if serde_json::from_str::<ProgressEvent>(&payload).is_ok() {
                    out.push_str(&format!("event: progress\ndata: {payload}\n\n"));
                }
            }
            // Fell behind: the oldest were dropped; go on with what is kept.
            Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => return out,
        }
    }
}

/// Whether this worker stops serving: draining, or past the listener pass of a hot
/// upgrade.
async fn leaving(app: Option<&AppState>) -> bool {
    let Some(app) = app else {
        return false;
    };
    if app.listener_passed.load(Ordering::Acquire) {
        return true;
    }
    match app.worker.send(GetStatus).await {
        Ok(s) => s.state != artex_actors::worker::WorkerState::Online,
        Err(_) => true,
    }
}

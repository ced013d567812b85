//! `GET /events`: the change feed as Server-Sent Events. Each task event is one SSE
//! event (`event: task`, `id:` its feed position, `data:` the JSON that `artex events
//! tail` prints), in the feed's final order. A client that reconnects sends the last id
//! it saw in `Last-Event-ID` (browsers' EventSource does it by itself) and resumes right
//! after it; `?after=XID-ID` does the same for a first connection. Without either, the
//! stream starts at the oldest kept event. A position older than the pruned events is
//! answered 410 Gone rather than with a silent gap. When the worker drains or hands its
//! socket to a successor (hot upgrade), the stream ends and the client's reconnection
//! lands on whoever serves the port then: an open stream never holds a shutdown back.
//! Each open stream holds one LISTEN session (a database connection of its own) and is
//! woken by the feed's NOTIFY, polling every 500 ms as a safety net. Routes hold no SQL:
//! the feed reader lives in the blackboard.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderValue, CACHE_CONTROL};
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use artex_actors::blackboard::{EventFeed, EventPosition, FeedStart};
use artex_actors::worker::GetStatus;
use artex_actors::Blackboard;
use serde::Deserialize;

use super::{ApiError, AppState};

/// What `/events` needs: the blackboard to read the feed from.
#[derive(Clone)]
pub struct EventsState {
    bb: Blackboard,
}

impl EventsState {
    /// Serves the feed of `bb`.
    pub fn new(bb: Blackboard) -> Self {
        EventsState { bb }
    }
}

/// `/events` query parameters.
#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    /// Start after this position (`XID-ID`); `Last-Event-ID` takes precedence.
    after: Option<String>,
}

/// Safety-net poll when no notification comes.
const POLL: Duration = Duration::from_millis(500);
/// A comment line at least this often, so proxies and clients see the stream is alive.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Events per read.
const BATCH: i64 = 500;

enum Phase {
    Start,
    Live,
    Done,
}

/// The SSE stream of task events.
pub async fn events(
    req: HttpRequest,
    state: web::Data<EventsState>,
    app: web::Data<AppState>,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let resume = req
        .headers()
        .get("Last-Event-ID")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| ("Last-Event-ID", s))
        .or_else(|| query.after.as_deref().map(|s| ("after", s)));
    let start = match resume {
        Some((field, value)) => {
            FeedStart::After(value.parse::<EventPosition>().map_err(|e| ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!("{field}: {e}"),
            })?)
        }
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
    // Listening before the first read: nothing committed in between goes unnoticed.
    feed.listen()
        .await
        .map_err(|e| ApiError::unavailable(format!("listening for events: {e}")))?;
    let stream = futures_util::stream::unfold(
        (feed, Phase::Start, app),
        |(mut feed, phase, app)| async move {
            match phase {
                Phase::Done => None,
                // Reconnect after a second if the stream breaks.
                Phase::Start => Some((
                    Ok(Bytes::from_static(b"retry: 1000\n\n")),
                    (feed, Phase::Live, app),
                )),
                Phase::Live => {
                    let (chunk, next) = next_chunk(&mut feed, &app).await;
                    Some((Ok::<_, std::convert::Infallible>(chunk), (feed, next, app)))
                }
            }
        },
    );
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((CACHE_CONTROL, HeaderValue::from_static("no-cache")))
        // nginx and friends: do not buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream))
}

/// The next piece of the stream: a batch of events, a keep-alive comment, or (when the
/// database fails) an error event that ends the stream; the client reconnects with its
/// `Last-Event-ID` and loses nothing.
async fn next_chunk(feed: &mut EventFeed, app: &AppState) -> (Bytes, Phase) {
    let deadline = Instant::now() + KEEPALIVE;
    loop {
        if leaving(app).await {
            return (
                Bytes::from_static(b": this process is stopping; reconnect\n\n"),
                Phase::Done,
            );
        }
        match feed.next_batch(BATCH).await {
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
            Ok(batch) => {
                let now = Instant::now();
                if now >= deadline {
                    return (Bytes::from_static(b": keep-alive\n\n"), Phase::Live);
                }
                let wait = if batch.held_back {
                    Duration::from_millis(5)
                } else {
                    feed.poll().min(deadline - now)
                };
                feed.wait(wait).await;
            }
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

/// Whether this process stops serving: draining, or handed over to a successor.
async fn leaving(app: &AppState) -> bool {
    if app.handed_over.load(Ordering::Acquire) {
        return true;
    }
    match app.worker.send(GetStatus).await {
        Ok(s) => s.state != artex_actors::worker::WorkerState::Online,
        Err(_) => true,
    }
}

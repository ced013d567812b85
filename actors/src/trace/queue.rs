//! The span processor in front of the OTLP exporter (`otlp`): a bounded queue that a
//! collector which is down or slow can never make a task wait for. Ending a span pushes
//! it under an uncontended lock (a full queue drops the span and counts it); one thread
//! of its own takes the queue and exports it, so an export that hangs until its timeout
//! holds back only that thread. That thread is woken when a batch is full, when asked
//! (a flush, the shutdown), or when a span has waited `delay`, never per span: a wake-up
//! per span cost a futex call and a context switch each, on the cores PostgreSQL runs on.
//! The SDK's batch processor drops as quietly but does not say how many: these counts
//! are what `/metrics` shows (`artex_trace_spans_dropped_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;

use super::otlp::{Exporter, Sent};

/// What happened to the spans this process ended, since it started.
#[derive(Debug, Default)]
pub struct Counts {
    /// Accepted by the collector.
    pub exported: AtomicU64,
    /// Dropped because the queue was full (the collector slower than the spans).
    pub dropped_queue_full: AtomicU64,
    /// Dropped because their export failed (the collector down, refusing, or past the
    /// export timeout).
    pub dropped_export_failed: AtomicU64,
}

/// The process's counts (one exporter per process).
pub static COUNTS: Counts = Counts {
    exported: AtomicU64::new(0),
    dropped_queue_full: AtomicU64::new(0),
    dropped_export_failed: AtomicU64::new(0),
};

/// The queue's sizes and pace: the SDK's batch processor's variables
/// (`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_SCHEDULE_DELAY`
/// in milliseconds) with their defaults.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Spans held at most; more are dropped.
    pub max_queue: usize,
    /// Spans per export at most.
    pub max_batch: usize,
    /// How long a span may wait for a batch to fill before it is exported.
    pub delay: Duration,
}

impl QueueConfig {
    /// From the environment, each variable that is unset at its default; one that is set
    /// but not a positive whole number is an error naming it.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str, default: u64| match std::env::var(name) {
            Err(_) => Ok(default),
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{name}={v:?}: expected a positive whole number")),
            },
        };
        Ok(QueueConfig {
            max_queue: var("OTEL_BSP_MAX_QUEUE_SIZE", 2048)? as usize,
            max_batch: var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)? as usize,
            delay: Duration::from_millis(var("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
        })
    }
}

/// What the export thread is asked besides spans.
enum Control {
    /// Export what is queued now, then answer.
    Flush(SyncSender<()>),
    /// Export what is queued, answer, and end.
    Shutdown(SyncSender<()>),
}

/// What the ending spans and the export thread share.
struct Queue {
    state: Mutex<State>,
    /// Signalled when a batch fills up or the thread is asked something.
    wake: Condvar,
    config: QueueConfig,
}

#[derive(Default)]
struct State {
    spans: Vec<SpanData>,
    /// Spans taken by the export thread and not yet exported: they count against
    /// `max_queue` too.
    exporting: usize,
    asked: Vec<Control>,
    /// The provider's resource, for the exporter (set before any span).
    resource: Option<Resource>,
    /// The export thread has ended: spans are dropped.
    ended: bool,
}

/// The bounded queue and its export thread (see the module doc).
pub struct QueueProcessor {
    queue: Arc<Queue>,
}

impl std::fmt::Debug for QueueProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueProcessor")
            .field("config", &self.queue.config)
            .finish_non_exhaustive()
    }
}

impl QueueProcessor {
    /// Starts the export thread, which owns `exporter`.
    pub fn start(exporter: Exporter, config: QueueConfig) -> std::io::Result<Self> {
        let queue = Arc::new(Queue {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            config,
        });
        let shared = queue.clone();
        std::thread::Builder::new()
            .name("artex-trace-export".into())
            .spawn(move || export_loop(exporter, &shared))?;
        Ok(QueueProcessor { queue })
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, OTelSdkError> {
        self.queue
            .state
            .lock()
            .map_err(|_| OTelSdkError::InternalFailure("the trace queue's lock".into()))
    }

    /// Asks the export thread `what` and waits up to `timeout` for its answer.
    fn ask(
        &self,
        what: impl FnOnce(SyncSender<()>) -> Control,
        timeout: Duration,
    ) -> OTelSdkResult {
        let (done, answered) = mpsc::sync_channel(1);
        {
            let mut state = self.state()?;
            if state.ended {
                return Err(OTelSdkError::AlreadyShutdown);
            }
            state.asked.push(what(done));
        }
        self.queue.wake.notify_one();
        answered
            .recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let Ok(mut state) = self.state() else {
            COUNTS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let config = &self.queue.config;
        if state.ended || state.spans.len() + state.exporting >= config.max_queue {
            drop(state);
            COUNTS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.spans.push(span);
        let full = state.spans.len() == config.max_batch;
        drop(state);
        if full {
            self.queue.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(5))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(mut state) = self.state() {
            state.resource = Some(resource.clone());
        }
        self.queue.wake.notify_one();
    }
}

/// The export thread: it sleeps until a batch of `max_batch` spans is queued, it is
/// asked something, or `delay` has passed since it last took the queue with spans in
/// it; then it takes every span queued and exports them in batches of at most
/// `max_batch`, and answers what it was asked.
fn export_loop(mut exporter: Exporter, queue: &Queue) {
    let config = queue.config;
    let export = |exporter: &mut Exporter, spans: &[SpanData]| {
        for batch in spans.chunks(config.max_batch) {
            let n = batch.len() as u64;
            match exporter.export(batch) {
                Ok(Sent::All) => COUNTS.exported.fetch_add(n, Ordering::Relaxed),
                Ok(Sent::Partly(refused, why)) => {
                    tracing::debug!(refused, why, "traces: the collector refused some spans");
                    let refused = refused.min(n);
                    COUNTS
                        .dropped_export_failed
                        .fetch_add(refused, Ordering::Relaxed);
                    COUNTS.exported.fetch_add(n - refused, Ordering::Relaxed)
                }
                Err(e) => {
                    tracing::debug!(error = %e, spans = n, "traces: an export failed; its spans are dropped");
                    COUNTS.dropped_export_failed.fetch_add(n, Ordering::Relaxed)
                }
            };
        }
    };
    // The spans being exported; swapped with the queue's, so neither side allocates
    // once both have grown.
    let mut taken: Vec<SpanData> = Vec::new();
    let mut due = Instant::now() + config.delay;
    loop {
        let asked = {
            let Ok(mut state) = queue.state.lock() else {
                return;
            };
            loop {
                if state.spans.len() >= config.max_batch
                    || !state.asked.is_empty()
                    || state.resource.is_some()
                {
                    break;
                }
                let now = Instant::now();
                if now >= due {
                    if !state.spans.is_empty() {
                        break;
                    }
                    due = now + config.delay;
                }
                state = match queue.wake.wait_timeout(state, due - now) {
                    Ok((s, _)) => s,
                    Err(_) => return,
                };
            }
            // The resource first: spans queued with it are the process's first.
            if let Some(r) = state.resource.take() {
                exporter.set_resource(&r);
            }
            std::mem::swap(&mut taken, &mut state.spans);
            state.exporting = taken.len();
            std::mem::take(&mut state.asked)
        };
        if !taken.is_empty() {
            export(&mut exporter, &taken);
            taken.clear();
            due = Instant::now() + config.delay;
            if let Ok(mut state) = queue.state.lock() {
                state.exporting = 0;
            }
        }
        for c in asked {
            match c {
                Control::Flush(done) => {
                    let _ = done.send(());
                }
                Control::Shutdown(done) => {
                    if let Ok(mut state) = queue.state.lock() {
                        state.ended = true;
                        taken = std::mem::take(&mut state.spans);
                    }
                    export(&mut exporter, &taken);
                    let _ = done.send(());
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    use super::super::testing::{collector, resource, spans};
    use super::*;

    fn count(body: &[u8]) -> usize {
        let req = ExportTraceServiceRequest::decode(body).expect("an export");
        req.resource_spans[0]
            .scope_spans
            .iter()
            .map(|s| s.spans.len())
            .sum()
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

    // One test, as the counts are the process's: a full batch goes at once, not after
    // the delay; a flush sends a part batch; an export that hangs holds its spans
    // against the bound, and what passes it is dropped and counted; a shutdown sends
    // what is queued, and spans after it are dropped.
    #[test]
    fn a_full_batch_goes_at_once_and_the_bound_drops_and_counts() {
        let (mut config, got) = collector(vec![Some(OK), Some(OK)]);
        config.timeout = Duration::from_secs(30);
        let queue = QueueConfig {
            max_queue: 4,
            max_batch: 2,
            delay: Duration::from_secs(3600),
        };
        let mut p = QueueProcessor::start(Exporter::new(config), queue).unwrap();
        p.set_resource(&resource());
        let span = spans().swap_remove(0);
        let dropped = || COUNTS.dropped_queue_full.load(Ordering::Relaxed);
        let exported = || COUNTS.exported.load(Ordering::Relaxed);
        let (dropped0, exported0) = (dropped(), exported());
        p.on_end(span.clone());
        p.on_end(span.clone());
        let (_, body) = got
            .recv_timeout(Duration::from_secs(20))
            .expect("a full batch, at once");
        assert_eq!(count(&body), 2);
        p.on_end(span.clone());
        p.force_flush().expect("the flush");
        assert_eq!(count(&got.recv().unwrap().1), 1);
        assert_eq!(exported() - exported0, 3);
        // The collector answers no more: this batch's export hangs, its two spans held.
        p.on_end(span.clone());
        p.on_end(span.clone());
        got.recv_timeout(Duration::from_secs(20))
            .expect("the third export");
        for _ in 0..4 {
            p.on_end(span.clone());
        }
        assert_eq!(
            dropped() - dropped0,
            2,
            "2 exporting + 2 queued = the bound of 4"
        );

        let (config, got) = collector(vec![Some(OK)]);
        let mut p = QueueProcessor::start(Exporter::new(config), queue).unwrap();
        p.set_resource(&resource());
        p.on_end(span.clone());
        p.shutdown_with_timeout(Duration::from_secs(20))
            .expect("the shutdown");
        assert_eq!(count(&got.recv().unwrap().1), 1);
        let dropped1 = dropped();
        p.on_end(span);
        assert_eq!(dropped() - dropped1, 1);
        assert!(matches!(
            p.force_flush(),
            Err(OTelSdkError::AlreadyShutdown)
        ));
    }

    // nextest runs each test in a process of its own: setting the environment here
    // changes no other test.
    #[test]
    fn the_queue_variables_default_when_unset_and_a_bad_one_is_named() {
        for name in [
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "OTEL_BSP_SCHEDULE_DELAY",
        ] {
            std::env::remove_var(name);
        }
        let c = QueueConfig::from_env().unwrap();
        assert_eq!((c.max_queue, c.max_batch), (2048, 512));
        assert_eq!(c.delay, Duration::from_millis(5000));
        std::env::set_var("OTEL_BSP_MAX_QUEUE_SIZE", " 64 ");
        assert_eq!(QueueConfig::from_env().unwrap().max_queue, 64);
        for bad in ["0", "-1", "lots"] {
            std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", bad);
            let e = QueueConfig::from_env().unwrap_err();
            assert!(
                e.contains("OTEL_BSP_SCHEDULE_DELAY") && e.contains(bad),
                "{e}"
            );
        }
    }
}

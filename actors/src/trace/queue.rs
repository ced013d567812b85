//! The span processor in front of the OTLP exporter: a bounded queue that a collector
//! which is down or slow can never make a task wait for. Ending a span is a `try_send`
//! (a full queue drops the span and counts it); one thread of its own batches the
//! queue and exports each batch, so an export that hangs until its timeout holds back
//! only that thread. The SDK's batch processor drops as quietly but does not say how
//! many: these counts are what `/metrics` shows (`artex_trace_spans_dropped_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

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
    /// The provider's resource, for the exporter (before any span).
    Resource(Resource),
    /// Export what is queued now, then answer.
    Flush(SyncSender<()>),
    /// Export what is queued, shut the exporter down, answer, and end.
    Shutdown(SyncSender<()>),
}

/// The bounded queue and its export thread (see the module doc).
#[derive(Debug)]
pub struct QueueProcessor {
    spans: SyncSender<SpanData>,
    control: Mutex<mpsc::Sender<Control>>,
}

impl QueueProcessor {
    /// Starts the export thread, which owns `exporter` and a one-thread runtime for it.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        config: QueueConfig,
    ) -> std::io::Result<Self> {
        let (spans, queued) = mpsc::sync_channel(config.max_queue);
        let (control, asked) = mpsc::channel();
        std::thread::Builder::new()
            .name("artex-trace-export".into())
            .spawn(move || export_loop(exporter, config, queued, asked))?;
        Ok(QueueProcessor {
            spans,
            control: Mutex::new(control),
        })
    }

    /// Sends `what` to the export thread and waits up to `timeout` for its answer.
    fn ask(
        &self,
        what: impl FnOnce(SyncSender<()>) -> Control,
        timeout: Duration,
    ) -> OTelSdkResult {
        let (done, answered) = mpsc::sync_channel(1);
        let sent = self
            .control
            .lock()
            .map_err(|_| OTelSdkError::InternalFailure("the trace queue's lock".into()))?
            .send(what(done));
        if sent.is_err() {
            return Err(OTelSdkError::AlreadyShutdown);
        }
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
        match self.spans.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                COUNTS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(5))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(c) = self.control.lock() {
            let _ = c.send(Control::Resource(resource.clone()));
        }
    }
}

/// The export thread: batches of at most `max_batch` spans, each exported when full or
/// when its first span has waited `delay`; control messages between exports.
fn export_loop<E: SpanExporter>(
    mut exporter: E,
    config: QueueConfig,
    queued: Receiver<SpanData>,
    asked: Receiver<Control>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "traces: no runtime for the exporter; spans are dropped");
            return;
        }
    };
    let export = |exporter: &E, batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match runtime.block_on(exporter.export(std::mem::take(batch))) {
            Ok(()) => COUNTS.exported.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::debug!(error = %e, spans = n, "traces: an export failed; its spans are dropped");
                COUNTS.dropped_export_failed.fetch_add(n, Ordering::Relaxed)
            }
        };
    };
    let mut batch: Vec<SpanData> = Vec::new();
    let mut first_at = Instant::now();
    // Control messages are looked at between spans at least this often.
    let tick = config.delay.min(Duration::from_millis(100));
    loop {
        while let Ok(c) = asked.try_recv() {
            match c {
                Control::Resource(r) => exporter.set_resource(&r),
                Control::Flush(done) => {
                    while let Ok(s) = queued.try_recv() {
                        batch.push(s);
                        if batch.len() >= config.max_batch {
                            export(&exporter, &mut batch);
                        }
                    }
                    export(&exporter, &mut batch);
                    let _ = done.send(());
                }
                Control::Shutdown(done) => {
                    while let Ok(s) = queued.try_recv() {
                        batch.push(s);
                    }
                    for mut chunk in std::mem::take(&mut batch)
                        .chunks(config.max_batch)
                        .map(<[SpanData]>::to_vec)
                    {
                        export(&exporter, &mut chunk);
                    }
                    let _ = exporter.shutdown();
                    let _ = done.send(());
                    return;
                }
            }
        }
        let wait = if batch.is_empty() {
            tick
        } else {
            config.delay.saturating_sub(first_at.elapsed()).min(tick)
        };
        match queued.recv_timeout(wait) {
            Ok(s) => {
                if batch.is_empty() {
                    first_at = Instant::now();
                }
                batch.push(s);
                if batch.len() >= config.max_batch {
                    export(&exporter, &mut batch);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if !batch.is_empty() && first_at.elapsed() >= config.delay {
                    export(&exporter, &mut batch);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                export(&exporter, &mut batch);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

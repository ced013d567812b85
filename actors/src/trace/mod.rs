//! OpenTelemetry traces from the submitter to the handler (docs/tracing.md): the W3C
//! context a task carries, the exporter, and the spans each process makes of the facts
//! it has. Off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); off, every span function returns at the first
//! check (one atomic load) and nothing else is read or written.
//!
//! # Layout
//! - `traceparent`: [`TraceParent`], the W3C header's value, parsed and checked (pure).
//! - `queue`: the bounded span queue in front of the OTLP/HTTP exporter, and the counts
//!   of spans exported and dropped.
//! - `otlp`: the exporter: its configuration, and the HTTP/1.1 client that posts each
//!   batch.
//! - `protobuf`: a batch's OTLP protobuf, written straight from the SDK's span data.
//! - `spans`: the submission, queue, assignment and attempt spans.

mod otlp;
mod protobuf;
mod queue;
mod spans;
#[cfg(test)]
mod testing;
mod traceparent;

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::metrics::{Exposition, Type};

pub use queue::QueueConfig;
pub use spans::{assignments, transfer, Assigned, AssignedBy, AttemptSpan, OpSpan, SubmitSpan};
pub use traceparent::{TraceParent, TRACEPARENT_FORMAT};

/// The process's tracer, once [`init`] found an endpoint.
static TRACER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// The tracer when tracing is on.
pub(crate) fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get().map(|(_, t)| t)
}

/// Whether this process exports traces.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Whether the environment configures an OTLP endpoint for traces (and does not
/// disable the SDK with `OTEL_SDK_DISABLED=true`).
pub fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Flushes and stops the exporter when dropped (at the end of `main`): the spans a
/// short-lived process made (`artex submit`) leave before it exits.
#[derive(Debug)]
pub struct Flush;

impl Drop for Flush {
    fn drop(&mut self) {
        if let Some((provider, _)) = TRACER.get() {
            let _ = provider.shutdown_with_timeout(std::time::Duration::from_secs(3));
        }
    }
}

/// Turns tracing on for this process if the environment configures an endpoint (see
/// docs/tracing.md for the variables): spans of `role` (`serve`, `planner`, `worker`,
/// `cli`, …) go to the collector over OTLP/HTTP. `Ok(None)` when not configured.
pub fn init(role: &str) -> Result<Option<Flush>, String> {
    if !configured() || TRACER.get().is_some() {
        return Ok(None);
    }
    protocol()?;
    let Some(export) = otlp::ExportConfig::from_env().map_err(|e| format!("traces: {e}"))? else {
        return Ok(None);
    };
    let exporter = otlp::Exporter::new(export);
    let config = QueueConfig::from_env().map_err(|e| format!("traces: {e}"))?;
    let processor = queue::QueueProcessor::start(exporter, config)
        .map_err(|e| format!("traces: the export thread: {e}"))?;
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("artex.role", role.to_string()),
        KeyValue::new("process.pid", std::process::id() as i64),
    ]);
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("artex");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("artex");
    let _ = TRACER.set((provider, tracer));
    Ok(Some(Flush))
}

/// The OTLP protocol: `http/protobuf` (what collectors expect by default) unless
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` says otherwise;
/// gRPC and JSON are not built in.
fn protocol() -> Result<(), String> {
    let asked = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    match asked.trim() {
        "" | "http/protobuf" => Ok(()),
        other => Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL {other:?}: artex exports traces over http/protobuf only"
        )),
    }
}

/// This process's span counts, in Prometheus' text format: written by every process
/// that serves `/metrics` (serve, workers, planners with `--metrics`).
pub fn write_metrics(out: &mut Exposition) {
    let c = &queue::COUNTS;
    let name = "artex_trace_spans_dropped_total";
    out.family(
        name,
        Type::Counter,
        "Spans this process made but never delivered: its queue was full, or their export failed.",
    )
    .sample(
        name,
        &[("reason", "queue_full")],
        c.dropped_queue_full.load(Ordering::Relaxed) as f64,
    )
    .sample(
        name,
        &[("reason", "export_failed")],
        c.dropped_export_failed.load(Ordering::Relaxed) as f64,
    );
    out.single(
        "artex_trace_spans_exported_total",
        Type::Counter,
        "Spans this process delivered to the OTLP collector.",
        c.exported.load(Ordering::Relaxed) as f64,
    );
}

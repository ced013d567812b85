//! OpenTelemetry traces from the submitter to the handler (issue 37, item 1;
//! docs/tracing.md).
//!
//! # Layout
//! - `stored`: a submission's W3C `traceparent`, through every surface (the API header,
//!   the CLI's flag and `TRACEPARENT`, `artex.submit`, the library), stored with the
//!   task; an invalid one refused naming the field, with nothing written.
//! - `spans`: real processes export to `receiver`, a real OTLP/HTTP receiver: one trace
//!   from the submitter to the handler, retries in it, a collector that is down.
//! - `receiver`: the OTLP/HTTP (protobuf) receiver, on 127.0.0.1 port 0.

#[path = "../common/mod.rs"]
mod common;

mod receiver;
mod spans;
mod stored;

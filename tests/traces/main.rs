//! OpenTelemetry traces from the submitter to the handler (issue 37, item 1;
//! docs/tracing.md).
//!
//! # Layout
//! - `stored`: a submission's W3C `traceparent`, through every surface (the API header,
//!   the CLI's flag and `TRACEPARENT`, `artex.submit`, the library), stored with the
//!   task; an invalid one refused naming the field, with nothing written.

#[path = "../common/mod.rs"]
mod common;

mod stored;

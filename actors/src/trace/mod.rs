//! OpenTelemetry traces from the submitter to the handler (docs/tracing.md): the W3C
//! context a task carries, and the spans each process makes of the facts it has.
//!
//! # Layout
//! - `traceparent`: [`TraceParent`], the W3C header's value, parsed and checked (pure).

mod traceparent;

pub use traceparent::{TraceParent, TRACEPARENT_FORMAT};

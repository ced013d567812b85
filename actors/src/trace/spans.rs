//! The spans artex makes, each where its facts are: the submission (the API server or
//! the CLI), the time in queue and the assignment (the planner's round, or the worker
//! that claimed the task itself), each attempt's run (the worker). All are children of
//! the task's stored `traceparent`, so one trace holds a task's whole life, retries
//! included; spans of the past carry explicit times.
//! Every function here returns at once when tracing is off.

use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::Span;
use uuid::Uuid;

use super::{tracer, TraceParent};
use crate::blackboard::{AssignedTask, Submitted};
use crate::submission::NewTask;

/// The span context `tp` names, as a remote parent.
fn parent(tp: &TraceParent) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.span_id),
        TraceFlags::new(tp.flags),
        true,
        TraceState::default(),
    ))
}

/// `span`'s context as a traceparent (what is stored, and handed to handlers).
fn traceparent_of(span: &Span) -> Option<TraceParent> {
    let sc = span.span_context();
    sc.is_valid().then(|| TraceParent {
        version: 0,
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    })
}

/// A submission's span, started before its tasks are written: its context is what the
/// tasks store (the submitter's own, `given`, is its parent; without one it starts a
/// trace). `None` when tracing is off.
pub struct SubmitSpan {
    span: Span,
    context: Option<TraceParent>,
}

impl SubmitSpan {
    /// Starts the span of a submission of `kinds` (one per task) by `via` (`api`, `cli`).
    pub fn start(given: Option<&TraceParent>, via: &str, tasks: &[NewTask]) -> Option<SubmitSpan> {
        let tracer = tracer()?;
        let cx = given.map(parent).unwrap_or_default();
        let mut attributes = vec![
            KeyValue::new("artex.via", via.to_string()),
            KeyValue::new("artex.tasks", tasks.len() as i64),
        ];
        if let Some(first) = tasks.first() {
            attributes.push(KeyValue::new("artex.task.kind", first.kind.clone()));
        }
        let span = tracer
            .span_builder("artex.submit")
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(tracer, &cx);
        let context = traceparent_of(&span);
        Some(SubmitSpan { span, context })
    }

    /// The context the submitted tasks store.
    pub fn traceparent(&self) -> Option<String> {
        self.context.map(|c| c.to_string())
    }

    /// Ends it with the tasks written (or the error that refused them).
    pub fn end<E: std::fmt::Display>(mut self, submitted: &Result<Vec<Submitted>, E>) {
        match submitted {
            Ok(s) if s.len() == 1 => self
                .span
                .set_attribute(KeyValue::new("artex.task.id", s[0].id.to_string())),
            Ok(s) => self.span.set_attribute(KeyValue::new(
                "artex.task.ids",
                s.iter()
                    .map(|s| s.id.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            )),
            Err(e) => self.span.set_status(Status::error(e.to_string())),
        }
        self.span.end();
    }
}

/// What the planner (or the claiming worker) knows of one assignment it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The task.
    pub task: Uuid,
    /// Its kind.
    pub kind: String,
    /// Its stored context.
    pub traceparent: TraceParent,
    /// When it became runnable (its `run_at`): its time in queue starts there.
    pub runnable_at: SystemTime,
    /// The worker it went to.
    pub worker: String,
}

/// Who assigned: a planner's round, or the worker's own claim (`artex.claim_and_read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignedBy<'a> {
    /// Round `round` of planner `planner`.
    Round {
        /// The planner's name.
        planner: &'a str,
        /// Its round, counted from its start.
        round: u64,
    },
    /// The worker claimed the tasks for itself.
    Claim,
}

/// The spans of one round's or one claim's assignments: per task, its time in queue
/// (runnable to the assignment's start) and its assignment (`started` to `ended`, with
/// the worker, and the planner and its round or `artex.claimed`).
pub fn assignments(by: AssignedBy<'_>, started: SystemTime, ended: SystemTime, given: &[Assigned]) {
    let Some(tracer) = tracer() else {
        return;
    };
    // Strings shared by the round's spans are counted references, not copies.
    let by = match by {
        AssignedBy::Round { planner, round } => vec![
            KeyValue::new(
                "artex.planner",
                Value::String(Arc::<str>::from(planner).into()),
            ),
            KeyValue::new("artex.round", round as i64),
        ],
        AssignedBy::Claim => vec![KeyValue::new("artex.claimed", true)],
    };
    for a in given {
        let cx = parent(&a.traceparent);
        let id = Value::String(Arc::<str>::from(a.task.to_string()).into());
        let kind = Value::String(Arc::<str>::from(a.kind.as_str()).into());
        let common = [
            KeyValue::new("artex.task.id", id),
            KeyValue::new("artex.task.kind", kind),
        ];
        let mut queue = tracer
            .span_builder("artex.queue")
            .with_kind(SpanKind::Consumer)
            .with_start_time(a.runnable_at.min(started))
            .with_attributes(common.to_vec())
            .start_with_context(tracer, &cx);
        queue.end_with_timestamp(started);
        let mut attributes = common.to_vec();
        attributes.extend(by.iter().cloned());
        attributes.push(KeyValue::new("artex.worker", a.worker.clone()));
        let mut span = tracer
            .span_builder("artex.assign")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(tracer, &cx);
        span.end_with_timestamp(ended);
    }
}

/// A hot upgrade's transfer of a running task, made by the new process: from when it was
/// asked to take the task over (`started`) to now, when it resumes it from its
/// checkpoint. Nothing when tracing is off or the task carries no context.
pub fn transfer(task: &AssignedTask, from: &str, to: &str, started: SystemTime) {
    let (Some(tracer), Some(tp)) = (tracer(), task.traceparent.as_ref()) else {
        return;
    };
    let mut span = tracer
        .span_builder("artex.transfer")
        .with_kind(SpanKind::Internal)
        .with_start_time(started)
        .with_attributes(vec![
            KeyValue::new("artex.task.id", task.id.to_string()),
            KeyValue::new("artex.task.kind", task.kind.clone()),
            KeyValue::new("artex.attempt", i64::from(task.retries) + 1),
            KeyValue::new("artex.worker.from", from.to_string()),
            KeyValue::new("artex.worker", to.to_string()),
        ])
        .start_with_context(tracer, &parent(tp));
    span.end();
}

/// One attempt's run in a worker: started when its handler starts, ended with its
/// outcome. Dropped without [`AttemptSpan::end`] (the lease was lost, the worker gave
/// the task back), it ends as `stopped`.
pub struct AttemptSpan {
    span: Option<Span>,
    context: Option<TraceParent>,
}

impl AttemptSpan {
    /// Starts the span of attempt `attempt` of task `task` on `worker`, child of the
    /// task's context; `None` when tracing is off or the task carries none.
    pub fn start(
        tp: Option<&TraceParent>,
        task: Uuid,
        kind: &str,
        attempt: i32,
        worker: &str,
    ) -> Option<AttemptSpan> {
        let (tracer, tp) = (tracer()?, tp?);
        let span = tracer
            .span_builder("artex.attempt")
            .with_kind(SpanKind::Consumer)
            .with_attributes(vec![
                KeyValue::new("artex.task.id", task.to_string()),
                KeyValue::new("artex.task.kind", kind.to_string()),
                KeyValue::new("artex.attempt", attempt as i64),
                KeyValue::new("artex.worker", worker.to_string()),
            ])
            .start_with_context(tracer, &parent(tp));
        let context = traceparent_of(&span);
        Some(AttemptSpan {
            span: Some(span),
            context,
        })
    }

    /// Its context: the parent of what the handler does (`TRACEPARENT` for programs).
    pub fn context(&self) -> Option<TraceParent> {
        self.context
    }

    /// Ends it with `outcome` (`succeeded`, `failed`, `timeout`, `discarded`,
    /// `snoozed`, `transferred`) and, for a failure, its error.
    pub fn end(mut self, outcome: &str, error: Option<&str>) {
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("artex.outcome", outcome.to_string()));
            if let Some(e) = error {
                span.set_status(Status::error(e.to_string()));
            }
            span.end();
        }
    }
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("artex.outcome", "stopped"));
            span.end();
        }
    }
}

/// A span of something this process does now (a hot upgrade, its upload): a child of
/// `parent`, or the root of a new trace. Dropped without [`OpSpan::end`], it ends as is.
pub struct OpSpan {
    span: Span,
    context: Option<TraceParent>,
}

impl OpSpan {
    /// Starts span `name`; `None` when tracing is off.
    pub fn start(name: &'static str, parent_tp: Option<&TraceParent>) -> Option<OpSpan> {
        let tracer = tracer()?;
        let cx = parent_tp.map(parent).unwrap_or_default();
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &cx);
        let context = traceparent_of(&span);
        Some(OpSpan { span, context })
    }

    /// Its context: the parent of the spans it holds.
    pub fn context(&self) -> Option<TraceParent> {
        self.context
    }

    /// Sets attribute `key` to a text.
    pub fn set_text(&mut self, key: &'static str, value: impl Into<String>) {
        self.span.set_attribute(KeyValue::new(key, value.into()));
    }

    /// Sets attribute `key` to a number.
    pub fn set_int(&mut self, key: &'static str, value: i64) {
        self.span.set_attribute(KeyValue::new(key, value));
    }

    /// Ends it, with an error status if `error`.
    pub fn end(mut self, error: Option<&str>) {
        if let Some(e) = error {
            self.span.set_status(Status::error(e.to_string()));
        }
        self.span.end();
    }
}

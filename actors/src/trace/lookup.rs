//! The trace a task taken by a worker belongs to: its stored context, which the
//! worker's read of its assignments and the tasks a wake-up carries bring with them
//! (migrations/V45), and the worker that runs it. Set only with tracing on.

use std::sync::Arc;

use uuid::Uuid;

use super::{AttemptSpan, TraceParent};
use crate::blackboard::AssignedTask;

/// A traced task's context as its worker holds it.
#[derive(Debug, Clone)]
pub struct TaskTrace {
    worker: Arc<str>,
    parent: TraceParent,
}

impl TaskTrace {
    /// With tracing on, gives each of `tasks` (taken by `worker`) that carries a context
    /// its trace. Off, it does nothing.
    pub fn attach(worker: &str, tasks: &mut [AssignedTask]) {
        if !super::enabled() {
            return;
        }
        let worker: Arc<str> = worker.into();
        for t in tasks {
            if let Some(parent) = t.traceparent {
                t.trace = Some(TaskTrace {
                    worker: worker.clone(),
                    parent,
                });
            }
        }
    }

    /// Starts the span of attempt `attempt` of task `id`.
    pub fn attempt_span(&self, id: Uuid, kind: &str, attempt: i32) -> Option<AttemptSpan> {
        AttemptSpan::start(Some(&self.parent), id, kind, attempt, &self.worker)
    }
}

//! A worker's read of the trace contexts of the tasks it just took (with tracing on
//! only): one read per batch, shared by the batch's attempts, each of which waits for it
//! before its handler starts (the attempt's span is the handler's parent). The worker's
//! own statements (its read of assignments, the tasks wake-ups carry) stay as they are,
//! plans and all, whether tracing is on or off.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use uuid::Uuid;

use super::{AttemptSpan, TraceParent};
use crate::blackboard::{AssignedTask, WorkerBoard};

type Contexts = Shared<BoxFuture<'static, Arc<HashMap<Uuid, TraceParent>>>>;

/// The trace a task taken by a worker belongs to, read with its batch's.
#[derive(Clone)]
pub struct TaskTrace {
    worker: Arc<str>,
    contexts: Contexts,
}

impl std::fmt::Debug for TaskTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskTrace")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

impl TaskTrace {
    /// With tracing on, gives each of `tasks` (taken by `worker`) the read of their
    /// contexts, which the first attempt to start runs. Off, it does nothing.
    pub fn attach(bb: &WorkerBoard, worker: &str, tasks: &mut [AssignedTask]) {
        if !super::enabled() || tasks.is_empty() {
            return;
        }
        let ids: Vec<Uuid> = tasks.iter().map(|t| t.id).collect();
        let bb = bb.clone();
        let contexts = async move {
            let found = bb.trace_contexts(&ids).await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "traces: reading the tasks' contexts");
                Vec::new()
            });
            Arc::new(
                found
                    .into_iter()
                    .filter_map(|(id, tp)| Some((id, TraceParent::parse(&tp).ok()?)))
                    .collect(),
            )
        }
        .boxed()
        .shared();
        let trace = TaskTrace {
            worker: worker.into(),
            contexts,
        };
        for t in tasks {
            t.trace = Some(trace.clone());
        }
    }

    /// Starts the span of attempt `attempt` of task `id` (`None` if the task carries no
    /// context).
    pub async fn attempt_span(&self, id: Uuid, kind: &str, attempt: i32) -> Option<AttemptSpan> {
        let contexts = self.contexts.clone().await;
        AttemptSpan::start(contexts.get(&id), id, kind, attempt, &self.worker)
    }
}

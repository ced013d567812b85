//! What a worker binary supplies and its handlers see: the [`Registry`] of handlers by
//! kind, the [`TaskHandler`] trait, the [`TaskContext`] an attempt gets, and how one
//! attempt runs (timeout, caught panics) to a result the Worker records.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use uuid::Uuid;

use super::fence::LeaseEnd;
use super::progress::ProgressSlots;
use crate::blackboard::{AssignedTask, WorkerBoard};
use crate::supervisor::panic_message;
use crate::trace::{AttemptSpan, TraceParent};

/// A failed attempt, as a handler reports it, and what follows it: by default it is
/// retried with backoff while the task's retry budget lasts ([`TaskError::new`], or `?` on
/// any error); the handler may instead end the task now ([`TaskError::discard`]), put it
/// off without counting an attempt ([`TaskError::snooze`]), or retry it at a time of its
/// choosing ([`TaskError::retry_at`]). The message is the task's error and the reason in
/// its history, which so says which it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    message: String,
    then: AfterError,
}

/// What the worker does after a handler's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterError {
    /// Retried after the worker's backoff while the task's retries last, then `failed`.
    Retry,
    /// `failed` now, whatever retries are left.
    Discard,
    /// Run again after this long; no attempt counted.
    Snooze(Duration),
    /// Retried at this time (an attempt counted); `failed` if none is left.
    RetryAt(chrono::DateTime<chrono::Utc>),
}

impl TaskError {
    /// A failure with this message: retried with backoff while retries last.
    pub fn new(msg: impl Into<String>) -> Self {
        TaskError {
            message: msg.into(),
            then: AfterError::Retry,
        }
    }

    /// Ends the task `failed` now, with no retry: a failure retrying cannot mend (bad
    /// input, a record that no longer exists). Recorded as `discarded: <reason>`.
    pub fn discard(reason: impl Into<String>) -> Self {
        TaskError {
            message: format!("discarded: {}", reason.into()),
            then: AfterError::Discard,
        }
    }

    /// Puts the task back to run again after `after`, counting no attempt: not a failure
    /// (the resource is busy, the time has not come). Recorded as `snoozed for N ms`.
    pub fn snooze(after: Duration) -> Self {
        TaskError {
            message: format!("snoozed for {} ms", after.as_millis()),
            then: AfterError::Snooze(after),
        }
    }

    /// A failure retried at `at` (now if it has passed) instead of after the backoff; it
    /// counts an attempt, and with none left the task ends `failed`. Recorded as
    /// `retry at <time>: <reason>`.
    pub fn retry_at(at: chrono::DateTime<chrono::Utc>, reason: impl Into<String>) -> Self {
        TaskError {
            message: format!("retry at {}: {}", at.to_rfc3339(), reason.into()),
            then: AfterError::RetryAt(at),
        }
    }

    /// The message recorded.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What follows the error.
    pub fn then(&self) -> &AfterError {
        &self.then
    }
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error> From<E> for TaskError {
    fn from(e: E) -> Self {
        TaskError::new(e.to_string())
    }
}

/// What a handler returns.
pub type HandlerResult = Result<serde_json::Value, TaskError>;
/// The future a handler returns. It runs on the worker's thread, so it need not be `Send`;
/// CPU-heavy work belongs in `tokio::task::spawn_blocking`.
pub type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult>>>;

/// Code that runs tasks of one kind.
pub trait TaskHandler: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, ctx: TaskContext) -> HandlerFuture;
}

impl<F, Fut> TaskHandler for F
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + 'static,
{
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        Box::pin(self(ctx))
    }
}

/// Handlers by kind: what a worker binary runs.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn TaskHandler>>,
    timeouts: HashMap<String, Duration>,
    resumable: HashSet<String>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `handler` for `kind` (replacing any earlier one).
    pub fn register(&mut self, kind: impl Into<String>, handler: impl TaskHandler) -> &mut Self {
        self.handlers.insert(kind.into(), Arc::new(handler));
        self
    }

    /// Registers `handler` for `kind` with its own default timeout per attempt.
    pub fn register_with_timeout(
        &mut self,
        kind: impl Into<String>,
        timeout: Duration,
        handler: impl TaskHandler,
    ) -> &mut Self {
        let kind = kind.into();
        self.timeouts.insert(kind.clone(), timeout);
        self.register(kind, handler)
    }

    /// Registers a handler that saves its progress with
    /// [`TaskContext::save_checkpoint`] and resumes from [`TaskContext::checkpoint`]: in a
    /// hot upgrade its running tasks move to the new process at their next checkpoint
    /// instead of running to their end in the old one.
    pub fn register_resumable(
        &mut self,
        kind: impl Into<String>,
        handler: impl TaskHandler,
    ) -> &mut Self {
        let kind = kind.into();
        self.resumable.insert(kind.clone());
        self.register(kind, handler)
    }

    /// Marks the registered `kind` resumable, as [`Registry::register_resumable`] does
    /// (for a handler registered otherwise, e.g. with a timeout); an unknown kind is
    /// left alone.
    pub fn set_resumable(&mut self, kind: &str) -> &mut Self {
        if self.handlers.contains_key(kind) {
            self.resumable.insert(kind.to_string());
        }
        self
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.handlers.keys().cloned().collect();
        k.sort();
        k
    }

    /// Keeps only the kinds for which `keep` says yes.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.handlers.retain(|k, _| keep(k));
        let handlers = &self.handlers;
        self.resumable.retain(|k| handlers.contains_key(k));
    }

    fn get(&self, kind: &str) -> Option<Arc<dyn TaskHandler>> {
        self.handlers.get(kind).cloned()
    }

    /// Whether `kind` was registered with [`Registry::register_resumable`].
    pub(super) fn is_resumable(&self, kind: &str) -> bool {
        self.resumable.contains(kind)
    }

    /// The timeout of an attempt at `task`: the task's own, else its handler's, else
    /// `default`.
    fn timeout(&self, task: &AssignedTask, default: Duration) -> Duration {
        task.timeout_ms
            .map(|ms| Duration::from_millis(ms as u64))
            .or_else(|| self.timeouts.get(&task.kind).copied())
            .unwrap_or(default)
    }

    /// One attempt at `task`, ready to run: its handler called with its context, under
    /// its timeout, with panics caught, steered by the worker (see [`Steering`]).
    pub(super) fn attempt(
        &self,
        task: AssignedTask,
        bb: WorkerBoard,
        steering: Steering,
        default_timeout: Duration,
    ) -> impl Future<Output = Result<serde_json::Value, Attempt>> + 'static {
        let Steering {
            suspend,
            cancel,
            progress,
            lease,
            span,
        } = steering;
        let handler = self.get(&task.kind);
        let timeout = self.timeout(&task, default_timeout);
        let kind = task.kind.clone();
        let suspended = suspend.clone();
        let ctx = TaskContext {
            id: task.id,
            kind: task.kind,
            payload: task.payload,
            epoch: task.epoch,
            attempt: task.retries + 1,
            max_attempts: task.max_retries + 1,
            checkpoint: task.checkpoint,
            bb,
            suspend,
            cancel,
            progress,
            lease,
            trace: span.as_ref().and_then(AttemptSpan::context),
        };
        async move {
            let Some(handler) = handler else {
                return Err(Attempt::failed(format!(
                    "no handler for kind '{kind}' in this worker"
                )));
            };
            let call = AssertUnwindSafe(handler.call(ctx)).catch_unwind();
            let result = match tokio::time::timeout(timeout, call).await {
                Ok(Ok(Ok(value))) => Ok(value),
                Ok(Ok(Err(e))) => Err(Attempt::Failed(e.message, e.then)),
                Ok(Err(panic)) => Err(Attempt::failed(format!(
                    "handler panicked: {}",
                    panic_message(&*panic)
                ))),
                Err(_) => Err(Attempt::TimedOut(format!(
                    "handler ran past its timeout of {} ms",
                    timeout.as_millis()
                ))),
            };
            if let Some(span) = span {
                let (outcome, error) = match &result {
                    // Stopped at a checkpoint for a hot upgrade: it runs on elsewhere.
                    Err(_) if suspended.load(Ordering::Acquire) => ("transferred", None),
                    Ok(_) => ("succeeded", None),
                    Err(Attempt::Failed(e, AfterError::Discard)) => ("discarded", Some(e)),
                    Err(Attempt::Failed(e, AfterError::Snooze(_))) => ("snoozed", Some(e)),
                    Err(Attempt::Failed(e, _)) => ("failed", Some(e)),
                    Err(Attempt::TimedOut(e)) => ("timeout", Some(e)),
                };
                span.end(outcome, error.map(String::as_str));
            }
            result
        }
    }
}

/// How an attempt went wrong (its success is its result).
pub(super) enum Attempt {
    /// The handler returned an error (and said what follows), panicked, or there is none
    /// for the kind.
    Failed(String, AfterError),
    /// The handler ran past its timeout.
    TimedOut(String),
}

impl Attempt {
    /// A failure retried as usual.
    fn failed(message: String) -> Self {
        Attempt::Failed(message, AfterError::Retry)
    }
}

/// What a handler gets: the task's input, its saved progress, and a fenced way to save
/// more.
#[derive(Clone)]
pub struct TaskContext {
    id: Uuid,
    kind: String,
    payload: serde_json::Value,
    epoch: i64,
    attempt: i32,
    max_attempts: i32,
    checkpoint: Option<serde_json::Value>,
    bb: WorkerBoard,
    suspend: Arc<AtomicBool>,
    cancel: Cancel,
    progress: ProgressSlots,
    lease: LeaseEnd,
    trace: Option<TraceParent>,
}

/// How the worker reaches a running attempt: `suspend`, the flag a hot upgrade raises to
/// stop it at its next checkpoint; `cancel`, raised when the task was canceled;
/// `progress`, what it reports, for the worker to write; `lease`, the end of the lease it
/// runs under as the worker knows it (renewals move it).
pub(super) struct Steering {
    pub suspend: Arc<AtomicBool>,
    pub cancel: Cancel,
    pub progress: ProgressSlots,
    pub lease: LeaseEnd,
    /// With tracing on and a context on the task, the attempt's span: the handler's parent.
    pub span: Option<AttemptSpan>,
}

/// An operator's cancel of a running task, as its handler sees it: raised once, when the
/// worker learns the task ended `canceled` (within a second of the cancel: the planners
/// push it to the worker that holds the task).
#[derive(Clone, Default)]
pub(super) struct Cancel(Arc<CancelState>);

#[derive(Default)]
struct CancelState {
    raised: AtomicBool,
    raise: tokio::sync::Notify,
}

impl Cancel {
    /// Tells the handler; every `cancelled()` waiting, and every later one, returns.
    pub(super) fn raise(&self) {
        self.0.raised.store(true, Ordering::Release);
        self.0.raise.notify_waiters();
    }

    fn is_raised(&self) -> bool {
        self.0.raised.load(Ordering::Acquire)
    }

    async fn raised(&self) {
        let notified = self.0.raise.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a raise between the two is not missed.
        notified.as_mut().enable();
        if self.is_raised() {
            return;
        }
        notified.await;
    }
}

impl TaskContext {
    /// Whether the task was canceled while this attempt runs: the handler should stop
    /// (what it returns is not recorded; the task ended `canceled` with the operator's
    /// reason). A handler still running `--cancel-grace-ms` after it was told is stopped.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_raised()
    }

    /// Returns when the task is canceled (at once if it was): select on it beside the
    /// handler's work to stop cleanly,
    /// `tokio::select! { r = work => r, _ = ctx.cancelled() => Err(TaskError::new("canceled")) }`.
    pub async fn cancelled(&self) {
        self.cancel.raised().await
    }

    /// Reports how far the attempt is: `fraction` from 0 to 1 (clamped; NaN or infinite
    /// is ignored) and an optional message (cut to 200 characters). Cheap: it only keeps
    /// the latest value, which the worker writes at most once a second
    /// ([`PROGRESS_EVERY`](super::progress::PROGRESS_EVERY)), together with every other
    /// task's, and once more just before the outcome, so a handler may call it on every
    /// item it processes. Shown by `artex task show`, the API's task, the dashboard and
    /// `/events` (`event: progress`); no history row is written for it.
    pub fn progress(&self, fraction: f64, message: Option<&str>) {
        self.progress.report(self.id, self.epoch, fraction, message);
    }

    /// The task id.
    pub fn id(&self) -> Uuid {
        self.id
    }
    /// The task's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The task's input.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
    /// 1 for the first attempt, 2 for the first retry, …
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
    /// The most attempts the task gets: its retry budget plus one.
    pub fn max_attempts(&self) -> i32 {
        self.max_attempts
    }
    /// The trace context of this attempt (its span, child of the context the task was
    /// submitted in), when tracing is on and the task carries one: the parent of what
    /// the handler does (its `traceparent` header is `to_string()`; see docs/tracing.md).
    pub fn trace_context(&self) -> Option<&TraceParent> {
        self.trace.as_ref()
    }
    /// The fencing token of this attempt.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }
    /// Progress saved by an earlier attempt (here or in another process), if any.
    pub fn checkpoint(&self) -> Option<&serde_json::Value> {
        self.checkpoint.as_ref()
    }

    /// How long the lease this attempt runs under surely still runs, as this worker
    /// knows it (renewals extend it; zero once past): a handler that must stop what it
    /// started before another worker may take the task stops it within this. `None`
    /// while unknown.
    pub fn lease_left(&self) -> Option<Duration> {
        self.lease.left(std::time::Instant::now())
    }

    /// Saves progress durably, fenced by this attempt's lease: an error means the lease was
    /// lost (the task belongs to someone else now), the task was canceled (then
    /// [`TaskContext::is_cancelled`] says so too), or the database is unreachable, and the
    /// handler should stop.
    pub async fn save_checkpoint(&mut self, state: serde_json::Value) -> Result<(), TaskError> {
        match self.bb.save_checkpoint(self.id, self.epoch, &state).await {
            Ok(true) => {
                self.checkpoint = Some(state);
                if self.suspend.load(Ordering::Acquire) {
                    // A hot upgrade asked this task to move: its progress is saved, so
                    // stop here; the new process resumes from this checkpoint.
                    return Err(TaskError::new("suspended for a task transfer"));
                }
                Ok(())
            }
            // An operator's cancel can reach the row before the worker tells the handler
            // (it learns of it through a wake-up or its next renewal): say which it was,
            // so the handler stops as canceled, not as if its lease had been lost.
            Ok(false)
                if self
                    .bb
                    .canceled_among(&[self.id])
                    .await
                    .is_ok_and(|c| !c.is_empty()) =>
            {
                self.cancel.raise();
                Err(TaskError::new("canceled while this attempt ran"))
            }
            Ok(false) => Err(TaskError::new(
                "lease lost: the task was taken back or transferred",
            )),
            Err(e) => Err(TaskError::new(format!("saving checkpoint: {e}"))),
        }
    }

    /// The results of this task's upstream tasks in its flow, by task name (empty outside
    /// a flow). Read from the blackboard when asked, not copied into the payload: see
    /// [`WorkerBoard::upstream_results`].
    pub async fn upstream_results(&self) -> Result<BTreeMap<String, serde_json::Value>, TaskError> {
        self.bb
            .upstream_results(self.id)
            .await
            .map_err(|e| TaskError::new(format!("reading upstream results: {e}")))
    }

    /// The file this task was submitted with (`artex upload`, `POST /api/v1/uploads`), or
    /// `None` when its payload names no upload. The worker checked its sha256 once the
    /// file was whole (at its last chunk, or at `complete` when the sha256 was given
    /// there); this checks that it is still there, with its size. The file is deleted
    /// once the task ends (after `--upload-keep-ms`).
    pub async fn upload(&self) -> Result<Option<UploadFile>, TaskError> {
        let Some(named) = self.payload.get("upload") else {
            return Ok(None);
        };
        let id = named
            .get("id")
            .and_then(|v| v.as_str())
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| {
                TaskError::new(format!(
                    "payload field 'upload': expected {{\"id\": <uuid>}}, got {named}"
                ))
            })?;
        let row = self
            .bb
            .upload(id)
            .await
            .map_err(|e| TaskError::new(format!("reading upload {id}: {e}")))?
            .ok_or_else(|| TaskError::new(format!("upload {id} is not recorded")))?;
        if row.state != "complete" {
            return Err(TaskError::new(format!(
                "upload {id}: its file was {}",
                row.state
            )));
        }
        let path = std::path::PathBuf::from(&row.path);
        let meta = tokio::fs::metadata(&path).await.map_err(|e| {
            TaskError::new(format!(
                "upload {id}: {} on host {}: {e}",
                path.display(),
                row.host
            ))
        })?;
        if meta.len() != row.size as u64 {
            return Err(TaskError::new(format!(
                "upload {id}: {} holds {} bytes; {} were received",
                path.display(),
                meta.len(),
                row.size
            )));
        }
        Ok(Some(UploadFile {
            id,
            path,
            size: row.size as u64,
            sha256: row.sha256,
        }))
    }
}

/// A file received by a worker for a task: where it is, and what was checked on arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadFile {
    /// The upload's id.
    pub id: Uuid,
    /// The file (read-only for handlers: it is deleted when the task ends).
    pub path: std::path::PathBuf,
    /// Its size in bytes, as declared and received.
    pub size: u64,
    /// Its sha256 (lowercase hex), checked once the file was whole.
    pub sha256: String,
}

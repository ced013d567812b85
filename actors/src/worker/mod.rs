//! The Worker: one per worker process. It registers and heartbeats, listens for its
//! assignments, reads them (up to its concurrency plus its prefetch, the rest waiting in
//! a local queue), runs each handler at once (with a timeout, catching panics), renews
//! the leases of long tasks, and records starts and outcomes in batches — a group commit:
//! what arrives while one batch is being written forms the next. A start is recorded
//! after the handler began, or with the outcome when the task finished first. Every
//! write names the lease epoch, so a worker that lost a task changes nothing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::FutureExt;
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::blackboard::{Blackboard, Completion, Outcome, Registration, StartedTask};
use crate::supervisor::{panic_message, ActorStats};

/// A failed attempt, as a handler reports it. It is retried with backoff while the task's
/// retry budget lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError(pub String);

impl TaskError {
    /// A failure with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        TaskError(msg.into())
    }
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for TaskError {
    fn from(e: E) -> Self {
        TaskError(e.to_string())
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
    checkpoint: Option<serde_json::Value>,
    bb: Blackboard,
    suspend: Arc<AtomicBool>,
}

impl TaskContext {
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
    /// The fencing token of this attempt.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }
    /// Progress saved by an earlier attempt (here or in another process), if any.
    pub fn checkpoint(&self) -> Option<&serde_json::Value> {
        self.checkpoint.as_ref()
    }

    /// Saves progress durably, fenced by this attempt's lease: an error means the lease was
    /// lost (the task belongs to someone else now) or the database is unreachable, and the
    /// handler should stop.
    pub async fn save_checkpoint(&mut self, state: serde_json::Value) -> Result<(), TaskError> {
        match self.bb.save_checkpoint(self.id, self.epoch, &state).await {
            Ok(true) => {
                self.checkpoint = Some(state);
                if self.suspend.load(Ordering::Acquire) {
                    // A hot upgrade asked this task to move: its progress is saved, so
                    // stop here; the new process resumes from this checkpoint.
                    return Err(TaskError::new("suspended for handover"));
                }
                Ok(())
            }
            Ok(false) => Err(TaskError::new(
                "lease lost: the task was taken back or handed over",
            )),
            Err(e) => Err(TaskError::new(format!("saving checkpoint: {e}"))),
        }
    }

    /// The results of this task's upstream tasks in its flow, by task name (empty outside
    /// a flow). Read from the blackboard when asked, not copied into the payload: see
    /// [`Blackboard::upstream_results`].
    pub async fn upstream_results(
        &self,
    ) -> Result<std::collections::BTreeMap<String, serde_json::Value>, TaskError> {
        self.bb
            .upstream_results(self.id)
            .await
            .map_err(|e| TaskError::new(format!("reading upstream results: {e}")))
    }
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Unique per process: `host:pid:suffix`.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Build version reported in the roster.
    pub version: String,
    /// Where its HTTP server listens.
    pub http_addr: Option<String>,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Tasks held beyond `concurrency`: read in one batch with the others and queued here
    /// until a slot frees up. The local queue hides the planner's round trip and makes
    /// every batch of starts and outcomes larger.
    pub prefetch: usize,
    /// Lease length; renewed every third of it.
    pub lease: Duration,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Safety-net poll for assignments whose NOTIFY was missed.
    pub poll: Duration,
    /// Timeout of an attempt when neither the task nor its handler sets one.
    pub default_timeout: Duration,
    /// Retry backoff: base·2^retries, capped, with jitter.
    pub retry_base: Duration,
    /// Cap of the retry backoff.
    pub retry_cap: Duration,
}

impl WorkerConfig {
    /// The NOTIFY channel the planner wakes this worker on.
    pub fn channel(&self) -> String {
        let suffix = self.id.rsplit(':').next().unwrap_or(&self.id);
        format!("artex_w_{suffix}")
    }

    fn backoff_ms(&self, retries: i32) -> i64 {
        let base = self.retry_base.as_millis() as f64;
        let cap = self.retry_cap.as_millis() as f64;
        let d = (base * 2f64.powi(retries.clamp(0, 30))).min(cap);
        (d * (0.5 + fastrand::f64() * 0.5)) as i64
    }
}

struct Running {
    kind: String,
    epoch: i64,
    retries: i32,
    max_retries: i32,
    started: Instant,
    /// Its start is in a batch written or being written.
    start_sent: bool,
    abort: AbortHandle,
    resumable: bool,
    suspend: Arc<AtomicBool>,
}

impl Running {
    /// What to write for this attempt: its start or its outcome, fenced by its epoch and
    /// carrying when its handler started here.
    fn record(&self, id: Uuid, outcome: Outcome) -> Completion {
        Completion {
            id,
            epoch: self.epoch,
            retries: self.retries,
            max_retries: self.max_retries,
            outcome,
            started_ago_ms: Some(self.started.elapsed().as_secs_f64() * 1000.0),
        }
    }
}

/// A task running in this worker, as `/status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RunningTask {
    /// Task id.
    pub id: Uuid,
    /// Kind.
    pub kind: String,
    /// Fencing token.
    pub epoch: i64,
    /// Milliseconds since it started here.
    pub running_ms: u64,
}

/// A snapshot of the worker for `/status` and `/health`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    /// Worker id.
    pub id: String,
    /// `online` or `draining`.
    pub state: &'static str,
    /// Whether the last database call succeeded.
    pub database_ok: bool,
    /// The last database error, if the last call failed.
    pub database_error: Option<String>,
    /// Tasks running now.
    pub running: Vec<RunningTask>,
    /// Tasks read from the blackboard and waiting here for a free slot.
    pub queued: usize,
    /// Outcomes waiting to be written.
    pub unwritten_outcomes: usize,
    /// Tasks finished by this process.
    pub finished: u64,
    /// Outcomes discarded because the lease had been lost.
    pub fenced_off: u64,
}

/// The Worker actor.
pub struct Worker {
    bb: Blackboard,
    config: WorkerConfig,
    registry: Registry,
    stats: ActorStats,
    running: HashMap<Uuid, Running>,
    /// Assigned to this worker (leased) and read, not yet handed to a handler: the local
    /// queue, at most `prefetch` beyond the free slots.
    queue: VecDeque<StartedTask>,
    /// Every (task, epoch) this worker took, so that a read never takes one twice: a task
    /// it ran stays `assigned` in the blackboard until its outcome is written. `None`
    /// while the outcome is not written; then the number of reads started by then: a read
    /// started later sees the write, and the entry goes.
    taken: HashMap<(Uuid, i64), Option<u64>>,
    /// Reads started so far.
    fetches: u64,
    /// The last read returned as many tasks as it asked for: there may be more.
    maybe_more: bool,
    outbox: Vec<Completion>,
    flushing: bool,
    fetching: bool,
    fetch_again: bool,
    draining: bool,
    drain_waiters: Vec<oneshot::Sender<()>>,
    suspended: Vec<(Uuid, i64)>,
    suspend_waiters: Vec<oneshot::Sender<()>>,
    db_error: Option<String>,
    finished: u64,
    fenced_off: u64,
}

impl Worker {
    /// A worker running `registry`'s kinds with `config`. Call [`Worker::register`] first,
    /// so a missing database fails the start instead of the first heartbeat.
    pub fn new(
        bb: Blackboard,
        config: WorkerConfig,
        registry: Registry,
        stats: ActorStats,
    ) -> Self {
        Worker {
            bb,
            config,
            registry,
            stats,
            running: HashMap::new(),
            queue: VecDeque::new(),
            taken: HashMap::new(),
            fetches: 0,
            maybe_more: false,
            outbox: Vec::new(),
            flushing: false,
            fetching: false,
            fetch_again: false,
            draining: false,
            drain_waiters: Vec::new(),
            suspended: Vec::new(),
            suspend_waiters: Vec::new(),
            db_error: None,
            finished: 0,
            fenced_off: 0,
        }
    }

    /// The row this worker writes into `artex.workers`.
    pub fn registration(config: &WorkerConfig, registry: &Registry) -> Registration {
        Registration {
            id: config.id.clone(),
            host: config.host.clone(),
            pid: std::process::id() as i32,
            version: config.version.clone(),
            http_addr: config.http_addr.clone(),
            channel: config.channel(),
            kinds: registry.kinds(),
            capacity: (config.concurrency + config.prefetch).max(1) as i32,
        }
    }

    /// Registers (or re-registers) the worker as online.
    pub async fn register(
        bb: &Blackboard,
        config: &WorkerConfig,
        registry: &Registry,
    ) -> crate::Result {
        bb.register_worker(&Worker::registration(config, registry))
            .await
    }

    /// How many tasks it may hold: running and queued.
    fn capacity(&self) -> usize {
        (self.config.concurrency + self.config.prefetch).max(1)
    }

    /// Tasks it holds: running or queued.
    fn held(&self) -> usize {
        self.running.len() + self.queue.len()
    }

    /// Tasks this process ran or is running whose outcome is not written yet (with the
    /// queue emptied, that is what a drain must not give back and a handover must not
    /// move: their start may not be written, so they may still read `assigned`).
    fn ran_here(&self) -> Vec<Uuid> {
        self.taken
            .iter()
            .filter(|(_, written)| written.is_none())
            .map(|((id, _), _)| *id)
            .collect()
    }

    /// Hands queued tasks to handlers while slots are free, then has their starts
    /// recorded. When draining, the queue is dropped: its tasks are still `assigned` in
    /// the blackboard, where a drain gives them back and a hot upgrade hands them over.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            for t in self.queue.drain(..) {
                self.taken.remove(&(t.id, t.epoch));
            }
            return;
        }
        let mut started = false;
        while self.running.len() < self.config.concurrency.max(1) {
            let Some(task) = self.queue.pop_front() else {
                break;
            };
            self.run(task, ctx);
            started = true;
        }
        if started {
            self.flush(ctx);
        }
    }

    fn db_result<T>(&mut self, r: &crate::Result<T>) {
        match r {
            Ok(_) => self.db_error = None,
            Err(e) if e.is_connection() => self.db_error = Some(e.to_string()),
            Err(_) => {}
        }
    }

    /// Reads the tasks assigned to it (up to its capacity) into the queue and starts
    /// what fits.
    fn fetch(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            return;
        }
        if self.fetching {
            self.fetch_again = true;
            return;
        }
        if self.held() >= self.capacity() {
            return;
        }
        self.fetching = true;
        self.fetch_again = false;
        self.fetches += 1;
        let this_fetch = self.fetches;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let limit = self.capacity();
        async move { bb.fetch_assigned(&id, limit as i64).await }
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.fetching = false;
                act.db_result(&res);
                match res {
                    Ok(tasks) => {
                        act.maybe_more = tasks.len() == limit;
                        for t in tasks {
                            if let std::collections::hash_map::Entry::Vacant(e) =
                                act.taken.entry((t.id, t.epoch))
                            {
                                e.insert(None);
                                act.queue.push_back(t);
                            }
                        }
                        act.taken.retain(|_, written| written.is_none_or(|at| at >= this_fetch));
                        act.pump(ctx);
                    }
                    Err(e) => {
                        act.stats.failed("worker");
                        tracing::warn!(error = %e, "cannot read assigned tasks; retrying on the next poll");
                    }
                }
                if act.fetch_again {
                    act.fetch(ctx);
                }
                act.check_drained();
            })
            .spawn(ctx);
    }

    fn run(&mut self, task: StartedTask, ctx: &mut Context<Self>) {
        let me = ctx.address();
        let (abort, reg) = AbortHandle::new_pair();
        let id = task.id;
        let epoch = task.epoch;
        let handler = self.registry.get(&task.kind);
        let timeout = task
            .timeout_ms
            .map(|ms| Duration::from_millis(ms as u64))
            .or_else(|| self.registry.timeouts.get(&task.kind).copied())
            .unwrap_or(self.config.default_timeout);
        let suspend = Arc::new(AtomicBool::new(false));
        let tctx = TaskContext {
            id,
            kind: task.kind.clone(),
            payload: task.payload,
            epoch,
            attempt: task.retries + 1,
            checkpoint: task.checkpoint,
            bb: self.bb.clone(),
            suspend: suspend.clone(),
        };
        tracing::debug!(task = %id, kind = %task.kind, epoch, "task started");
        self.running.insert(
            id,
            Running {
                kind: task.kind.clone(),
                epoch,
                retries: task.retries,
                max_retries: task.max_retries,
                started: Instant::now(),
                start_sent: false,
                abort,
                resumable: self.registry.resumable.contains(&task.kind),
                suspend,
            },
        );
        let kind = task.kind;
        let attempt = async move {
            let Some(handler) = handler else {
                return Err(Attempt::Failed(format!(
                    "no handler for kind '{kind}' in this worker"
                )));
            };
            let call = AssertUnwindSafe(handler.call(tctx)).catch_unwind();
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(Ok(value))) => Ok(value),
                Ok(Ok(Err(e))) => Err(Attempt::Failed(e.0)),
                Ok(Err(panic)) => Err(Attempt::Failed(format!(
                    "handler panicked: {}",
                    panic_message(&*panic)
                ))),
                Err(_) => Err(Attempt::TimedOut(format!(
                    "handler ran past its timeout of {} ms",
                    timeout.as_millis()
                ))),
            }
        };
        actix::spawn(async move {
            // Aborted means the lease was lost or the worker gave the task back: the
            // outcome is decided elsewhere, so nothing is reported.
            if let Ok(result) = Abortable::new(attempt, reg).await {
                me.do_send(TaskFinished { id, epoch, result });
            }
        });
    }

    /// Writes the waiting outcomes and the starts not written yet, in one statement.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let mut batch = std::mem::take(&mut self.outbox);
        for (id, r) in self.running.iter_mut().filter(|(_, r)| !r.start_sent) {
            r.start_sent = true;
            batch.push(r.record(*id, Outcome::Started));
        }
        if batch.is_empty() {
            return;
        }
        self.flushing = true;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        async move {
            let res = bb.record(&id, &batch).await;
            (res, batch)
        }
        .into_actor(self)
        .map(move |(res, batch), act, ctx| {
            act.flushing = false;
            act.db_result(&res);
            match res {
                Ok(written) => {
                    let written: HashSet<Uuid> = written.into_iter().collect();
                    for c in &batch {
                        if c.outcome != Outcome::Started || !written.contains(&c.id) {
                            act.taken.insert((c.id, c.epoch), Some(act.fetches));
                        }
                    }
                    for c in batch.iter().filter(|c| !written.contains(&c.id)) {
                        act.fenced_off += 1;
                        if c.outcome == Outcome::Started {
                            // Taken back or handed over before its start was written:
                            // stop the handler; whatever it would write is fenced off.
                            if let Some(r) = act.running.get(&c.id).filter(|r| r.epoch == c.epoch) {
                                tracing::warn!(task = %c.id, epoch = c.epoch, "lease lost before the start was written; stopping the handler");
                                r.abort.abort();
                                act.running.remove(&c.id);
                            }
                        } else {
                            tracing::warn!(task = %c.id, epoch = c.epoch,
                                "outcome discarded: the lease was lost before it was written");
                        }
                    }
                    act.finished += batch
                        .iter()
                        .filter(|c| c.outcome != Outcome::Started && written.contains(&c.id))
                        .count() as u64;
                    act.stats.ran("worker");
                }
                Err(e) => {
                    // Nothing is dropped while the process lives: outcomes go back to the
                    // outbox, starts are sent again with the next batch (the database may
                    // be restarting).
                    act.stats.failed("worker");
                    tracing::warn!(error = %e, count = batch.len(), "cannot record starts and outcomes; retrying");
                    for c in batch.iter().filter(|c| c.outcome == Outcome::Started) {
                        if let Some(r) = act.running.get_mut(&c.id).filter(|r| r.epoch == c.epoch) {
                            r.start_sent = false;
                        }
                    }
                    let mut again: Vec<Completion> = batch
                        .into_iter()
                        .filter(|c| c.outcome != Outcome::Started)
                        .collect();
                    again.append(&mut act.outbox);
                    act.outbox = again;
                    ctx.run_later(Duration::from_millis(100), |act, ctx| act.flush(ctx));
                    return;
                }
            }
            act.flush(ctx);
            act.check_suspended();
            act.check_drained();
        })
        .spawn(ctx);
    }

    fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.held() == 0 {
            return;
        }
        let held: Vec<(Uuid, i64)> = self
            .running
            .iter()
            .map(|(id, r)| (*id, r.epoch))
            .chain(self.queue.iter().map(|t| (t.id, t.epoch)))
            .collect();
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let lease = self.config.lease.as_secs_f64();
        async move {
            let res = bb.renew_leases(&id, &held, lease).await;
            (res, held)
        }
        .into_actor(self)
        .map(|(res, held), act, _ctx| {
            act.db_result(&res);
            match res {
                Ok(kept) => {
                    let lost: HashSet<(Uuid, i64)> = held
                        .iter()
                        .filter(|(id, _)| !kept.contains(id))
                        .copied()
                        .collect();
                    for key in &lost {
                        act.taken.insert(*key, Some(act.fetches));
                    }
                    act.queue.retain(|t| {
                        let gone = lost.contains(&(t.id, t.epoch));
                        if gone {
                            tracing::warn!(task = %t.id, epoch = t.epoch, "lease lost before the task left the queue");
                        }
                        !gone
                    });
                    for (id, epoch) in &lost {
                        // The task was taken back (reaper) or handed over: stop running it
                        // here; whatever it would write would be fenced off anyway.
                        if let Some(r) = act.running.get(id) {
                            if r.epoch == *epoch {
                                tracing::warn!(task = %id, epoch, "lease lost; stopping the handler");
                                r.abort.abort();
                                act.running.remove(id);
                                act.fenced_off += 1;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot renew leases; retrying"),
            }
            act.check_suspended();
            act.check_drained();
        })
        .spawn(ctx);
    }

    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        let bb = self.bb.clone();
        let config = self.config.clone();
        let registry = self.registry.clone();
        let inflight = self.held() as i32;
        let draining = self.draining;
        async move {
            let state = bb.heartbeat(&config.id, inflight).await?;
            match state.as_deref() {
                Some("online") | Some("draining") | Some("upgrading") => Ok(false),
                _ if draining => Ok(false),
                // Declared gone (e.g. this process was stopped past the threshold) or
                // deleted: come back as a new registration; the tasks it held were taken
                // back and its stale writes are fenced off.
                _ => Worker::register(&bb, &config, &registry).await.map(|_| true),
            }
        }
        .into_actor(self)
        .map(|res: crate::Result<bool>, act, ctx| {
            act.db_result(&res);
            match res {
                Ok(true) => {
                    tracing::warn!(worker = %act.config.id, "this worker had been declared gone; registered again");
                    act.fetch(ctx);
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        })
        .spawn(ctx);
    }

    /// Wakes a waiting handover once no resumable task is still on its way to a checkpoint.
    fn check_suspended(&mut self) {
        let waiting = self
            .running
            .values()
            .any(|r| r.resumable && r.suspend.load(Ordering::Acquire));
        if !waiting {
            for w in self.suspend_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    fn check_drained(&mut self) {
        // Drained: nothing runs, every outcome is written, and no read is in flight (what
        // it brings is dropped, but only once it has come back).
        if self.draining
            && self.running.is_empty()
            && self.queue.is_empty()
            && self.outbox.is_empty()
            && !self.flushing
            && !self.fetching
        {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// A snapshot for `/status`.
    fn status(&self) -> WorkerStatus {
        let mut running: Vec<RunningTask> = self
            .running
            .iter()
            .map(|(id, r)| RunningTask {
                id: *id,
                kind: r.kind.clone(),
                epoch: r.epoch,
                running_ms: r.started.elapsed().as_millis() as u64,
            })
            .collect();
        running.sort_by_key(|r| std::cmp::Reverse(r.running_ms));
        WorkerStatus {
            id: self.config.id.clone(),
            state: if self.draining { "draining" } else { "online" },
            database_ok: self.db_error.is_none(),
            database_error: self.db_error.clone(),
            running,
            queued: self.queue.len(),
            unwritten_outcomes: self.outbox.len(),
            finished: self.finished,
            fenced_off: self.fenced_off,
        }
    }
}

enum Attempt {
    Failed(String),
    TimedOut(String),
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.config.poll, |act, ctx| act.fetch(ctx));
        ctx.run_interval(self.config.heartbeat, |act, ctx| act.heartbeat(ctx));
        ctx.run_interval(self.config.lease / 3, |act, ctx| act.renew(ctx));
        let bb = self.bb.clone();
        let channel = self.config.channel();
        let me = ctx.address();
        async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match bb.listen(std::slice::from_ref(&channel)).await {
                    Ok(mut listener) => {
                        backoff = Duration::from_millis(100);
                        me.do_send(Wake);
                        while listener.recv().await.is_some() {
                            listener.drain_pending();
                            me.do_send(Wake);
                            if listener.take_cancel() {
                                me.do_send(CheckLeases);
                            }
                        }
                        tracing::warn!("worker's LISTEN session dropped; reconnecting");
                    }
                    Err(e) => tracing::warn!(error = %e, "worker cannot LISTEN; retrying"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
        .into_actor(self)
        .spawn(ctx);
        self.fetch(ctx);
    }
}

impl Supervised for Worker {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("worker");
        self.fetching = false;
        self.flushing = false;
    }
}

/// There may be assignments: start what fits.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

impl Handler<Wake> for Worker {
    type Result = ();
    fn handle(&mut self, _msg: Wake, ctx: &mut Context<Self>) {
        self.fetch(ctx);
    }
}

/// A task this worker holds was canceled (its channel got a `cancel` notification):
/// check the leases now, which stops the handlers of tasks it no longer holds, instead of
/// at the next renewal.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckLeases;

impl Handler<CheckLeases> for Worker {
    type Result = ();
    fn handle(&mut self, _msg: CheckLeases, ctx: &mut Context<Self>) {
        self.renew(ctx);
    }
}

/// A handler finished an attempt.
#[derive(Message)]
#[rtype(result = "()")]
struct TaskFinished {
    id: Uuid,
    epoch: i64,
    result: Result<serde_json::Value, Attempt>,
}

impl Handler<TaskFinished> for Worker {
    type Result = ();
    fn handle(&mut self, msg: TaskFinished, ctx: &mut Context<Self>) {
        let Some(r) = self.running.remove(&msg.id) else {
            return;
        };
        if r.epoch != msg.epoch {
            return;
        }
        if r.suspend.load(Ordering::Acquire) && msg.result.is_err() {
            // Stopped at a checkpoint for a handover: no outcome, the task moves on.
            tracing::info!(task = %msg.id, kind = %r.kind, "task suspended for handover");
            self.suspended.push((msg.id, r.epoch));
            self.check_suspended();
            return;
        }
        let outcome = match msg.result {
            Ok(v) => {
                tracing::debug!(task = %msg.id, kind = %r.kind, "task succeeded");
                Outcome::Succeeded(v)
            }
            Err(Attempt::Failed(error)) => {
                tracing::info!(task = %msg.id, kind = %r.kind, %error, attempt = r.retries + 1, "task failed");
                Outcome::Failed {
                    error,
                    retry_in_ms: self.config.backoff_ms(r.retries),
                }
            }
            Err(Attempt::TimedOut(error)) => {
                tracing::info!(task = %msg.id, kind = %r.kind, %error, attempt = r.retries + 1, "task timed out");
                Outcome::TimedOut {
                    error,
                    retry_in_ms: self.config.backoff_ms(r.retries),
                }
            }
        };
        self.outbox.push(r.record(msg.id, outcome));
        // Handlers started now have their starts written with this outcome.
        self.pump(ctx);
        self.flush(ctx);
        if self.queue.is_empty() && self.maybe_more {
            self.fetch(ctx);
        }
        self.check_suspended();
    }
}

/// Stop taking work, give back what was assigned but not started, let running tasks
/// finish within `deadline`, give back what is still running then, write every outcome,
/// and mark the worker gone. Answers when all of that is done.
#[derive(Message)]
#[rtype(result = "DrainReport")]
pub struct Drain {
    /// How long running tasks may take to finish.
    pub deadline: Duration,
}

/// What a drain did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainReport {
    /// Tasks that finished during the drain.
    pub finished_during_drain: u64,
    /// Tasks given back unstarted.
    pub released_unstarted: usize,
    /// Tasks still running at the deadline, stopped and given back.
    pub released_running: usize,
}

impl Handler<Drain> for Worker {
    type Result = ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        // Tasks stopped for a handover that did not take them: back to the planner (a
        // release counts no attempt, so the retry figures play no part).
        for (id, epoch) in std::mem::take(&mut self.suspended) {
            self.outbox.push(Completion {
                id,
                epoch,
                retries: 0,
                max_retries: 0,
                outcome: Outcome::Released,
                started_ago_ms: None,
            });
        }
        self.pump(ctx);
        self.flush(ctx);
        let finished_before = self.finished;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let running = self.ran_here();
        Box::pin(
            async move {
                // Draining first: a task given back while the roster still shows this
                // worker online could be assigned to it again.
                if let Err(e) = bb.set_worker_state(&id, "draining").await {
                    tracing::warn!(error = %e, "cannot mark the worker draining");
                }
                // Queued and unread tasks go back; running ones finish here, and finished
                // ones whose outcome is on its way stay for it.
                bb.release_assigned(&id, "released by a draining worker", &running)
                    .await
                    .map(|v| v.len())
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "cannot give back unstarted tasks; the reaper will");
                        0
                    })
            }
            .into_actor(self)
            .then(move |released, act, _ctx| {
                let (tx, rx) = oneshot::channel();
                act.drain_waiters.push(tx);
                act.check_drained();
                async move {
                    let finished_in_time = tokio::time::timeout(msg.deadline, rx).await.is_ok();
                    (released, finished_in_time)
                }
                .into_actor(act)
            })
            .then(move |(released, finished_in_time), act, _ctx| {
                let mut report = DrainReport {
                    released_unstarted: released,
                    ..Default::default()
                };
                let mut late = Vec::new();
                if !finished_in_time {
                    for (id, r) in act.running.drain() {
                        r.abort.abort();
                        late.push(r.record(id, Outcome::Released));
                    }
                }
                report.released_running = late.len();
                let mut outcomes = std::mem::take(&mut act.outbox);
                outcomes.extend(late);
                let bb = act.bb.clone();
                let id = act.config.id.clone();
                async move {
                    // The last writes of this process: retry for a while if the database
                    // is restarting, then leave what is left to the reaper.
                    for attempt in 0..50 {
                        match bb.record(&id, &outcomes).await {
                            Ok(_) => break,
                            Err(e) => {
                                tracing::warn!(error = %e, attempt, "cannot record final outcomes");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                    if let Err(e) = bb.set_worker_state(&id, "gone").await {
                        tracing::warn!(error = %e, "cannot deregister; the reaper will mark it gone");
                    }
                    report
                }
                .into_actor(act)
                .map(move |mut report, act, _| {
                    report.finished_during_drain = act.finished - finished_before;
                    report
                })
            }),
        )
    }
}

/// Ask for a status snapshot.
#[derive(Message)]
#[rtype(result = "WorkerStatus")]
pub struct GetStatus;

impl Handler<GetStatus> for Worker {
    type Result = MessageResult<GetStatus>;
    fn handle(&mut self, _msg: GetStatus, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status())
    }
}

/// Hot upgrade, old side: stop taking work and bring every resumable running task to a
/// stop at its next checkpoint (aborting those that do not reach one by `deadline`).
/// Answers with the tasks to hand over and the ones that keep running here.
#[derive(Message)]
#[rtype(result = "Handover")]
pub struct SuspendForHandover {
    /// How long resumable tasks may take to reach a checkpoint.
    pub deadline: Duration,
}

/// What a worker suspending for a hot upgrade answers.
#[derive(Debug, Clone, Default)]
pub struct Handover {
    /// Stopped at a checkpoint (or at the deadline), to resume in the new process: (task
    /// id, epoch held).
    pub suspended: Vec<(Uuid, i64)>,
    /// Tasks whose handlers run on here to their end (not resumable), or whose outcome
    /// is still being written here. Every other task assigned to this worker (its queue,
    /// what it had not read) moves to the new process.
    pub staying: Vec<Uuid>,
}

impl Handler<SuspendForHandover> for Worker {
    type Result = ResponseActFuture<Self, Handover>;

    fn handle(&mut self, msg: SuspendForHandover, ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        self.pump(ctx);
        for r in self.running.values() {
            if r.resumable {
                r.suspend.store(true, Ordering::Release);
            }
        }
        let (tx, rx) = oneshot::channel();
        self.suspend_waiters.push(tx);
        self.check_suspended();
        Box::pin(
            async move {
                let _ = tokio::time::timeout(msg.deadline, rx).await;
            }
            .into_actor(self)
            .map(|_, act, _ctx| {
                // Past the deadline: stop the stragglers; the blackboard holds their last
                // checkpoint, which is what the new process resumes from.
                let late: Vec<Uuid> = act
                    .running
                    .iter()
                    .filter(|(_, r)| r.resumable)
                    .map(|(id, _)| *id)
                    .collect();
                for id in late {
                    if let Some(r) = act.running.remove(&id) {
                        r.abort.abort();
                        act.suspended.push((id, r.epoch));
                    }
                }
                Handover {
                    suspended: std::mem::take(&mut act.suspended),
                    staying: act.ran_here(),
                }
            }),
        )
    }
}

/// Take over running tasks that worker `from` held at the given epochs (hot upgrade, new
/// side; or the old side itself after a rollback) and resume each from its checkpoint.
#[derive(Message)]
#[rtype(result = "crate::Result<ResumeReport>")]
pub struct ResumeTasks {
    /// The worker that held them.
    pub from: String,
    /// (task id, epoch held).
    pub tasks: Vec<(Uuid, i64)>,
}

/// What a takeover did.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ResumeReport {
    /// Tasks taken over and running here now.
    pub resumed: Vec<Uuid>,
    /// Tasks the blackboard no longer had at that epoch (taken back, canceled).
    pub conflicts: Vec<Uuid>,
}

impl Handler<ResumeTasks> for Worker {
    type Result = ResponseActFuture<Self, crate::Result<ResumeReport>>;

    fn handle(&mut self, msg: ResumeTasks, _ctx: &mut Context<Self>) -> Self::Result {
        let bb = self.bb.clone();
        let me = self.config.id.clone();
        let lease = self.config.lease.as_secs_f64();
        Box::pin(
            async move { bb.take_over(&msg.from, &me, &msg.tasks, lease).await.map(|t| (t, msg.tasks)) }
                .into_actor(self)
                .map(|res, act, ctx| {
                    let (taken, asked) = res?;
                    let mut report = ResumeReport::default();
                    for (id, _) in &asked {
                        if !taken.iter().any(|t| t.id == *id) {
                            tracing::warn!(task = %id, "handover conflict: the blackboard no longer has this task at that epoch");
                            report.conflicts.push(*id);
                        }
                    }
                    for t in taken {
                        tracing::info!(task = %t.id, kind = %t.kind, epoch = t.epoch, "resuming a handed-over task from its checkpoint");
                        report.resumed.push(t.id);
                        act.taken.insert((t.id, t.epoch), None);
                        act.run(t, ctx);
                    }
                    act.flush(ctx);
                    Ok(report)
                }),
        )
    }
}

/// Hot upgrade rolled back: take work again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResumeWork;

impl Handler<ResumeWork> for Worker {
    type Result = ();
    fn handle(&mut self, _msg: ResumeWork, ctx: &mut Context<Self>) {
        self.draining = false;
        for r in self.running.values() {
            r.suspend.store(false, Ordering::Release);
        }
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        actix::spawn(async move {
            if let Err(e) = bb.set_worker_state(&id, "online").await {
                tracing::warn!(error = %e, "cannot mark the worker online again");
            }
        });
        self.fetch(ctx);
    }
}

/// The worker's id.
#[derive(Message)]
#[rtype(result = "String")]
pub struct GetId;

impl Handler<GetId> for Worker {
    type Result = String;
    fn handle(&mut self, _msg: GetId, _ctx: &mut Context<Self>) -> String {
        self.config.id.clone()
    }
}

//! The Worker: one per worker process. It registers and heartbeats, listens for its
//! assignments, takes them from the wake-up that carries them or reads them (up to its
//! concurrency plus its prefetch, the rest waiting in a local queue whose depth follows
//! its pace), runs each handler at once (with a
//! timeout, catching panics), renews the leases of long tasks, and records starts and
//! outcomes in batches — a group commit: what arrives while one batch is being written
//! forms the next. A start is recorded after the handler began, or with the outcome
//! when the task finished first. Every write names the lease epoch, so a worker that
//! lost a task changes nothing.
//!
//! This file is the actor and its run loop; [`handlers`] is what it runs, the ledger
//! keeps it from taking a task twice, `intake.rs` reads its assignments or takes
//! the ones a wake-up carries (and judges when it may), [`depth`] sizes its queue, [`status`] is what it
//! shows, [`progress`] keeps what handlers report until it is written (throttled), and
//! [`drain`] and [`transfer`] (the task transfer of a hot upgrade) are how it stops. It
//! retries a failed attempt after its kind's retry policy (`crate::retry`, read every
//! [`POLICY_REFRESH`] while it holds tasks), else its own backoff.

pub mod depth;
pub mod drain;
mod fence;
pub mod handlers;
mod intake;
mod ledger;
mod liveness;
pub mod progress;
pub mod status;
pub mod transfer;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::{AbortHandle, Abortable};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::blackboard::carried::carries_assignments;
pub use crate::blackboard::WorkerState;
use crate::blackboard::{
    AssignedTask, AttemptRecord, ListenEvent, Outcome, Registration, Step, WorkerBoard,
    CANCEL_PAYLOAD, TASKS_CHANNEL,
};
use crate::retry::RetryPolicy;
use crate::supervisor::ActorStats;
use depth::QueueDepth;
pub use drain::{Drain, DrainReport};
use fence::LeaseClock;
pub use handlers::{
    AfterError, HandlerFuture, HandlerResult, Registry, TaskContext, TaskError, TaskHandler,
    UploadFile,
};
use handlers::{Attempt, Cancel};
use ledger::Ledger;
use progress::{ProgressSlots, PROGRESS_EVERY};
pub use status::{GetStatus, RunningTask, WorkerStatus, WAKE_UPS_POLLING};
pub use transfer::{
    GetId, ResumeReport, ResumeTasks, ResumeWork, SuspendForTransfer, SuspendReport,
};

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
    /// Where planners push its wake-ups (`host:port` of its HTTP server, `POST /wake`):
    /// it then holds no LISTEN session, and its poll slows down once pushes arrive (see
    /// [`PUSHED_POLL`]). `None`: it LISTENs on its channel, as workers of older builds
    /// and library users without an HTTP server do.
    pub wake_addr: Option<String>,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Tasks held beyond `concurrency`: read in one batch with the others and queued here
    /// until a slot frees up. The local queue hides the planner's round trip and makes
    /// every batch of starts and outcomes larger. `None`: sized from the worker's
    /// completion rate (see [`depth`]); `Some(n)` pins it.
    pub prefetch: Option<usize>,
    /// Payload bytes (as JSON text) it holds at most, running and queued: big payloads
    /// are read a few at a time. A task larger than this runs alone.
    pub queue_max_bytes: usize,
    /// Lease length; renewed every third of it.
    pub lease: Duration,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Safety-net poll for assignments whose wake-up was missed.
    pub poll: Duration,
    /// Timeout of an attempt when neither the task nor its handler sets one.
    pub default_timeout: Duration,
    /// How long a canceled task's handler has to stop once told before it is stopped.
    pub cancel_grace: Duration,
    /// Retry backoff of a kind without a retry policy (`artex kind retry`):
    /// base·2^retries, capped, with jitter.
    pub retry_base: Duration,
    /// Cap of that retry backoff.
    pub retry_cap: Duration,
}

impl WorkerConfig {
    /// The `application_name` of its LISTEN session, by which planners see it is there.
    pub fn session_name(&self) -> String {
        format!("artex-listen:{}", self.channel())
    }

    /// The NOTIFY channel the planner wakes this worker on.
    pub fn channel(&self) -> String {
        let suffix = self.id.rsplit(':').next().unwrap_or(&self.id);
        format!("artex_w_{suffix}")
    }

    /// The fleet's default backoff (a kind without a retry policy).
    fn backoff_ms(&self, retries: i32) -> i64 {
        let base = self.retry_base.as_millis() as f64;
        let cap = self.retry_cap.as_millis() as f64;
        let d = (base * 2f64.powi(retries.clamp(0, 30))).min(cap);
        (d * (0.5 + fastrand::f64() * 0.5)) as i64
    }
}

/// A worker woken by pushes polls at least this far apart once a push has reached it:
/// planners push every assignment (and give back what they could not announce), so the
/// poll only covers a planner that died between its commit and its push. Until a push
/// arrives — no planner may reach its address — it polls every [`WorkerConfig::poll`]
/// while its reads find tasks, and backs off to this while they find none: a thousand
/// idle workers starting at once would otherwise read 5,000 times a second before the
/// planners' greetings reach them.
pub const PUSHED_POLL: Duration = Duration::from_secs(2);

/// How often a worker reads its kinds' retry policies again (`artex kind retry`) while
/// it holds tasks: a change reaches its retries within this. An idle worker does not
/// read them (it has nothing to retry); it reads them again when it gets work.
pub const POLICY_REFRESH: Duration = Duration::from_secs(5);

/// How often an idle worker (holding no task) looks at its timers: a task it is given
/// meets its first self-fencing check within this, well inside the fencing margin of
/// any lease (a fifth of it).
pub const IDLE_TICK: Duration = Duration::from_millis(500);

struct Running {
    kind: String,
    epoch: i64,
    retries: i32,
    max_retries: i32,
    started: Instant,
    /// Its start is in a batch written or being written.
    start_sent: bool,
    abort: AbortHandle,
    /// Tells the handler its task was canceled (`TaskContext::cancelled`).
    cancel: Cancel,
    /// When the worker learned the task was canceled: its handler is stopped if it has
    /// not ended `cancel_grace` later, and what it returns is not recorded.
    canceled: Option<Instant>,
    resumable: bool,
    suspend: Arc<AtomicBool>,
    /// Its payload's size, counted against the queue memory budget while it runs.
    payload_bytes: i64,
}

impl Running {
    /// What to write for this attempt: its start or its outcome, fenced by its epoch and
    /// carrying when its handler started here.
    fn record(&self, id: Uuid, step: Step) -> AttemptRecord {
        AttemptRecord {
            id,
            epoch: self.epoch,
            retries: self.retries,
            max_retries: self.max_retries,
            step,
            started_ago_ms: Some(self.started.elapsed().as_secs_f64() * 1000.0),
        }
    }
}

/// The Worker actor.
pub struct Worker {
    bb: WorkerBoard,
    config: WorkerConfig,
    registry: Registry,
    stats: ActorStats,
    running: HashMap<Uuid, Running>,
    /// Assigned to this worker (leased) and read, not yet handed to a handler: the local
    /// queue, at most `prefetch` beyond the free slots.
    queue: VecDeque<AssignedTask>,
    /// Every (task, epoch) this worker took, so that a read never takes one twice: a task
    /// it ran stays `assigned` in the blackboard until its outcome is written.
    ledger: Ledger,
    /// The last read returned as many tasks as it asked for, or stopped at the memory
    /// budget: there may be more.
    maybe_more: bool,
    outbox: Vec<AttemptRecord>,
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
    /// When the leases of what it holds end at the latest (see [`fence`]).
    leases: LeaseClock,
    /// Tasks it stopped itself because it could not renew their lease in time.
    self_fenced: u64,
    renewing: bool,
    /// A lease check was asked for (a cancel) while a renewal was in flight: another
    /// follows it at once.
    renew_again: bool,
    heartbeating: bool,
    /// The capacity changed while a heartbeat was in flight: send another when it
    /// returns, so the latest capacity is the one written.
    beat_again: bool,
    /// The local queue's depth, pinned or following the completion rate.
    depth: QueueDepth,
    /// When it last gave slots back (sent outcomes to be written) and has not read new
    /// tasks since: how long the planner takes to refill it is part of the depth.
    gave_back: Option<Instant>,
    /// A handler slot went idle with the queue empty since the last refill: the queue,
    /// not the handlers, held the pace back (see [`QueueDepth::starved`]).
    ran_dry: bool,
    /// What its latest finished read saw: which carried tasks it may take, and how long
    /// their leases surely run (see `blackboard::carried`).
    last_read: Option<intake::LastRead>,
    /// A planner's push reached it (see [`PUSHED_POLL`]).
    pushed: bool,
    /// Planners record that their pushes fail to reach it (read with its heartbeat):
    /// it polls for its tasks.
    wake_unreachable: bool,
    /// When its last read of its assignments was sent.
    read_at: Instant,
    /// When the poll last came due.
    polled_at: Instant,
    /// The poll's period now (see [`PUSHED_POLL`]).
    poll_every: Duration,
    /// Progress its handlers reported and it has not written yet (see [`progress`]).
    progress: ProgressSlots,
    /// A write of progress is in flight.
    progress_writing: bool,
    /// When it last sent progress to be written.
    progress_sent: Instant,
    /// Its kinds' retry policies, as last read (see [`POLICY_REFRESH`]).
    policies: HashMap<String, RetryPolicy>,
    /// When the policies were last read; `None`: never.
    policies_read: Option<Instant>,
    /// A read of the policies is in flight.
    reading_policies: bool,
}

impl Worker {
    /// A worker running `registry`'s kinds with `config`. Call [`Worker::register`] first,
    /// so a missing database fails the start instead of the first heartbeat.
    pub fn new(
        bb: WorkerBoard,
        config: WorkerConfig,
        registry: Registry,
        stats: ActorStats,
    ) -> Self {
        let depth = QueueDepth::new(config.prefetch, Instant::now());
        let poll = config.poll;
        Worker {
            bb,
            config,
            registry,
            stats,
            running: HashMap::new(),
            queue: VecDeque::new(),
            ledger: Ledger::new(),
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
            leases: LeaseClock::default(),
            self_fenced: 0,
            renewing: false,
            renew_again: false,
            heartbeating: false,
            beat_again: false,
            depth,
            gave_back: None,
            ran_dry: false,
            last_read: None,
            pushed: false,
            wake_unreachable: false,
            read_at: Instant::now(),
            polled_at: Instant::now(),
            poll_every: poll,
            progress: ProgressSlots::default(),
            progress_writing: false,
            progress_sent: Instant::now(),
            policies: HashMap::new(),
            policies_read: None,
            reading_policies: false,
        }
    }

    /// Remembers when the lease of `task`, read by a request sent at `sent`, ends.
    fn hold_until(&mut self, task: &AssignedTask, sent: Instant) {
        let left = Duration::from_secs_f64(task.lease_left_ms.max(0.0) / 1000.0);
        self.leases.read((task.id, task.epoch), sent, left);
    }

    /// The row this worker writes into `artex.workers`, as it starts: a sized queue
    /// starts at its minimum and grows with the heartbeats that follow.
    pub fn registration(config: &WorkerConfig, registry: &Registry) -> Registration {
        Registration {
            id: config.id.clone(),
            host: config.host.clone(),
            pid: std::process::id() as i32,
            version: config.version.clone(),
            http_addr: config.http_addr.clone(),
            channel: config.channel(),
            kinds: registry.kinds(),
            capacity: (config.concurrency + config.prefetch.unwrap_or(depth::MIN_DEPTH)).max(1)
                as i32,
            // A worker woken by pushes holds no LISTEN session.
            session: config.wake_addr.is_none().then(|| config.session_name()),
            wake_addr: config.wake_addr.clone(),
            lease_ms: i32::try_from(config.lease.as_millis()).ok(),
        }
    }

    /// Registers (or re-registers) the worker as online.
    pub async fn register(
        bb: &WorkerBoard,
        config: &WorkerConfig,
        registry: &Registry,
    ) -> crate::Result {
        bb.register_worker(&Worker::registration(config, registry))
            .await
    }

    /// How many tasks it may hold: running and queued. Also its capacity in the
    /// blackboard (written with each heartbeat), which planners never assign beyond.
    fn capacity(&self) -> usize {
        (self.config.concurrency + self.depth.current()).max(1)
    }

    /// Samples the completion rate; when the queue's depth moved, has the new capacity
    /// written at once. A deeper queue wakes the planners (the heartbeat statement does),
    /// a shallower one only stops new assignments until the worker holds less.
    fn resize(&mut self, ctx: &mut Context<Self>) {
        if let Some(depth) = self.depth.tick(Instant::now()) {
            tracing::debug!(worker = %self.config.id, depth, rate = self.depth.rate(),
                "local queue resized");
            self.beat_again = self.heartbeating;
            self.heartbeat(ctx);
        }
    }

    /// Tasks it holds: running or queued.
    fn held(&self) -> usize {
        self.running.len() + self.queue.len()
    }

    /// Payload bytes of the tasks it holds, running or queued.
    fn held_bytes(&self) -> i64 {
        let running: i64 = self.running.values().map(|r| r.payload_bytes).sum();
        let queued: i64 = self.queue.iter().map(|t| t.payload_bytes).sum();
        running + queued
    }

    /// Hands queued tasks to handlers while slots are free, then has their starts
    /// recorded. When draining, the queue is dropped: its tasks are still `assigned` in
    /// the blackboard, where a drain gives them back and a hot upgrade hands them over.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            for t in self.queue.drain(..) {
                self.ledger.dropped_unrun((t.id, t.epoch));
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
        if self.running.len() < self.config.concurrency.max(1) {
            self.ran_dry = true;
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

    /// Starts `task`'s handler now; its start is written with the next batch.
    fn run(&mut self, task: AssignedTask, ctx: &mut Context<Self>) {
        let me = ctx.address();
        let (abort, reg) = AbortHandle::new_pair();
        let id = task.id;
        let epoch = task.epoch;
        let suspend = Arc::new(AtomicBool::new(false));
        let cancel = Cancel::default();
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
                cancel: cancel.clone(),
                canceled: None,
                resumable: self.registry.is_resumable(&task.kind),
                suspend: suspend.clone(),
                payload_bytes: task.payload_bytes,
            },
        );
        let attempt = fence::Fenced::new(
            self.registry.attempt(
                task,
                self.bb.clone(),
                suspend,
                cancel,
                self.progress.clone(),
                self.config.default_timeout,
            ),
            self.leases.watch((id, epoch)),
            fence::margin(self.config.lease),
        );
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
            batch.push(r.record(*id, Step::Start));
        }
        if batch.is_empty() {
            return;
        }
        // A finished task's last progress, written just before its outcome (which the
        // fence of the progress write would refuse once written).
        let last_progress: Vec<_> = batch
            .iter()
            .filter(|c| !c.step.is_start())
            .filter_map(|c| self.progress.take(c.id, c.epoch))
            .collect();
        self.flushing = true;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        let sent = Instant::now();
        async move {
            if let Err(e) = bb.save_progress(&id, &last_progress, true).await {
                tracing::debug!(error = %e, "cannot write the last progress of finished tasks");
            }
            let res = bb.record(&id, &batch).await;
            // Starts refused because an operator canceled the task meanwhile: its
            // handler is told (as at a renewal), not stopped at once.
            let mut canceled = HashSet::new();
            if let Ok(written) = &res {
                let refused: Vec<Uuid> = batch
                    .iter()
                    .filter(|c| c.step.is_start() && !written.contains(&c.id))
                    .map(|c| c.id)
                    .collect();
                if !refused.is_empty() {
                    if let Ok(ids) = bb.canceled_among(&refused).await {
                        canceled.extend(ids);
                    }
                }
            }
            (res, batch, canceled)
        }
        .into_actor(self)
        .map(move |(res, batch, canceled), act, ctx| {
            act.flushing = false;
            act.db_result(&res);
            match res {
                Ok(written) => {
                    if act.gave_back.is_none() && batch.iter().any(|c| !c.step.is_start()) {
                        act.gave_back = Some(sent);
                    }
                    let written: HashSet<Uuid> = written.into_iter().collect();
                    for c in &batch {
                        // A written start leaves the task held; anything else (an
                        // outcome, or a record fenced off) lets it go.
                        if !c.step.is_start() || !written.contains(&c.id) {
                            act.ledger.let_go((c.id, c.epoch));
                        }
                    }
                    for c in batch.iter().filter(|c| !written.contains(&c.id)) {
                        act.fenced_off += 1;
                        if c.step.is_start() && canceled.contains(&c.id) {
                            act.tell_canceled(c.id, c.epoch);
                        } else if c.step.is_start() {
                            // Taken back or transferred before its start was written:
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
                        .filter(|c| !c.step.is_start() && written.contains(&c.id))
                        .count() as u64;
                    act.stats.ran("worker");
                }
                Err(e) => {
                    // Nothing is dropped while the process lives: outcomes go back to the
                    // outbox, starts are sent again with the next batch (the database may
                    // be restarting).
                    act.stats.failed("worker");
                    tracing::warn!(error = %e, count = batch.len(), "cannot record starts and outcomes; retrying");
                    for c in batch.iter().filter(|c| c.step.is_start()) {
                        if let Some(r) = act.running.get_mut(&c.id).filter(|r| r.epoch == c.epoch) {
                            r.start_sent = false;
                        }
                    }
                    let mut again: Vec<AttemptRecord> = batch
                        .into_iter()
                        .filter(|c| !c.step.is_start())
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
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // One timer for self-fencing, the queue's sizing and the poll (see `tick`).
        self.tick(ctx);
        ctx.run_interval(self.config.heartbeat, |act, ctx| act.heartbeat(ctx));
        ctx.run_interval(self.config.lease / 3, |act, ctx| act.renew(ctx));
        if self.config.wake_addr.is_none() {
            self.listen(ctx);
        }
        self.read_policies(ctx);
        self.fetch(ctx);
    }
}

impl Worker {
    /// Self-fencing, the queue's sizing, and the safety-net poll when it is due; again
    /// in a tenth of a second while the worker holds tasks, in [`IDLE_TICK`] while it
    /// holds none (a thousand idle workers on one host would otherwise wake ten
    /// thousand times a second between them for nothing).
    fn tick(&mut self, ctx: &mut Context<Self>) {
        self.fence(ctx);
        if self.depth.is_auto() {
            self.resize(ctx);
        }
        if self.polled_at.elapsed() >= self.poll_every {
            self.polled_at = Instant::now();
            self.poll(ctx);
        }
        if self.progress_sent.elapsed() >= PROGRESS_EVERY {
            self.write_progress(ctx);
        }
        let policies_due = self
            .policies_read
            .is_none_or(|at| at.elapsed() >= POLICY_REFRESH);
        if policies_due && self.held() > 0 {
            self.read_policies(ctx);
        }
        let busy = self.held() > 0 || !self.outbox.is_empty() || !self.running.is_empty();
        let next = if busy {
            fence::FENCE_TICK.min(depth::TICK)
        } else {
            IDLE_TICK.min(self.poll_every)
        };
        ctx.run_later(next, |act, ctx| act.tick(ctx));
    }

    /// The wait before the retry of a failed attempt of `kind` after `retries` earlier
    /// failures: its kind's retry policy as last read, else the fleet's default.
    fn backoff_ms(&self, kind: &str, retries: i32) -> i64 {
        match self.policies.get(kind) {
            Some(p) => p.delay_ms(retries),
            None => self.config.backoff_ms(retries),
        }
    }

    /// Starts with `policies`, read before the worker takes its first task (see
    /// `artex::runtime::run_worker`): a task that fails at once already waits as its
    /// kind's policy says, not as the worker's own backoff.
    pub fn with_retry_policies(mut self, policies: HashMap<String, RetryPolicy>) -> Self {
        self.policies = policies;
        self.policies_read = Some(Instant::now());
        self
    }

    /// Reads its kinds' retry policies again. A failed read keeps the last ones (and is
    /// tried again at the next tick).
    fn read_policies(&mut self, ctx: &mut Context<Self>) {
        if self.reading_policies {
            return;
        }
        self.reading_policies = true;
        let bb = self.bb.clone();
        let kinds = self.registry.kinds();
        async move { bb.retry_policies(&kinds).await }
            .into_actor(self)
            .map(|res, act, _ctx| {
                act.reading_policies = false;
                match res {
                    Ok(policies) => {
                        act.policies = policies;
                        act.policies_read = Some(Instant::now());
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the kinds' retry policies"),
                }
            })
            .spawn(ctx);
    }

    /// Writes the progress its running tasks reported since the last write, all in one
    /// statement (none when nothing was reported). A value of a task that no longer runs
    /// here is dropped; one whose row the worker's own batch in flight locked is kept for
    /// the next write, unless a newer one came.
    ///
    /// Never while a renewal is in flight, nor a renewal during it: both skip the rows
    /// the other locks, and with leases renewed about every second too they would meet
    /// again and again (the next tick, a tenth of a second later, tries again).
    fn write_progress(&mut self, ctx: &mut Context<Self>) {
        if self.progress_writing || self.renewing {
            return;
        }
        let notes: Vec<_> = self
            .progress
            .take_all()
            .into_iter()
            .filter(|n| self.running.get(&n.id).is_some_and(|r| r.epoch == n.epoch))
            .collect();
        self.progress_sent = Instant::now();
        if notes.is_empty() {
            return;
        }
        self.progress_writing = true;
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        async move {
            let res = bb.save_progress(&id, &notes, false).await;
            (res, notes)
        }
        .into_actor(self)
        .map(|(res, notes), act, ctx| {
            act.progress_writing = false;
            if std::mem::take(&mut act.renew_again) {
                act.renew(ctx);
            }
            act.db_result(&res);
            let written: HashSet<Uuid> = match res {
                Ok(ids) => ids.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(error = %e, count = notes.len(), "cannot write progress; retrying");
                    HashSet::new()
                }
            };
            for n in notes.into_iter().filter(|n| !written.contains(&n.id)) {
                if act.running.get(&n.id).is_some_and(|r| r.epoch == n.epoch) {
                    act.progress.put_back(n);
                }
            }
        })
        .spawn(ctx);
    }

    /// A read of its assignments found `found` new tasks: a worker woken by pushes that
    /// none has reached yet polls every [`WorkerConfig::poll`] while reads find tasks, and
    /// backs off (doubling) to [`PUSHED_POLL`] while they find none.
    fn read_found(&mut self, found: usize) {
        self.poll_every = if self.config.wake_addr.is_none() {
            self.config.poll
        } else if self.pushed {
            PUSHED_POLL.max(self.config.poll)
        } else if found > 0 {
            self.config.poll
        } else {
            (self.poll_every * 2).clamp(self.config.poll, PUSHED_POLL.max(self.config.poll))
        };
    }

    /// The safety-net poll: a read of its assignments, unless pushes reach it and it read
    /// less than [`PUSHED_POLL`] ago.
    fn poll(&mut self, ctx: &mut Context<Self>) {
        if self.read_at.elapsed() < self.poll_every {
            return;
        }
        self.fetch(ctx);
    }

    /// Follows its LISTEN session (a worker without a push address): after each
    /// (re)connect, a read catches whatever was assigned while it was away.
    fn listen(&mut self, ctx: &mut Context<Self>) {
        let mut session = self
            .bb
            .listen_session("worker", &[self.config.channel()])
            .named(self.config.session_name());
        let me = ctx.address();
        let bb = self.bb.clone();
        async move {
            loop {
                match session.next().await {
                    // Planners offer work only to workers whose session is there (see
                    // `RosterEntry`): it is now, so a round may place more.
                    ListenEvent::Connected => {
                        bb.wake(&[TASKS_CHANNEL]);
                        me.do_send(Wake)
                    }
                    ListenEvent::Notified(batch) => {
                        me.do_send(WakeUps {
                            payloads: batch.into_iter().map(|n| n.payload).collect(),
                            pushed: false,
                        });
                    }
                    ListenEvent::Lost(_) => {}
                }
            }
        }
        .into_actor(self)
        .spawn(ctx);
    }
}

/// Wake-ups that reached the worker, by NOTIFY or pushed by a planner (`POST /wake`):
/// their payloads, in the order sent — tasks carried (see `blackboard::carried`), a
/// plain "look again" (empty), or [`CANCEL_PAYLOAD`].
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct WakeUps {
    /// The payloads.
    pub payloads: Vec<String>,
    /// Pushed by a planner (not a NOTIFY).
    pub pushed: bool,
}

impl Handler<WakeUps> for Worker {
    type Result = ();

    fn handle(&mut self, msg: WakeUps, ctx: &mut Context<Self>) {
        if msg.pushed && !self.pushed && !self.wake_unreachable {
            tracing::info!(worker = %self.config.id, "planners reach this worker: it polls every {PUSHED_POLL:?} now");
            self.pushed = true;
            self.poll_every = PUSHED_POLL.max(self.config.poll);
        }
        let (with_tasks, plain): (Vec<_>, Vec<_>) = msg
            .payloads
            .into_iter()
            .partition(|p| carries_assignments(p));
        if !with_tasks.is_empty() {
            ctx.notify(intake::Carried(with_tasks));
        }
        if plain.iter().any(|p| p == CANCEL_PAYLOAD) {
            ctx.notify(CheckLeases);
        }
        if !plain.is_empty() {
            ctx.notify(Wake);
        }
    }
}

impl Supervised for Worker {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("worker");
        self.fetching = false;
        self.flushing = false;
        // A call in flight when the actor restarted never reports back: without this,
        // heartbeats and renewals would stop for good.
        self.renewing = false;
        self.heartbeating = false;
        self.progress_writing = false;
        self.reading_policies = false;
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
        if let Some(at) = r.canceled {
            // The task ended `canceled` in the blackboard already: what the handler
            // returned is not an outcome (its write would be fenced off anyway).
            tracing::info!(task = %msg.id, kind = %r.kind,
                stopped_after_ms = at.elapsed().as_millis() as u64,
                "a canceled task's handler stopped");
            self.pump(ctx);
            self.check_suspended();
            self.check_drained();
            return;
        }
        if r.suspend.load(Ordering::Acquire) && msg.result.is_err() {
            // Stopped at a checkpoint for a task transfer: no outcome, the task moves on.
            tracing::info!(task = %msg.id, kind = %r.kind, "task suspended for a task transfer");
            self.suspended.push((msg.id, r.epoch));
            self.check_suspended();
            return;
        }
        let outcome = match msg.result {
            Ok(v) => {
                tracing::debug!(task = %msg.id, kind = %r.kind, "task succeeded");
                Outcome::Succeeded(v)
            }
            Err(Attempt::Failed(error, then)) => {
                tracing::info!(task = %msg.id, kind = %r.kind, %error, attempt = r.retries + 1, "task failed");
                match then {
                    AfterError::Retry => Outcome::Failed {
                        error,
                        retry_in_ms: self.backoff_ms(&r.kind, r.retries),
                    },
                    AfterError::RetryAt(at) => Outcome::Failed {
                        error,
                        retry_in_ms: (at - chrono::Utc::now()).num_milliseconds().max(0),
                    },
                    AfterError::Discard => Outcome::Discarded { error },
                    AfterError::Snooze(after) => Outcome::Snoozed {
                        note: error,
                        delay_ms: i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
                    },
                }
            }
            Err(Attempt::TimedOut(error)) => {
                tracing::info!(task = %msg.id, kind = %r.kind, %error, attempt = r.retries + 1, "task timed out");
                Outcome::TimedOut {
                    error,
                    retry_in_ms: self.backoff_ms(&r.kind, r.retries),
                }
            }
        };
        self.outbox.push(r.record(msg.id, Step::Finish(outcome)));
        self.depth.finished(1);
        // Handlers started now have their starts written with this outcome.
        self.pump(ctx);
        self.flush(ctx);
        if self.queue.is_empty() && self.maybe_more {
            self.fetch(ctx);
        }
        self.check_suspended();
    }
}

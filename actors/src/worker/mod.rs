//! The Worker: one per worker process. It registers and heartbeats, listens for its
//! assignments, takes them from the wake-up that carries them or reads them (up to its
//! concurrency plus its prefetch, the rest waiting in a local queue whose depth follows
//! its pace), runs each handler at once (with a timeout, catching panics), renews the
//! leases of long tasks, and records starts and outcomes in batches. Every write names
//! the lease epoch, so a worker that lost a task changes nothing.
//!
//! This file is the actor, its run loop (`tick`) and what runs a handler; the rest are
//! its parts, each owning its own state, with every call to the blackboard one
//! `flight` at a time ("one call in flight, coalesce the repeats"):
//! - `held`: what it holds — running handlers, the local queue (`turns`: a fair kind's
//!   tasks start by turns across their keys), the ledger that keeps a read from taking a
//!   task twice, the leases' ends (`fence` stops what it cannot renew);
//! - `intake`: its reads, the poll's pace, the tasks wake-ups carry;
//! - `outcomes`: starts and outcomes written in batches (a group commit);
//! - `liveness`: lease renewals and heartbeats;
//! - `policies`: its kinds' retry policies and which are fair, read every
//!   [`POLICY_REFRESH`] while it holds tasks; [`progress`]: handlers' progress, throttled;
//! - [`drain`] and [`transfer`] (the task transfer of a hot upgrade): how it stops;
//!   [`depth`] sizes its queue, [`status`] is what it shows, [`handlers`] what it runs.

pub mod depth;
pub mod drain;
mod fence;
pub mod handlers;
mod held;
mod intake;
mod ledger;
mod liveness;
pub mod metrics;
mod outcomes;
mod policies;
pub mod progress;
pub mod status;
pub mod transfer;
mod turns;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::{AbortHandle, Abortable};
use uuid::Uuid;

use crate::blackboard::carried::carries_assignments;
pub use crate::blackboard::WorkerState;
use crate::blackboard::{
    AssignedTask, ListenEvent, Outcome, Registration, Step, WorkerBoard, CANCEL_PAYLOAD,
    TASKS_CHANNEL,
};
use crate::supervisor::ActorStats;
use depth::QueueDepth;
use drain::Stopping;
pub use drain::{Drain, DrainReport};
pub use handlers::{
    AfterError, HandlerFuture, HandlerResult, Registry, TaskContext, TaskError, TaskHandler,
    UploadFile,
};
use handlers::{Attempt, Cancel, Steering};
use held::{Held, Running};
use intake::Intake;
use liveness::Liveness;
use outcomes::Outcomes;
use policies::Policies;
use progress::{Progress, PROGRESS_EVERY};
pub use status::{GetStatus, RunningTask, WorkerStatus, WAKE_UPS_POLLING};
pub use transfer::{
    GetId, ResumeReport, ResumeTasks, ResumeWork, SuspendForTransfer, SuspendReport, TransferDone,
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

/// How often a worker reads its kinds' retry policies (`artex kind retry`) and which are
/// fair again while it holds tasks: a change reaches its retries and its local queue
/// within this (the planners apply fairness at once). An idle worker does not
/// read them (it has nothing to retry); it reads them again when it gets work.
pub const POLICY_REFRESH: Duration = Duration::from_secs(1);

/// How often an idle worker (holding no task) looks at its timers: a task it is given
/// meets its first self-fencing check within this, well inside the fencing margin of
/// any lease (a fifth of it).
pub const IDLE_TICK: Duration = Duration::from_millis(500);

/// The Worker actor: the composition of its parts, each owning its own state (see the
/// module doc).
pub struct Worker {
    bb: WorkerBoard,
    config: WorkerConfig,
    registry: Registry,
    stats: ActorStats,
    /// What it holds: running handlers, the local queue, the ledger, the leases' ends.
    held: Held,
    /// The local queue's depth, pinned or following the completion rate.
    depth: QueueDepth,
    /// How tasks reach it: reads of its assignments, the poll, wake-ups.
    intake: Intake,
    /// Starts and outcomes on their way to the blackboard.
    outcomes: Outcomes,
    /// Lease renewals, heartbeats, and what they tell of the database.
    liveness: Liveness,
    /// Its kinds' retry policies, as last read.
    policies: Policies,
    /// Handlers' progress on its way to the blackboard.
    progress: Progress,
    /// A drain or a task transfer under way.
    stopping: Stopping,
    /// What `/metrics` shows of it.
    metrics: Arc<metrics::WorkerMetrics>,
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
        let intake = Intake::new(config.poll);
        Worker {
            bb,
            config,
            registry,
            stats,
            held: Held::default(),
            depth,
            intake,
            outcomes: Outcomes::default(),
            liveness: Liveness::default(),
            policies: Policies::default(),
            progress: Progress::default(),
            stopping: Stopping::default(),
            metrics: Arc::default(),
        }
    }

    /// Counts into `metrics` (shared with its HTTP server's `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<metrics::WorkerMetrics>) -> Self {
        self.metrics = metrics;
        self
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
            slots: i32::try_from(config.concurrency).ok(),
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

    /// Its free slots as the blackboard counts them, which still holds a finished task
    /// whose outcome is not written, and its slot offered to new tasks: what a planner
    /// sees free (a claim that finds tasks waiting gives the offer back first, and may
    /// take one more).
    fn free_seen(&self) -> usize {
        self.capacity()
            .saturating_sub(self.held.ledger.held())
            .saturating_sub(usize::from(self.intake.offered))
    }

    /// Whether a claim after a written outcome is worth its read of every task the worker
    /// holds ([`intake::claim_after_outcome`]).
    fn claim_worth_it(&self) -> bool {
        intake::claim_after_outcome(
            self.free_seen(),
            self.capacity(),
            self.held.queue.len(),
            self.config.concurrency,
        )
    }

    /// Samples the completion rate; when the queue's depth moved, has the new capacity
    /// written at once. A deeper queue wakes the planners (the heartbeat statement does),
    /// a shallower one only stops new assignments until the worker holds less.
    fn resize(&mut self, ctx: &mut Context<Self>) {
        if let Some(depth) = self.depth.tick(Instant::now()) {
            tracing::debug!(worker = %self.config.id, depth, rate = self.depth.rate(),
                "local queue resized");
            self.beat_now(ctx);
        }
    }

    /// Hands queued tasks to handlers while slots are free, then has their starts
    /// recorded. When draining, the queue is dropped: its tasks are still `assigned` in
    /// the blackboard, where a drain gives them back and a hot upgrade hands them over.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.stopping.draining {
            for t in self.held.queue.drain(..) {
                self.held.ledger.dropped_unrun((t.id, t.epoch));
            }
            return;
        }
        let mut started = false;
        while self.held.running.len() < self.config.concurrency.max(1) {
            let Some(task) = self.held.turns.next(&mut self.held.queue) else {
                break;
            };
            self.run(task, ctx);
            started = true;
        }
        if self.held.running.len() < self.config.concurrency.max(1) {
            self.intake.ran_dry = true;
        }
        if started {
            self.flush_starts(ctx);
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
        if task.retries == 0 && task.checkpoint.is_none() {
            self.metrics.first_start(&task.kind, id);
        }
        // An earlier attempt of this task still running here lost its lease: the task was
        // taken back behind its back and assigned here again (the epoch moved on). It is
        // stopped as any lost lease's handler is; left running, two attempts of one task
        // overlapped on this worker, the older untracked.
        if let Some(older) = self
            .held
            .running
            .get(&id)
            .map(|r| r.epoch)
            .filter(|e| *e < epoch)
        {
            self.lost(&HashSet::from([(id, older)]), &HashSet::new());
        }
        self.held.running.insert(
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
        let lease = self.held.leases.watch((id, epoch));
        // With tracing on and a context on the task (migrations/V45), its attempt's span.
        let span = crate::trace::AttemptSpan::start(
            task.traceparent.as_ref(),
            id,
            &task.kind,
            task.retries + 1,
            &self.config.id,
        );
        let attempt = fence::Fenced::new(
            self.registry.attempt(
                task,
                self.bb.clone(),
                Steering {
                    suspend,
                    cancel,
                    progress: self.progress.slots.clone(),
                    lease: lease.clone(),
                    span,
                },
                self.config.default_timeout,
            ),
            lease,
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
        if self.intake.poll_due() {
            self.poll(ctx);
        }
        if self.progress.sent.elapsed() >= PROGRESS_EVERY {
            self.write_progress(ctx);
        }
        if self.policies.due() && self.held.count() > 0 {
            self.read_policies(ctx);
        }
        let busy = self.held.count() > 0
            || !self.outcomes.outbox.is_empty()
            || !self.held.running.is_empty();
        let next = if busy {
            fence::FENCE_TICK.min(depth::TICK)
        } else {
            IDLE_TICK.min(self.intake.poll_every)
        };
        ctx.run_later(next, |act, ctx| act.tick(ctx));
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
        if msg.pushed {
            self.intake.pushed(&self.config);
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
        // A call in flight when the actor restarted never reports back: without this,
        // heartbeats and renewals would stop for good.
        self.intake.flight.reset();
        self.intake.offer.reset();
        self.outcomes.flight.reset();
        self.liveness.renew.reset();
        self.liveness.beat.reset();
        self.progress.flight.reset();
        self.policies.flight.reset();
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
        // A handler of an earlier attempt that finished anyway changes nothing.
        if self.held.running_at(&msg.id, msg.epoch).is_none() {
            return;
        }
        let Some(r) = self.held.running.remove(&msg.id) else {
            return;
        };
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
            self.metrics.transferred_out.inc();
            self.stopping.suspended.push((msg.id, r.epoch));
            self.check_suspended();
            return;
        }
        let outcome = self.outcome(msg.id, &r, msg.result);
        self.metrics
            .ended(&r.kind, r.started.elapsed(), attempt_outcome(&outcome));
        self.outcomes
            .outbox
            .push(r.record(msg.id, Step::Finish(outcome)));
        self.depth.finished(1);
        // Handlers started now have their starts written with this outcome.
        self.pump(ctx);
        self.flush(ctx);
        if self.held.queue.is_empty() && self.intake.maybe_more {
            self.fetch(ctx);
        }
        self.check_suspended();
    }
}

impl Worker {
    /// What an attempt's result is as an outcome to write: a failure retried after its
    /// kind's policy (or as the handler said: at a time, discarded, snoozed).
    fn outcome(
        &self,
        id: Uuid,
        r: &Running,
        result: Result<serde_json::Value, Attempt>,
    ) -> Outcome {
        match result {
            Ok(v) => {
                tracing::debug!(task = %id, kind = %r.kind, "task succeeded");
                Outcome::Succeeded(v)
            }
            Err(Attempt::Failed(error, then)) => {
                tracing::info!(task = %id, kind = %r.kind, %error, attempt = r.retries + 1, "task failed");
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
                tracing::info!(task = %id, kind = %r.kind, %error, attempt = r.retries + 1, "task timed out");
                Outcome::TimedOut {
                    error,
                    retry_in_ms: self.backoff_ms(&r.kind, r.retries),
                }
            }
        }
    }
}

/// An outcome as `/metrics` labels it. A handler's result is never `Released` (drains
/// and transfers release tasks without one); like a snooze, it would count no attempt.
fn attempt_outcome(outcome: &Outcome) -> metrics::AttemptOutcome {
    use metrics::AttemptOutcome as A;
    match outcome {
        Outcome::Succeeded(_) => A::Succeeded,
        Outcome::Failed { .. } => A::Failed,
        Outcome::TimedOut { .. } => A::Timeout,
        Outcome::Discarded { .. } => A::Discarded,
        Outcome::Snoozed { .. } | Outcome::Released => A::Snoozed,
    }
}

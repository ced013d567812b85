//! The task transfer of a hot upgrade, worker side: the old process suspends resumable
//! tasks at a checkpoint and tells what stays ([`SuspendForTransfer`] →
//! [`SuspendReport`]); the new one takes them over and resumes them ([`ResumeTasks`] →
//! [`ResumeReport`]); a rollback has the old one take work again ([`ResumeWork`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{fence, Worker};
use crate::blackboard::{AssignedTask, WorkerBoard, WorkerState};
use crate::error::retry_unreachable;

/// Task transfer, old side: stop taking work and bring every resumable running task to a
/// stop at its next checkpoint (aborting those that do not reach one by `deadline`).
/// Answers with the tasks to transfer and the ones that keep running here.
#[derive(Message)]
#[rtype(result = "SuspendReport")]
pub struct SuspendForTransfer {
    /// How long resumable tasks may take to reach a checkpoint.
    pub deadline: Duration,
}

/// What a worker suspending for a task transfer answers.
#[derive(Debug, Clone, Default)]
pub struct SuspendReport {
    /// Stopped at a checkpoint (or at the deadline), to resume in the new process: (task
    /// id, epoch held).
    pub suspended: Vec<(Uuid, i64)>,
    /// Tasks whose handlers run on here to their end (not resumable), or whose outcome
    /// is still being written here. Every other task assigned to this worker (its queue,
    /// what it had not read) moves to the new process.
    pub staying: Vec<Uuid>,
}

impl Handler<SuspendForTransfer> for Worker {
    type Result = ResponseActFuture<Self, SuspendReport>;

    fn handle(&mut self, msg: SuspendForTransfer, ctx: &mut Context<Self>) -> Self::Result {
        self.stopping.draining = true;
        self.pump(ctx);
        for r in self.held.running.values() {
            if r.resumable {
                r.suspend.store(true, Ordering::Release);
            }
        }
        let (tx, rx) = oneshot::channel();
        self.stopping.suspend_waiters.push(tx);
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
                    .held
                    .running
                    .iter()
                    .filter(|(_, r)| r.resumable)
                    .map(|(id, _)| *id)
                    .collect();
                for id in late {
                    if let Some(r) = act.held.running.remove(&id) {
                        r.abort.abort();
                        act.stopping.suspended.push((id, r.epoch));
                    }
                }
                // Kept (and renewed with what this process holds) until taken over:
                // the new process may take a while to get to it (a failover).
                SuspendReport {
                    suspended: act.stopping.suspended.clone(),
                    staying: act.held.ledger.outcome_unwritten(),
                }
            }),
        )
    }
}

/// Take over running tasks that worker `from` held at the given epochs (task transfer,
/// new side; or the old side itself after a rollback) and resume each from its checkpoint.
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
        let lease = self.config.lease;
        let (started, from) = (std::time::SystemTime::now(), msg.from.clone());
        let take = async move {
            let taken = take_over(&bb, &msg.from, &me, &msg.tasks, lease).await;
            taken.map(|t| (t, msg.tasks))
        };
        Box::pin(
            take.into_actor(self)
                .map(move |res, act, ctx| {
                    let (taken, asked) = res?;
                    let mut report = ResumeReport::default();
                    for (id, _) in &asked {
                        if !taken.iter().any(|(t, _)| t.id == *id) {
                            tracing::warn!(task = %id, "task transfer conflict: the blackboard no longer has this task at that epoch");
                            report.conflicts.push(*id);
                        }
                    }
                    act.stopping.suspended.retain(|(id, _)| !taken.iter().any(|(t, _)| t.id == *id));
                    for (t, sent) in taken {
                        tracing::info!(task = %t.id, kind = %t.kind, epoch = t.epoch, "resuming a transferred task from its checkpoint");
                        crate::trace::transfer(&t, &from, &act.config.id, started);
                        report.resumed.push(t.id);
                        act.metrics.transferred_in.inc();
                        act.held.ledger.took_over((t.id, t.epoch));
                        act.held.hold_until(&t, sent);
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
        self.stopping.draining = false;
        for r in self.held.running.values() {
            r.suspend.store(false, Ordering::Release);
        }
        // What the rollback could not resume here (the database away past a lease) is
        // given back rather than held unrun.
        self.release_suspended();
        self.flush(ctx);
        let bb = self.bb.clone();
        let id = self.config.id.clone();
        actix::spawn(async move {
            if let Err(e) = bb.set_worker_state(&id, WorkerState::Online).await {
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

/// Task transfer, old side, once the new process said it took over: what was
/// suspended here is the new process's (or the blackboard's, for a conflict), not to be
/// given back by this process's drain.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TransferDone;

impl Handler<TransferDone> for Worker {
    type Result = ();
    fn handle(&mut self, _msg: TransferDone, _ctx: &mut Context<Self>) {
        self.stopping.suspended.clear();
    }
}

/// Takes `tasks` over from `from` for `me`: each with the moment its lease is counted
/// from, on this process's clock.
/// - Through a database that is away for a moment (a failover, a restart): the tasks'
///   leases outlast it (their old holder renews them until they are taken), and sending
///   the take-over again is fine (see the blackboard's `take_over`). Past a lease they
///   are the reaper's anyway.
/// - A lease is counted from when its request was sent (the database's clock started
///   later; see `fence`). A take-over that waited (a planner's round holding the
///   worker's row, a slow commit) would have the tasks look spent and stopped at once:
///   one renewal sent right after counts them afresh.
async fn take_over(
    bb: &WorkerBoard,
    from: &str,
    me: &str,
    tasks: &[(Uuid, i64)],
    lease: Duration,
) -> crate::Result<Vec<(AssignedTask, Instant)>> {
    let (taken, sent) = retry_unreachable(Some(lease), "taking transferred tasks over", || async {
        let sent = Instant::now();
        Ok((
            bb.take_over(from, me, tasks, lease.as_secs_f64()).await?,
            sent,
        ))
    })
    .await?;
    if taken.is_empty() || sent.elapsed() < fence::margin(lease) {
        return Ok(taken.into_iter().map(|t| (t, sent)).collect());
    }
    let held: Vec<(Uuid, i64)> = taken.iter().map(|t| (t.id, t.epoch)).collect();
    let again = Instant::now();
    let renewed = bb
        .renew_leases(me, &held, lease.as_secs_f64())
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot renew the tasks just taken over; counting their leases from the take-over");
            Vec::new()
        });
    Ok(taken
        .into_iter()
        .map(|mut t| {
            let left = renewed
                .iter()
                .find(|(id, _)| *id == t.id)
                .and_then(|(_, r)| r.left(lease));
            match left {
                Some(left) => {
                    t.lease_left_ms = left.as_secs_f64() * 1000.0;
                    (t, again)
                }
                None => (t, sent),
            }
        })
        .collect())
}

impl Worker {
    /// Wakes a waiting task transfer once no resumable task is still on its way to a checkpoint.
    pub(super) fn check_suspended(&mut self) {
        let waiting = self
            .held
            .running
            .values()
            .any(|r| r.resumable && r.suspend.load(Ordering::Acquire));
        if !waiting {
            for w in self.stopping.suspend_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

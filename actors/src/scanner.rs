//! The Scanner: notices runnable work and drives the Assigner. Woken by NOTIFY on
//! `artex_tasks` (new tasks, freed capacity) with a poll as the safety net — NOTIFY is a
//! hint, the tables are the truth. It also listens on `artex_wake` for canceled tasks
//! held by workers woken over HTTP, and has the [`Waker`] pass each cancel on. Wake-ups that arrive while a round runs fold into one
//! more round, so a burst of notifications costs one extra round, not one each.

use std::time::Duration;

use actix::prelude::*;

use crate::assigner::{AssignNow, Assigner};
use crate::blackboard::{AssignReport, ListenEvent, PlannerBoard, TASKS_CHANNEL};
use crate::flight::SingleFlight;
use crate::supervisor::ActorStats;
use crate::waker::Waker;

/// The channel on which the database announces a canceled task held by a worker woken
/// over HTTP (payload `cancel:<worker id>`; migrations/V14).
pub const WAKE_CHANNEL: &str = "artex_wake";

/// The Scanner actor.
pub struct Scanner {
    bb: PlannerBoard,
    assigner: Addr<Assigner>,
    poll: Duration,
    stats: ActorStats,
    /// A round is under way; another is owed after it.
    round: SingleFlight,
    waker: Option<Waker>,
}

impl Scanner {
    /// A scanner that polls every `poll` and asks `assigner` for rounds (another at once
    /// when one filled its batch while workers had room left).
    pub fn new(
        bb: PlannerBoard,
        assigner: Addr<Assigner>,
        poll: Duration,
        stats: ActorStats,
    ) -> Self {
        Scanner {
            bb,
            assigner,
            poll,
            stats,
            round: SingleFlight::default(),
            waker: None,
        }
    }

    /// Passes cancels announced on [`WAKE_CHANNEL`] on to their workers with `waker`.
    pub fn with_waker(mut self, waker: Waker) -> Self {
        self.waker = Some(waker);
        self
    }

    /// Starts an assignment round, or, if one is running, asks for another right after it
    /// (a burst of wake-ups costs one extra round). [`ScanNow`] runs one and awaits it.
    fn start_round(&mut self, ctx: &mut Context<Self>) {
        if !self.round.start() {
            return;
        }
        self.assigner
            .send(AssignNow)
            .into_actor(self)
            .map(|res, act, ctx| {
                let mut again = act.round.end();
                match res {
                    Ok(Ok(report)) => {
                        act.stats.ran("scanner");
                        again |= report.more_may_fit();
                        if report.assigned > 0 {
                            tracing::debug!(assigned = report.assigned, "assigned tasks");
                        }
                    }
                    Ok(Err(e)) => {
                        act.stats.failed("scanner");
                        tracing::warn!(error = %e, "assignment round failed; retrying on the next poll");
                    }
                    Err(e) => {
                        act.stats.failed("scanner");
                        tracing::warn!(error = %e, "assigner unavailable; retrying on the next poll");
                    }
                }
                if again {
                    act.start_round(ctx);
                }
            })
            .spawn(ctx);
    }
}

impl Actor for Scanner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.poll, |act, ctx| act.start_round(ctx));
        // The LISTEN session: reconnects forever; after each (re)connect, a round catches
        // whatever was notified while it was away.
        let mut session = self
            .bb
            .listen_session("planner", &[TASKS_CHANNEL, WAKE_CHANNEL]);
        let me = ctx.address();
        let waker = self.waker.clone();
        async move {
            loop {
                match session.next().await {
                    ListenEvent::Connected => me.do_send(Wake),
                    ListenEvent::Notified(batch) => {
                        let mut tasks = false;
                        for n in batch {
                            match n.payload.strip_prefix("cancel:") {
                                Some(worker) if n.channel == WAKE_CHANNEL => {
                                    if let Some(waker) = &waker {
                                        waker.cancel(worker).await;
                                    }
                                }
                                _ => tasks = true,
                            }
                        }
                        if tasks {
                            me.do_send(Wake);
                        }
                    }
                    ListenEvent::Lost(_) => {}
                }
            }
        }
        .into_actor(self)
        .spawn(ctx);
    }
}

impl Supervised for Scanner {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.round.reset();
        self.stats.restarted("scanner");
    }
}

/// A hint that there may be work: start a round (or fold into the running one).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

impl Handler<Wake> for Scanner {
    type Result = ();
    fn handle(&mut self, _msg: Wake, ctx: &mut Context<Self>) {
        self.start_round(ctx);
    }
}

/// Run one assignment round now and answer with its report (for tests and operators).
#[derive(Message)]
#[rtype(result = "crate::Result<AssignReport>")]
pub struct ScanNow;

impl Handler<ScanNow> for Scanner {
    type Result = ResponseFuture<crate::Result<AssignReport>>;
    fn handle(&mut self, _msg: ScanNow, _ctx: &mut Context<Self>) -> Self::Result {
        let assigner = self.assigner.clone();
        Box::pin(async move { assigner.send(AssignNow).await? })
    }
}

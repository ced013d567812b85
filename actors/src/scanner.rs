//! The Scanner: notices runnable work and drives the Assigner. Woken by NOTIFY on
//! `artex_tasks` (new tasks, freed capacity) with a poll as the safety net — NOTIFY is a
//! hint, the tables are the truth. It also listens on `artex_wake` for canceled tasks
//! held by workers woken over HTTP and for tasks born assigned to them (V62), and has
//! the [`Waker`] pass each on. Wake-ups that arrive while a round runs fold into one more
//! round, so a burst of notifications costs one extra round, not one each.
//!
//! **A quiet fleet.** When the last round found nothing waiting and workers with a free
//! handler slot ([`Quiet`]), new tasks (the insert's notification says `new`:
//! migrations/V52) need no round to start: the Scanner wakes one of those workers, in
//! turn, which claims what it may run in one durable statement (`artex.claim_and_read`,
//! under the same rules as a round: its kinds, online, not paused or limited, no task
//! bound to another host). The round follows [`CLAIM_FIRST`] later for what that worker
//! did not take (another kind, more than its slots), skipping what it holds locked. A
//! round is a read, a write and a push before the worker hears of a task; the claim
//! takes the round's read and write off the path of a quiet queue's lone task (W2). A
//! busy queue, where the last round found tasks, keeps its rounds. No worker claims a
//! limited kind's task: an insert with one says `new limited` (V63), and the round runs
//! at once. The notifications are read by `asked`, a pure function. The worker makes the
//! claimed tasks' spans of their time in queue and assignment (V53), as the round would
//! have.
//!
//! **Tasks due later.** An insert of tasks whose `run_at` is ahead, and a worker's
//! retries and snoozes, say when the soonest falls due (payload `at:<Unix ms>`,
//! migrations/V57). The Scanner keeps those times ([`DueTimes`]) and, at the soonest,
//! does what it does for tasks just submitted; before V57 they waited for the poll.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use actix::prelude::*;

use crate::assigner::{AssignNow, Assigner};
use crate::blackboard::{
    parse_due_at, parse_given, parse_wait_at, AssignReport, ListenEvent, PlannerBoard,
    NEW_LIMITED_TASKS, NEW_TASKS, TASKS_CHANNEL,
};
use crate::flight::SingleFlight;
use crate::scheduler::WaitDue;
use crate::supervisor::ActorStats;
use crate::waker::Waker;

/// The channel on which the database announces a canceled task held by a worker woken
/// over HTTP (payload `cancel:<worker id>`; migrations/V14).
pub const WAKE_CHANNEL: &str = "artex_wake";

/// How long the round waits after a quiet fleet's worker was woken to claim new tasks:
/// its claim takes about a millisecond; the round then finds what it left.
pub const CLAIM_FIRST: Duration = Duration::from_millis(5);

/// What the last round saw of a quiet fleet: the workers with a free handler slot that
/// take pushes (id, address), when it found no task waiting; none otherwise.
#[derive(Debug, Default)]
pub struct Quiet {
    idle: Vec<(String, String)>,
    /// Wake-ups given since the start, to take the idle workers in turn.
    given: usize,
}

impl Quiet {
    /// A round's report: `claimed` tasks found waiting, `idle` workers.
    pub fn after_round(&mut self, claimed: usize, idle: Vec<(String, String)>) {
        self.idle = if claimed == 0 { idle } else { Vec::new() };
    }

    /// Nothing known (a round failed).
    pub fn forget(&mut self) {
        self.idle.clear();
    }

    /// The worker to wake for tasks just submitted, each in turn; `None` unless the
    /// fleet was quiet at the last round.
    pub fn turn(&mut self) -> Option<(String, String)> {
        if self.idle.is_empty() {
            return None;
        }
        let i = self.given % self.idle.len();
        self.given = self.given.wrapping_add(1);
        Some(self.idle[i].clone())
    }
}

/// What one notification on the planners' channels asks of them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    /// A canceled task's worker, woken over HTTP, is told (`cancel:` on `artex_wake`).
    Cancel(String),
    /// Tasks born assigned to a worker woken over HTTP: its push, passed on (`given:`
    /// on `artex_wake`, migrations/V62).
    Given {
        /// The worker.
        worker: String,
        /// The push's payload (the tasks carried, or empty: a plain wake-up).
        carried: String,
    },
    /// Runnable tasks were inserted: a quiet fleet's worker claims them first (V52).
    New,
    /// Runnable tasks were inserted, one of a limited kind that no worker claims: a
    /// round at once (V63).
    NewLimited,
    /// Pending tasks fall due at this time (V57).
    DueAt(SystemTime),
    /// A flow's wait falls due at this time: the Scheduler's (V61).
    WaitAt(SystemTime),
    /// Anything else: work may wait, a round.
    Round,
}

/// What the notification `payload` on `channel` asks.
fn asked(channel: &str, payload: &str) -> Asked {
    if channel == WAKE_CHANNEL {
        if let Some(worker) = payload.strip_prefix("cancel:") {
            return Asked::Cancel(worker.to_string());
        }
        return match parse_given(payload) {
            Some((worker, carried)) => Asked::Given { worker, carried },
            None => Asked::Round,
        };
    }
    if channel != TASKS_CHANNEL {
        return Asked::Round;
    }
    match payload {
        NEW_TASKS => Asked::New,
        NEW_LIMITED_TASKS => Asked::NewLimited,
        _ => {
            if let Some(at) = parse_due_at(payload) {
                Asked::DueAt(at)
            } else if let Some(at) = parse_wait_at(payload) {
                Asked::WaitAt(at)
            } else {
                Asked::Round
            }
        }
    }
}

/// What a batch of notifications asks of the Scanner together (cancels and given tasks
/// are passed on as they come, wait times to the Scheduler).
#[derive(Debug, Default)]
struct Hints {
    round: bool,
    new: bool,
    new_limited: bool,
    due: Vec<SystemTime>,
}

/// What the Scanner does for a batch.
#[derive(Debug, PartialEq, Eq)]
enum Then {
    /// A round now.
    Round,
    /// A quiet fleet's worker claims first, the round follows ([`Submitted`]).
    ClaimFirst,
}

impl Hints {
    fn add(&mut self, a: Asked) {
        match a {
            Asked::New => self.new = true,
            Asked::NewLimited => self.new_limited = true,
            Asked::DueAt(at) => self.due.push(at),
            // Passed on to their worker as they come: nothing for the Scanner.
            Asked::Cancel(_) | Asked::Given { .. } => {}
            // A wait's time with no Scheduler to keep it: the round finds what is due.
            Asked::WaitAt(_) | Asked::Round => self.round = true,
        }
    }

    /// A limited kind's new tasks take a round now (no worker would claim them); other
    /// new tasks a claim first, which its round follows; any other hint a round.
    fn then(&self) -> Option<Then> {
        if self.new_limited {
            Some(Then::Round)
        } else if self.new {
            Some(Then::ClaimFirst)
        } else if self.round {
            Some(Then::Round)
        } else {
            None
        }
    }
}

/// The most times of tasks due later a planner keeps; past it the latest are let go,
/// and their tasks wait for the poll as before V57.
pub const MAX_DUE: usize = 4096;

/// The times at which pending tasks fall due that this planner was told of, soonest
/// first.
#[derive(Debug, Default)]
pub struct DueTimes {
    at: BTreeSet<SystemTime>,
}

impl DueTimes {
    /// Keeps `at`; true when it is new and now the soonest (the timer is to be set
    /// again).
    pub fn add(&mut self, at: SystemTime) -> bool {
        let new = self.at.insert(at);
        if self.at.len() > MAX_DUE {
            self.at.pop_last();
        }
        new && self.at.first() == Some(&at)
    }

    /// Lets go of the times up to `now`; true if there was any.
    pub fn take_due(&mut self, now: SystemTime) -> bool {
        let mut any = false;
        while self.at.first().is_some_and(|at| *at <= now) {
            self.at.pop_first();
            any = true;
        }
        any
    }

    /// The soonest time kept.
    pub fn soonest(&self) -> Option<SystemTime> {
        self.at.first().copied()
    }
}

/// How long after a due time its round (or the Scheduler's pass) starts: the payload's
/// time is rounded down to the millisecond, and a round that starts before `run_at`
/// finds nothing.
pub(crate) const DUE_MARGIN: Duration = Duration::from_millis(1);

/// The Scanner actor.
pub struct Scanner {
    bb: PlannerBoard,
    assigner: Addr<Assigner>,
    poll: Duration,
    stats: ActorStats,
    /// A round is under way; another is owed after it.
    round: SingleFlight,
    waker: Option<Waker>,
    /// Whom new tasks wake while the fleet is quiet.
    quiet: Quiet,
    /// A round is set to follow a quiet fleet's claim.
    round_due: bool,
    /// When tasks due later fall due, and the timer set for the soonest.
    due: DueTimes,
    due_timer: Option<SpawnHandle>,
    /// Whom flows' waits just reached are announced to (migrations/V61).
    scheduler: Option<Recipient<WaitDue>>,
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
            quiet: Quiet::default(),
            round_due: false,
            due: DueTimes::default(),
            due_timer: None,
            scheduler: None,
        }
    }

    /// Hands the due times of flows' waits just reached to `scheduler`, which ends them.
    pub fn with_scheduler(mut self, scheduler: Recipient<WaitDue>) -> Self {
        self.scheduler = Some(scheduler);
        self
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
                    Ok(Ok(mut report)) => {
                        act.stats.ran("scanner");
                        act.quiet
                            .after_round(report.claimed, std::mem::take(&mut report.idle));
                        again |= report.more_may_fit();
                        if report.assigned > 0 {
                            tracing::debug!(assigned = report.assigned, "assigned tasks");
                        }
                    }
                    Ok(Err(e)) => {
                        act.stats.failed("scanner");
                        act.quiet.forget();
                        tracing::warn!(error = %e, "assignment round failed; retrying on the next poll");
                    }
                    Err(e) => {
                        act.stats.failed("scanner");
                        act.quiet.forget();
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
        self.arm_due(ctx);
        // The LISTEN session: reconnects forever; after each (re)connect, a round catches
        // whatever was notified while it was away.
        let mut session = self
            .bb
            .listen_session("planner", &[TASKS_CHANNEL, WAKE_CHANNEL]);
        let me = ctx.address();
        let waker = self.waker.clone();
        let scheduler = self.scheduler.clone();
        async move {
            loop {
                match session.next().await {
                    ListenEvent::Connected => {
                        // What was announced while it was away: tasks waiting (the
                        // round), tasks born assigned to workers it pushes to (V62).
                        if let Some(waker) = &waker {
                            waker.wake_linked();
                        }
                        me.do_send(Wake)
                    }
                    ListenEvent::Notified(batch) => {
                        let mut hints = Hints::default();
                        for n in batch {
                            match asked(&n.channel, &n.payload) {
                                Asked::Cancel(worker) => {
                                    if let Some(waker) = &waker {
                                        waker.cancel(&worker).await;
                                    }
                                }
                                Asked::Given { worker, carried } => {
                                    if let Some(waker) = &waker {
                                        waker.given(&worker, &carried).await;
                                    }
                                }
                                Asked::WaitAt(at) => match &scheduler {
                                    Some(s) => s.do_send(WaitDue(at)),
                                    None => hints.add(Asked::Round),
                                },
                                other => hints.add(other),
                            }
                        }
                        if !hints.due.is_empty() {
                            me.do_send(Due(std::mem::take(&mut hints.due)));
                        }
                        match hints.then() {
                            Some(Then::Round) => me.do_send(Wake),
                            Some(Then::ClaimFirst) => me.do_send(Submitted),
                            None => {}
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
        self.round_due = false;
        self.due_timer = None;
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

/// Tasks were submitted: a worker of a quiet fleet claims them, the round follows; else
/// a round now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submitted;

impl Handler<Submitted> for Scanner {
    type Result = ();
    fn handle(&mut self, _msg: Submitted, ctx: &mut Context<Self>) {
        self.submitted(ctx);
    }
}

/// Tasks due later fall due at these times (migrations/V57).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Due(pub Vec<SystemTime>);

impl Handler<Due> for Scanner {
    type Result = ();
    fn handle(&mut self, msg: Due, ctx: &mut Context<Self>) {
        let mut sooner = false;
        for at in msg.0 {
            sooner |= self.due.add(at);
        }
        if sooner {
            self.arm_due(ctx);
        }
    }
}

impl Scanner {
    /// Sets the timer for the soonest due time kept, in place of the one set before:
    /// then the tasks due are treated as just submitted.
    fn arm_due(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.due_timer.take() {
            ctx.cancel_future(handle);
        }
        let Some(at) = self.due.soonest() else {
            return;
        };
        let wait = at.duration_since(SystemTime::now()).unwrap_or_default() + DUE_MARGIN;
        self.due_timer = Some(ctx.run_later(wait, |act, ctx| {
            act.due_timer = None;
            if act.due.take_due(SystemTime::now()) {
                act.submitted(ctx);
            }
            act.arm_due(ctx);
        }));
    }

    /// Tasks became runnable: a worker of a quiet fleet claims them, the round follows;
    /// else a round now.
    fn submitted(&mut self, ctx: &mut Context<Self>) {
        let (Some(waker), Some((worker, addr))) = (&self.waker, self.quiet.turn()) else {
            self.start_round(ctx);
            return;
        };
        waker.nudge(&worker, &addr);
        if !self.round_due {
            self.round_due = true;
            ctx.run_later(CLAIM_FIRST, |act, ctx| {
                act.round_due = false;
                act.start_round(ctx);
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_notification_asks_for_what_its_payload_says() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        let cases = [
            (WAKE_CHANNEL, "cancel:w1", Asked::Cancel("w1".into())),
            (
                WAKE_CHANNEL,
                r#"given:["w:1","{}"]"#,
                Asked::Given {
                    worker: "w:1".into(),
                    carried: "{}".into(),
                },
            ),
            (WAKE_CHANNEL, "", Asked::Round),
            (WAKE_CHANNEL, "given:[", Asked::Round),
            // Only artex_tasks says new tasks or times.
            (WAKE_CHANNEL, NEW_TASKS, Asked::Round),
            (TASKS_CHANNEL, "new", Asked::New),
            (TASKS_CHANNEL, "new limited", Asked::NewLimited),
            (TASKS_CHANNEL, "at:1765000000123", Asked::DueAt(at)),
            (TASKS_CHANNEL, "wait-at:1765000000123", Asked::WaitAt(at)),
            (TASKS_CHANNEL, "", Asked::Round),
            (TASKS_CHANNEL, "cancel:w1", Asked::Round),
            (TASKS_CHANNEL, "new  limited", Asked::Round),
            ("artex_other", "new", Asked::Round),
        ];
        for (channel, payload, want) in cases {
            assert_eq!(asked(channel, payload), want, "{channel} {payload:?}");
        }
    }

    #[test]
    fn a_limited_kind_s_new_tasks_take_a_round_now_and_others_a_claim_first() {
        let then = |asks: Vec<Asked>| {
            let mut h = Hints::default();
            asks.into_iter().for_each(|a| h.add(a));
            h.then()
        };
        assert_eq!(then(vec![]), None);
        assert_eq!(then(vec![Asked::New]), Some(Then::ClaimFirst));
        assert_eq!(then(vec![Asked::Round, Asked::New]), Some(Then::ClaimFirst));
        assert_eq!(then(vec![Asked::New, Asked::NewLimited]), Some(Then::Round));
        assert_eq!(then(vec![Asked::Round]), Some(Then::Round));
        let at = SystemTime::UNIX_EPOCH;
        // Times alone are the Due handler's: no round now.
        assert_eq!(then(vec![Asked::DueAt(at)]), None);
    }

    fn workers(ids: &[&str]) -> Vec<(String, String)> {
        ids.iter()
            .map(|id| (id.to_string(), format!("{id}:80")))
            .collect()
    }

    #[test]
    fn due_times_are_kept_soonest_first_and_let_go_once_due() {
        let t = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut due = DueTimes::default();
        assert!(due.add(t(20)), "the first is the soonest");
        assert!(!due.add(t(30)), "a later one leaves the timer as it is");
        assert!(due.add(t(10)), "a sooner one sets it again");
        assert!(!due.add(t(10)), "a time told twice is kept once");
        assert_eq!(due.soonest(), Some(t(10)));
        assert!(!due.take_due(t(9)), "nothing is due yet");
        assert!(due.take_due(t(20)));
        assert_eq!(due.soonest(), Some(t(30)));
        assert!(due.take_due(t(99)));
        assert_eq!(due.soonest(), None);
    }

    #[test]
    fn past_the_most_kept_the_latest_times_are_let_go() {
        let t = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut due = DueTimes::default();
        for ms in 0..MAX_DUE as u64 + 10 {
            due.add(t(1_000 + ms));
        }
        assert!(!due.add(t(1_000_000)), "the latest is let go at once");
        assert!(due.take_due(t(1_000 + MAX_DUE as u64 - 1)));
        assert_eq!(due.soonest(), None, "the ten latest were let go");
    }

    #[test]
    fn a_quiet_fleet_wakes_its_idle_workers_in_turn() {
        let mut quiet = Quiet::default();
        assert_eq!(quiet.turn(), None, "nothing known before a round");
        quiet.after_round(0, workers(&["a", "b"]));
        let woken: Vec<String> = (0..3).map(|_| quiet.turn().unwrap().0).collect();
        assert_eq!(woken, ["a", "b", "a"]);
    }

    #[test]
    fn a_round_that_found_tasks_or_failed_leaves_nobody_to_wake() {
        let mut quiet = Quiet::default();
        quiet.after_round(3, workers(&["a"]));
        assert_eq!(quiet.turn(), None, "tasks waited: the rounds keep them");
        quiet.after_round(0, Vec::new());
        assert_eq!(quiet.turn(), None, "no worker had a free slot");
        quiet.after_round(0, workers(&["a"]));
        quiet.forget();
        assert_eq!(quiet.turn(), None);
    }
}

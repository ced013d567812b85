//! The status machine against a model of it (issue 25): random sequences of writes to one
//! real task row — plain SQL updates of any column the trigger looks at, and the
//! runtime's own statements (a planner's assignment; a worker's starts, outcomes,
//! renewals, checkpoints, releases and handovers; an operator's controls). After every
//! step the database has accepted exactly the writes the model calls legal, and the row,
//! the history rows the triggers wrote and the workers' held counters equal the model's.
//!
//! The model is written from the rules (SPEC §1, migrations V1, V3, V10, V11, V12), not
//! from the trigger's code: where they differ, the test fails and says on which step.
//! Cases and seed: `testkit/src/props.rs`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use artex_actors::blackboard::{AttemptRecord, Control, Outcome, Step};
use artex_actors::Error;
use artex_testkit::props;
use chrono::{DateTime, Duration as Span, Utc};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{fixtures, TestDb};

type Ts = DateTime<Utc>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending,
    Assigned,
    Running,
    Succeeded,
    Failed,
    Timeout,
    Paused,
    Blocked,
    Canceled,
}

const STATUSES: [St; 9] = [
    St::Pending,
    St::Assigned,
    St::Running,
    St::Succeeded,
    St::Failed,
    St::Timeout,
    St::Paused,
    St::Blocked,
    St::Canceled,
];

impl St {
    fn name(self) -> &'static str {
        match self {
            St::Pending => "pending",
            St::Assigned => "assigned",
            St::Running => "running",
            St::Succeeded => "succeeded",
            St::Failed => "failed",
            St::Timeout => "timeout",
            St::Paused => "paused",
            St::Blocked => "blocked",
            St::Canceled => "canceled",
        }
    }

    fn parse(s: &str) -> St {
        *STATUSES
            .iter()
            .find(|x| x.name() == s)
            .unwrap_or_else(|| panic!("unknown status {s}"))
    }

    fn held(self) -> bool {
        matches!(self, St::Assigned | St::Running)
    }

    fn terminal(self) -> bool {
        matches!(
            self,
            St::Succeeded | St::Failed | St::Timeout | St::Canceled
        )
    }
}

/// The legal moves between different statuses (SPEC §1; V11 adds `pending → failed`).
fn legal(from: St, to: St) -> bool {
    use St::*;
    match from {
        Pending => matches!(to, Assigned | Paused | Canceled | Failed),
        Assigned => matches!(to, Running | Pending | Canceled | Failed | Timeout),
        Running => matches!(to, Succeeded | Failed | Timeout | Pending | Canceled),
        Paused => matches!(to, Pending | Blocked | Canceled),
        Blocked => matches!(to, Pending | Paused | Canceled),
        Succeeded | Failed | Timeout | Canceled => false,
    }
}

/// The columns of a task row that the status machine reads or writes.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    status: St,
    assigned_to: Option<String>,
    lease_until: Option<Ts>,
    lease_epoch: i64,
    retries: i32,
    max_retries: i32,
    error: Option<String>,
    result: Option<Value>,
    checkpoint: Option<Value>,
    run_at: Ts,
    started_at: Option<Ts>,
    finished_at: Option<Ts>,
    updated_at: Ts,
}

/// One history row (`artex.task_transitions`).
#[derive(Clone, Debug, PartialEq)]
struct Hist {
    from: Option<St>,
    to: St,
    reason: Option<String>,
    actor: String,
    worker: Option<String>,
    lease_epoch: i64,
    at: Ts,
    assigned_at: Option<Ts>,
}

/// Workers the operations name: two registered, one never registered (a holder the
/// workers table does not know, as plain SQL may write).
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
const REGISTERED: [&str; 2] = ["w1", "w2"];

/// Which fencing token a worker's write names, relative to the task's.
#[derive(Clone, Copy, Debug)]
enum Epoch {
    Held,
    Stale,
    Ahead,
}

impl Epoch {
    fn of(self, current: i64) -> i64 {
        match self {
            Epoch::Held => current,
            Epoch::Stale => current - 1,
            Epoch::Ahead => current + 1,
        }
    }
}

/// A plain SQL update of the task: each `Some` sets that column.
#[derive(Clone, Debug)]
struct Raw {
    status: Option<St>,
    holder: Option<Option<&'static str>>,
    /// `lease_until = now() + secs` (NULL for `None`).
    lease_secs: Option<Option<i64>>,
    /// `lease_epoch = lease_epoch + d`.
    epoch_delta: Option<i64>,
    /// `retries = retries + d`.
    retries_delta: Option<i32>,
    max_retries: Option<i32>,
    error: Option<Option<&'static str>>,
    /// `started_at = now() - ms` (a negative `ms` is in the future; NULL for `None`).
    started_ago_ms: Option<Option<i64>>,
    /// `artex.set_context(actor, reason)` in the same statement.
    context: Option<(&'static str, Option<&'static str>)>,
}

#[derive(Clone, Copy, Debug)]
enum StepKind {
    Start,
    Succeeded,
    Failed { retry_in_ms: i64 },
    TimedOut { retry_in_ms: i64 },
    Released,
    Discarded,
    Snoozed { delay_ms: i64 },
}

#[derive(Clone, Copy, Debug)]
enum Ctl {
    Pause,
    Resume,
    Cancel,
}

#[derive(Clone, Debug)]
enum Op {
    Raw(Raw),
    /// The planner's assignment: a pending task to `worker` (its round's write, reduced
    /// to one task).
    Assign {
        worker: &'static str,
        secs: i64,
    },
    /// A worker's start or outcome (`WorkerBoard::record`).
    Record {
        worker: &'static str,
        epoch: Epoch,
        step: StepKind,
        started_ago_ms: Option<i64>,
    },
    Renew {
        worker: &'static str,
        epoch: Epoch,
        secs: i64,
    },
    Checkpoint {
        epoch: Epoch,
        n: u8,
    },
    /// A draining worker gives back what it has not started; `spare`: the task is one it
    /// runs (its start perhaps unwritten), which it keeps.
    Release {
        worker: &'static str,
        spare: bool,
    },
    /// A hot upgrade's new process takes over a held task.
    TakeOver {
        from: &'static str,
        to: &'static str,
        epoch: Epoch,
        secs: i64,
    },
    /// A hot upgrade moves the old process's unstarted tasks over.
    MoveAssigned {
        from: &'static str,
        to: &'static str,
        spare: bool,
        secs: i64,
    },
    Control {
        control: Ctl,
        reason: Option<&'static str>,
    },
}

/// Who a statement says wrote it (`artex.set_context`), if anyone.
#[derive(Clone, Debug, Default)]
struct Ctx {
    actor: Option<String>,
    reason: Option<String>,
}

/// What the database must make of a write (whether the triggers refuse a matched one is
/// [`Model::apply`]'s to say).
#[derive(Debug)]
enum Expect {
    /// The statement matched no row: nothing changes.
    Unmatched,
    /// The row changed (its `updated_at` is the statement's `now()`, which the caller
    /// reads from the database and hands to `change`).
    Changed(Change),
}

/// A matched write before the triggers: the `new` row the statement makes at a given
/// `now()`, and who wrote it.
struct Change {
    new: Box<dyn Fn(Ts) -> Row>,
    ctx: Ctx,
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Change").field("ctx", &self.ctx).finish()
    }
}

/// The model's task: its row, its history and the held counters of every worker.
#[derive(Clone, Debug)]
struct Model {
    row: Row,
    history: Vec<Hist>,
    /// `workers.taken` (registered workers only).
    taken: BTreeMap<String, i64>,
    /// `worker_released.released` (any holder's name).
    released: BTreeMap<String, i64>,
    /// The database role: the actor of plain SQL writes that name none.
    user: String,
}

/// A refusal: the violated rules, any of which the database may name.
type Refusal = Vec<&'static str>;

impl Model {
    /// The `new` row the before-update trigger returns for `n` (what the statement wrote)
    /// at `now`, or why it refuses; then the table's check constraints.
    fn trigger(&self, mut n: Row, now: Ts) -> Result<Row, Refusal> {
        let old = &self.row;
        n.updated_at = now;
        if n.lease_epoch < old.lease_epoch {
            return Err(vec!["fencing token of task"]);
        }
        if n.status == old.status {
            // Not a transition: a renewal, a checkpoint, or a handover, which fences the
            // previous holder off.
            if n.assigned_to != old.assigned_to && n.lease_epoch == old.lease_epoch {
                n.lease_epoch = old.lease_epoch + 1;
            }
        } else {
            // A write from `assigned` straight to an outcome that says when the handler
            // started is that start and that outcome (V3); a start time it does not say
            // (NULL) says nothing.
            let ran = old.status == St::Assigned
                && !matches!(n.status, St::Assigned | St::Running | St::Canceled)
                && n.started_at.is_some()
                && n.started_at != old.started_at;
            let was = if ran { St::Running } else { old.status };
            if !(legal(old.status, n.status) || (ran && legal(was, n.status))) {
                return Err(vec!["illegal task transition"]);
            }
            if ran && n.started_at.is_some_and(|t| t > now) {
                return Err(vec!["cannot have started in the future"]);
            }
            // A retry past the budget ends the task for good.
            if n.status == St::Pending && was.held() && n.retries > n.max_retries {
                n.status = if was == St::Assigned || n.error.is_none() {
                    St::Timeout
                } else {
                    St::Failed
                };
            }
            match n.status {
                St::Assigned => {
                    if n.assigned_to.is_none() || n.lease_until.is_none() {
                        return Err(vec!["needs assigned_to and lease_until"]);
                    }
                    n.lease_epoch = old.lease_epoch + 1;
                }
                St::Running => {
                    if n.assigned_to != old.assigned_to {
                        return Err(vec!["is assigned to"]);
                    }
                    if n.started_at == old.started_at || n.started_at.is_some_and(|t| t > now) {
                        n.started_at = Some(now);
                    }
                }
                _ => {
                    n.assigned_to = None;
                    n.lease_until = None;
                }
            }
            if n.status.terminal() {
                n.finished_at = Some(now);
            }
        }
        let mut broken = Vec::new();
        if n.status.held() != n.assigned_to.is_some() {
            broken.push("holder_only_while_held");
        }
        if n.status.held() != n.lease_until.is_some() {
            broken.push("lease_only_while_held");
        }
        if n.retries > n.max_retries + 1 {
            broken.push("retries_within_budget");
        }
        if n.retries < 0 {
            broken.push("tasks_retries_check");
        }
        if n.max_retries < 0 {
            broken.push("tasks_max_retries_check");
        }
        if n.assigned_to.as_deref() == Some("") {
            broken.push("tasks_assigned_to_check");
        }
        if n.error.as_deref() == Some("") {
            broken.push("tasks_error_check");
        }
        if broken.is_empty() {
            Ok(n)
        } else {
            Err(broken)
        }
    }

    /// The history rows the after-update trigger writes for `old → n` (V10): none for an
    /// assignment or a write that moves nothing; the assignment's own row when it ends
    /// unstarted; the start and the outcome of a task that ran in one write.
    fn history_rows(&self, n: &Row, now: Ts, ctx: &Ctx) -> Vec<Hist> {
        let old = &self.row;
        let moved = n.status != old.status && n.status != St::Assigned;
        let handed =
            n.status == old.status && n.assigned_to != old.assigned_to && n.assigned_to.is_some();
        if !moved && !handed {
            return Vec::new();
        }
        let ran = old.status == St::Assigned
            && !matches!(n.status, St::Assigned | St::Running | St::Canceled)
            && n.started_at.is_some()
            && n.started_at != old.started_at;
        let actor = ctx.actor.clone().unwrap_or_else(|| self.user.clone());
        let worker = n.assigned_to.clone().or_else(|| old.assigned_to.clone());
        let or_error = |to: St, from_running: bool| {
            ctx.reason.clone().or_else(|| {
                (matches!(to, St::Failed | St::Pending) && from_running)
                    .then(|| n.error.clone())
                    .flatten()
            })
        };
        let mut rows = Vec::new();
        if old.status == St::Assigned && n.status != St::Running && !ran {
            rows.push(Hist {
                from: Some(St::Pending),
                to: St::Assigned,
                reason: Some("assigned".into()),
                actor: actor.clone(),
                worker: old.assigned_to.clone(),
                lease_epoch: old.lease_epoch,
                at: old.updated_at,
                assigned_at: None,
            });
        }
        let reason = if old.status == n.status {
            ctx.reason.clone().or(Some("handed over".into()))
        } else if ran {
            Some("started".into())
        } else if old.status == St::Assigned && n.status == St::Running {
            ctx.reason.clone().or(Some("started".into()))
        } else {
            or_error(n.status, old.status == St::Running)
        };
        rows.push(Hist {
            from: Some(old.status),
            to: if ran { St::Running } else { n.status },
            reason,
            actor: actor.clone(),
            worker: worker.clone(),
            lease_epoch: n.lease_epoch,
            at: if ran {
                n.started_at.expect("a task that ran says when it started")
            } else {
                now
            },
            assigned_at: (old.status == St::Assigned && (ran || n.status == St::Running))
                .then_some(old.updated_at),
        });
        if ran {
            rows.push(Hist {
                from: Some(St::Running),
                to: n.status,
                reason: or_error(n.status, true),
                actor,
                worker,
                lease_epoch: n.lease_epoch,
                at: now,
                assigned_at: None,
            });
        }
        rows
    }

    /// Applies a matched write at `now`: the row, its history and the held counters
    /// (V12: gains to `workers.taken` of a registered worker, losses to
    /// `worker_released`).
    fn apply(&mut self, change: &Change, now: Ts) -> Result<(), Refusal> {
        let n = self.trigger((change.new)(now), now)?;
        let rows = self.history_rows(&n, now, &change.ctx);
        let old = &self.row;
        let mut delta: BTreeMap<String, i64> = BTreeMap::new();
        if old.status.held() && (!n.status.held() || n.assigned_to != old.assigned_to) {
            *delta.entry(old.assigned_to.clone().unwrap()).or_default() -= 1;
        }
        if n.status.held() && (!old.status.held() || n.assigned_to != old.assigned_to) {
            *delta.entry(n.assigned_to.clone().unwrap()).or_default() += 1;
        }
        for (w, d) in delta {
            if d > 0 {
                if let Some(t) = self.taken.get_mut(&w) {
                    *t += d;
                }
            } else if d < 0 {
                *self.released.entry(w).or_default() -= d;
            }
        }
        self.history.extend(rows);
        self.row = n;
        Ok(())
    }

    /// What the database must make of `op` on the current row.
    fn expect(&self, op: &Op) -> Expect {
        let old = self.row.clone();
        let held_by = |w: &str| old.status.held() && old.assigned_to.as_deref() == Some(w);
        let changed = |ctx: Ctx, f: Box<dyn Fn(Ts) -> Row>| Expect::Changed(Change { new: f, ctx });
        let ctx = |actor: &str, reason: Option<&str>| Ctx {
            actor: Some(actor.to_string()),
            reason: reason.map(str::to_string),
        };
        match op {
            Op::Raw(r) => {
                let r = r.clone();
                let c = match r.context {
                    Some((a, reason)) => ctx(a, reason),
                    None => Ctx::default(),
                };
                changed(
                    c,
                    Box::new(move |now| {
                        let mut n = old.clone();
                        if let Some(s) = r.status {
                            n.status = s;
                        }
                        if let Some(h) = r.holder {
                            n.assigned_to = h.map(str::to_string);
                        }
                        if let Some(l) = r.lease_secs {
                            n.lease_until = l.map(|s| now + Span::seconds(s));
                        }
                        if let Some(d) = r.epoch_delta {
                            n.lease_epoch = old.lease_epoch + d;
                        }
                        if let Some(d) = r.retries_delta {
                            n.retries = old.retries + d;
                        }
                        if let Some(m) = r.max_retries {
                            n.max_retries = m;
                        }
                        if let Some(e) = r.error {
                            n.error = e.map(str::to_string);
                        }
                        if let Some(s) = r.started_ago_ms {
                            n.started_at = s.map(|ms| now - Span::milliseconds(ms));
                        }
                        n
                    }),
                )
            }
            Op::Assign { worker, secs } => {
                if old.status != St::Pending {
                    return Expect::Unmatched;
                }
                let (w, secs) = (worker.to_string(), *secs);
                changed(
                    ctx("planner", Some("assigned")),
                    Box::new(move |now| Row {
                        status: St::Assigned,
                        assigned_to: Some(w.clone()),
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::Record {
                worker,
                epoch,
                step,
                started_ago_ms,
            } => {
                let exhausted = old.retries + 1 > old.max_retries;
                let (status, result, error, failed, delay_ms) = match *step {
                    StepKind::Start => (St::Running, None, None, false, 0),
                    StepKind::Succeeded => (St::Succeeded, Some(json!({"ok": 1})), None, false, 0),
                    StepKind::Failed { retry_in_ms } => (
                        if exhausted { St::Failed } else { St::Pending },
                        None,
                        Some("boom"),
                        true,
                        retry_in_ms,
                    ),
                    StepKind::TimedOut { retry_in_ms } => (
                        if exhausted { St::Timeout } else { St::Pending },
                        None,
                        Some("ran past 5s"),
                        true,
                        retry_in_ms,
                    ),
                    StepKind::Released => (St::Pending, None, None, false, 0),
                    StepKind::Discarded => {
                        (St::Failed, None, Some("discarded: bad input"), true, 0)
                    }
                    StepKind::Snoozed { delay_ms } => (
                        St::Pending,
                        None,
                        Some("snoozed for a while"),
                        false,
                        delay_ms,
                    ),
                };
                let matched = old.lease_epoch == epoch.of(old.lease_epoch)
                    && old.assigned_to.as_deref() == Some(*worker)
                    && (old.status == St::Running
                        || (old.status == St::Assigned
                            && (started_ago_ms.is_some() || status == St::Pending)));
                if !matched {
                    return Expect::Unmatched;
                }
                let ago = *started_ago_ms;
                changed(
                    ctx(worker, None),
                    Box::new(move |now| Row {
                        status,
                        result: result.clone(),
                        error: error.map(str::to_string).or_else(|| old.error.clone()),
                        retries: old.retries + i32::from(failed),
                        run_at: if status == St::Pending {
                            now + Span::milliseconds(delay_ms)
                        } else {
                            old.run_at
                        },
                        started_at: match ago {
                            Some(ms) if old.status == St::Assigned => {
                                Some(now - Span::milliseconds(ms))
                            }
                            _ => old.started_at,
                        },
                        ..old.clone()
                    }),
                )
            }
            Op::Renew {
                worker,
                epoch,
                secs,
            } => {
                if !(held_by(worker) && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let secs = *secs;
                changed(
                    Ctx::default(),
                    Box::new(move |now| Row {
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::Checkpoint { epoch, n } => {
                if !(old.status.held() && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let n = *n;
                changed(
                    Ctx {
                        actor: old.assigned_to.clone(),
                        reason: Some("started".into()),
                    },
                    Box::new(move |_| Row {
                        checkpoint: Some(json!({ "done": n })),
                        status: St::Running,
                        ..old.clone()
                    }),
                )
            }
            Op::Release { worker, spare } => {
                if *spare
                    || old.status != St::Assigned
                    || old.assigned_to.as_deref() != Some(*worker)
                {
                    return Expect::Unmatched;
                }
                changed(
                    ctx(worker, Some("draining")),
                    Box::new(move |_| Row {
                        status: St::Pending,
                        ..old.clone()
                    }),
                )
            }
            Op::TakeOver {
                from,
                to,
                epoch,
                secs,
            } => {
                if !(held_by(from) && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let (to_w, secs) = (to.to_string(), *secs);
                changed(
                    ctx(to, Some(&format!("handed over by {from}"))),
                    Box::new(move |now| Row {
                        assigned_to: Some(to_w.clone()),
                        lease_epoch: old.lease_epoch + 1,
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::MoveAssigned {
                from,
                to,
                spare,
                secs,
            } => {
                if *spare || old.status != St::Assigned || old.assigned_to.as_deref() != Some(*from)
                {
                    return Expect::Unmatched;
                }
                let (to_w, secs) = (to.to_string(), *secs);
                changed(
                    ctx(from, Some(&format!("handed over to {to}"))),
                    Box::new(move |now| Row {
                        assigned_to: Some(to_w.clone()),
                        lease_epoch: old.lease_epoch + 1,
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::Control { control, reason } => {
                let (to, applies, done) = match control {
                    Ctl::Pause => (
                        St::Paused,
                        matches!(old.status, St::Pending | St::Blocked),
                        "paused",
                    ),
                    // No flow, so nothing upstream to wait on: back to pending.
                    Ctl::Resume => (St::Pending, old.status == St::Paused, "resumed"),
                    Ctl::Cancel => (St::Canceled, !old.status.terminal(), "canceled"),
                };
                if !applies {
                    return Expect::Unmatched;
                }
                let reason = reason
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{done} by operator"));
                changed(
                    ctx("op", Some(&reason)),
                    Box::new(move |_| Row {
                        status: to,
                        ..old.clone()
                    }),
                )
            }
        }
    }
}

// ---- the database side ----

/// What the database made of a write.
#[derive(Debug)]
enum Seen {
    Refused(String),
    Unmatched,
    Matched,
}

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn opt_lit(s: Option<&str>) -> String {
    s.map(lit).unwrap_or_else(|| "null".into())
}

/// The plain SQL text of a raw write.
fn raw_sql(r: &Raw) -> String {
    let mut set = Vec::new();
    if let Some(s) = r.status {
        set.push(format!("status = '{}'", s.name()));
    }
    if let Some(h) = r.holder {
        set.push(format!("assigned_to = {}", opt_lit(h)));
    }
    if let Some(l) = r.lease_secs {
        set.push(match l {
            Some(s) => format!("lease_until = now() + interval '{s} seconds'"),
            None => "lease_until = null".into(),
        });
    }
    if let Some(d) = r.epoch_delta {
        set.push(format!("lease_epoch = t.lease_epoch + ({d})"));
    }
    if let Some(d) = r.retries_delta {
        set.push(format!("retries = t.retries + ({d})"));
    }
    if let Some(m) = r.max_retries {
        set.push(format!("max_retries = {m}"));
    }
    if let Some(e) = r.error {
        set.push(format!("error = {}", opt_lit(e)));
    }
    if let Some(s) = r.started_ago_ms {
        set.push(match s {
            Some(ms) => format!("started_at = now() - ({ms} * interval '1 millisecond')"),
            None => "started_at = null".into(),
        });
    }
    if set.is_empty() {
        set.push("status = t.status".into());
    }
    match r.context {
        Some((actor, reason)) => format!(
            "update artex.tasks t set {} from artex.set_context({}, {}) ctx \
             where ctx and t.id = $1",
            set.join(", "),
            lit(actor),
            opt_lit(reason)
        ),
        None => format!(
            "update artex.tasks t set {} where t.id = $1",
            set.join(", ")
        ),
    }
}

/// The planner round's write for one task (`artex.assign_round`, reduced): a pending task
/// to a worker, with a lease.
const ASSIGN: &str = "update artex.tasks t set status = 'assigned', assigned_to = $2,
        lease_until = now() + make_interval(secs => $3::float8)
    from artex.set_context('planner', 'assigned') ctx
    where ctx and t.id = $1 and t.status::text = 'pending'";

fn db_message(e: &Error) -> String {
    match e {
        Error::Db(d) => d
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| d.to_string()),
        other => other.to_string(),
    }
}

fn pg_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

async fn run_op(db: &TestDb, c: &Client, id: Uuid, m: &Model, op: &Op) -> Seen {
    let one = |n: usize| {
        if n == 0 {
            Seen::Unmatched
        } else {
            Seen::Matched
        }
    };
    let w = db.bb.worker();
    match op {
        Op::Raw(r) => match c.execute(&raw_sql(r), &[&id]).await {
            Ok(n) => one(n as usize),
            Err(e) => Seen::Refused(pg_message(&e)),
        },
        Op::Assign { worker, secs } => {
            match c.execute(ASSIGN, &[&id, worker, &(*secs as f64)]).await {
                Ok(n) => one(n as usize),
                Err(e) => Seen::Refused(pg_message(&e)),
            }
        }
        Op::Record {
            worker,
            epoch,
            step,
            started_ago_ms,
        } => {
            let step = match *step {
                StepKind::Start => Step::Start,
                StepKind::Succeeded => Step::Finish(Outcome::Succeeded(json!({"ok": 1}))),
                StepKind::Failed { retry_in_ms } => Step::Finish(Outcome::Failed {
                    error: "boom".into(),
                    retry_in_ms,
                }),
                StepKind::TimedOut { retry_in_ms } => Step::Finish(Outcome::TimedOut {
                    error: "ran past 5s".into(),
                    retry_in_ms,
                }),
                StepKind::Released => Step::Finish(Outcome::Released),
                StepKind::Discarded => Step::Finish(Outcome::Discarded {
                    error: "discarded: bad input".into(),
                }),
                StepKind::Snoozed { delay_ms } => Step::Finish(Outcome::Snoozed {
                    note: "snoozed for a while".into(),
                    delay_ms,
                }),
            };
            // The retry budget as the worker read it when the task started.
            let record = AttemptRecord {
                id,
                epoch: epoch.of(m.row.lease_epoch),
                retries: m.row.retries,
                max_retries: m.row.max_retries,
                step,
                started_ago_ms: started_ago_ms.map(|ms| ms as f64),
            };
            match w.record(worker, &[record]).await {
                Ok(ids) => one(ids.len()),
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::Renew {
            worker,
            epoch,
            secs,
        } => {
            let held = [(id, epoch.of(m.row.lease_epoch))];
            match w.renew_leases(worker, &held, *secs as f64).await {
                Ok(r) => {
                    assert!(r.iter().all(|(_, renewed)| *renewed), "{r:?}");
                    one(r.len())
                }
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::Checkpoint { epoch, n } => {
            match w
                .save_checkpoint(id, epoch.of(m.row.lease_epoch), &json!({ "done": n }))
                .await
            {
                Ok(saved) => one(usize::from(saved)),
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::Release { worker, spare } => {
            let running = if *spare { vec![id] } else { Vec::new() };
            match w.release_assigned(worker, "draining", &running).await {
                Ok(ids) => one(ids.len()),
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::TakeOver {
            from,
            to,
            epoch,
            secs,
        } => {
            let tasks = [(id, epoch.of(m.row.lease_epoch))];
            match w.take_over(from, to, &tasks, *secs as f64).await {
                Ok(taken) => one(taken.len()),
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::MoveAssigned {
            from,
            to,
            spare,
            secs,
        } => {
            let running = if *spare { vec![id] } else { Vec::new() };
            match w.move_assigned(from, to, *secs as f64, &running).await {
                Ok(n) => one(n as usize),
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
        Op::Control { control, reason } => {
            let control = match control {
                Ctl::Pause => Control::Pause,
                Ctl::Resume => Control::Resume,
                Ctl::Cancel => Control::Cancel,
            };
            match db.bb.operator().control(control, id, "op", *reason).await {
                Ok(report) => one(report.changed.len()),
                // A control that applies to nothing is refused, writing nothing.
                Err(Error::Refused(_)) => Seen::Unmatched,
                Err(e) => Seen::Refused(db_message(&e)),
            }
        }
    }
}

const ROW: &str = "select status::text, assigned_to, lease_until, lease_epoch, retries,
        max_retries, error, result, checkpoint, run_at, started_at, finished_at, updated_at
    from artex.tasks where id = $1";

const HISTORY: &str = "select from_status::text, to_status::text, reason, actor, worker,
        lease_epoch, at, assigned_at
    from artex.task_transitions where task_id = $1 order by id";

const COUNTERS: &str = "select n, (select taken from artex.workers where id = n),
        (select released from artex.worker_released where worker = n)
    from unnest($1::text[]) as n order by n";

async fn read_row(c: &Client, id: Uuid) -> Row {
    let r = c.query_one(ROW, &[&id]).await.expect("reading the task");
    Row {
        status: St::parse(r.get(0)),
        assigned_to: r.get(1),
        lease_until: r.get(2),
        lease_epoch: r.get(3),
        retries: r.get(4),
        max_retries: r.get(5),
        error: r.get(6),
        result: r.get(7),
        checkpoint: r.get(8),
        run_at: r.get(9),
        started_at: r.get(10),
        finished_at: r.get(11),
        updated_at: r.get(12),
    }
}

async fn read_history(c: &Client, id: Uuid) -> Vec<Hist> {
    c.query(HISTORY, &[&id])
        .await
        .expect("reading the history")
        .iter()
        .map(|r| Hist {
            from: r.get::<_, Option<&str>>(0).map(St::parse),
            to: St::parse(r.get(1)),
            reason: r.get(2),
            actor: r.get(3),
            worker: r.get(4),
            lease_epoch: r.get(5),
            at: r.get(6),
            assigned_at: r.get(7),
        })
        .collect()
}

/// (taken of registered workers, released of any) for the workers the operations name.
async fn read_counters(c: &Client) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let names: Vec<&str> = WORKERS.to_vec();
    let mut taken = BTreeMap::new();
    let mut released = BTreeMap::new();
    for r in c
        .query(COUNTERS, &[&names])
        .await
        .expect("reading counters")
    {
        let n: String = r.get(0);
        if let Some(t) = r.get::<_, Option<i64>>(1) {
            taken.insert(n.clone(), t);
        }
        if let Some(x) = r.get::<_, Option<i64>>(2) {
            released.insert(n, x);
        }
    }
    (taken, released)
}

/// One case: a task inserted in `first`, then `ops`, the database held to the model at
/// every step.
async fn run_case(
    db: &TestDb,
    c: &Client,
    tally: &RefCell<Tally>,
    user: &str,
    first: St,
    max_retries: i32,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    // The worker-wide writes (a drain's release, a handover of everything assigned) reach
    // every task a worker holds: earlier cases' tasks end first, so only this one is held.
    c.execute(
        "update artex.tasks set status = 'canceled'
         where status not in ('succeeded', 'failed', 'timeout', 'canceled')",
        &[],
    )
    .await
    .map_err(|e| TestCaseError::fail(format!("ending earlier cases: {}", pg_message(&e))))?;
    let id: Uuid = c
        .query_one(
            "insert into artex.tasks (kind, payload, status, max_retries)
             values ('echo', '{}', $1::text::artex.task_status, $2) returning id",
            &[&first.name(), &max_retries],
        )
        .await
        .map_err(|e| TestCaseError::fail(format!("inserting: {}", pg_message(&e))))?
        .get(0);
    let row = read_row(c, id).await;
    let (taken, released) = read_counters(c).await;
    prop_assert_eq!(row.status, first);
    prop_assert_eq!(
        (
            row.lease_epoch,
            row.retries,
            &row.assigned_to,
            row.lease_until
        ),
        (0, 0, &None, None)
    );
    let mut model = Model {
        history: vec![Hist {
            from: None,
            to: first,
            reason: Some("submitted".into()),
            actor: user.to_string(),
            worker: None,
            lease_epoch: 0,
            at: row.updated_at,
            assigned_at: None,
        }],
        row,
        taken,
        released,
        user: user.to_string(),
    };
    prop_assert_eq!(&read_history(c, id).await, &model.history, "insert");

    for (i, op) in ops.iter().enumerate() {
        let expect = model.expect(op);
        let seen = run_op(db, c, id, &model, op).await;
        let row = read_row(c, id).await;
        let at = format!("step {i} {op:?} from {:?}", model.row);
        let here = || at.clone();
        match (&expect, &seen) {
            (Expect::Unmatched, Seen::Unmatched) => {
                prop_assert_eq!(
                    &row,
                    &model.row,
                    "{} matched nothing yet changed the row",
                    here()
                );
            }
            (Expect::Changed(change), Seen::Matched) => {
                let now = row.updated_at;
                prop_assert!(
                    now > model.row.updated_at,
                    "{}: updated_at did not move",
                    here()
                );
                let known = model.history.len();
                if let Err(why) = model.apply(change, now) {
                    return Err(TestCaseError::fail(format!(
                        "{}: the database accepted a write the model refuses ({why:?}); \
                         the row became {row:?}",
                        here()
                    )));
                }
                prop_assert_eq!(&row, &model.row, "{}: the row", here());
                for h in &model.history[known..] {
                    let from = h.from.map_or("new", St::name);
                    tally.borrow_mut().moved.insert((from, h.to.name()));
                }
            }
            (Expect::Changed(change), Seen::Refused(msg)) => {
                let now = model.row.updated_at;
                let mut probe = model.clone();
                match probe.apply(change, now) {
                    Err(why) => {
                        prop_assert!(
                            why.iter().any(|w| msg.contains(w)),
                            "{}: refused with {msg:?}, the model expects one of {why:?}",
                            here()
                        );
                        *tally.borrow_mut().refused.entry(why[0]).or_default() += 1;
                    }
                    Ok(()) => {
                        return Err(TestCaseError::fail(format!(
                            "{}: the database refused a write the model accepts: {msg:?} \
                             (the model's row: {:?})",
                            here(),
                            probe.row
                        )))
                    }
                }
                prop_assert_eq!(
                    &row,
                    &model.row,
                    "{}: a refused write changed the row",
                    here()
                );
            }
            _ => {
                return Err(TestCaseError::fail(format!(
                    "{}: the model expects {expect:?}, the database did {seen:?}; row now {row:?}",
                    here()
                )))
            }
        }
        prop_assert_eq!(
            &read_history(c, id).await,
            &model.history,
            "{}: history",
            here()
        );
        let (taken, released) = read_counters(c).await;
        prop_assert_eq!(
            (&taken, &released),
            (&model.taken, &model.released),
            "{}: held counters",
            here()
        );
    }
    Ok(())
}

/// What the cases exercised: the moves the database made, and its refusals by rule.
#[derive(Debug, Default)]
struct Tally {
    moved: BTreeSet<(&'static str, &'static str)>,
    refused: BTreeMap<&'static str, usize>,
}

// ---- generators ----

fn status() -> impl Strategy<Value = St> {
    proptest::sample::select(STATUSES.to_vec())
}

fn worker() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => Just("w1"), 3 => Just("w2"), 1 => Just("w3")]
}

fn epoch() -> impl Strategy<Value = Epoch> {
    prop_oneof![6 => Just(Epoch::Held), 1 => Just(Epoch::Stale), 1 => Just(Epoch::Ahead)]
}

fn raw() -> impl Strategy<Value = Raw> {
    use proptest::option::weighted;
    let holder = prop_oneof![
        6 => worker().prop_map(Some),
        2 => Just(None),
        1 => Just(Some("")),
    ];
    (
        weighted(0.8, status()),
        weighted(0.5, holder),
        weighted(0.5, weighted(0.85, 1i64..600)),
        weighted(0.15, -1i64..=2),
        weighted(0.2, -1i32..=2),
        weighted(0.1, 0i32..=3),
        weighted(
            0.25,
            proptest::option::of(proptest::sample::select(vec!["oops", "", "it's broken"])),
        ),
        weighted(
            0.25,
            proptest::option::of(prop_oneof![
                Just(-1500i64),
                Just(0i64),
                Just(250i64),
                Just(1500i64)
            ]),
        ),
        weighted(
            0.4,
            (
                proptest::sample::select(vec!["tester", "w1", "operator 'x'"]),
                proptest::option::of(proptest::sample::select(vec![
                    "by hand",
                    "r\u{e9}sum\u{e9}",
                ])),
            ),
        ),
    )
        .prop_map(
            |(
                status,
                holder,
                lease_secs,
                epoch_delta,
                retries_delta,
                max_retries,
                error,
                started_ago_ms,
                context,
            )| Raw {
                status,
                holder,
                lease_secs,
                epoch_delta,
                retries_delta,
                max_retries,
                error,
                started_ago_ms,
                context,
            },
        )
}

fn step_kind() -> impl Strategy<Value = StepKind> {
    prop_oneof![
        3 => Just(StepKind::Start),
        3 => Just(StepKind::Succeeded),
        3 => prop_oneof![Just(0i64), Just(500), Just(60_000)]
            .prop_map(|retry_in_ms| StepKind::Failed { retry_in_ms }),
        2 => prop_oneof![Just(0i64), Just(1500)]
            .prop_map(|retry_in_ms| StepKind::TimedOut { retry_in_ms }),
        1 => Just(StepKind::Released),
        1 => Just(StepKind::Discarded),
        1 => prop_oneof![Just(0i64), Just(1500)].prop_map(|delay_ms| StepKind::Snoozed { delay_ms }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let secs = || prop_oneof![Just(1i64), Just(30), Just(300)];
    prop_oneof![
        7 => raw().prop_map(Op::Raw),
        4 => (worker(), secs()).prop_map(|(worker, secs)| Op::Assign { worker, secs }),
        6 => (
            worker(),
            epoch(),
            step_kind(),
            proptest::option::weighted(0.6, prop_oneof![Just(0i64), Just(250), Just(1000)])
        )
            .prop_map(|(worker, epoch, step, started_ago_ms)| Op::Record {
                worker,
                epoch,
                step,
                started_ago_ms
            }),
        1 => (worker(), epoch(), secs()).prop_map(|(worker, epoch, secs)| Op::Renew {
            worker,
            epoch,
            secs
        }),
        1 => (epoch(), any::<u8>()).prop_map(|(epoch, n)| Op::Checkpoint { epoch, n }),
        1 => (worker(), proptest::bool::weighted(0.2))
            .prop_map(|(worker, spare)| Op::Release { worker, spare }),
        1 => (worker(), worker(), epoch(), secs()).prop_map(|(from, to, epoch, secs)| {
            Op::TakeOver {
                from,
                to,
                epoch,
                secs
            }
        }),
        1 => (worker(), worker(), proptest::bool::weighted(0.2), secs()).prop_map(
            |(from, to, spare, secs)| Op::MoveAssigned {
                from,
                to,
                spare,
                secs
            }
        ),
        2 => (
            prop_oneof![Just(Ctl::Pause), Just(Ctl::Resume), Just(Ctl::Cancel)],
            proptest::option::of(Just("by the model"))
        )
            .prop_map(|(control, reason)| Op::Control { control, reason }),
    ]
}

#[test]
fn the_database_accepts_exactly_the_models_moves() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (db, c, user) = rt.block_on(async {
        let db = TestDb::new().await;
        for w in REGISTERED {
            fixtures::worker(&db.bb, w, &["echo"], 100).await;
        }
        let c = db.client().await;
        let user: String = c
            .query_one("select current_user::text", &[])
            .await
            .expect("current_user")
            .get(0);
        (db, c, user)
    });
    // Half the cases start from a task that ran once and waits for its retry: what a
    // task looks like on its later attempts (it keeps its first start time, its error
    // and a retry counted).
    let ran_once = [
        Op::Assign {
            worker: "w1",
            secs: 30,
        },
        Op::Record {
            worker: "w1",
            epoch: Epoch::Held,
            step: StepKind::Start,
            started_ago_ms: Some(250),
        },
        Op::Record {
            worker: "w1",
            epoch: Epoch::Held,
            step: StepKind::Failed { retry_in_ms: 0 },
            started_ago_ms: None,
        },
    ];
    let case = (
        prop_oneof![3 => Just(St::Pending), 1 => Just(St::Paused), 1 => Just(St::Blocked)],
        1i32..=3,
        any::<bool>(),
        proptest::collection::vec(op(), 1..24),
    )
        .prop_map(move |(first, max_retries, again, ops)| {
            let ops = if again && first == St::Pending {
                ran_once.iter().cloned().chain(ops).collect()
            } else {
                ops
            };
            (first, max_retries, ops)
        });
    let tally = RefCell::new(Tally::default());
    let cases = 96;
    props::check(
        "status machine model",
        cases,
        case,
        |(first, max_retries, ops)| {
            rt.block_on(run_case(&db, &c, &tally, &user, first, max_retries, &ops))
        },
    );
    let tally = tally.into_inner();
    eprintln!("{tally:#?}");
    // The property is only as good as what it reached: at the default count, every
    // legal move was made (as the history records them: a write from `assigned` to an
    // outcome is a start and an outcome), and the trigger refused writes for each of its
    // main rules.
    if props::settings(cases).cases >= cases {
        for from in STATUSES {
            for to in STATUSES {
                if legal(from, to) {
                    assert!(
                        tally.moved.contains(&(from.name(), to.name())),
                        "no case moved a task {} -> {}: {tally:#?}",
                        from.name(),
                        to.name()
                    );
                }
            }
        }
        for rule in [
            "illegal task transition",
            "fencing token of task",
            "needs assigned_to and lease_until",
            "holder_only_while_held",
            "retries_within_budget",
        ] {
            assert!(
                tally.refused.contains_key(rule),
                "no refusal by {rule}: {tally:#?}"
            );
        }
    }
}

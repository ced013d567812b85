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
//!
//! # Layout
//! - here: the model's vocabulary (statuses, the row, history rows, the steps), one case
//!   run against a fresh task, and the property test.
//! - `model`: what the rules say each step does: legal or refused (and by which rule),
//!   and the row, history and counters after it.
//! - `database`: each step as SQL or as the runtime's own statement, and what the
//!   database holds after it.
//! - `generators`: the strategies that make the steps.

mod database;
mod generators;
mod model;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use artex_testkit::props;
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{fixtures, TestDb};
use database::{pg_message, read_counters, read_history, read_row, run_op, Seen};
use generators::op;

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
    /// A renewal for `secs`: `change` where the lease had at most three quarters of
    /// `secs` left at the statement's `now()`, or more than `secs`; else matched with
    /// nothing written.
    Renewal { secs: i64, change: Change },
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
            (Expect::Renewal { secs, .. }, Seen::Kept(left)) => {
                prop_assert!(
                    *left > 0.75 * *secs as f64 && *left <= *secs as f64,
                    "{}: a renewal for {secs} s wrote nothing with {left} s left",
                    here()
                );
                prop_assert_eq!(
                    &row,
                    &model.row,
                    "{} wrote nothing yet changed the row",
                    here()
                );
            }
            (Expect::Changed(change) | Expect::Renewal { change, .. }, Seen::Matched) => {
                let now = row.updated_at;
                prop_assert!(
                    now > model.row.updated_at,
                    "{}: updated_at did not move",
                    here()
                );
                if let (Expect::Renewal { secs, .. }, Some(until)) =
                    (&expect, model.row.lease_until)
                {
                    prop_assert!(
                        until < now + chrono::Duration::milliseconds(secs * 750)
                            || until > now + chrono::Duration::seconds(*secs),
                        "{}: a renewal for {secs} s rewrote a lease with between three \
                         quarters and all of it left",
                        here()
                    );
                }
                let known = model.history.len();
                if let Err(why) = model.apply(change, now) {
                    return Err(TestCaseError::fail(format!(
                        "{}: the database accepted a write the model refuses ({why:?}); \
                         the row became {row:?}",
                        here()
                    )));
                }
                if let (Op::TakeOver { .. }, Some(db), Some(counted)) =
                    (op, row.lease_until, model.row.lease_until)
                {
                    // A take-over counts its lease from the clock once it holds the new
                    // worker's row, not from the statement's start: a moment later.
                    prop_assert!(
                        db >= counted && db < counted + chrono::Duration::seconds(1),
                        "{}: a take-over's lease ends at {db}, not just after {counted}",
                        here()
                    );
                    model.row.lease_until = Some(db);
                }
                prop_assert_eq!(&row, &model.row, "{}: the row", here());
                for h in &model.history[known..] {
                    let from = h.from.map_or("new", St::name);
                    tally.borrow_mut().moved.insert((from, h.to.name()));
                }
            }
            (Expect::Changed(change) | Expect::Renewal { change, .. }, Seen::Refused(msg)) => {
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

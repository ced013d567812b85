//! The database side: each step as plain SQL or as the runtime's own statement (planner,
//! worker, operator), what the database made of it, and the row, history rows and
//! counters it holds afterwards.

use std::collections::BTreeMap;

use artex_actors::blackboard::{AttemptRecord, Control, Outcome, Renewal, Step};
use artex_actors::Error;
use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::TestDb;

use super::*;

/// What the database made of a write.
#[derive(Debug)]
pub(super) enum Seen {
    Refused(String),
    Unmatched,
    Matched,
    /// A renewal matched and wrote nothing: the lease had this many seconds left.
    Kept(f64),
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

pub(super) fn pg_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

pub(super) async fn run_op(db: &TestDb, c: &Client, id: Uuid, m: &Model, op: &Op) -> Seen {
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
                measured: None,
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
                Ok(r) => match r.as_slice() {
                    [] => Seen::Unmatched,
                    [(_, Renewal::Renewed)] => Seen::Matched,
                    [(_, Renewal::Kept { left_secs })] => Seen::Kept(*left_secs),
                    // No write of the worker's own is in flight beside it here.
                    _ => panic!("renewal of one task: {r:?}"),
                },
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

pub(super) async fn read_row(c: &Client, id: Uuid) -> Row {
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

pub(super) async fn read_history(c: &Client, id: Uuid) -> Vec<Hist> {
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
pub(super) async fn read_counters(c: &Client) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
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

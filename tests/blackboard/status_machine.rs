//! The status machine's trigger: every legal transition applied and audited, every
//! illegal one refused, and the history holding real transitions only.

use artex_actors::blackboard::{AssignedTask, AttemptRecord, Outcome, Renewal, Step, TaskStatus};
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_postgres::error::SqlState;

use crate::common::{lines_of, TestDb};
use crate::{
    assign, attempt_record, events, finish, insert_task, move_to, msg, pair, snapshot, start,
    status_of, task_in, transitions, MOVE,
};

/// The status machine as the migration documents it: from → the statuses it may move to.
/// Every pair not listed here (between different statuses) must be refused.
const LEGAL: &[(&str, &[&str])] = &[
    // `failed`: a task that can never run (its upload's host is gone for good; V11).
    ("pending", &["assigned", "paused", "canceled", "failed"]),
    (
        "assigned",
        &["running", "pending", "canceled", "failed", "timeout"],
    ),
    (
        "running",
        &["succeeded", "failed", "timeout", "pending", "canceled"],
    ),
    ("paused", &["pending", "blocked", "canceled"]),
    ("blocked", &["pending", "paused", "canceled"]),
];

fn is_legal(from: &str, to: &str) -> bool {
    LEGAL.iter().any(|(f, tos)| *f == from && tos.contains(&to))
}

fn statuses() -> Vec<&'static str> {
    TaskStatus::ALL.iter().map(|s| s.as_str()).collect()
}

fn is_held(status: &str) -> bool {
    status == "assigned" || status == "running"
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "timeout" | "canceled")
}

#[tokio::test]
async fn every_legal_transition_is_applied_audited_and_refreshes_updated_at() {
    let db = TestDb::new().await;
    let mut c = db.client().await;
    let db_statuses: Vec<String> = c
        .query_one("select enum_range(null::artex.task_status)::text[]", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        db_statuses,
        statuses(),
        "the test's status list is the database's"
    );

    let mut checked = 0;
    for &from in &statuses() {
        for &to in &statuses() {
            if from == to || !is_legal(from, to) {
                continue;
            }
            let id = task_in(&c, from).await;
            let before = snapshot(&c, id).await;
            let before_updated: DateTime<Utc> = c
                .query_one("select updated_at from artex.tasks where id = $1", &[&id])
                .await
                .unwrap()
                .get(0);
            let reason = format!("test {from} -> {to}");

            let tx = c.transaction().await.unwrap();
            tx.execute("select artex.set_context('tester', $1)", &[&reason])
                .await
                .unwrap();
            tx.execute(MOVE, &[&id, &to])
                .await
                .unwrap_or_else(|e| panic!("legal {from} -> {to} refused: {}", msg(&e)));
            let r = tx
                .query_one(
                    "select status::text, updated_at = now(), updated_at, assigned_to,
                            lease_epoch, finished_at is not null
                     from artex.tasks where id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            tx.commit().await.unwrap();

            assert_eq!(r.get::<_, String>(0), to, "{from} -> {to}");
            assert!(
                r.get::<_, bool>(1),
                "{from} -> {to}: updated_at is not now()"
            );
            assert!(
                r.get::<_, DateTime<Utc>>(2) > before_updated,
                "{from} -> {to}: updated_at did not move"
            );
            let holder: Option<String> = r.get(3);
            assert_eq!(
                holder.is_some(),
                is_held(to),
                "{from} -> {to}: holder {holder:?}"
            );
            let epoch: i64 = r.get(4);
            assert_eq!(
                r.get::<_, bool>(5),
                is_terminal(to),
                "{from} -> {to}: finished_at"
            );

            let audit = c
                .query(
                    "select from_status::text, to_status::text, actor, reason, worker, lease_epoch
                     from artex.task_transitions where task_id = $1 order by id",
                    &[&id],
                )
                .await
                .unwrap();
            // One row per transition the task went through: none for an assignment
            // (its start, or its end, writes it), two when an assignment ends
            // unstarted (the assignment, dated when it was made, then its end).
            let old_rows = before.transitions.as_array().unwrap().len();
            let new_rows = match (from, to) {
                (_, "assigned") => 0,
                ("assigned", "running") => 1,
                ("assigned", _) => 2,
                _ => 1,
            };
            assert_eq!(
                audit.len(),
                old_rows + new_rows,
                "{from} -> {to}: history rows"
            );
            if new_rows == 0 {
                checked += 1;
                continue;
            }
            if new_rows == 2 {
                let a = &audit[audit.len() - 2];
                assert_eq!(a.get::<_, Option<String>>(0).as_deref(), Some("pending"));
                assert_eq!(a.get::<_, String>(1), "assigned");
                assert_eq!(a.get::<_, Option<String>>(4).as_deref(), Some("w1"));
                assert_eq!(
                    a.get::<_, i64>(5),
                    epoch,
                    "{from} -> {to}: assignment epoch"
                );
            }
            let a = audit.last().unwrap();
            assert_eq!(a.get::<_, Option<String>>(0).as_deref(), Some(from));
            assert_eq!(a.get::<_, String>(1), to);
            assert_eq!(a.get::<_, String>(2), "tester", "{from} -> {to}: actor");
            assert_eq!(a.get::<_, Option<String>>(3), Some(reason.clone()));
            let expected_worker = (is_held(from) || is_held(to)).then(|| "w1".to_string());
            assert_eq!(
                a.get::<_, Option<String>>(4),
                expected_worker,
                "{from} -> {to}"
            );
            assert_eq!(a.get::<_, i64>(5), epoch, "{from} -> {to}: audited epoch");

            // The feed shows every real transition but the assignment.
            let after = snapshot(&c, id).await;
            let new_events =
                after.events.as_array().unwrap().len() - before.events.as_array().unwrap().len();
            assert_eq!(
                new_events,
                usize::from(to != "assigned"),
                "{from} -> {to}: feed rows"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 20, "legal pairs checked");
}

#[tokio::test]
async fn every_illegal_transition_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut checked = Vec::new();
    for &from in &statuses() {
        for &to in &statuses() {
            if from == to || is_legal(from, to) {
                continue;
            }
            let id = task_in(&c, from).await;
            let before = snapshot(&c, id).await;
            match move_to(&c, id, to).await {
                Ok(n) => panic!("illegal {from} -> {to} was accepted ({n} row)"),
                Err(e) => {
                    let m = msg(&e);
                    assert!(
                        m.contains("illegal task transition"),
                        "{from} -> {to} refused with {m:?}"
                    );
                    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{m}");
                }
            }
            assert_eq!(
                snapshot(&c, id).await,
                before,
                "{from} -> {to} changed something"
            );
            checked.push(format!("{from}->{to}"));
        }
    }
    // 9 statuses: 72 ordered pairs of different ones, 20 of them legal.
    assert_eq!(checked.len(), 52, "illegal pairs checked: {checked:?}");
    for must in [
        "succeeded->running",
        "pending->running",
        "canceled->pending",
    ] {
        assert!(checked.iter().any(|p| p == must), "{must} not checked");
    }
}

#[tokio::test]
async fn a_start_written_with_the_outcome_is_audited_as_two_steps() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let bb = &db.bb;
    let ran = insert_task(&c).await;
    let long = insert_task(&c).await;
    let idle = insert_task(&c).await;
    for id in [ran, long, idle] {
        assign(&c, id, "w1").await;
    }
    // Reading assignments writes nothing.
    let held = crate::common::assigned(bb, "w1", 10).await;
    assert_eq!(held.len(), 3);
    for id in [ran, long, idle] {
        assert_eq!(status_of(&c, id).await, "assigned");
    }
    let task = |id| held.iter().find(|t| t.id == id).unwrap();
    let started = |t: &AssignedTask, step, ago| AttemptRecord {
        started_ago_ms: ago,
        measured: None,
        ..attempt_record(t, t.epoch, step)
    };

    // `ran` finished before its start was written; `long` runs on (its start alone);
    // `idle` never ran, so it cannot have an outcome (only be given back).
    let written = bb
        .worker()
        .record(
            "w1",
            &[
                started(
                    task(ran),
                    Step::Finish(Outcome::Succeeded(json!(1))),
                    Some(250.0),
                ),
                started(task(long), Step::Start, Some(40.0)),
                started(task(idle), Step::Finish(Outcome::Succeeded(json!(1))), None),
            ],
        )
        .await
        .unwrap();
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(!written.contains(&idle));
    assert_eq!(status_of(&c, ran).await, "succeeded");
    assert_eq!(status_of(&c, long).await, "running");
    assert_eq!(status_of(&c, idle).await, "assigned");
    // The start time is the handler's, not the write's.
    let ms = start_to_finish_ms(&c, ran).await;
    assert!(
        (200.0..5000.0).contains(&ms),
        "{ms} ms between start and finish"
    );

    let trail = |id| {
        lines_of(
            &c,
            "select coalesce(from_status::text, 'new') || '>' || to_status
                 || coalesce(' ' || reason, '')
             from artex.task_transitions where task_id = $1 order by id",
            id,
        )
    };
    // The start is dated when the handler started, and says when it was assigned.
    assert_eq!(
        trail(ran).await,
        [
            "new>pending submitted",
            "assigned>running started",
            "running>succeeded"
        ]
    );
    let starts = lines_of(
        &c,
        "select (h.at = t.started_at and h.assigned_at is not null
                 and h.lease_epoch = t.lease_epoch)::text
         from artex.task_transitions h join artex.tasks t on t.id = h.task_id
         where h.task_id = $1 and h.to_status = 'running'",
        ran,
    )
    .await;
    assert_eq!(starts, ["true"]);

    // Then `long` ends: one step, from `running`.
    let written = bb
        .worker()
        .record(
            "w1",
            &[started(
                task(long),
                Step::Finish(Outcome::Succeeded(json!(2))),
                Some(90.0),
            )],
        )
        .await
        .unwrap();
    assert_eq!(written, [long]);
    assert_eq!(
        trail(long).await[1..],
        ["assigned>running started", "running>succeeded"]
    );

    // Plain SQL cannot jump from `assigned` to an outcome without saying when it started.
    let e = c
        .execute(
            "update artex.tasks set status = 'succeeded' where id = $1",
            &[&idle],
        )
        .await
        .unwrap_err();
    assert!(
        msg(&e).contains("illegal task transition assigned -> succeeded"),
        "{}",
        msg(&e)
    );
}

/// Milliseconds from task `id`'s recorded start to its finish.
async fn start_to_finish_ms(c: &tokio_postgres::Client, id: uuid::Uuid) -> f64 {
    c.query_one(
        "select (extract(epoch from finished_at - started_at) * 1000)::float8 from artex.tasks
         where id = $1",
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

/// A worker measures how long ago a handler began when the handler ends, then the
/// record may wait in its outbox (a lingering batch, a write in flight): the write
/// counts that wait too, so the start is dated when the handler began.
#[tokio::test]
async fn a_start_that_waited_in_the_outbox_is_dated_when_the_handler_began() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    let held = crate::common::assigned(&db.bb, "w1", 10).await;
    // Ended 50 ms after it began, and measured then; written 300 ms later.
    let record = AttemptRecord {
        started_ago_ms: Some(50.0),
        measured: Some(std::time::Instant::now() - std::time::Duration::from_millis(300)),
        ..attempt_record(
            &held[0],
            held[0].epoch,
            Step::Finish(Outcome::Succeeded(json!(1))),
        )
    };
    let written = db.bb.worker().record("w1", &[record]).await.unwrap();
    assert_eq!(written, [id]);
    let ms = start_to_finish_ms(&c, id).await;
    assert!(
        (350.0..5000.0).contains(&ms),
        "{ms} ms between the start and the write: the 300 ms in the outbox are not counted"
    );
}

#[tokio::test]
async fn the_history_holds_real_transitions_only() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let bb = &db.bb;
    let id = insert_task(&c).await;
    let t = start(&db, &c, id, "w1").await;

    let before = (transitions(&c, id).await, events(&c, id).await);
    assert_eq!(
        bb.worker()
            .renew_leases("w1", &[(id, t.epoch)], 60.0)
            .await
            .unwrap(),
        [(id, Renewal::Renewed)]
    );
    c.execute(
        "update artex.tasks set lease_until = lease_until + interval '1 minute' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert!(bb
        .worker()
        .save_checkpoint(id, t.epoch, &json!({"done": 3}))
        .await
        .unwrap());
    assert_eq!(
        (transitions(&c, id).await, events(&c, id).await),
        before,
        "renewals and checkpoints are not transitions"
    );

    let done = bb
        .worker()
        .record("w1", &[finish(&t, t.epoch, Outcome::Succeeded(json!({})))])
        .await
        .unwrap();
    assert_eq!(done, [id]);
    assert_eq!(
        events(&c, id).await,
        [
            pair(None, "pending"),
            pair(Some("assigned"), "running"),
            pair(Some("running"), "succeeded"),
        ]
    );
    assert_eq!(
        transitions(&c, id).await,
        events(&c, id).await,
        "an assignment followed by a start has no row of its own: 3 rows in all"
    );
}

/// Found by `status_model`: a task assigned again after an earlier attempt keeps that
/// attempt's start time; a plain SQL write that ended it and cleared the time was read
/// as "it ran" with a start dated NULL, and the history refused it with a not-null
/// violation on another table (V21).
#[tokio::test]
async fn a_write_that_clears_the_start_time_is_not_a_start() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let reassigned = || async {
        let id = insert_task(&c).await;
        assign(&c, id, "w1").await;
        move_to(&c, id, "running").await.unwrap();
        c.execute(
            "update artex.tasks set status = 'pending', retries = 1, error = 'x' where id = $1",
            &[&id],
        )
        .await
        .unwrap();
        assign(&c, id, "w1").await;
        id
    };

    // A legal end of an unstarted attempt: accepted, audited as the assignment and its end.
    let id = reassigned().await;
    c.execute(
        "update artex.tasks set status = 'failed', started_at = null where id = $1",
        &[&id],
    )
    .await
    .unwrap_or_else(|e| panic!("assigned -> failed refused: {}", msg(&e)));
    assert_eq!(status_of(&c, id).await, "failed");
    assert_eq!(
        transitions(&c, id).await[3..],
        [
            pair(Some("pending"), "assigned"),
            pair(Some("assigned"), "failed")
        ]
    );

    // An outcome that never started: the illegal transition, said so.
    let id = reassigned().await;
    let before = snapshot(&c, id).await;
    let e = c
        .execute(
            "update artex.tasks set status = 'succeeded', started_at = null where id = $1",
            &[&id],
        )
        .await
        .unwrap_err();
    assert!(
        msg(&e).contains("illegal task transition assigned -> succeeded"),
        "{}",
        msg(&e)
    );
    assert_eq!(snapshot(&c, id).await, before);
}

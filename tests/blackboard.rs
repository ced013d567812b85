//! The blackboard at the database level (issue 2): the schema's defaults and constraints,
//! the status machine's trigger, the fencing token, retries, the outbox, NOTIFY and the
//! scanner's index — against a real PostgreSQL, one fresh database per test.

mod common;

use std::time::Duration;

use artex_actors::blackboard::{
    AssignedTask, AttemptRecord, Outcome, ReapParams, Step, TaskStatus, DISPATCH_SQL, TASKS_CHANNEL,
};
use chrono::{DateTime, Utc};
use common::{lines_of, start_assigned, TestDb};
use serde_json::{json, Value};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use uuid::Uuid;

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

/// Legal steps from `pending` to `status`.
fn path_to(status: &str) -> &'static [&'static str] {
    match status {
        "pending" => &[],
        "assigned" => &["assigned"],
        "running" => &["assigned", "running"],
        "succeeded" => &["assigned", "running", "succeeded"],
        "failed" => &["assigned", "running", "failed"],
        "timeout" => &["assigned", "running", "timeout"],
        "paused" => &["paused"],
        "blocked" => &["paused", "blocked"],
        "canceled" => &["canceled"],
        other => panic!("unknown status {other}"),
    }
}

/// A plain SQL status change; an assignment names a holder ('w1') and a lease.
const MOVE: &str = "update artex.tasks set status = $2::text::artex.task_status,
        assigned_to = case when $2::text = 'assigned' then 'w1' else assigned_to end,
        lease_until = case when $2::text = 'assigned' then now() + interval '5 minutes'
                           else lease_until end
    where id = $1";

async fn insert_task(c: &Client) -> Uuid {
    c.query_one(
        "insert into artex.tasks (kind, payload) values ('echo', '{}') returning id",
        &[],
    )
    .await
    .expect("inserting a task")
    .get(0)
}

async fn insert_task_with_budget(c: &Client, max_retries: i32) -> Uuid {
    c.query_one(
        "insert into artex.tasks (kind, payload, max_retries) values ('echo', '{}', $1)
         returning id",
        &[&max_retries],
    )
    .await
    .expect("inserting a task")
    .get(0)
}

async fn move_to(c: &Client, id: Uuid, to: &str) -> Result<u64, tokio_postgres::Error> {
    c.execute(MOVE, &[&id, &to]).await
}

/// A new task driven by legal plain SQL steps to `status`.
async fn task_in(c: &Client, status: &str) -> Uuid {
    let id = insert_task(c).await;
    for step in path_to(status) {
        let n = move_to(c, id, step)
            .await
            .unwrap_or_else(|e| panic!("driving a task to {status} ({step}): {}", msg(&e)));
        assert_eq!(n, 1);
    }
    assert_eq!(status_of(c, id).await, status);
    id
}

/// Assigns a pending task to `worker` by plain SQL, as the planner would.
async fn assign(c: &Client, id: Uuid, worker: &str) {
    let n = c
        .execute(
            "update artex.tasks set status = 'assigned', assigned_to = $2,
                 lease_until = now() + interval '5 minutes'
             where id = $1 and status = 'pending'",
            &[&id, &worker],
        )
        .await
        .unwrap_or_else(|e| panic!("assigning to {worker}: {}", msg(&e)));
    assert_eq!(n, 1, "task {id} was not pending");
}

async fn status_of(c: &Client, id: Uuid) -> String {
    c.query_one("select status::text from artex.tasks where id = $1", &[&id])
        .await
        .expect("reading a status")
        .get(0)
}

async fn epoch_of(c: &Client, id: Uuid) -> i64 {
    c.query_one("select lease_epoch from artex.tasks where id = $1", &[&id])
        .await
        .expect("reading an epoch")
        .get(0)
}

/// The history rows the change feed shows: real status changes, not assignments nor
/// handovers (see `blackboard/events.rs`).
const FEED_ROWS: &str = "to_status <> 'assigned' and from_status is distinct from to_status";

/// Everything a write could change: the row itself, the task's history rows, and those
/// of them the feed shows.
#[derive(Debug, PartialEq)]
struct Snapshot {
    row: Value,
    transitions: Value,
    events: Value,
}

async fn snapshot(c: &Client, id: Uuid) -> Snapshot {
    let r = c
        .query_one(
            &format!(
                "select to_jsonb(t),
                    (select coalesce(jsonb_agg(to_jsonb(x) order by x.at, x.id), '[]')
                     from artex.task_transitions x where x.task_id = t.id),
                    (select coalesce(jsonb_agg(to_jsonb(e) order by e.at, e.id), '[]')
                     from artex.task_transitions e where e.task_id = t.id and {FEED_ROWS})
             from artex.tasks t where t.id = $1"
            ),
            &[&id],
        )
        .await
        .expect("taking a snapshot");
    Snapshot {
        row: r.get(0),
        transitions: r.get(1),
        events: r.get(2),
    }
}

/// (from, to) of a task's history rows, oldest first.
async fn transitions(c: &Client, id: Uuid) -> Vec<(Option<String>, String)> {
    c.query(
        "select from_status::text, to_status::text from artex.task_transitions
         where task_id = $1 order by at, id",
        &[&id],
    )
    .await
    .expect("reading transitions")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// (from, to) of a task's history rows that the feed shows, oldest first.
async fn events(c: &Client, id: Uuid) -> Vec<(Option<String>, String)> {
    c.query(
        &format!(
            "select from_status::text, to_status::text from artex.task_transitions
             where task_id = $1 and {FEED_ROWS} order by at, id"
        ),
        &[&id],
    )
    .await
    .expect("reading events")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The database's message, or the client's when there is none.
fn msg(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

fn attempt_record(t: &AssignedTask, epoch: i64, step: Step) -> AttemptRecord {
    AttemptRecord {
        id: t.id,
        epoch,
        retries: t.retries,
        max_retries: t.max_retries,
        step,
        started_ago_ms: None,
    }
}

fn finish(t: &AssignedTask, epoch: i64, outcome: Outcome) -> AttemptRecord {
    attempt_record(t, epoch, Step::Finish(outcome))
}

fn reap_params(now: DateTime<Utc>) -> ReapParams {
    ReapParams {
        now: Some(now),
        worker_timeout_secs: 30.0,
        prune_after_secs: 3600.0,
        batch: 100,
        retry_base_ms: 1000.0,
        retry_cap_ms: 60_000.0,
        judge_liveness: true,
        upload_host_deadline_secs: 600.0,
    }
}

fn pair(from: Option<&str>, to: &str) -> (Option<String>, String) {
    (from.map(str::to_string), to.to_string())
}

#[tokio::test]
async fn plain_insert_of_kind_and_payload_gets_defaults_and_one_audit_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    let r = c
        .query_one(
            "select status::text, retries, max_retries, lease_epoch, assigned_to, lease_until,
                    result, error, priority,
                    extract(epoch from now() - run_at)::float8, created_at = updated_at,
                    current_user::text
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(id.get_version_num(), 7, "id {id} is not time-ordered");
    assert_eq!(r.get::<_, String>(0), "pending");
    assert_eq!(r.get::<_, i32>(1), 0, "retries");
    assert_eq!(r.get::<_, i32>(2), 3, "max_retries");
    assert_eq!(r.get::<_, i64>(3), 0, "lease_epoch");
    assert_eq!(r.get::<_, Option<String>>(4), None, "assigned_to");
    assert_eq!(r.get::<_, Option<DateTime<Utc>>>(5), None, "lease_until");
    assert_eq!(r.get::<_, Option<Value>>(6), None, "result");
    assert_eq!(r.get::<_, Option<String>>(7), None, "error");
    assert_eq!(r.get::<_, i32>(8), 0, "priority");
    let run_at_age: f64 = r.get(9);
    assert!(
        (0.0..10.0).contains(&run_at_age),
        "run_at is {run_at_age}s before now, expected the insert's time"
    );
    assert!(r.get::<_, bool>(10), "created_at = updated_at");
    let role: String = r.get(11);

    let audit = c
        .query(
            "select from_status::text, to_status::text, actor, reason, lease_epoch
             from artex.task_transitions where task_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "one audit row for the insert");
    assert_eq!(audit[0].get::<_, Option<String>>(0), None);
    assert_eq!(audit[0].get::<_, String>(1), "pending");
    assert_eq!(
        audit[0].get::<_, String>(2),
        role,
        "actor is the database role"
    );
    assert_eq!(
        audit[0].get::<_, Option<String>>(3).as_deref(),
        Some("submitted")
    );
    assert_eq!(audit[0].get::<_, i64>(4), 0);

    let outbox = c
        .query(
            &format!(
                "select from_status::text, to_status::text, kind from artex.task_transitions
                 where task_id = $1 and {FEED_ROWS}"
            ),
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(outbox.len(), 1, "the insert's row is in the feed");
    assert_eq!(outbox[0].get::<_, Option<String>>(0), None);
    assert_eq!(outbox[0].get::<_, String>(1), "pending");
    assert_eq!(outbox[0].get::<_, String>(2), "echo");
}

/// The Unix time in milliseconds a UUIDv7 starts with.
fn unix_ms_of(id: Uuid) -> i64 {
    let b = id.as_bytes();
    b[..6]
        .iter()
        .fold(0i64, |ms, byte| ms << 8 | i64::from(*byte))
}

// A task inserted with plain SQL gets an id like artex's own submits: time-ordered
// (UUIDv7), so new rows land on the right edge of the primary key, not on a random page.
#[tokio::test]
async fn a_plain_insert_gets_a_time_ordered_id_stamped_now() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let clock_ms = "select floor(extract(epoch from clock_timestamp()) * 1000)::int8";
    let mut last: Option<Uuid> = None;
    for _ in 0..50 {
        let before: i64 = c.query_one(clock_ms, &[]).await.unwrap().get(0);
        let id = insert_task(&c).await;
        let after: i64 = c.query_one(clock_ms, &[]).await.unwrap().get(0);
        assert_eq!(id.get_version_num(), 7, "id {id} is not a UUIDv7");
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "id {id}");
        let ms = unix_ms_of(id);
        assert!(
            (before..=after).contains(&ms),
            "id {id} says {ms} ms, inserted between {before} and {after}"
        );
        if let Some(last) = last {
            assert!(id > last, "id {id} inserted after {last} sorts before it");
        }
        last = Some(id);
    }
    // Many in one statement (one transaction): each still gets its own time, not the
    // transaction's, and they are all distinct.
    let ids: Vec<Uuid> = c
        .query(
            "insert into artex.tasks (kind) select 'echo' from generate_series(1, 1000)
             returning id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let distinct: std::collections::HashSet<&Uuid> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "duplicate ids");
    assert!(ids.iter().all(|id| id.get_version_num() == 7));
    assert!(
        ids.iter().all(|id| *id > last.unwrap()),
        "bulk ids sort after earlier ones"
    );
    let flow: Uuid = c
        .query_one(
            "insert into artex.flows (name) values ('plain') returning id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(flow.get_version_num(), 7, "flow id {flow}");
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
async fn an_assignment_needs_a_real_holder_and_a_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    let before = snapshot(&c, id).await;
    let refused = [
        (
            "no holder",
            "update artex.tasks set status = 'assigned', lease_until = now() + interval '1 minute'
             where id = $1",
        ),
        (
            "no lease",
            "update artex.tasks set status = 'assigned', assigned_to = 'w1' where id = $1",
        ),
        (
            "empty holder",
            "update artex.tasks set status = 'assigned', assigned_to = '',
                 lease_until = now() + interval '1 minute'
             where id = $1",
        ),
        (
            "holder on a pending task",
            "update artex.tasks set assigned_to = 'w1', lease_until = now() + interval '1 minute'
             where id = $1",
        ),
    ];
    for (what, sql) in refused {
        let e = c
            .execute(sql, &[&id])
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert_eq!(
            e.code(),
            Some(&SqlState::CHECK_VIOLATION),
            "{what}: {}",
            msg(&e)
        );
        assert_eq!(snapshot(&c, id).await, before, "{what}: changed the task");
    }

    // Starting names the holder it was assigned to, and no other.
    assign(&c, id, "w1").await;
    let e = c
        .execute(
            "update artex.tasks set status = 'running', assigned_to = 'w2' where id = $1",
            &[&id],
        )
        .await
        .expect_err("running under another holder was accepted");
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
    assert_eq!(status_of(&c, id).await, "assigned");

    // A new task cannot arrive already held.
    let e = c
        .execute(
            "insert into artex.tasks (kind, assigned_to, lease_until)
             values ('echo', 'w1', now() + interval '1 minute')",
            &[],
        )
        .await
        .expect_err("a task inserted with a holder was accepted");
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
}

#[tokio::test]
async fn a_task_that_is_not_held_names_no_holder_nor_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for status in ["pending", "paused", "succeeded", "canceled"] {
        let id = task_in(&c, status).await;
        let before = snapshot(&c, id).await;
        for set in [
            "assigned_to = 'w1'",
            "lease_until = now() + interval '1 minute'",
        ] {
            let sql = format!("update artex.tasks set {set} where id = $1");
            let e = c
                .execute(&sql, &[&id])
                .await
                .err()
                .unwrap_or_else(|| panic!("{status} task: `{set}` accepted"));
            assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
            assert_eq!(snapshot(&c, id).await, before, "{status}: `{set}`");
        }
    }
}

#[tokio::test]
async fn lease_epoch_bumps_at_every_assignment_and_handover() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assert_eq!(epoch_of(&c, id).await, 0);

    assign(&c, id, "w1").await;
    assert_eq!(epoch_of(&c, id).await, 1, "first assignment");
    move_to(&c, id, "pending").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 1, "a release is not an assignment");
    assign(&c, id, "w1").await;
    assert_eq!(epoch_of(&c, id).await, 2, "assignment after a release");
    move_to(&c, id, "pending").await.unwrap();
    assign(&c, id, "w2").await;
    assert_eq!(
        epoch_of(&c, id).await,
        3,
        "second assignment after a release"
    );

    c.execute(
        "update artex.tasks set lease_until = lease_until + interval '1 minute' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 3, "a lease renewal keeps the epoch");

    c.execute(
        "update artex.tasks set assigned_to = 'w3' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 4, "handover while assigned");
    move_to(&c, id, "running").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 4, "starting keeps the epoch");
    c.execute(
        "update artex.tasks set assigned_to = 'w4' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 5, "handover while running");

    let audited: Vec<(String, String, String, i64)> = c
        .query(
            "select from_status::text, to_status::text, worker, lease_epoch
             from artex.task_transitions
             where task_id = $1 and to_status in ('assigned', 'running') order by id",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let row = |from: &str, to: &str, worker: &str, epoch: i64| {
        (from.to_string(), to.to_string(), worker.to_string(), epoch)
    };
    assert_eq!(
        audited,
        [
            row("pending", "assigned", "w1", 1),
            row("pending", "assigned", "w1", 2),
            row("pending", "assigned", "w2", 3),
            row("assigned", "assigned", "w3", 4),
            row("assigned", "running", "w3", 4),
            row("running", "running", "w4", 5),
        ],
        "assignments, handovers and the start are audited with their epoch"
    );
}

#[tokio::test]
async fn lease_epoch_never_moves_backwards() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    move_to(&c, id, "pending").await.unwrap();
    assign(&c, id, "w1").await;
    move_to(&c, id, "running").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 2);
    // Whether refused or ignored, the token must not go back to the earlier lease's.
    let _ = c
        .execute(
            "update artex.tasks set lease_epoch = lease_epoch - 1 where id = $1",
            &[&id],
        )
        .await;
    assert!(
        epoch_of(&c, id).await >= 2,
        "the fencing token moved backwards"
    );
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
    let held = bb.fetch_assigned("w1", 10).await.unwrap();
    assert_eq!(held.len(), 3);
    for id in [ran, long, idle] {
        assert_eq!(status_of(&c, id).await, "assigned");
    }
    let task = |id| held.iter().find(|t| t.id == id).unwrap();
    let started = |t: &AssignedTask, step, ago| AttemptRecord {
        started_ago_ms: ago,
        ..attempt_record(t, t.epoch, step)
    };

    // `ran` finished before its start was written; `long` runs on (its start alone);
    // `idle` never ran, so it cannot have an outcome (only be given back).
    let written = bb
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
    let ms: f64 = c
        .query_one(
            "select (extract(epoch from finished_at - started_at) * 1000)::float8 from artex.tasks
             where id = $1",
            &[&ran],
        )
        .await
        .unwrap()
        .get(0);
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

#[tokio::test]
async fn writes_with_a_stale_epoch_change_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let bb = &db.bb;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    let e = epoch_of(&c, id).await;
    let started = start_assigned(bb, "w1", 10).await;
    assert_eq!(started.len(), 1);
    let t1 = &started[0];
    assert_eq!((t1.id, t1.epoch), (id, e));
    assert_eq!(status_of(&c, id).await, "running");

    let before = snapshot(&c, id).await;
    for (worker, epoch) in [("w1", e - 1), ("w1", e + 1), ("w2", e)] {
        let done = bb
            .record(worker, &[finish(t1, epoch, Outcome::Succeeded(json!(1)))])
            .await
            .unwrap();
        assert!(
            done.is_empty(),
            "{worker} at epoch {epoch} completed {done:?}"
        );
        assert_eq!(snapshot(&c, id).await, before, "{worker} at epoch {epoch}");
    }

    // The lease runs out; the reaper takes the task back and it goes to w2.
    let report = bb
        .reap(
            "reaper",
            &reap_params(Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    assert_eq!((report.requeued, report.ended), (1, 0), "{report:?}");
    assert_eq!(status_of(&c, id).await, "pending");
    assign(&c, id, "w2").await;
    let started = start_assigned(bb, "w2", 10).await;
    assert_eq!(started.len(), 1);
    let t2 = &started[0];
    assert_eq!(t2.epoch, e + 1);

    let before = snapshot(&c, id).await;
    let done = bb
        .record("w1", &[finish(t1, e, Outcome::Succeeded(json!("old")))])
        .await
        .unwrap();
    assert!(done.is_empty(), "the old holder completed {done:?}");
    let done = bb
        .record("w2", &[finish(t2, e, Outcome::Succeeded(json!("old")))])
        .await
        .unwrap();
    assert!(
        done.is_empty(),
        "the new holder completed with the old epoch"
    );
    assert!(!bb
        .save_checkpoint(id, e, &json!({"step": 1}))
        .await
        .unwrap());
    assert!(bb
        .renew_leases("w1", &[(id, e)], 60.0)
        .await
        .unwrap()
        .is_empty());
    assert!(bb
        .renew_leases("w2", &[(id, e)], 60.0)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        snapshot(&c, id).await,
        before,
        "stale writes changed the task"
    );

    // The current holder's writes go through.
    assert!(bb
        .save_checkpoint(id, t2.epoch, &json!({"step": 2}))
        .await
        .unwrap());
    assert_eq!(
        bb.renew_leases("w2", &[(id, t2.epoch)], 60.0)
            .await
            .unwrap(),
        [(id, true)]
    );
    let done = bb
        .record(
            "w2",
            &[finish(t2, t2.epoch, Outcome::Succeeded(json!("new")))],
        )
        .await
        .unwrap();
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, result, checkpoint from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "succeeded");
    assert_eq!(r.get::<_, Option<Value>>(1), Some(json!("new")));
    assert_eq!(r.get::<_, Option<Value>>(2), Some(json!({"step": 2})));
}

/// Assigns `id` to `worker` and starts it through the API.
async fn start(db: &TestDb, c: &Client, id: Uuid, worker: &str) -> AssignedTask {
    assign(c, id, worker).await;
    let mut started = start_assigned(&db.bb, worker, 10).await;
    assert_eq!(started.len(), 1);
    let t = started.pop().unwrap();
    assert_eq!(t.id, id);
    t
}

#[tokio::test]
async fn a_failed_attempt_is_retried_later_until_the_budget_is_spent() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task_with_budget(&c, 1).await;

    let t = start(&db, &c, id, "w1").await;
    assert_eq!((t.retries, t.max_retries), (0, 1));
    let failed = Outcome::Failed {
        error: "boom 1".into(),
        retry_in_ms: 60_000,
    };
    let done = db
        .bb
        .record("w1", &[finish(&t, t.epoch, failed)])
        .await
        .unwrap();
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, retries, error, assigned_to, run_at > now() + interval '30 s'
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "pending");
    assert_eq!(r.get::<_, i32>(1), 1, "retries");
    assert_eq!(r.get::<_, Option<String>>(2).as_deref(), Some("boom 1"));
    assert_eq!(r.get::<_, Option<String>>(3), None, "holder released");
    assert!(
        r.get::<_, bool>(4),
        "run_at is not pushed back by the backoff"
    );
    let reason: Option<String> = c
        .query_one(
            "select reason from artex.task_transitions where task_id = $1 order by id desc limit 1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reason.as_deref(), Some("boom 1"), "the audit says why");
    // Not runnable before its backoff ends, though a worker has free slots for its kind.
    c.batch_execute(
        "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
         values ('sim', 'sim', 1, 'test', 'artex_w_sim', array['echo'], 10)",
    )
    .await
    .unwrap();
    let read = c
        .query(
            DISPATCH_SQL,
            &[&600.0f64, &10i64, &1i32, &Vec::<i32>::new()],
        )
        .await
        .unwrap();
    let roster: Vec<String> = read.iter().filter_map(|r| r.get(0)).collect();
    let claimed = read
        .iter()
        .filter(|r| r.get::<_, Option<Uuid>>(5).is_some())
        .count();
    assert_eq!(
        roster,
        ["sim"],
        "a worker with a free slot for it is on the roster"
    );
    assert_eq!(claimed, 0, "claimed during its backoff");

    let t = start(&db, &c, id, "w1").await;
    assert_eq!((t.retries, t.max_retries), (1, 1));
    let failed = Outcome::Failed {
        error: "boom 2".into(),
        retry_in_ms: 60_000,
    };
    let done = db
        .bb
        .record("w1", &[finish(&t, t.epoch, failed)])
        .await
        .unwrap();
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, retries, error, finished_at is not null
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "failed", "at the budget");
    assert_eq!(r.get::<_, i32>(1), 2);
    assert_eq!(r.get::<_, Option<String>>(2).as_deref(), Some("boom 2"));
    assert!(r.get::<_, bool>(3), "finished_at");
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried_and_ends_timeout_at_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let timed_out = || Outcome::TimedOut {
        error: "too slow".into(),
        retry_in_ms: 10,
    };

    let id = insert_task_with_budget(&c, 1).await;
    let t = start(&db, &c, id, "w1").await;
    db.bb
        .record("w1", &[finish(&t, t.epoch, timed_out())])
        .await
        .unwrap();
    assert_eq!(
        status_of(&c, id).await,
        "pending",
        "retried within the budget"
    );
    let t = start(&db, &c, id, "w1").await;
    let done = db
        .bb
        .record("w1", &[finish(&t, t.epoch, timed_out())])
        .await
        .unwrap();
    assert_eq!(done, [id]);
    assert_eq!(status_of(&c, id).await, "timeout", "at the budget");

    // Released: back to pending, no attempt counted.
    let id = insert_task_with_budget(&c, 0).await;
    let t = start(&db, &c, id, "w1").await;
    db.bb
        .record("w1", &[finish(&t, t.epoch, Outcome::Released)])
        .await
        .unwrap();
    let r = c
        .query_one(
            "select status::text, retries from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, String>(0), r.get::<_, i32>(1)),
        ("pending".into(), 0)
    );
}

#[tokio::test]
async fn the_trigger_ends_a_retry_past_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let cases = [
        ("running", None, "timeout"),
        ("running", Some("boom"), "failed"),
        ("assigned", Some("boom"), "timeout"),
    ];
    for (from, error, expected) in cases {
        let id = task_in(&c, from).await;
        c.execute(
            "update artex.tasks set status = 'pending', retries = max_retries + 1,
                 error = coalesce($2, error)
             where id = $1",
            &[&id, &error],
        )
        .await
        .unwrap_or_else(|e| panic!("{from} -> pending past the budget: {}", msg(&e)));
        let r = c
            .query_one(
                "select status::text, assigned_to, finished_at is not null
                 from artex.tasks where id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(
            r.get::<_, String>(0),
            expected,
            "{from} with error {error:?}"
        );
        assert_eq!(r.get::<_, Option<String>>(1), None);
        assert!(r.get::<_, bool>(2), "finished_at");
        assert_eq!(
            transitions(&c, id).await.last().unwrap(),
            &pair(Some(from), expected),
            "the audit records where it ended"
        );
    }
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
        bb.renew_leases("w1", &[(id, t.epoch)], 60.0).await.unwrap(),
        [(id, true)]
    );
    c.execute(
        "update artex.tasks set lease_until = lease_until + interval '1 minute' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert!(bb
        .save_checkpoint(id, t.epoch, &json!({"done": 3}))
        .await
        .unwrap());
    assert_eq!(
        (transitions(&c, id).await, events(&c, id).await),
        before,
        "renewals and checkpoints are not transitions"
    );

    let done = bb
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

#[tokio::test]
async fn a_plain_insert_of_a_pending_task_notifies_listeners() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut listener = db.bb.listen(&[TASKS_CHANNEL.to_string()]).await.unwrap();
    assert_eq!(TASKS_CHANNEL, "artex_tasks");
    insert_task(&c).await;
    let got = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("no notification within 10 s");
    assert_eq!(got.map(|n| n.channel).as_deref(), Some("artex_tasks"));
}

/// Whether a plan (EXPLAIN's JSON) walks the index `name` anywhere.
fn uses_index(plan: &Value, name: &str) -> bool {
    match plan {
        Value::Object(o) => {
            o.get("Index Name").and_then(Value::as_str) == Some(name)
                || o.values().any(|v| uses_index(v, name))
        }
        Value::Array(a) => a.iter().any(|v| uses_index(v, name)),
        _ => false,
    }
}

#[tokio::test]
async fn the_claim_query_uses_the_runnable_index_on_100k_tasks() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // 99,000 tasks that are not runnable and 1,000 that are. (Paused at insert, which is
    // legal: moving 99,000 rows in one UPDATE would hit the trigger's quadratic join, see
    // `a_bulk_update_does_not_join_old_and_new_rows_in_a_nested_loop`. The index's predicate does not
    // care which non-pending status a row has.)
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority, status)
             select 'echo', jsonb_build_object('n', g), g % 3, 'paused'
             from generate_series(1, 99000) g;
         insert into artex.tasks (kind, payload, priority)
             select 'echo', jsonb_build_object('n', g), g % 3 from generate_series(1, 1000) g;
         analyze artex.tasks;",
    )
    .await
    .unwrap();
    let counts: Vec<(String, i64)> = c
        .query(
            "select status::text, count(*) from artex.tasks group by 1 order by 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counts,
        [("paused".to_string(), 99000), ("pending".to_string(), 1000)]
    );

    // A worker that runs both kinds, with room for every task: the claim's kinds come
    // from the roster.
    c.batch_execute(&format!(
        "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
             values ('sim', 'sim', 1, 'test', 'artex_w_sim', array['echo', 'sleep'], 100000);
         prepare claim(float8, int8, int4, int4[]) as {DISPATCH_SQL}"
    ))
    .await
    .unwrap();
    // The scanner's arguments: every shard, then two shards of four (several planners).
    // A prepared statement runs custom plans first and then the generic plan when it is
    // no dearer: the unsharded query must use the index either way. Sharded, the custom
    // plan may underestimate `shard % n = any(...)` (1 %) and prefer another path; the
    // generic plan, which the statement settles on, uses the index.
    let cases = [
        ("force_custom_plan", "600, 100, 1, '{}'"),
        ("force_generic_plan", "600, 100, 1, '{}'"),
        ("force_generic_plan", "600, 100, 4, '{0,2}'"),
    ];
    for (mode, args) in cases {
        c.batch_execute(&format!("set plan_cache_mode = {mode}"))
            .await
            .unwrap();
        let plan: Value = c
            .query_one(&format!("explain (format json) execute claim({args})"), &[])
            .await
            .unwrap()
            .get(0);
        assert!(
            uses_index(&plan, "tasks_runnable"),
            "{mode}, claim({args}) does not use tasks_runnable:\n{plan:#}"
        );
    }
}

#[tokio::test]
async fn a_held_task_cannot_be_deleted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for status in ["assigned", "running"] {
        let id = task_in(&c, status).await;
        let before = snapshot(&c, id).await;
        let e = c
            .execute("delete from artex.tasks where id = $1", &[&id])
            .await
            .err()
            .unwrap_or_else(|| panic!("deleting a {status} task was accepted"));
        assert!(msg(&e).contains("cancel it before deleting"), "{}", msg(&e));
        assert_eq!(snapshot(&c, id).await, before);
    }
    for status in ["pending", "succeeded", "canceled"] {
        let id = task_in(&c, status).await;
        let n = c
            .execute("delete from artex.tasks where id = $1", &[&id])
            .await
            .unwrap_or_else(|e| panic!("deleting a {status} task: {}", msg(&e)));
        assert_eq!(n, 1, "a {status} task can be deleted");
    }
}

/// A sweep that may take back nothing per statement would loop forever: a batch below 1
/// is refused at once, saying what was wrong, before the sweep changes anything.
#[tokio::test]
async fn a_reap_with_an_empty_batch_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    let before = snapshot(&c, id).await;
    // An hour on, the lease has expired: a real sweep would take the task back.
    let params = ReapParams {
        batch: 0,
        ..reap_params(Utc::now() + chrono::Duration::hours(1))
    };
    let reaped = tokio::time::timeout(Duration::from_secs(5), db.bb.reap("reaper", &params))
        .await
        .expect("reap with batch 0 did not return within 5 s");
    match reaped {
        Err(artex_actors::Error::Invalid(m)) => {
            assert_eq!(m, "reap batch: 0; expected at least 1")
        }
        other => panic!("reap with batch 0: expected it refused as invalid, got {other:?}"),
    }
    assert_eq!(snapshot(&c, id).await, before);
}

/// Plans (EXPLAIN JSON) of `node` and below that join two transition tables in a nested
/// loop: transition tables have no index, so such a join compares every pair of rows.
fn nested_loops_over_transition_tables(node: &Value) -> usize {
    fn tuplestore_scans(node: &Value) -> usize {
        let here = usize::from(node["Node Type"] == "Named Tuplestore Scan");
        here + children(node).map(tuplestore_scans).sum::<usize>()
    }
    fn children(node: &Value) -> impl Iterator<Item = &Value> {
        node["Plans"].as_array().into_iter().flatten()
    }
    let here = usize::from(node["Node Type"] == "Nested Loop" && tuplestore_scans(node) >= 2);
    here + children(node)
        .map(nested_loops_over_transition_tables)
        .sum::<usize>()
}

#[tokio::test]
async fn a_bulk_update_does_not_join_old_and_new_rows_in_a_nested_loop() {
    const N: usize = 20_000;
    let db = TestDb::new().await;
    // auto_explain reports the plans of the trigger's statements as notices.
    let (c, mut connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    // paused -> pending wakes the planner, so the statement's `exists` stops at the first
    // row and the test stays fast whatever the plan; the plan is the same either way.
    c.batch_execute(&format!(
        "insert into artex.tasks (kind, status) select 'echo', 'paused'
             from generate_series(1, {N});
         load 'auto_explain';
         set auto_explain.log_min_duration = 0;
         set auto_explain.log_nested_statements = on;
         set auto_explain.log_format = json;
         set client_min_messages = log;
         update artex.tasks set status = 'pending';
         reset client_min_messages;"
    ))
    .await
    .unwrap();
    drop(c);
    let mut joins = 0;
    while let Some(m) = notices.recv().await {
        let Some(start) = m.find('{') else { continue };
        let logged: Value = serde_json::from_str(&m[start..])
            .unwrap_or_else(|e| panic!("auto_explain output {m:?}: {e}"));
        let text = logged["Query Text"].as_str().unwrap_or_default();
        if !text.contains("old_rows") {
            continue;
        }
        joins += 1;
        assert_eq!(
            nested_loops_over_transition_tables(&logged["Plan"]),
            0,
            "quadratic join of the {N} updated rows:\n{text}\n{:#}",
            logged["Plan"]
        );
    }
    assert!(
        joins >= 2,
        "auto_explain reported {joins} joins of old_rows"
    );
}

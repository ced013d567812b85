//! Fair dispatch (`artex kind limit K --fair`, migrations/V43): a fair kind's tasks are
//! handed out round-robin across their limit keys, so a key with a backlog does not hold
//! back one with a few; priority still orders a key's tasks; nothing waits while there is
//! room. Through the Assigner's rounds, and through three real planner processes.

use std::time::Duration;

use artex_actors::assigner::Assigner;
use artex_actors::blackboard::{LimitSpec, NewTask};
use serde_json::json;

use crate::common::procs::{wait_count, wait_for, Proc};
use crate::common::{count, fixtures, run_cli, TestDb};

fn keyed(kind: &str, key: &str, priority: i32, n: i32) -> Vec<NewTask> {
    (0..n)
        .map(|i| NewTask {
            limit_key: Some(key.into()),
            priority,
            ..NewTask::new(kind, json!({ "key": key, "n": i }))
        })
        .collect()
}

/// `n` tasks of `sleep` for `ms` each with the limit key `key`.
fn sleeps(key: &str, n: usize, ms: u64) -> Vec<NewTask> {
    (0..n)
        .map(|i| NewTask {
            limit_key: Some(key.into()),
            ..NewTask::new("sleep", json!({ "ms": ms, "n": i }))
        })
        .collect()
}

/// The tasks a worker holds (running or queued).
const HELD: &str = "select count(*) from artex.tasks where assigned_to is not null";

/// Waits until a task runs and the worker holds at least `held` tasks.
async fn wait_holding(c: &tokio_postgres::Client, held: i64) {
    wait_for(
        &format!("a task running and {held} held"),
        Duration::from_secs(30),
        || async {
            let started = count(
                c,
                "select count(*) from artex.tasks where started_at is not null",
            )
            .await;
            (started >= 1 && count(c, HELD).await >= held).then_some(())
        },
    )
    .await;
}

/// Waits until `n` tasks of the key `key` succeeded.
async fn wait_succeeded(c: &tokio_postgres::Client, key: &str, n: i64) {
    wait_count(
        c,
        &format!(
            "select count(*) from artex.tasks where limit_key = '{key}' and status = 'succeeded'"
        ),
        n,
        Duration::from_secs(60),
    )
    .await;
}

/// One round with four free slots per kind: the fair kind gives each key its turn (two
/// of the backlog's, two of the late key's), the same tasks of a kind limited but not
/// fair go by age (four of the backlog's), a fair kind with one key fills every slot,
/// and a key's high-priority task comes first within its turn.
#[tokio::test]
async fn a_round_gives_every_key_of_a_fair_kind_its_turn() {
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w-fair", &["fair"], 4).await;
    fixtures::worker(&db.bb, "w-unfair", &["unfair"], 4).await;
    fixtures::worker(&db.bb, "w-solo", &["solo"], 4).await;
    let fair = LimitSpec {
        fair: true,
        ..LimitSpec::default()
    };
    let unfair = LimitSpec {
        key_concurrency: Some(100),
        ..LimitSpec::default()
    };
    ops.set_kind_limit("fair", &fair, "test").await.unwrap();
    ops.set_kind_limit("solo", &fair, "test").await.unwrap();
    ops.set_kind_limit("unfair", &unfair, "test").await.unwrap();
    for kind in ["fair", "unfair"] {
        ops.submit_many(&keyed(kind, "big", 0, 40), "test")
            .await
            .unwrap();
        ops.submit_many(&keyed(kind, "big", 5, 1), "test")
            .await
            .unwrap();
        ops.submit_many(&keyed(kind, "small", 0, 3), "test")
            .await
            .unwrap();
    }
    ops.submit_many(&keyed("solo", "only", 0, 10), "test")
        .await
        .unwrap();
    Assigner::run_once(&db.bb.planner(), &crate::round_config())
        .await
        .unwrap();
    let c = db.client().await;
    let rows = c
        .query(
            "select kind, limit_key, priority, count(*) from artex.tasks
             where assigned_to is not null group by 1, 2, 3 order by 1, 2, 3",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, i32, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let row = |k: &str, key: &str, p: i32, n: i64| (k.to_string(), key.to_string(), p, n);
    assert_eq!(
        got,
        [
            // Turn 1: big's high-priority task and small's first; turn 2: one of each.
            row("fair", "big", 0, 1),
            row("fair", "big", 5, 1),
            row("fair", "small", 0, 2),
            row("solo", "only", 0, 4),
            // By priority, then age: the backlog's.
            row("unfair", "big", 0, 3),
            row("unfair", "big", 5, 1),
        ]
    );
    let shown = ops.kind_limits(Some("fair")).await.unwrap();
    assert!(shown[0].fair, "{shown:?}");
}

/// `artex kind limit sleep --fair` with three planner processes and one worker running
/// two tasks at a time: three tasks of a late key all start before the backlog of 60
/// submitted ahead of them is a third through (by age alone they would start last).
#[tokio::test]
async fn three_planners_hand_a_late_key_its_turn_past_a_backlog() {
    let db = TestDb::new().await;
    let (code, out, err) = run_cli(&db.url, &["kind", "limit", "sleep", "--fair", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["limits"]["fair"],
        json!(true),
        "{out}"
    );
    let ops = db.bb.operator();
    ops.submit_many(&sleeps("big", 60, 100), "test")
        .await
        .unwrap();
    ops.submit_many(&sleeps("small", 3, 100), "test")
        .await
        .unwrap();
    let _planners: Vec<Proc> = (1..=3)
        .map(|i| Proc::planner(&format!("planner-{i}"), &db.url, &[]))
        .collect();
    let _w = Proc::worker("worker", &db.url, &["--concurrency", "2"]);
    let c = db.client().await;
    wait_succeeded(&c, "small", 3).await;
    let before = count(
        &c,
        "select count(*) from artex.tasks b where b.limit_key = 'big' and b.started_at <
             (select max(s.started_at) from artex.tasks s where s.limit_key = 'small')",
    )
    .await;
    assert!(
        before < 20,
        "{before} of the backlog started before the late key's last"
    );
}

/// A worker's local queue takes a fair kind's turns too: with forty tasks queued on one
/// slot (`--prefetch 40`), a late key's task starts next once it is queued, not after the
/// whole queue (migrations/V44, worker/turns.rs): at most the big tasks that start while
/// it is on its way there go ahead of it.
#[tokio::test]
async fn a_workers_local_queue_gives_a_late_key_its_turn() {
    let db = TestDb::new().await;
    let (code, _, err) = run_cli(&db.url, &["kind", "limit", "sleep", "--fair"]);
    assert_eq!(code, 0, "{err}");
    let ops = db.bb.operator();
    ops.submit_many(&sleeps("big", 30, 50), "test")
        .await
        .unwrap();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker(
        "worker",
        &db.url,
        &["--concurrency", "1", "--prefetch", "40"],
    );
    let c = db.client().await;
    wait_holding(&c, 21).await;
    ops.submit_many(&sleeps("small", 1, 50), "test")
        .await
        .unwrap();
    wait_succeeded(&c, "small", 1).await;
    let ahead = count(
        &c,
        "select count(*) from artex.tasks b, artex.tasks s
         where b.limit_key = 'big' and s.limit_key = 'small'
           and b.started_at > s.created_at and b.started_at < s.started_at",
    )
    .await;
    let queued = count(
        &c,
        "select count(*) from artex.tasks where limit_key = 'big' and started_at is null",
    )
    .await;
    assert!(
        ahead <= 2,
        "{ahead} queued tasks of the big key started between the late task's submission and its start ({queued} still waiting)"
    );
}

/// A busy worker keeps its last queue place for a fair kind's key that holds no task
/// (migrations/V48): with one slot and a queue of three (`--prefetch 3`) full of the
/// backlog's three-second tasks, a late key's task is assigned at once, before the
/// backlog's first ends, where without the kept place it would wait for that end.
#[tokio::test]
async fn a_busy_worker_keeps_a_place_for_a_late_key() {
    let db = TestDb::new().await;
    let (code, _, err) = run_cli(&db.url, &["kind", "limit", "sleep", "--fair"]);
    assert_eq!(code, 0, "{err}");
    let ops = db.bb.operator();
    ops.submit_many(&sleeps("big", 10, 3000), "test")
        .await
        .unwrap();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker(
        "worker",
        &db.url,
        &["--concurrency", "1", "--prefetch", "3"],
    );
    let c = db.client().await;
    wait_holding(&c, 3).await;
    assert_eq!(
        count(&c, HELD).await,
        3,
        "the worker holds four places, one kept"
    );
    ops.submit_many(&sleeps("small", 1, 10), "test")
        .await
        .unwrap();
    wait_count(
        &c,
        "select count(*) from artex.tasks
         where limit_key = 'small' and (assigned_to is not null or status = 'succeeded')",
        1,
        Duration::from_secs(30),
    )
    .await;
    let ended = count(
        &c,
        "select count(*) from artex.tasks where limit_key = 'big' and finished_at is not null",
    )
    .await;
    assert_eq!(
        ended, 0,
        "the late task was assigned only after the backlog's first task ended"
    );
}

/// A kind that is only fair has no limit to exceed: a round's write neither locks its
/// row of `artex.kind_limits` nor counts what the fleet holds of it (V66), so a
/// transaction holding that row (an operator changing the kind, another planner's
/// write) does not hold its assignments back. A kind with a limit still waits for its
/// row: its count must see every assignment before it.
#[tokio::test]
async fn a_fair_kind_s_round_does_not_wait_for_its_kind_s_row() {
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w-fair", &["fair"], 4).await;
    fixtures::worker(&db.bb, "w-capped", &["capped"], 4).await;
    let fair = LimitSpec {
        fair: true,
        ..LimitSpec::default()
    };
    let capped = LimitSpec {
        concurrency: Some(2),
        ..LimitSpec::default()
    };
    ops.set_kind_limit("fair", &fair, "test").await.unwrap();
    ops.set_kind_limit("capped", &capped, "test").await.unwrap();
    let holder = db.client().await;
    let c = db.client().await;
    let round = || {
        let planner = db.bb.planner();
        tokio::spawn(async move { Assigner::run_once(&planner, &crate::round_config()).await })
    };
    let held = |kind: &'static str| {
        let c = &c;
        async move {
            count(
                c,
                &format!("select count(*) from artex.tasks where kind = '{kind}' and assigned_to is not null"),
            )
            .await
        }
    };
    // The fair kind's row held: its round goes through.
    ops.submit_many(&keyed("fair", "a", 0, 3), "test")
        .await
        .unwrap();
    holder
        .batch_execute("begin; select 1 from artex.kind_limits where kind = 'fair' for update")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), round())
        .await
        .expect("the round waited for the fair kind's row")
        .unwrap()
        .unwrap();
    assert_eq!(held("fair").await, 3);
    holder.batch_execute("rollback").await.unwrap();
    // The capped kind's row held: its round waits for it, then counts.
    ops.submit_many(&keyed("capped", "a", 0, 3), "test")
        .await
        .unwrap();
    holder
        .batch_execute("begin; select 1 from artex.kind_limits where kind = 'capped' for update")
        .await
        .unwrap();
    let mut waiting = round();
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut waiting)
            .await
            .is_err(),
        "a round of a kind with a limit went by its row's lock"
    );
    holder.batch_execute("rollback").await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the round once the row was free")
        .unwrap()
        .unwrap();
    assert_eq!(held("capped").await, 2, "its limit of 2 holds");
}

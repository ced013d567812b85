//! Planners: several at once never assign a task twice, a stopped one leaves the work
//! to another, NOTIFY dispatches at once (and its listener reconnects), the poll catches
//! what no notification announced, a quiet fleet's worker claims a new task itself, and a
//! task submitted to an idle fleet is born assigned to its worker.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use nix::sys::signal::Signal;
use serde_json::json;

use super::{assert_no_double_run, tasks, wait_all_finished, ASSIGNMENT_ROWS};
use crate::common::procs::{
    planner_counter, planner_metrics, planner_rounds_pass, wait_for, wait_status, worker_id, Proc,
};
use crate::common::{count, TestDb};

#[tokio::test]
async fn three_planners_never_assign_a_task_twice() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("planner{i}"), &db.url, &["--batch", "50"]))
        .collect();
    let workers: Vec<Proc> = (0..3)
        .map(|i| Proc::worker(&format!("worker{i}"), &db.url, &["--concurrency", "20"]))
        .collect();
    for w in &workers {
        worker_id(&c, w).await;
    }
    // Submitted in waves so every planner is woken many times and they race.
    for wave in 0..30 {
        let batch: Vec<NewTask> = (0..100)
            .map(|i| NewTask::new("echo", json!({ "wave": wave, "i": i })))
            .collect();
        db.bb.operator().submit_many(&batch, "test").await.unwrap();
    }
    wait_all_finished(&c, Duration::from_secs(120)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'"
        )
        .await,
        3000
    );
    // A task is assigned again only after it was taken back (its worker was declared
    // gone under load, say): never while another worker holds it.
    let assignments = count(
        &c,
        &format!("select count(*) from artex.task_transitions where {ASSIGNMENT_ROWS}"),
    )
    .await;
    assert!(
        assignments >= 3000,
        "{assignments} assignments in the history"
    );
    let assigned_without_release = count(
        &c,
        &format!(
            "select count(*) from (
                 select task_id,
                        count(*) filter (where {ASSIGNMENT_ROWS}) as assignments,
                        count(*) filter (where to_status = 'pending'
                                         and from_status in ('assigned', 'running')) as releases
                 from artex.task_transitions group by task_id) x
             where assignments > releases + 1"
        ),
    )
    .await;
    assert_eq!(assigned_without_release, 0);
    assert_no_double_run(&c).await;
    // (Which planner made each assignment is no longer in the history since V10: an
    // assignment followed by a start has no row of its own, and the start names the
    // worker, not the planner.)
}

#[tokio::test]
async fn a_stopped_planner_leaves_the_work_to_another() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut p1 = Proc::planner("planner1", &db.url, &[]);
    let _p2 = Proc::planner("planner2", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    worker_id(&c, &w).await;
    // Its stop signals are in place once it logs (a SIGTERM before the process reaches
    // them ends it as the default action does: seen on a loaded CI host).
    wait_for("planner1 starting", Duration::from_secs(30), || async {
        p1.log_text().contains("planner starting").then_some(())
    })
    .await;
    p1.signal(Signal::SIGTERM);
    let status = p1
        .wait_exit(Duration::from_secs(10))
        .expect("planner exits");
    assert!(status.success());
    db.bb
        .operator()
        .submit_many(&tasks("echo", 50, json!({})), "test")
        .await
        .unwrap();
    wait_all_finished(&c, Duration::from_secs(30)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'"
        )
        .await,
        50
    );
}

#[tokio::test]
async fn notify_dispatches_at_once_and_a_dropped_listener_reconnects() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Polls so slow that only NOTIFY (or the reconnect rescan) can explain a dispatch.
    let _p = Proc::planner("planner", &db.url, &["--planner-poll-ms", "600000"]);
    let w = Proc::worker("worker", &db.url, &["--worker-poll-ms", "600000"]);
    worker_id(&c, &w).await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({"n": 1})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(10)).await;
    // Cut every LISTEN session: both reconnect, re-LISTEN and rescan.
    let cut = count(
        &c,
        "select count(pg_terminate_backend(pid)) from pg_stat_activity
         where datname = current_database() and query ilike 'listen%'",
    )
    .await;
    assert!(
        cut >= 2,
        "expected the planner's and the worker's LISTEN sessions, cut {cut}"
    );
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({"n": 2})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
}

#[tokio::test]
async fn the_poll_catches_tasks_that_no_notification_announces() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    worker_id(&c, &w).await;
    // Due in an hour, then moved by plain SQL to a second and a half from now, in a
    // transaction that defers its wake-ups (as a worker's outcomes do, which send their
    // own): the insert announced an hour, and nothing announces the new time.
    let id = submit_echo_due(&db, chrono::Duration::hours(1)).await;
    c.batch_execute(&format!(
        "begin;
         select artex.defer_wakeups();
         update artex.tasks set run_at = now() + interval '1.5 seconds' where id = '{id}';
         commit"
    ))
    .await
    .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
    let t = db.bb.operator().task(id).await.unwrap();
    assert!(t.started_at.unwrap() >= t.run_at);
}

#[tokio::test]
async fn tasks_due_later_start_when_due_without_a_poll() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Polls so slow that only the planner's timer for the due time (V57) can explain a
    // start within the test.
    let _p = Proc::planner("planner", &db.url, &["--planner-poll-ms", "600000"]);
    let w = Proc::worker("worker", &db.url, &["--worker-poll-ms", "600000"]);
    worker_id(&c, &w).await;
    // Due later at its insert.
    let delayed = submit_echo_due(&db, chrono::Duration::milliseconds(1500)).await;
    // Due later at its retry: the first attempt fails, to be retried in 1.5 s.
    let retried = db
        .bb
        .operator()
        .submit(
            &NewTask::new("fail", json!({"times": 1, "then": "retry_at", "ms": 1500})),
            "test",
        )
        .await
        .unwrap();
    // Due in an hour at its insert, then moved by plain SQL to 4 s from now (V60):
    // after the others are done, so that no round for them takes it.
    let moved = submit_echo_due(&db, chrono::Duration::hours(1)).await;
    c.execute(
        "update artex.tasks set run_at = now() + interval '4 seconds' where id = $1",
        &[&moved],
    )
    .await
    .unwrap();
    wait_status(&db.bb, delayed, "succeeded", Duration::from_secs(30)).await;
    wait_status(&db.bb, retried, "succeeded", Duration::from_secs(30)).await;
    wait_status(&db.bb, moved, "succeeded", Duration::from_secs(30)).await;
    let t = db.bb.operator().task(delayed).await.unwrap();
    assert!(t.started_at.unwrap() >= t.run_at);
    let t = db.bb.operator().task(retried).await.unwrap();
    assert_eq!(t.retries, 1, "{t:?}");
    assert!(t.started_at.unwrap() >= t.run_at);
    let t = db.bb.operator().task(moved).await.unwrap();
    assert!(t.started_at.unwrap() >= t.run_at);
}

#[tokio::test]
async fn a_quiet_fleet_s_worker_claims_new_tasks_without_a_round() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let p = Proc::planner("planner", &db.url, &["--metrics", "127.0.0.1:0"]);
    // Its poll never comes: a task it holds was claimed at a planner's wake-up.
    let w = Proc::worker("worker", &db.url, &["--worker-poll-ms", "600000"]);
    worker_id(&c, &w).await;
    let metrics = planner_metrics(&p).await;
    let assigned = || planner_counter(&metrics, "artex_planner_assignments_total");
    let mut assigned_before = None;
    let mut claimed = 0;
    for n in 0..6 {
        // Traced: a traced task is never born assigned to the worker's offered slot
        // (V62), so that the wake-up and claim of V52 are what is tested here.
        let task = NewTask {
            traceparent: Some(format!("00-{:032x}-{:016x}-01", 0xabc0 + n, 0x10 + n)),
            ..NewTask::new("echo", json!({ "n": n }))
        };
        let id = db.bb.operator().submit(&task, "test").await.unwrap();
        wait_status(&db.bb, id, "succeeded", Duration::from_secs(10)).await;
        // Two more rounds: the second began after this task ended, and saw the worker
        // idle and nothing waiting.
        planner_rounds_pass(&metrics, 2.0).await;
        // The first may be a round's: the planner had not seen the worker idle yet. A
        // later one too, now and then, on a loaded machine: a round follows each wake-up
        // 5 ms later and takes a task whose claim has not begun.
        let now = assigned();
        if assigned_before == Some(now) {
            claimed += 1;
        }
        assigned_before = Some(now);
    }
    assert!(
        claimed > 0,
        "rounds assigned all of the five tasks submitted while the worker was idle: none \
         was claimed at a planner's wake-up"
    );
    assert_no_double_run(&c).await;
}

/// A task submitted to an idle fleet is born assigned to the slot its worker offered
/// (migrations/V62): its assignment is dated at its insert, so no round nor claim took
/// it; the planner passed the insert's `given:` on to the worker, whose poll never
/// comes; and the worker offered again for the next task.
#[tokio::test]
async fn a_task_submitted_to_an_idle_fleet_is_born_assigned_to_its_worker() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &["--planner-poll-ms", "600000"]);
    let w = Proc::worker("worker", &db.url, &["--worker-poll-ms", "600000"]);
    worker_id(&c, &w).await;
    for n in 0..3 {
        wait_for("the worker's offer", Duration::from_secs(30), || async {
            let offers: i64 = c
                .query_one("select count(*) from artex.worker_offers", &[])
                .await
                .unwrap()
                .get(0);
            (offers == 1).then_some(())
        })
        .await;
        let id = db
            .bb
            .operator()
            .submit(&NewTask::new("echo", json!({ "n": n })), "test")
            .await
            .unwrap();
        wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
        let born: bool = c
            .query_one(
                "select h.assigned_at = t.created_at
                 from artex.task_transitions h join artex.tasks t on t.id = h.task_id
                 where h.task_id = $1 and h.to_status = 'running'",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            born,
            "task {n} was assigned after its insert, not born assigned"
        );
    }
    assert_no_double_run(&c).await;
}

/// A task born assigned to a worker whose process was just killed (its row still online,
/// heard from a moment ago) is given back as soon as the planner's push is refused, as a
/// round's task is, and runs on the other worker: not a lease (here 60 s) later. (A push
/// reset by the process being torn down gives it back at the next probe, refused.)
#[tokio::test]
async fn a_task_born_assigned_to_a_killed_worker_is_recalled_when_its_push_is_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let planner = Proc::planner("planner", &db.url, &[]);
    let long_lease = ["--lease-ms", "60000"];
    let a = Proc::worker("worker-a", &db.url, &long_lease);
    let b = Proc::worker("worker-b", &db.url, &long_lease);
    let (ida, idb) = (worker_id(&c, &a).await, worker_id(&c, &b).await);
    // Both offer; an insert takes the oldest offer.
    let oldest = wait_for("both workers' offers", Duration::from_secs(30), || async {
        let rows = c
            .query("select worker from artex.worker_offers order by id", &[])
            .await
            .unwrap();
        (rows.len() == 2).then(|| rows[0].get::<_, String>(0))
    })
    .await;
    let (victim, survivor) = if oldest == ida { (a, idb) } else { (b, ida) };
    // The planner is held still from the kill to the insert: a push to the dead worker
    // in between (refused, so its pushes are marked failing) would keep its offer from
    // being taken, and the recall this test is about would never come into play.
    planner.signal(Signal::SIGSTOP);
    victim.signal(Signal::SIGKILL);
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    planner.signal(Signal::SIGCONT);
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(20)).await;
    let steps: Vec<(String, Option<String>, Option<String>)> = c
        .query(
            "select to_status::text, reason, worker from artex.task_transitions
             where task_id = $1 order by id",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        steps.iter().any(|(to, reason, _)| to == "pending"
            && reason.as_deref() == Some(&format!("wake-up not delivered to worker {oldest}"))),
        "born assigned to the killed worker, then recalled: {steps:?}"
    );
    assert_eq!(
        steps.last().and_then(|s| s.2.clone()),
        Some(survivor),
        "{steps:?}"
    );
    drop(victim);
}

/// Submits an echo task due `after` from now.
async fn submit_echo_due(db: &TestDb, after: chrono::Duration) -> uuid::Uuid {
    let task = NewTask {
        run_at: Some(chrono::Utc::now() + after),
        ..NewTask::new("echo", json!({}))
    };
    db.bb.operator().submit(&task, "test").await.unwrap()
}

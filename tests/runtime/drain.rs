//! Graceful stops: SIGTERM drains a worker, and a drain deadline gives long tasks back
//! without counting an attempt.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use nix::sys::signal::Signal;
use serde_json::json;

use super::{assert_no_double_run, tasks, wait_all_finished};
use crate::common::procs::{http_get, wait_for, wait_status, worker_http, worker_id, Proc};
use crate::common::{count, TestDb};

#[tokio::test]
async fn sigterm_drains_a_worker_gracefully() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let mut a = Proc::worker(
        "draining",
        &db.url,
        &["--concurrency", "2", "--prefetch", "4"],
    );
    let a_id = worker_id(&c, &a).await;
    db.bb
        .operator()
        .submit_many(&tasks("sleep", 6, json!({ "ms": 1000 })), "test")
        .await
        .unwrap();
    let c2 = &c;
    let aid = a_id.clone();
    let http = worker_http(&c, &a).await;
    // Two handlers run; the other four wait in the worker's local queue, still `assigned`
    // in the blackboard.
    wait_for(
        "2 running and 4 queued on the worker",
        Duration::from_secs(20),
        || {
            let aid = aid.clone();
            let http = http.clone();
            async move {
                let r = c2
                    .query_one(
                        "select count(*) filter (where status = 'running'),
                            count(*) filter (where status = 'assigned')
                     from artex.tasks where assigned_to = $1",
                        &[&aid],
                    )
                    .await
                    .unwrap();
                let (_, body) = http_get(&http, "/status").ok()?;
                let status: serde_json::Value = serde_json::from_str(&body).ok()?;
                let running = status["running"].as_array()?.len();
                (r.get::<_, i64>(0) == 2
                    && r.get::<_, i64>(1) == 4
                    && running == 2
                    && status["queued"] == 4)
                    .then_some(())
            }
        },
    )
    .await;
    a.signal(Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(15))
        .expect("worker exits after draining");
    assert!(status.success(), "exit status {status:?}");
    // The two running tasks finished there; the four queued were given back unstarted.
    assert_eq!(
        count(&c, &format!(
            "select count(*) from artex.task_transitions where to_status = 'succeeded' and worker = '{a_id}'"
        ))
        .await,
        2
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'pending' and retries = 0 and started_at is null"
        )
        .await,
        4
    );
    let state: String = c
        .query_one(
            "select state::text from artex.workers where id = $1",
            &[&a_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "gone");
    let _b = Proc::worker("next", &db.url, &[]);
    wait_all_finished(&c, Duration::from_secs(30)).await;
    assert_no_double_run(&c).await;
}

#[tokio::test]
async fn a_drain_deadline_gives_long_tasks_back_without_counting_an_attempt() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let mut a = Proc::worker("slow", &db.url, &["--drain-ms", "300"]);
    worker_id(&c, &a).await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("sleep", json!({ "ms": 60000 })), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "running", Duration::from_secs(20)).await;
    a.signal(Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(10))
        .expect("worker exits at its deadline");
    assert!(status.success());
    let t = db.bb.operator().task(id).await.unwrap();
    assert_eq!(t.status.as_str(), "pending");
    assert_eq!(t.retries, 0);
}

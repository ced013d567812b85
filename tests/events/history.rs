//! The history: one row per real transition of a task, the assignment's kept when it
//! ends without a start, and the feed showing the rows it should.

use std::time::Duration;

use artex_actors::blackboard::{EventPosition, NewTask, ReapParams, TaskStatus};
use serde_json::json;

use crate::all_positions;
use crate::common::fixtures;
use crate::common::procs::{history_settled, wait_for, Proc};
use crate::common::{count, lines_of, TestDb};

#[tokio::test]
async fn a_task_that_ran_once_has_three_history_rows_and_the_feed_shows_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    // Leases renewed every 200 ms during a 1.5 s task; heartbeats every 200 ms.
    let _w = Proc::worker("worker", &db.url, &["--lease-ms", "600"]);
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("sleep", json!({ "ms": 1500 })), "test")
        .await
        .unwrap();
    wait_for("the task to succeed", Duration::from_secs(20), || async {
        (db.bb.operator().task(id).await.ok()?.status == TaskStatus::Succeeded).then_some(())
    })
    .await;
    let lines = lines_of(
        &c,
        "select coalesce(from_status::text, '(new)') || '>' || to_status::text
         from artex.task_transitions where task_id = $1 order by at, id",
        id,
    )
    .await;
    assert_eq!(
        lines,
        ["(new)>pending", "assigned>running", "running>succeeded"],
        "no row for lease renewals, heartbeats, or an assignment followed by a start"
    );
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        3
    );
    // The start names the worker, the fencing token and when the task was assigned.
    let task = db.bb.operator().task(id).await.unwrap();
    let trail = db.bb.operator().transitions(id).await.unwrap();
    let start = &trail[1];
    assert!(start.worker.as_deref().is_some_and(|w| !w.is_empty()));
    assert_eq!(start.lease_epoch, task.lease_epoch);
    let assigned_at = start
        .assigned_at
        .expect("the start says when it was assigned");
    assert!(task.created_at <= assigned_at && assigned_at <= start.at);
    // The feed reads the same rows, at their positions.
    history_settled(&c).await;
    let batch = db
        .bb
        .feed()
        .events_after(EventPosition::default(), 100)
        .await
        .unwrap();
    let feed: Vec<String> = batch
        .events
        .iter()
        .map(|e| format!("{:?}>{:?}", e.from, e.to))
        .collect();
    assert_eq!(
        feed,
        [
            "None>Pending",
            "Some(Assigned)>Running",
            "Some(Running)>Succeeded"
        ]
    );
    assert!(batch.events.iter().all(|e| e.kind == "sleep"));
    assert_eq!(
        batch
            .events
            .iter()
            .map(|e| e.position.to_string())
            .collect::<Vec<_>>(),
        all_positions(&c).await
    );
}

/// A task given back before it started still has its assignment in the history (written
/// when it ends, dated when it was made), though the feed does not show it.
#[tokio::test]
async fn an_assignment_that_ends_without_a_start_keeps_its_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    fixtures::worker(&db.bb, "w-test", &["echo"], 4).await;
    assert_eq!(fixtures::assign(&db.bb).await.assigned, 1);
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        1,
        "an assignment alone writes no row"
    );
    // The reaper takes it back once its lease (a minute) has run out.
    let reaped = db
        .bb
        .planner()
        .reap(
            "reaper",
            &ReapParams {
                now: Some(chrono::Utc::now() + chrono::Duration::minutes(2)),
                worker_timeout_secs: 3600.0,
                prune_after_secs: 86_400.0,
                batch: 100,
                retry_base_ms: 10.0,
                retry_cap_ms: 100.0,
                judge_liveness: true,
                upload_host_deadline_secs: 3600.0,
            },
        )
        .await
        .unwrap();
    assert_eq!(reaped.requeued, 1, "{reaped:?}");
    let trail = db.bb.operator().transitions(id).await.unwrap();
    let steps: Vec<String> = trail
        .iter()
        .map(|t| format!("{:?}>{:?} {:?}", t.from_status, t.to_status, t.worker))
        .collect();
    assert_eq!(
        steps,
        [
            "None>Pending None",
            "Some(Pending)>Assigned Some(\"w-test\")",
            "Some(Assigned)>Pending Some(\"w-test\")"
        ]
    );
    assert_eq!(trail[1].lease_epoch, 1);
    assert!(
        trail[1].at < trail[2].at,
        "the assignment is dated when it was made"
    );
    assert_eq!(trail[2].reason.as_deref(), Some("lease expired"));
    history_settled(&c).await;
    let feed = db
        .bb
        .feed()
        .events_after(EventPosition::default(), 100)
        .await
        .unwrap();
    let shown: Vec<String> = feed
        .events
        .iter()
        .map(|e| format!("{:?}>{:?}", e.from, e.to))
        .collect();
    assert_eq!(shown, ["None>Pending", "Some(Assigned)>Pending"]);
}

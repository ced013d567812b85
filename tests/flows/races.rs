//! Races: siblings completing at once promote their joins exactly once; a flow canceled
//! or paused while an upload's task joins it.

use std::time::Duration;

use artex_actors::blackboard::{Control, FlowSpec, NewTask, NewUpload, TaskStatus};
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common;
use crate::common::procs::wait_for;
use crate::common::{count, TestDb};
use crate::task;

/// 200 siblings finishing in concurrent transactions: their join is promoted exactly
/// once (a check-then-promote would leave it blocked forever when the last two finish at
/// the same moment), and two joins over the same siblings never deadlock.
#[tokio::test]
async fn concurrent_completions_of_siblings_promote_their_joins_exactly_once() {
    let db = TestDb::new().await;
    let mut tasks: Vec<Value> = (0..200)
        .map(|i| json!({"name": format!("s{i}"), "kind": "echo"}))
        .collect();
    let names: Vec<String> = (0..200).map(|i| format!("s{i}")).collect();
    let mut reversed = names.clone();
    reversed.reverse();
    tasks.push(json!({"name": "join1", "kind": "echo", "depends_on": names}));
    tasks.push(json!({"name": "join2", "kind": "echo", "depends_on": reversed}));
    let spec: FlowSpec = serde_json::from_value(json!({"name": "fanin", "tasks": tasks})).unwrap();
    let id = db.bb.operator().submit_flow(&spec, "test").await.unwrap();
    let f = db.bb.operator().flow(id).await.unwrap();
    let siblings: Vec<Uuid> = f
        .tasks
        .iter()
        .filter(|t| t.name.starts_with('s'))
        .map(|t| t.id)
        .collect();
    // Eight sessions, each finishing its share one task per transaction, all at once.
    let mut handles = Vec::new();
    for part in 0..8 {
        let mine: Vec<Uuid> = siblings.iter().skip(part).step_by(8).copied().collect();
        let url = db.url.clone();
        handles.push(tokio::spawn(async move {
            let mut c = common::connect(&url).await;
            for t in mine {
                let tx = c.transaction().await.unwrap();
                tx.execute(
                    "update artex.tasks set status = 'assigned', assigned_to = 'w',
                         lease_until = now() + interval '1 minute' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.execute(
                    "update artex.tasks set status = 'running' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.execute(
                    "update artex.tasks set status = 'succeeded', result = '{}' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.expect("a session failed (deadlock?)");
    }
    let c = db.client().await;
    for join in ["join1", "join2"] {
        let j = task(&f, join).id;
        assert_eq!(
            db.bb.operator().task(j).await.unwrap().status,
            TaskStatus::Pending
        );
        let promotions: i64 = c
            .query_one(
                "select count(*) from artex.task_transitions
                 where task_id = $1 and to_status = 'pending'",
                &[&j],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(promotions, 1, "{join}");
    }
    assert_eq!(
        count(
            &c,
            "select coalesce(sum(upstream_left), -1) from artex.task_waits"
        )
        .await,
        0
    );
}

/// How many sessions of this test's database wait for a lock.
async fn lock_waiters(c: &Client) -> i64 {
    count(
        c,
        "select count(*) from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'",
    )
    .await
}

/// Waits until `job` has ended or `n` sessions wait for a lock: a side that does not
/// wait in one build (it runs through) does in another (it waits for the other side).
async fn ended_or_waiting<T>(c: &Client, job: &tokio::task::JoinHandle<T>, n: i64, what: &str) {
    wait_for(what, Duration::from_secs(30), || async move {
        (job.is_finished() || lock_waiters(c).await >= n).then_some(())
    })
    .await;
}

/// A one-task flow (its task pending: no worker runs here) and an upload to join it.
async fn flow_and_upload(db: &TestDb) -> (Uuid, Uuid, NewUpload) {
    let spec: FlowSpec = serde_json::from_value(json!({
        "name": "upload-race", "tasks": [{"name": "a", "kind": "echo"}]
    }))
    .unwrap();
    let flow = db.bb.operator().submit_flow(&spec, "test").await.unwrap();
    let a = task(&db.bb.operator().flow(flow).await.unwrap(), "a").id;
    let upload = NewUpload {
        id: Uuid::now_v7(),
        host: "h1".into(),
        path: "/uploads/x".into(),
        size: 1,
        sha256: "0".repeat(64),
        chunks: 1,
        name: None,
        shared: true,
        flow: Some(flow),
    };
    (flow, a, upload)
}

fn record(db: &TestDb, upload: &NewUpload) -> tokio::task::JoinHandle<(Uuid, bool)> {
    let (bb, upload) = (db.bb.clone(), upload.clone());
    tokio::spawn(async move {
        let task = NewTask::new("digest", json!({"upload": {"id": upload.id}}));
        bb.worker()
            .record_upload(&upload, &task, "test")
            .await
            .unwrap()
    })
}

fn cancel(db: &TestDb, flow: Uuid) -> tokio::task::JoinHandle<Vec<(Uuid, TaskStatus)>> {
    let bb = db.bb.clone();
    tokio::spawn(async move {
        bb.operator()
            .control(Control::Cancel, flow, "test", Some("race"))
            .await
            .unwrap()
            .changed
    })
}

/// A flow canceled while an upload's task joins it: whichever commits first, the task
/// never stays runnable in the canceled flow. Each of the two interleavings is forced by
/// a test session holding a lock that one side meets after reading its snapshot: (1) the
/// cancel waits for a task's row, the upload's task joins meanwhile; (2) the upload
/// waits for its own row (the same upload in flight elsewhere), the flow is canceled
/// meanwhile. Without the flow's row lock each ends with a `pending` task that the
/// cancel never saw, in a flow whose every other task it canceled.
#[tokio::test]
async fn a_flow_canceled_while_an_uploads_task_joins_it_leaves_nothing_runnable() {
    let db = TestDb::new().await;
    let watcher = db.client().await;

    // (1) The cancel first: its task lookup waits for `a`, held by the test session.
    let (flow, a, upload) = flow_and_upload(&db).await;
    let mut holder = common::connect(&db.url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute("select 1 from artex.tasks where id = $1 for update", &[&a])
        .await
        .unwrap();
    let canceling = cancel(&db, flow);
    ended_or_waiting(&watcher, &canceling, 1, "the cancel to wait for task a").await;
    assert!(
        !canceling.is_finished(),
        "the cancel went through a held task"
    );
    let recording = record(&db, &upload);
    ended_or_waiting(&watcher, &recording, 2, "the upload to end or wait").await;
    tx.rollback().await.unwrap();
    let changed = canceling.await.unwrap();
    let (joined, wrote) = recording.await.unwrap();
    assert!(wrote);
    assert_eq!(changed, vec![(a, TaskStatus::Canceled)]);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.flow_id, Some(flow));
    assert_eq!(
        t.status,
        TaskStatus::Paused,
        "the flow was canceled before the upload's task joined it: {t:?}"
    );
    assert!(
        t.error.as_deref().unwrap_or("").contains("had ended"),
        "{t:?}"
    );

    // (2) The upload first: its row is in flight in the test session's transaction, so
    // recording it waits; the flow is canceled meanwhile.
    let (flow, a, upload) = flow_and_upload(&db).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "insert into artex.uploads (id, host, path, size, sha256, chunks, task_id)
         values ($1, 'h1', '/uploads/x', 1, repeat('0', 64), 1, $2)",
        &[&upload.id, &Uuid::now_v7()],
    )
    .await
    .unwrap();
    let recording = record(&db, &upload);
    ended_or_waiting(&watcher, &recording, 1, "the upload to wait for its row").await;
    assert!(
        !recording.is_finished(),
        "the upload went through a held row"
    );
    let canceling = cancel(&db, flow);
    ended_or_waiting(&watcher, &canceling, 2, "the cancel to end or wait").await;
    tx.rollback().await.unwrap();
    let (joined, wrote) = recording.await.unwrap();
    let changed = canceling.await.unwrap();
    assert!(wrote);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.flow_id, Some(flow));
    assert_eq!(
        t.status,
        TaskStatus::Canceled,
        "the upload's task joined the flow before it was canceled: {t:?}"
    );
    let mut changed = changed;
    changed.sort_by_key(|c| c.0);
    let mut expected = vec![(a, TaskStatus::Canceled), (joined, TaskStatus::Canceled)];
    expected.sort_by_key(|c| c.0);
    assert_eq!(changed, expected);
}

/// An upload's task joining a flow an operator paused is held paused with it (reason
/// given), and resuming the flow runs it with the rest; joining a running flow it is
/// pending at once.
#[tokio::test]
async fn an_uploads_task_joining_a_paused_flow_waits_for_the_flows_resume() {
    let db = TestDb::new().await;
    let (flow, a, upload) = flow_and_upload(&db).await;
    let paused = db
        .bb
        .operator()
        .control(Control::Pause, flow, "test", None)
        .await
        .unwrap();
    assert_eq!(paused.changed, vec![(a, TaskStatus::Paused)]);
    let (joined, wrote) = record(&db, &upload).await.unwrap();
    assert!(wrote);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.status, TaskStatus::Paused);
    let why = t.error.unwrap_or_default();
    assert!(why.contains("was paused"), "{why}");
    let resumed = db
        .bb
        .operator()
        .control(Control::Resume, flow, "test", None)
        .await
        .unwrap();
    let mut changed = resumed.changed;
    changed.sort_by_key(|c| c.0);
    let mut want = vec![(a, TaskStatus::Pending), (joined, TaskStatus::Pending)];
    want.sort_by_key(|c| c.0);
    assert_eq!(changed, want);

    // A running flow: the task is pending at once.
    let (_, _, upload) = flow_and_upload(&db).await;
    let (joined, _) = record(&db, &upload).await.unwrap();
    assert_eq!(
        db.bb.operator().task(joined).await.unwrap().status,
        TaskStatus::Pending
    );
}

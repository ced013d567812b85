//! Cancel reaches a handler whatever process runs it: a task handed over in a hot
//! upgrade is canceled through its new process, whose handler stops at once.

use std::time::Duration;

use artex_actors::blackboard::{NewTask, TaskStatus};
use serde_json::json;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::journal;
use crate::common::procs::{wait_for, wait_status, worker_http, Proc};
use crate::common::{run_cli as artex, TestDb};
use crate::{curl_upgrade, upgradable_worker, KillAll};

#[tokio::test]
async fn a_task_handed_over_in_a_hot_upgrade_is_canceled_in_its_new_process() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let bundle = keys.variant_bundles(1).remove(0).0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &[], &[]);
    let http = worker_http(&c, &gen0).await;
    // Resumable (it checkpoints each step), so the upgrade hands it to the new process.
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new(
                "journal-checkpoint",
                json!({ "file": file, "steps": 600, "ms": 100 }),
            ),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, id, "running", Duration::from_secs(20)).await;

    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    gen0.wait_exit(Duration::from_secs(30)).expect("gen0 exits");
    // The new process runs it: cancel that execution at once. (Under load the cancel
    // used to reach the row before the worker told the handler, whose next checkpoint
    // then read "lease lost" and ended the execution "stopped": the checkpoint now says
    // it was canceled.)
    wait_for(
        "the new process to resume the task",
        Duration::from_secs(45),
        || async {
            journal::read(&file)
                .iter()
                .any(|l| l.pid == new && l.what == "start")
                .then_some(())
        },
    )
    .await;

    let (code, _, err) = artex(
        &db.url,
        &["cancel", &id.to_string(), "--reason", "not needed"],
    );
    assert_eq!(code, 0, "{err}");
    wait_for(
        "the new process's handler to stop, told it was canceled",
        Duration::from_secs(10),
        || async {
            journal::read(&file)
                .iter()
                .any(|l| l.pid == new && l.what == "end" && l.how == "canceled")
                .then_some(())
        },
    )
    .await;
    let task = db.bb.operator().task(id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Canceled);
    let last = db
        .bb
        .operator()
        .transitions(id)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(last.reason.as_deref(), Some("not needed"));
    // Every execution ended: none runs on in either process.
    let lines = journal::read(&file);
    let starts = lines.iter().filter(|l| l.what == "start").count();
    let ends = lines.iter().filter(|l| l.what == "end").count();
    assert_eq!(starts, ends, "{lines:?}");
}

/// A cancel that reaches the row of a checkpointing task before its worker tells the
/// handler (here no planner runs to push the cancel to the worker, which learns of it
/// only at its next renewal, 3 s apart): the handler's next checkpoint finds the task
/// canceled, says so, and the execution ends "canceled", not as a lost lease.
#[tokio::test]
async fn a_cancel_found_by_a_checkpoint_stops_the_handler_as_canceled() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let planner = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &["--lease-ms", "9000"]);
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new(
                "journal-checkpoint",
                json!({ "file": file, "steps": 600, "ms": 100 }),
            ),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, id, "running", Duration::from_secs(20)).await;
    drop(planner);
    let (code, _, err) = artex(&db.url, &["cancel", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    wait_for("the execution to end", Duration::from_secs(15), || async {
        journal::read(&file)
            .iter()
            .any(|l| l.what == "end")
            .then_some(())
    })
    .await;
    let lines = journal::read(&file);
    assert!(
        lines.iter().any(|l| l.what == "end" && l.how == "canceled"),
        "{lines:?}\n{}",
        w.log_text()
    );
    assert!(!w.log_text().contains("lease lost"), "{}", w.log_text());
}

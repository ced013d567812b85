//! Cancel reaches a handler whatever process runs it: a task handed over in a hot
//! upgrade is canceled through its new process, whose handler stops at once.

use std::time::Duration;

use artex_actors::blackboard::{NewTask, TaskStatus};
use serde_json::json;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{wait_for, wait_status, worker_http, Proc};
use crate::common::{run_cli as artex, TestDb};
use crate::{curl_upgrade, upgradable_worker, KillAll};

/// The journal's lines: (pid, "start"|"end", how, unix ms).
fn journal_of(file: &std::path::Path) -> Vec<(i32, String, String, u128)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[2].parse().unwrap(),
                f[3].to_string(),
                f.get(5).unwrap_or(&"").to_string(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

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
    // The new process runs it, and has for 2.5 s (past its first lease renewals): under
    // full-suite load its first execution there was seen to end about a second after
    // the resume with "lease lost" (a separate problem, reported in the session note of
    // 2026-12-02), and be started again later; what is tested here is the cancel of an
    // execution that runs in the new process.
    wait_for(
        "the new process to run the task for 2.5 s",
        Duration::from_secs(45),
        || async {
            let lines = journal_of(&file);
            let last = lines.last()?;
            let steady =
                last.0 == new && last.1 == "start" && unix_ms().saturating_sub(last.3) >= 2500;
            steady.then_some(())
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
            journal_of(&file)
                .iter()
                .any(|(pid, what, how, _)| *pid == new && what == "end" && how == "canceled")
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
    let lines = journal_of(&file);
    let starts = lines.iter().filter(|l| l.1 == "start").count();
    let ends = lines.iter().filter(|l| l.1 == "end").count();
    assert_eq!(starts, ends, "{lines:?}");
}

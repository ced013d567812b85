//! An upload's task is bound to the host holding the file: it fails, saying why, once
//! that host's workers are gone past the deadline.

use std::time::Duration;

use serde_json::json;

use crate::common;
use crate::common::procs::{worker_http, Proc};
use crate::common::{fixtures, TestDb};
use crate::{call, data, send_all, sha, token_file};

/// Reaper settings for a direct run of the upload guard.
fn guard_params(deadline_secs: f64, judge: bool) -> artex_actors::blackboard::ReapParams {
    artex_actors::blackboard::ReapParams {
        now: None,
        worker_timeout_secs: 10.0,
        prune_after_secs: 3600.0,
        batch: 100,
        retry_base_ms: 10.0,
        retry_cap_ms: 100.0,
        judge_liveness: judge,
        upload_host_deadline_secs: deadline_secs,
    }
}

#[tokio::test]
async fn a_task_whose_hosts_workers_are_gone_past_the_deadline_fails_saying_why() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Workers: one host gone an hour ago (two rows, both gone), one gone a minute ago,
    // one with a live worker.
    for (id, host, state, ago) in [
        ("a:1:x", "host-a", "gone", "2 hours"),
        ("a:2:x", "host-a", "gone", "1 hour"),
        ("b:1:x", "host-b", "gone", "1 minute"),
        ("c:1:x", "host-c", "online", "1 second"),
    ] {
        fixtures::raw::worker_seen(&c, id, host, state, ago).await;
    }
    let upload = uuid::Uuid::now_v7();
    let mut tasks = std::collections::BTreeMap::new();
    for host in [
        Some("host-a"),
        Some("host-b"),
        Some("host-c"),
        Some("host-z"),
        None,
    ] {
        let id =
            fixtures::raw::task_on_host(&c, "digest", &json!({"upload": {"id": upload}}), host)
                .await;
        tasks.insert(host.unwrap_or("shared"), id);
    }
    let status = |id: uuid::Uuid| {
        let c = &c;
        async move {
            let r = c
                .query_one(
                    "select status::text, error from artex.tasks where id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (r.get::<_, String>(0), r.get::<_, Option<String>>(1))
        }
    };

    // A reaper that may not judge liveness (it was blind lately) fails nothing.
    let none = artex_actors::upload_guard::run_once(
        &db.bb.planner(),
        "test-reaper",
        &guard_params(600.0, false),
    )
    .await
    .unwrap();
    assert!(none.is_empty(), "{none:?}");

    // Deadline ten minutes: host-a (gone an hour) and host-z (no worker on record) fail;
    // host-b (gone a minute) may come back; host-c has a live worker; shared is any
    // host's.
    let failed = artex_actors::upload_guard::run_once(
        &db.bb.planner(),
        "test-reaper",
        &guard_params(600.0, true),
    )
    .await
    .unwrap();
    let ids: std::collections::BTreeSet<uuid::Uuid> = failed.iter().map(|t| t.id).collect();
    assert_eq!(ids, [tasks["host-a"], tasks["host-z"]].into(), "{failed:?}");
    let (st, error) = status(tasks["host-a"]).await;
    assert_eq!(st, "failed");
    let error = error.unwrap();
    assert!(
        error.starts_with(&format!("upload {upload} is on host host-a, gone since "))
            && error.contains("no other worker can read it"),
        "{error}"
    );
    let (_, error_z) = status(tasks["host-z"]).await;
    assert!(error_z
        .unwrap()
        .contains("none of its workers is on record"));
    for host in ["host-b", "host-c", "shared"] {
        assert_eq!(
            status(tasks[host]).await,
            ("pending".into(), None),
            "{host}"
        );
    }
    // Audited as a transition pending → failed, with the reaper as its actor.
    let audit = c
        .query_one(
            "select from_status::text, to_status::text, actor, reason
             from artex.task_transitions where task_id = $1 order by id desc limit 1",
            &[&tasks["host-a"]],
        )
        .await
        .unwrap();
    assert_eq!(
        audit.get::<_, Option<String>>(0).as_deref(),
        Some("pending")
    );
    assert_eq!(audit.get::<_, String>(1), "failed");
    assert_eq!(audit.get::<_, String>(2), "test-reaper");
    assert!(audit.get::<_, String>(3).contains("host is gone"));

    // A minute's deadline: host-b too. Again: nothing more.
    let failed = artex_actors::upload_guard::run_once(
        &db.bb.planner(),
        "test-reaper",
        &guard_params(30.0, true),
    )
    .await
    .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, tasks["host-b"]);
    let again = artex_actors::upload_guard::run_once(
        &db.bb.planner(),
        "test-reaper",
        &guard_params(30.0, true),
    )
    .await
    .unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(status(tasks["host-c"]).await.0, "pending");
    assert_eq!(status(tasks["shared"]).await.0, "pending");
}

#[tokio::test]
async fn an_uploads_task_fails_when_its_worker_is_killed_and_its_host_stays_gone() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let (_t, token) = token_file();
    // The worker runs no `digest`: the upload's task waits, bound to this host.
    let worker = Proc::worker(
        "uploads-worker",
        &db.url,
        &[
            "--write-token-file",
            &token,
            "--upload-dir",
            uploads.to_str().unwrap(),
            "--kinds",
            "echo",
        ],
    );
    let _planner = Proc::planner(
        "uploads-planner",
        &db.url,
        &["--upload-host-deadline-ms", "500"],
    );
    let http = worker_http(&db.client().await, &worker).await;
    let file = data(3000, 37);
    // No worker declared `digest`: the task says its workers come later.
    let (code, body) = call(
        &http,
        "POST",
        "/api/v1/uploads",
        &[],
        json!({"size": 3000, "sha256": sha(&file), "chunk_size": 1024,
               "task": {"kind": "digest", "allow_unregistered_kind": true}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    let id = body["id"].as_str().unwrap();
    let task = send_all(&http, id, &file, 1024);
    assert_eq!(
        db.bb.operator().task(task).await.unwrap().status.as_str(),
        "pending"
    );
    let mut worker = worker;
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    worker.wait_exit(Duration::from_secs(10)).expect("killed");
    // The reaper marks it gone after its silence, then the deadline passes.
    common::procs::wait_status(&db.bb, task, "failed", Duration::from_secs(60)).await;
    let t = db.bb.operator().task(task).await.unwrap();
    let error = t.error.unwrap_or_default();
    assert!(
        error.contains(&format!("upload {id} is on host ")) && error.contains("gone since"),
        "{error}"
    );
}

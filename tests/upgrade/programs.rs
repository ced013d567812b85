//! Programs shipped in the signed bundle and hot-upgraded with the worker (docs/programs.md):
//! a bundle made with `--tasks-dir` installs its programs beside the worker's tasks folder
//! and the new generation runs them; a resumable Python program (`resumable = true`) is
//! stopped at its next checkpoint and runs on in the new process from it, each step once;
//! a plain one finishes in the old process.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use serde_json::{json, Value};

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{wait_for, wait_status, worker_http, worker_id, Proc};
use crate::common::{self, TestDb};
use crate::{curl_upgrade, upgradable_worker, KillAll};

const STEPS: u64 = 50;

/// Writes a file of `dir` with `mode`.
fn put(dir: &Path, name: &str, text: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tasks folder whose `greet` answers `version`, with the resumable `steps` (each step
/// journaled with the worker's pid, then checkpointed) and the plain `plain`.
fn programs(dir: &Path, version: &str) {
    std::fs::create_dir(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    put(
        dir,
        "greet.sh",
        &format!("#!/bin/sh\necho '{{\"result\":\"{version}\"}}' >&3\n"),
        0o755,
    );
    put(
        dir,
        "steps.py",
        &format!(
            r#"#!/usr/bin/env python3
import json, os, sys, time
task = json.load(sys.stdin)
out = os.fdopen(3, "w")
done = (task.get("checkpoint") or {{}}).get("done", 0)
for step in range(done + 1, {STEPS} + 1):
    time.sleep(0.1)
    with open(task["payload"]["journal"], "a") as j:
        j.write(f"{{step}} {{os.getppid()}}\n")
    out.write(json.dumps({{"checkpoint": {{"done": step}}}}) + "\n")
    out.flush()
out.write(json.dumps({{"result": {{"resumed_from": done}}}}) + "\n")
"#
        ),
        0o755,
    );
    put(dir, "steps.toml", "resumable = true\n", 0o644);
    put(
        dir,
        "plain.sh",
        "#!/bin/sh\nsleep 3\necho '{\"result\":\"plain done\"}' >&3\n",
        0o755,
    );
}

async fn result_of(db: &TestDb, kind: &str) -> Value {
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new(kind, json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
    db.bb.operator().task(id).await.unwrap().result.unwrap()
}

#[tokio::test]
async fn a_bundle_ships_new_programs_and_moves_a_resumable_one_to_the_new_process() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let root = tempfile::tempdir().unwrap();
    // Traversable and writable by `nobody`, whom a root worker runs programs as.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (v1, v2) = (root.path().join("v1"), root.path().join("v2"));
    programs(&v1, "v1");
    programs(&v2, "v2");
    let journal = root.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o666)).unwrap();

    // The same binary, new programs: an upgrade all the same. (Made first: packing the
    // binary takes seconds.)
    let (bundle, _) = keys.bundle_with(
        Path::new(common::artex_bin()),
        "programs-v2",
        "programs-v2.zip",
        &["--tasks-dir", v2.to_str().unwrap()],
    );
    let _planner = Proc::planner("planner", &db.url, &[]);
    let tasks_dir = v1.to_str().unwrap();
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &["--tasks-dir", tasks_dir], &[]);
    let http = worker_http(&c, &gen0).await;
    let old_worker = worker_id(&c, &gen0).await;
    let old = gen0.pid();
    assert_eq!(result_of(&db, "greet").await, json!("v1"));

    let steps = db
        .bb
        .operator()
        .submit(
            &NewTask::new("steps", json!({ "journal": journal })),
            "test",
        )
        .await
        .unwrap();
    let plain = db
        .bb
        .operator()
        .submit(&NewTask::new("plain", json!({})), "test")
        .await
        .unwrap();
    wait_for(
        "the resumable program to checkpoint",
        Duration::from_secs(30),
        || async {
            let t = db.bb.operator().task(steps).await.ok()?;
            let done = t.checkpoint?.get("done")?.as_u64()?;
            (done >= 3).then_some(())
        },
    )
    .await;
    wait_status(&db.bb, plain, "running", Duration::from_secs(10)).await;

    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}\n{}", gen0.log_text());
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    assert_eq!(
        body["tasks_resumed"], 1,
        "the resumable program moved: {body}"
    );
    assert_eq!(
        result_of(&db, "greet").await,
        json!("v2"),
        "the new programs run"
    );
    let installed: Vec<String> = std::fs::read_dir(&v1)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".artex-gen-"))
        .collect();
    assert_eq!(installed.len(), 1, "{installed:?}");

    wait_status(&db.bb, steps, "succeeded", Duration::from_secs(30)).await;
    wait_status(&db.bb, plain, "succeeded", Duration::from_secs(30)).await;
    gen0.wait_exit(Duration::from_secs(30))
        .expect("the old process exits");

    // Every step once, the first ones in the old process, the rest in the new one.
    let lines = std::fs::read_to_string(&journal).unwrap();
    let seen: Vec<(u64, i32)> = lines
        .lines()
        .map(|l| {
            let (step, pid) = l.split_once(' ').unwrap();
            (step.parse().unwrap(), pid.parse().unwrap())
        })
        .collect();
    let numbers: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        numbers,
        (1..=STEPS).collect::<Vec<_>>(),
        "each step once:\n{lines}"
    );
    let switch = seen
        .iter()
        .position(|s| s.1 == new)
        .expect("steps in the new process");
    assert!(switch >= 3, "{lines}");
    assert!(
        seen[..switch].iter().all(|s| s.1 == old) && seen[switch..].iter().all(|s| s.1 == new),
        "old pid {old}, new pid {new}:\n{lines}"
    );
    let t = db.bb.operator().task(steps).await.unwrap();
    assert_eq!(t.retries, 0);
    assert_eq!(t.result.unwrap()["resumed_from"], json!(switch));
    // The plain program finished where it started.
    let history = db.bb.operator().transitions(plain).await.unwrap();
    assert!(
        history
            .iter()
            .all(|h| h.worker.as_deref().is_none_or(|w| w == old_worker)),
        "{history:?}"
    );
}

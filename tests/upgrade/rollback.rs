//! Failed upgrades roll back: the old worker carries on, and nothing of the failed
//! successor is left behind, under `artex master` too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use serde_json::{json, Value};

use crate::common;
use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{
    alive, http_get, online_http, wait_for, wait_status, worker_http, Proc, FAST_WORKER,
};
use crate::common::{count, TestDb};
use crate::{curl_upgrade, upgradable_worker, wait_gone, KillAll};

#[tokio::test]
async fn failed_upgrades_roll_back_and_the_old_worker_carries_on() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &["--upgrade-ready-ms", "3000"],
        &[],
    );
    let http = worker_http(&c, &w).await;
    let task = db
        .bb
        .operator()
        .submit(
            &NewTask::new("checkpoint", json!({ "steps": 30, "ms": 150 })),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, task, "running", Duration::from_secs(20)).await;
    let panicking = format!(
        "#!/bin/sh\nARTEX_FAILPOINTS=after_listener_pass exec {} \"$@\"\n",
        common::artex_bin()
    );
    let cases = [
        (
            "exits-at-start",
            "#!/bin/sh\nexit 3\n".to_string(),
            "exited",
        ),
        (
            "never-ready",
            "#!/bin/sh\nexec sleep 60\n".to_string(),
            "did not",
        ),
        // It dies right after saying `Serving`, which this side may read before or after
        // it sees the exit: "during the listener pass" or "during the task transfer".
        ("panics-after-ready", panicking, "exited during the "),
    ];
    for (name, script, why) in cases {
        let bundle = keys.script_bundle(name, &script);
        let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
        assert_eq!(code, 500, "{name}: {body}");
        assert_eq!(body["status"], "rolled_back", "{name}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(why),
            "{name}: {body}"
        );
        let child = body["new_pid"].as_i64().unwrap() as i32;
        assert!(
            !alive(child),
            "{name}: the failed child {child} was left running"
        );
        let (code, health) = http_get(&http, "/health").unwrap();
        assert_eq!(code, 200, "{name}: {health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(
            health["pid"],
            w.pid(),
            "{name}: the old worker still serves"
        );
    }
    // Its task was never disturbed beyond a suspend-and-resume in the same process.
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
    let t = db.bb.operator().task(task).await.unwrap();
    let steps = t.result.unwrap()["steps"].as_array().unwrap().clone();
    assert_eq!(steps.len(), 30);
    assert!(
        steps.iter().all(|s| s["pid"] == w.pid()),
        "steps ran elsewhere: {steps:?}"
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.workers where state = 'online'"
        )
        .await,
        1,
        "the failed generations left no online worker behind"
    );
    // And it still works: a fresh task runs there.
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
    assert!(std::fs::read_dir(keys.path("upgrades"))
        .unwrap()
        .next()
        .is_none());
}

/// Pids of the processes whose environment holds `marker` (zombies have none).
fn marked_processes(marker: &str) -> Vec<i32> {
    let needle = marker.as_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .collect()
}

/// A bundle whose "binary" starts a background `sleep 600`, writes its pid to `bg_pid`,
/// then `ends` (`exec sleep 60`: never ready; `exit 3`: dies at once). Both carry
/// `marker` in their environment.
fn leaky_bundle(keys: &Keys, name: &str, marker: &str, bg_pid: &Path, ends: &str) -> PathBuf {
    let script = format!(
        "#!/bin/sh\nexport ARTEX_TEST_MARKER={marker}\nsleep 600 &\necho $! > '{}'\n{ends}\n",
        bg_pid.display()
    );
    keys.script_bundle(name, &script)
}

/// Uploads bundles that leave a background process behind, expects each to be rolled
/// back, and checks that nothing of them is left: not the child, not its background
/// process, nothing with their marker.
async fn rollbacks_leave_nothing(http: &str, keys: &Keys, serving: i32) {
    for (name, ends, why) in [
        ("leaky-never-ready", "exec sleep 60", "did not"),
        ("leaky-exits", "exit 3", "exited"),
    ] {
        let marker = uuid::Uuid::new_v4().simple().to_string();
        let bg_file = keys.path(&format!("{name}.pid"));
        let bundle = leaky_bundle(keys, name, &marker, &bg_file, ends);
        let (code, body) = curl_upgrade(http, &bundle, Some(TOKEN), false);
        assert_eq!(code, 500, "{name}: {body}");
        assert_eq!(body["status"], "rolled_back", "{name}: {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains(why),
            "{name}: {body}"
        );
        let child = body["new_pid"].as_i64().unwrap() as i32;
        let bg: i32 = std::fs::read_to_string(&bg_file)
            .unwrap_or_else(|e| panic!("{name}: the script never ran: {e}"))
            .trim()
            .parse()
            .unwrap();
        let _leftovers = KillAll(vec![child, bg]);
        // SIGKILL is sent before the answer; the kernel may take a moment to finish them.
        wait_for(
            &format!("{name}: child {child} and its background {bg} to be gone"),
            Duration::from_secs(10),
            || async { (!alive(child) && !alive(bg)).then_some(()) },
        )
        .await;
        wait_for(
            &format!("{name}: no process with marker {marker} left"),
            Duration::from_secs(10),
            || async { marked_processes(&marker).is_empty().then_some(()) },
        )
        .await;
        let (code, health) = http_get(http, "/health").unwrap();
        assert_eq!(code, 200, "{name}: {health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(
            health["pid"], serving,
            "{name}: the old worker still serves"
        );
    }
}

#[tokio::test]
async fn a_rolled_back_successor_leaves_no_process_behind() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &["--upgrade-ready-ms", "3000"],
        &[],
    );
    let http = worker_http(&c, &w).await;
    rollbacks_leave_nothing(&http, &keys, w.pid()).await;
}

/// (ppid, pgid) of process `pid`.
fn parent_and_group(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    (fields[1].parse().unwrap(), fields[2].parse().unwrap())
}

#[tokio::test]
async fn under_master_a_rollback_leaves_nothing_and_a_successor_joins_the_lineage() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let mut args: Vec<String> = vec!["master".into()];
    args.extend(FAST_WORKER.iter().map(|s| s.to_string()));
    args.extend(keys.flags("upgrades"));
    args.extend(["--upgrade-ready-ms".into(), "3000".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut master = Proc::start("master", &db.url, &args, &[]);
    let http = online_http(&c).await;
    let (_, health) = http_get(&http, "/health").unwrap();
    let first = serde_json::from_str::<Value>(&health).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    // Whatever happens, the lineage's group goes with the test.
    struct KillGroup(i32);
    impl Drop for KillGroup {
        fn drop(&mut self) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _lineage = KillGroup(first);
    assert_eq!(parent_and_group(first), (master.pid(), first));

    rollbacks_leave_nothing(&http, &keys, first).await;
    assert_eq!(
        parent_and_group(first),
        (master.pid(), first),
        "the generation and its group are untouched"
    );

    // A successful successor ends up in the lineage's group, not in the one it was
    // spawned in, so the master keeps tracking (and stopping) it.
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    wait_gone(first, Duration::from_secs(30)).await;
    assert_eq!(parent_and_group(new), (master.pid(), first));
    assert!(
        master.wait_exit(Duration::from_millis(50)).is_none(),
        "the master keeps running: {}",
        master.log_text()
    );
    assert!(
        !master.log_text().contains("died"),
        "the master saw no generation die"
    );
    master.signal(nix::sys::signal::Signal::SIGTERM);
    let status = master
        .wait_exit(Duration::from_secs(30))
        .expect("the master stops");
    assert!(status.success(), "{status:?}");
    assert!(!alive(new), "the successor stopped with the master");
}

//! A bundle needing a newer schema than the blackboard's is refused with 409, nothing
//! spawned, until the schema has been expanded.

use std::process::Command;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use serde_json::{json, Value};

use crate::common;
use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{http_get, wait_status, worker_http, Proc};
use crate::common::{count, TestDb};
use crate::{curl_upgrade, upgradable_worker, wait_gone, KillAll};

#[tokio::test]
async fn a_bundle_needing_a_newer_schema_is_refused_with_409_and_nothing_spawned() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let knows = artex_actors::blackboard::MIGRATIONS
        .last()
        .map(|m| m.version)
        .unwrap();
    let (expand, contract) = (knows + 1, knows + 2);
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut w = upgradable_worker("worker", &db.url, &keys, &[], &[]);
    let http = worker_http(&c, &w).await;

    // "The new build": it needs one migration more than this one, and says so when
    // `bundle create` asks it; otherwise it runs this build.
    let out = Command::new(common::artex_bin())
        .args(["schema", "--json"])
        .output()
        .unwrap();
    let mut schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    schema["needs"].as_array_mut().unwrap().push(json!({
        "version": expand, "name": "future_things", "checksum": "ffffffffffffffff"
    }));
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = schema ]; then echo '{schema}'; exit 0; fi\nexec {} \"$@\"\n",
        common::artex_bin()
    );
    let bin = keys.path("newer");
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (newer, _) = keys.bundle_of(&bin, "0.2.0", "newer.zip");

    let (code, body) = curl_upgrade(&http, &newer, Some(TOKEN), false);
    // Should the check fail to refuse, the process it let through is not left running.
    let _leaked = KillAll(
        body["new_pid"]
            .as_i64()
            .map(|p| p as i32)
            .into_iter()
            .collect(),
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["status"], "refused", "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("V{expand}__future_things"))
            && error.contains("run `artex migrate` with the new build first"),
        "{body}"
    );
    // Nothing was spawned: no new process said so, no new worker registered, nothing
    // unpacked stays behind; the old worker serves and runs tasks.
    assert!(
        !w.log_text().contains("new process spawned"),
        "{}",
        w.log_text()
    );
    assert_eq!(count(&c, "select count(*) from artex.workers").await, 1);
    assert!(std::fs::read_dir(keys.path("upgrades"))
        .unwrap()
        .next()
        .is_none());
    let (code, health) = http_get(&http, "/health").unwrap();
    assert_eq!(code, 200, "{health}");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["pid"], w.pid());
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;

    // The rolling order: the new build's `artex migrate` expands the schema (simulated:
    // the table and its row), the old worker runs on, and the same bundle now goes in.
    c.batch_execute(&format!(
        "create table artex.future_things (id bigint primary key);
         insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({expand}, 'future_things', 'ffffffffffffffff', 0)"
    ))
    .await
    .unwrap();
    let (code, body) = curl_upgrade(&http, &newer, Some(TOKEN), false);
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("upgraded")),
        "{body}"
    );
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    w.wait_exit(Duration::from_secs(30))
        .expect("the old worker exits");
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;

    // A rollback to a build that predates a contraction is refused the same way.
    c.batch_execute(&format!(
        "insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({contract}, 'drop_old_things', 'eeeeeeeeeeeeeeee', {expand})"
    ))
    .await
    .unwrap();
    let (older, _) = keys.variant_bundle(1);
    let (code, body) = curl_upgrade(&http, &older, Some(TOKEN), false);
    assert_eq!(code, 409, "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("V{contract}__drop_old_things"))
            && error.contains(&format!("the new build knows up to V{knows}")),
        "{body}"
    );
    let (_, health) = http_get(&http, "/health").unwrap();
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["pid"], new, "the running generation serves on");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(new, Duration::from_secs(30)).await;
}

// Found by the soak: an upgrade sent while PostgreSQL restarted answered 500, as if the
// worker had failed; the database away is a 503, and nothing is spawned.
#[tokio::test]
async fn an_upgrade_while_the_database_is_away_is_503_and_nothing_spawned() {
    let pg = common::PrivateCluster::start().await;
    let c = common::connect(&pg.url).await;
    let keys = Keys::new();
    let bundle = keys.variant_bundles(1).remove(0).0;
    let mut w = upgradable_worker("worker", &pg.url, &keys, &[], &[]);
    let http = worker_http(&c, &w).await;
    drop(c);
    pg.cluster.stop().expect("stopping the private cluster");
    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
    pg.cluster
        .start()
        .expect("starting the private cluster again");
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "not_started", "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("reading the database's schema"),
        "{body}"
    );
    // The worker carries on: nothing spawned took its place.
    assert!(w.wait_exit(Duration::from_millis(500)).is_none());
    let (code, _) = http_get(&http, "/status").unwrap();
    assert_ne!(code, 0);
}

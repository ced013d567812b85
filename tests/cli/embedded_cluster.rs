//! The embedded PostgreSQL cluster: created once and reused, not made by one-shot
//! commands, kept where the server can reach it, and its missing binaries named.

use std::path::Path;
use std::process::Command;

use crate::common;
use crate::pipes::{assert_quiet, into_closed_pipe};
use crate::{artex, json_of, stderr, stdout};

#[test]
fn one_shot_commands_in_an_empty_folder_create_no_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Some(data.as_path());
    let id = uuid::Uuid::new_v4().to_string();
    for args in [
        &["submit", "echo", "--allow-unregistered-kind"][..],
        &["tasks"],
        &["task", "show", &id],
        &["cancel", &id],
        &["events", "tail"],
        &["migrate"],
        &["limits"],
    ] {
        let out = artex(None, d, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no --database-url and no cluster in")
                && err.contains("artex db start")
                && err.contains("artex up"),
            "{args:?}: {err}"
        );
        assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
        assert!(!data.exists(), "{args:?} created {}", data.display());
    }
}

#[tokio::test]
async fn the_embedded_cluster_is_created_once_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Some(data.as_path());
    let out = artex(None, d, &["db", "status"]);
    assert!(stdout(&out).starts_with("absent"), "{}", stdout(&out));
    assert_eq!(out.status.code(), Some(3), "not running: exit 3");
    let out = artex(None, d, &["db", "status", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "not running: exit 3, --json too"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["state"], "absent", "{v}");
    let out = artex(None, d, &["db", "url"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("artex db start"), "{}", stderr(&out));

    // First start: initdb, start, create the database, migrate.
    let out = artex(None, d, &["db", "start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let url = stdout(&out).trim().to_string();
    assert!(url.starts_with("postgresql:///artex?host="), "{url}");
    assert!(data.join("pg/PG_VERSION").exists());
    struct Stop(std::path::PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = artex(None, Some(&self.0), &["db", "stop"]);
        }
    }
    let _stop = Stop(data.clone());
    // Into a pipe whose reader has gone: quiet, exit 141 (every other command: `pipes`).
    for args in [&["db", "url"][..], &["db", "url", "--json"]] {
        assert_quiet(args, &into_closed_pipe(None, d, args));
    }
    let ended = into_closed_pipe(None, d, &["db", "start"]);
    assert_eq!(ended.code, Some(141), "{ended:?}");
    assert!(
        ended.stderr.starts_with("already running:") && ended.stderr.lines().count() == 1,
        "{ended:?}"
    );
    let out = artex(None, d, &["db", "status"]);
    assert!(stdout(&out).starts_with("running"));
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&artex(None, d, &["db", "status", "--json"]));
    assert_eq!(
        (&v["state"], &v["url"]),
        (&"running".into(), &url.as_str().into()),
        "{v}"
    );
    assert!(v["pid"].as_i64().is_some(), "{v}");
    assert_eq!(
        json_of(&artex(None, d, &["db", "url", "--json"]))["url"],
        url.as_str()
    );
    let again = artex(None, d, &["db", "start"]);
    assert!(
        stderr(&again).contains("already running"),
        "{}",
        stderr(&again)
    );
    assert_eq!(stdout(&again).trim(), url);

    // No URL: commands use the embedded cluster.
    let out = artex(None, d, &["submit", "noop", "--allow-unregistered-kind"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    // The URL works for clients too.
    let c = common::connect(&url).await;
    let n: i64 = c
        .query_one("select count(*) from artex.tasks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    drop(c);

    // `up` on the embedded cluster says Ctrl-C leaves the cluster running, and how to
    // stop it.
    let log = dir.path().join("up.log");
    let mut up = crate::artex_command(None, d, &["up", "--http", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run artex up");
    let banner = common::procs::wait_for("up's banner", std::time::Duration::from_secs(60), || {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        async move { log.contains("Stop with Ctrl-C").then_some(log) }
    })
    .await;
    let _ = up.kill();
    let _ = up.wait();
    assert!(
        banner.contains("the embedded PostgreSQL keeps running") && banner.contains("db stop"),
        "{banner}"
    );

    // Second start after a stop reuses the cluster: the task is still there.
    assert_eq!(stdout(&artex(None, d, &["db", "stop"])).trim(), "stopped");
    let out = artex(None, d, &["db", "status"]);
    assert!(stdout(&out).starts_with("stopped"));
    assert_eq!(out.status.code(), Some(3), "not running: exit 3");
    let out = artex(None, d, &["task", "show", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("kind:        noop"));
    assert!(stdout(&artex(None, d, &["db", "status"])).starts_with("running"));
}

#[test]
fn missing_postgres_binaries_name_the_package_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(common::artex_bin());
    let out = cmd
        .args(["db", "start"])
        .env("ARTEX_DATA_DIR", dir.path())
        .env("ARTEX_PG_BIN", dir.path().join("nowhere"))
        .env_remove("ARTEX_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("apt-get install -y postgresql"), "{err}");
    assert!(!dir.path().join("pg").exists(), "nothing created");
}

/// As root in a clone under `/root` (mode 0700, the usual place), the server's user cannot
/// reach the data dir: the cluster lives under /var/lib/artex instead, keyed by the data
/// dir, which keeps a note saying where; every command finds it there.
#[tokio::test]
async fn as_root_a_data_dir_the_server_cannot_reach_gets_its_cluster_elsewhere() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CI runs as root): it shows the embedded default under a \
         0700 home"
    );
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let d = home.path().join("clone").join(".artex");
    let start = artex(None, Some(&d), &["db", "start"]);
    assert_eq!(start.status.code(), Some(0), "{}", stderr(&start));
    let note = std::fs::read_to_string(d.join("CLUSTER-LOCATION")).expect("the note");
    let base = note
        .split_whitespace()
        .find(|w| w.starts_with("/var/lib/artex/"))
        .map(|w| w.trim_end_matches(':').to_string())
        .unwrap_or_else(|| panic!("no location in the note: {note}"));
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _remove = Remove(base.clone());
    assert!(Path::new(&base).join("pg").join("PG_VERSION").exists());
    assert!(stdout(&start).contains(&base), "{}", stdout(&start));
    assert!(stdout(&artex(None, Some(&d), &["db", "status"])).starts_with("running"));
    let submit = artex(
        None,
        Some(&d),
        &["submit", "echo", "--allow-unregistered-kind"],
    );
    assert_eq!(submit.status.code(), Some(0), "{}", stderr(&submit));
    let stop = artex(None, Some(&d), &["db", "stop"]);
    assert_eq!(stop.status.code(), Some(0), "{}", stderr(&stop));
}

//! The command line as a user meets it: bad input is refused with a one-line error naming
//! what was wrong, exit code 2, and nothing written; good input works; the embedded
//! PostgreSQL cluster is created on first start and reused on the second.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::TestDb;

/// `artex ARGS…` against `url` (or the embedded cluster in `data_dir` when `url` is None).
fn artex(url: Option<&str>, data_dir: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(common::artex_bin());
    cmd.args(args)
        .env_remove("ARTEX_DATABASE_URL")
        .env("ARTEX_LOG", "warn");
    if let Some(u) = url {
        cmd.env("ARTEX_DATABASE_URL", u);
    }
    if let Some(d) = data_dir {
        cmd.env("ARTEX_DATA_DIR", d);
    }
    cmd.output().expect("run artex")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

async fn task_count(db: &TestDb) -> i64 {
    db.client()
        .await
        .query_one("select count(*) from artex.tasks", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn bad_input_is_refused_with_exit_2_and_nothing_written() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let cases: &[(&[&str], &str)] = &[
        (&["submit", "echo", "--payload", "{not json"], "--payload"),
        (
            &["submit", "echo", "--payload", "{not json"],
            "not valid JSON",
        ),
        (&["submit", "echo", "--run-at", "tomorrow"], "RFC 3339"),
        (&["submit", "echo", "--max-retries", "-1"], "--max-retries"),
        (&["submit", "echo", "--priority", "high"], "--priority"),
        (&["submit", "echo", "--timeout-ms", "0"], "--timeout-ms"),
        (&["submit", ""], "kind: must not be empty"),
        (&["submit", "echo", "--bogus"], "--bogus"),
        (&["task", "show", "not-a-uuid"], "not a task id"),
        (
            &["tasks", "--status", "sleeping"],
            "expected one of: pending",
        ),
        (&["tasks", "--limit", "0"], "--limit"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, expect) in cases {
        let out = artex(url, None, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expect),
            "{args:?}: expected {expect:?} in {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "{args:?} printed {}", stdout(&out));
    }
    // Our own errors are one line (clap's usage errors add a usage hint, also exit 2).
    let out = artex(url, None, &["submit", ""]);
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
    let unknown = uuid::Uuid::new_v4().to_string();
    let out = artex(url, None, &["task", "show", &unknown]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!("no task with id {unknown}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        task_count(&db).await,
        0,
        "a refused command wrote something"
    );
}

#[tokio::test]
async fn submit_show_and_list_a_task() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let out = artex(
        url,
        None,
        &[
            "submit",
            "echo",
            "--payload",
            r#"{"hello":"world"}"#,
            "--priority",
            "5",
            "--max-retries",
            "1",
            "--run-at",
            "2030-01-01T00:00:00Z",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    uuid::Uuid::parse_str(&id).expect("submit prints the task id");
    let out = artex(url, None, &["task", "show", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["task"]["status"], "pending");
    assert_eq!(v["task"]["payload"]["hello"], "world");
    assert_eq!(v["task"]["priority"], 5);
    assert_eq!(v["task"]["max_retries"], 1);
    assert_eq!(v["task"]["run_at"], "2030-01-01T00:00:00Z");
    assert_eq!(v["transitions"][0]["to_status"], "pending");
    let out = artex(url, None, &["task", "show", &id]);
    let text = stdout(&out);
    assert!(text.contains("status:      pending"), "{text}");
    assert!(text.contains("(new) -> pending"), "{text}");
    let out = artex(url, None, &["tasks", "--status", "pending"]);
    assert!(stdout(&out).contains(&id), "{}", stdout(&out));
    let out = artex(url, None, &["tasks", "--status", "succeeded"]);
    assert!(!stdout(&out).contains(&id));
}

#[tokio::test]
async fn the_embedded_cluster_is_created_once_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Some(data.as_path());
    let out = artex(None, d, &["db", "status"]);
    assert!(stdout(&out).starts_with("absent"), "{}", stdout(&out));
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
    assert!(stdout(&artex(None, d, &["db", "status"])).starts_with("running"));
    let again = artex(None, d, &["db", "start"]);
    assert!(
        stderr(&again).contains("already running"),
        "{}",
        stderr(&again)
    );
    assert_eq!(stdout(&again).trim(), url);

    // No URL: commands use the embedded cluster.
    let out = artex(None, d, &["submit", "noop"]);
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

    // Second start after a stop reuses the cluster: the task is still there.
    assert_eq!(stdout(&artex(None, d, &["db", "stop"])).trim(), "stopped");
    assert!(stdout(&artex(None, d, &["db", "status"])).starts_with("stopped"));
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

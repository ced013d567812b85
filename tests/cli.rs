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
    let long_kind = "k".repeat(101);
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
        (
            &["submit", "echo", "--payload", "{}", "--payload", "[]"],
            "'--payload <PAYLOAD>' cannot be used multiple times",
        ),
        (
            &["submit", "echo", "--payload", r#"{"a": "x\u0000y"}"#],
            "--payload: contains the character \\u0000",
        ),
        (&["submit", "a\nb"], r#"kind: "a\nb" is not a kind name"#),
        (&["submit", "a'b"], r#"kind: "a'b" is not a kind name"#),
        (&["submit", "a\"b"], r#"kind: "a\"b" is not a kind name"#),
        (
            &["submit", "../etc"],
            r#"kind: "../etc" is not a kind name"#,
        ),
        (
            &["submit", long_kind.as_str()],
            "kind: 101 bytes long, at most 100",
        ),
        // No worker ever declared `echo` in this database.
        (
            &["submit", "echo"],
            r#"kind: "echo" has never been declared by a worker"#,
        ),
        (&["submit", "ech0"], "--allow-unregistered-kind"),
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
        assert_refused(&out, &format!("{args:?}"), expect);
    }
    // Not a PostgreSQL URL: refused before anything runs, naming the option.
    for (bad, expect) in [
        (
            "mysql://root@localhost/artex",
            "--database-url: 'mysql://' is not PostgreSQL",
        ),
        (
            "postgresql://host:notaport/artex",
            "--database-url: invalid connection string",
        ),
        ("not a url", "--database-url: invalid connection string"),
    ] {
        let out = artex(Some(bad), None, &["submit", "echo"]);
        assert_refused(&out, bad, expect);
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

/// Exit 2, `expect` in a message on one line (clap's own usage errors add a usage hint
/// after it), nothing on stdout.
fn assert_refused(out: &Output, what: &str, expect: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains(expect),
        "{what}: expected {expect:?} in the first line of {err}"
    );
    if !first.starts_with("error:") {
        assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
    }
    assert!(stdout(out).is_empty(), "{what} printed {}", stdout(out));
}

/// Registers a worker row declaring `kinds`, as a worker's start-up does.
async fn register_worker(db: &TestDb, kinds: &[&str]) {
    let kinds: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
    db.client()
        .await
        .execute(
            "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
             values ('w1', 'test', 1, 'test', 'artex_w1', $1, 1)",
            &[&kinds],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn kinds_a_worker_declared_are_accepted_and_others_only_when_allowed() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    register_worker(&db, &["echo", "resize.v2"]).await;
    let out = artex(url, None, &["kinds"]);
    assert!(stdout(&out).contains("resize.v2"), "{}", stdout(&out));
    let out = artex(url, None, &["submit", "resize.v2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A typo is refused, and the message lists what workers declared.
    let out = artex(url, None, &["submit", "ech0"]);
    assert_refused(
        &out,
        "ech0",
        r#"kind: "ech0" has never been declared by a worker"#,
    );
    assert!(
        stderr(&out).contains("known kinds: echo, resize.v2"),
        "{}",
        stderr(&out)
    );
    assert_eq!(task_count(&db).await, 1);
    let out = artex(url, None, &["submit", "ech0", "--allow-unregistered-kind"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(task_count(&db).await, 2);

    // Flows: every task's kind, named with its file and task.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    let flow = r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
        {"name": "b", "kind": "ech0", "depends_on": ["a"]}]}"#;
    std::fs::write(&file, flow).unwrap();
    let path = file.to_str().unwrap();
    let out = artex(url, None, &["flow", "submit", path]);
    assert_refused(&out, "flow", &format!("{path}: task 'b': kind: \"ech0\""));
    assert_eq!(task_count(&db).await, 2);
    let out = artex(
        url,
        None,
        &["flow", "submit", path, "--allow-unregistered-kind"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(task_count(&db).await, 4);
}

#[tokio::test]
async fn a_real_worker_registers_its_kinds() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let w = common::procs::Proc::worker("worker", &db.url, &[]);
    common::procs::worker_id(&c, &w).await;
    let out = artex(Some(&db.url), None, &["submit", "echo"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn the_payload_limit_is_the_databases_and_refused_payloads_write_nothing() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    register_worker(&db, &["echo"]).await;
    let out = artex(url, None, &["limits"]);
    assert_eq!(stdout(&out).trim(), "max_payload_bytes: 1048576");
    let out = artex(url, None, &["limits", "--max-payload-bytes", "100"]);
    assert_eq!(
        stdout(&out).trim(),
        "max_payload_bytes: 100",
        "{}",
        stderr(&out)
    );
    let out = artex(url, None, &["limits", "--max-payload-bytes", "0"]);
    assert_refused(&out, "limit 0", "--max-payload-bytes");

    // {"s": "xxx…"} as PostgreSQL prints it: 9 bytes around the string.
    let big = format!(r#"{{"s":"{}"}}"#, "x".repeat(192));
    let out = artex(url, None, &["submit", "echo", "--payload", &big]);
    assert_refused(
        &out,
        "big payload",
        "--payload: 201 bytes, more than the limit of 100 bytes",
    );
    // The database refuses it too, whoever writes.
    let c = db.client().await;
    let err = c
        .execute(
            "insert into artex.tasks (kind, payload) values ('echo', $1::text::jsonb)",
            &[&big],
        )
        .await
        .unwrap_err();
    let err = err.as_db_error().unwrap().message().to_string();
    assert!(
        err.contains("is 201 bytes, more than the limit of 100 bytes"),
        "{err}"
    );
    let err = c
        .execute("insert into artex.tasks (kind) values ('../x')", &[])
        .await
        .unwrap_err();
    assert!(
        format!("{:?}", err.as_db_error()).contains("not a kind name"),
        "{err:?}"
    );
    assert_eq!(task_count(&db).await, 0, "a refused payload was written");
    let fits = format!(r#"{{"s":"{}"}}"#, "x".repeat(91));
    let out = artex(url, None, &["submit", "echo", "--payload", &fits]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(task_count(&db).await, 1);
}

#[tokio::test]
async fn payload_from_a_file_or_standard_input() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    register_worker(&db, &["echo"]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.json");
    std::fs::write(&file, r#"{"from": "file"}"#).unwrap();
    let at = format!("@{}", file.display());
    let out = artex(url, None, &["submit", "echo", "--payload", &at]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let show = artex(url, None, &["task", "show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(v["task"]["payload"]["from"], "file");

    let mut child = Command::new(common::artex_bin())
        .args(["submit", "echo", "--payload", "-"])
        .env("ARTEX_DATABASE_URL", &db.url)
        .env("ARTEX_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(br#"{"from": "stdin"}"#).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let show = artex(url, None, &["task", "show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(v["task"]["payload"]["from"], "stdin");

    // A file that is not JSON is bad input; one that cannot be read, a failure.
    std::fs::write(&file, "{not json").unwrap();
    let out = artex(url, None, &["submit", "echo", "--payload", &at]);
    let expect = format!("--payload (file {}): not valid JSON", file.display());
    assert_refused(&out, "bad file", &expect);
    let missing = format!("@{}", dir.path().join("missing.json").display());
    let out = artex(url, None, &["submit", "echo", "--payload", &missing]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("--payload: reading {}", &missing[1..])),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).trim().lines().count(), 1);
    assert_eq!(task_count(&db).await, 2);
}

#[tokio::test]
async fn show_and_list_cut_large_values_unless_full() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let big = format!(r#"{{"s":"{}"}}"#, "y".repeat(5000));
    let out = artex(
        url,
        None,
        &[
            "submit",
            "echo",
            "--payload",
            &big,
            "--allow-unregistered-kind",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let whole = 5000 + r#"{"s": ""}"#.len();

    let text = stdout(&artex(url, None, &["task", "show", &id]));
    let line = text.lines().find(|l| l.starts_with("payload:")).unwrap();
    assert!(
        line.ends_with(&format!("… ({whole} bytes; --full to see all)")),
        "{line}"
    );
    assert!(line.len() < 1200, "{} bytes shown", line.len());
    let text = stdout(&artex(url, None, &["task", "show", &id, "--full"]));
    assert!(text.contains(&"y".repeat(5000)), "--full shows all");

    let v: serde_json::Value =
        serde_json::from_str(&stdout(&artex(url, None, &["task", "show", &id, "--json"]))).unwrap();
    assert_eq!(v["task"]["cut"][0]["field"], "payload");
    assert_eq!(v["task"]["cut"][0]["bytes"], whole);
    assert_eq!(v["task"]["payload"].as_str().unwrap().len(), 1024);
    let v: serde_json::Value = serde_json::from_str(&stdout(&artex(
        url,
        None,
        &["task", "show", &id, "--json", "--full"],
    )))
    .unwrap();
    assert_eq!(v["task"]["payload"]["s"].as_str().unwrap().len(), 5000);
    assert!(v["task"].get("cut").is_none());

    let line = stdout(&artex(url, None, &["tasks", "--json"]));
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["cut"][0]["bytes"], whole);
    let line = stdout(&artex(url, None, &["tasks", "--json", "--full"]));
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["payload"]["s"].as_str().unwrap().len(), 5000);
    let text = stdout(&artex(url, None, &["tasks"]));
    assert!(text.contains(&id), "{text}");
}

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
            // No worker runs in this test.
            "--allow-unregistered-kind",
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
    assert_eq!(out.status.code(), Some(3), "not running: exit 3");
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
    let out = artex(None, d, &["db", "status"]);
    assert!(stdout(&out).starts_with("running"));
    assert_eq!(out.status.code(), Some(0));
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

/// What a newcomer reads: one-shot commands print their result and nothing else, a task
/// that failed once and then succeeded shows its error as history and the worker that
/// finished it, `tasks` has a header, and a missing flow file is bad input.
#[tokio::test]
async fn one_shot_output_says_what_happened_and_only_that() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let c = db.client().await;
    let w = common::procs::Proc::worker("w", &db.url, &[]);
    let worker = common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", &db.url, &[]);
    let out = artex(
        url,
        None,
        &["submit", "fail", "--payload", r#"{"times": 1}"#],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "a one-shot command logged");
    let id = stdout(&out).trim().to_string();
    let task: uuid::Uuid = id.parse().unwrap();
    common::procs::wait_status(
        &db.bb,
        task,
        "succeeded",
        std::time::Duration::from_secs(20),
    )
    .await;
    let text = stdout(&artex(url, None, &["task", "show", &id]));
    assert!(text.contains("status:      succeeded"), "{text}");
    assert!(text.contains("last error:  "), "{text}");
    assert!(!text.contains("\nerror:"), "{text}");
    assert!(text.contains(&format!("worker:      {worker}")), "{text}");
    let list = stdout(&artex(url, None, &["tasks"]));
    assert!(list.starts_with("ID "), "{list}");
    let out = artex(url, None, &["flow", "submit", "/nonexistent/flow.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no such flow file"),
        "{}",
        stderr(&out)
    );
}

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

    let v = json_of(&artex(url, None, &["tasks", "--json"]));
    assert_eq!(v["tasks"][0]["cut"][0]["bytes"], whole);
    let v = json_of(&artex(url, None, &["tasks", "--json", "--full"]));
    assert_eq!(v["tasks"][0]["payload"]["s"].as_str().unwrap().len(), 5000);
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

/// An `artex` run in the background, its standard output read line by line as it comes;
/// killed if the test ends first.
struct Background {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Background {
    fn start(url: &str, args: &[&str]) -> Background {
        let mut child = Command::new(common::artex_bin())
            .args(args)
            .env("ARTEX_DATABASE_URL", url)
            .env("ARTEX_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run artex");
        let out = child.stdout.take().expect("its standard output");
        let lines = std::io::BufRead::lines(std::io::BufReader::new(out));
        Background { child, lines }
    }

    /// Its next line of output (the test waits for it: a hung command hangs the test,
    /// which names it).
    fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("a line of output before the end")
            .expect("readable output")
    }

    /// The rest of its output, its exit code and its standard error, once it has exited.
    fn finish(mut self) -> (Vec<String>, Option<i32>, String) {
        let rest: Vec<String> = self.lines.by_ref().map_while(|l| l.ok()).collect();
        let status = self.child.wait().expect("wait for artex");
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        (rest, status.code(), err)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", stdout(out)))
}

/// Every command that prints data prints one JSON document with --json, with the HTTP
/// API's field names where the API has the same thing.
#[tokio::test]
async fn json_output_is_one_document_with_the_apis_fields() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    register_worker(&db, &["echo"]).await;

    let v = json_of(&artex(url, None, &["submit", "echo", "--json"]));
    let id = v["id"].as_str().expect("submit: id").to_string();
    let v = json_of(&artex(url, None, &["tasks", "--json", "--limit", "1"]));
    assert_eq!(v["tasks"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["tasks"][0]["status"], "pending", "{v}");
    assert_eq!(v["next"], id.as_str(), "a full page names the next: {v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--after", &id]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(0), "{v}");
    assert!(v["next"].is_null(), "{v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--kind", "echo"]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(1), "{v}");
    let v = json_of(&artex(url, None, &["task", "show", &id, "--json"]));
    assert_eq!(v["task"]["kind"], "echo", "{v}");
    assert_eq!(v["transitions"][0]["to_status"], "pending", "{v}");
    let v = json_of(&artex(url, None, &["pause", &id, "--json"]));
    assert_eq!(v["changed"][0][1], "paused", "{v}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    std::fs::write(
        &file,
        r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
            {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    )
    .unwrap();
    let v = json_of(&artex(
        url,
        None,
        &["flow", "submit", file.to_str().unwrap(), "--json"],
    ));
    let flow = v["id"].as_str().expect("flow submit: id").to_string();
    let v = json_of(&artex(url, None, &["flow", "show", &flow, "--json"]));
    assert_eq!(v["id"], flow.as_str(), "{v}");
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["tasks"][1]["depends_on"][0], "a", "{v}");
    let v = json_of(&artex(url, None, &["flow", "list", "--json"]));
    assert_eq!(v["flows"][0]["id"], flow.as_str(), "{v}");
    assert_eq!(v["flows"][0]["state"], "running", "{v}");
    assert_eq!(v["flows"][0]["counts"]["blocked"], 1, "{v}");
    assert!(v["next"].is_null(), "one flow, one page: {v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--flow", &flow]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(2), "{v}");

    let v = json_of(&artex(url, None, &["kinds", "--json"]));
    assert_eq!(v["kinds"][0]["kind"], "echo", "{v}");
    let v = json_of(&artex(url, None, &["workers", "--json"]));
    assert_eq!(v["workers"][0]["id"], "w1", "{v}");
    for field in ["state", "pid", "version", "capacity", "held", "last_seen"] {
        assert!(
            v["workers"][0].get(field).is_some(),
            "workers: {field}: {v}"
        );
    }
    assert_eq!(v["more"], false, "{v}");
    let v = json_of(&artex(url, None, &["stats", "--json"]));
    // The paused task, the flow's first (pending) and second (blocked).
    for status in ["paused", "pending", "blocked"] {
        assert_eq!(v["by_status"][status], 1, "{status}: {v}");
    }
    assert!(v["recent"]["queue_ms"].is_object(), "{v}");
    let v = json_of(&artex(url, None, &["limits", "--json"]));
    assert!(v["max_payload_bytes"].as_i64().unwrap_or(0) > 0, "{v}");
    let v = json_of(&artex(url, None, &["events", "retention", "--json"]));
    assert!(v["keep_secs"].as_f64().is_some(), "{v}");
    let v = json_of(&artex(url, None, &["events", "prune", "--json"]));
    assert_eq!(v["tasks_pruned"], 0, "{v}");
    assert!(v["partitions_dropped"].is_array(), "{v}");
    let v = json_of(&artex(url, None, &["migrate", "--json"]));
    assert!(
        v["already"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );
    assert_eq!(v["applied"], serde_json::json!([]), "{v}");
    // The feed is JSON lines: one event a line.
    let out = artex(url, None, &["events", "tail"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert!(
        lines.iter().any(|e| e["task_id"] == id.as_str()),
        "{lines:?}"
    );
}

/// `submit --wait` waits for the task to end, says how it went on standard error, and
/// exits with its outcome: 0 succeeded, 4 failed, 5 canceled.
#[tokio::test]
async fn submit_wait_exits_with_the_tasks_outcome() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let c = db.client().await;
    // Submitted before any worker runs: the wait follows it from pending to the end.
    let mut wait = Background::start(
        url,
        &[
            "submit",
            "fail",
            "--payload",
            r#"{"times": 1}"#,
            "--allow-unregistered-kind",
            "--wait",
        ],
    );
    let id = wait.line();
    uuid::Uuid::parse_str(&id).expect("the id comes first");
    let w = common::procs::Proc::worker("w", url, &[]);
    common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", url, &[]);
    let (rest, code, err) = wait.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(rest.is_empty(), "only the id on standard output: {rest:?}");
    assert!(err.contains(&format!("task {id}: pending")), "{err}");
    assert!(
        err.contains("failing on purpose (attempt 1)"),
        "the retry: {err}"
    );
    assert!(err.contains("succeeded after"), "{err}");
    assert!(err.contains("succeeded_on_attempt"), "the result: {err}");

    let out = artex(
        Some(url),
        None,
        &["submit", "fail", "--max-retries", "0", "--wait"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("failed after"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: task") && stderr(&out).contains("failing on purpose"),
        "{}",
        stderr(&out)
    );

    let out = artex(Some(url), None, &["submit", "echo", "--wait", "--json"]);
    let v = json_of(&out);
    assert_eq!(v["task"]["status"], "succeeded", "{v}");
    assert!(
        v["transitions"].as_array().is_some_and(|t| t.len() >= 3),
        "{v}"
    );

    // Canceled while it runs: the wait ends with 5.
    let mut wait = Background::start(
        url,
        &["submit", "sleep", "--payload", r#"{"ms": 60000}"#, "--wait"],
    );
    let id = wait.line();
    let task: uuid::Uuid = id.parse().unwrap();
    common::procs::wait_status(&db.bb, task, "running", std::time::Duration::from_secs(20)).await;
    let out = artex(Some(url), None, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (_, code, err) = wait.finish();
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("canceled"), "{err}");
}

/// `flow show --follow` shows the flow, then its tasks' changes as they happen, and ends
/// when the flow has finished, with its outcome as exit code.
#[tokio::test]
async fn flow_show_follow_ends_when_the_flow_finishes() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let c = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    std::fs::write(
        &file,
        r#"{"name": "etl", "tasks": [{"name": "extract", "kind": "echo"},
            {"name": "load", "kind": "echo", "depends_on": ["extract"]}]}"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = artex(
        Some(url),
        None,
        &["flow", "submit", path, "--allow-unregistered-kind"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let flow = stdout(&out).trim().to_string();

    // Followed before anything runs: the first line is the flow as it stands.
    let mut json = Background::start(url, &["flow", "show", &flow, "--follow", "--json"]);
    let mut text = Background::start(url, &["flow", "show", &flow, "--follow"]);
    let first: serde_json::Value = serde_json::from_str(&json.line()).unwrap();
    assert_eq!(first["state"], "running", "{first}");
    assert_eq!(first["tasks"][1]["status"], "blocked", "{first}");
    assert!(text.line().starts_with("flow:"), "the table first");
    let w = common::procs::Proc::worker("w", url, &[]);
    common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", url, &[]);

    let (rest, code, err) = json.finish();
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<serde_json::Value> = rest
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let last = lines.last().expect("a line after the start");
    assert_eq!(last["state"], "succeeded", "{last}");
    assert_eq!(last["counts"]["succeeded"], 2, "{last}");
    assert!(
        lines.iter().all(|l| l["id"] == flow.as_str()),
        "each line is the whole flow: {lines:?}"
    );
    let (rest, code, err) = text.finish();
    assert_eq!(code, Some(0), "{err}");
    let shown = rest.join("\n");
    assert!(
        shown.lines().any(|l| l.contains(" load ")
            && l.ends_with("blocked -> pending: all upstream tasks succeeded")),
        "the promotion, as it happened: {shown}"
    );
    assert!(
        shown.contains(&format!("flow {flow}: succeeded (2 succeeded)")),
        "{shown}"
    );

    // A flow that fails: exit 4, whether followed or already over.
    std::fs::write(
        &file,
        r#"{"name": "bad", "tasks": [{"name": "a", "kind": "fail", "max_retries": 0},
            {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    )
    .unwrap();
    let out = artex(Some(url), None, &["flow", "submit", path]);
    let flow = stdout(&out).trim().to_string();
    let out = artex(Some(url), None, &["flow", "show", &flow, "--follow"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("flow {flow}: failed")),
        "{}",
        stdout(&out)
    );
}

/// `bundle create` tells its steps on standard error, a line each when it is no terminal
/// (a test, a log); `--json` prints the bundle's path, size and manifest.
#[test]
fn bundle_create_tells_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "keygen",
            "--secret",
            &p("key"),
            "--public",
            &p("key.pub"),
            "--json",
        ],
    );
    let v = json_of(&out);
    assert_eq!(v["public"], p("key.pub"), "{v}");
    // A "binary" that answers the schema question as artex does.
    let schema = stdout(&artex(None, None, &["schema", "--json"]));
    let bin = p("worker");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\nif [ \"$1\" = schema ]; then echo '{}'; exit 0; fi\nexit 1\n",
            schema.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let size = std::fs::metadata(&bin).unwrap().len();
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "create",
            "--binary",
            &bin,
            "--key",
            &p("key"),
            "--out",
            &p("b.zip"),
            "--json",
        ],
    );
    let v = json_of(&out);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "a line per step, no bar: {err}");
    assert!(
        lines[0].starts_with("artex: bundle: asking") && lines[0].contains("schema"),
        "{err}"
    );
    assert_eq!(
        lines[1],
        format!("artex: bundle: hashing and compressing {bin} ({size} bytes)")
    );
    assert!(lines[2].contains(&format!("wrote {}", p("b.zip"))), "{err}");
    assert!(
        !err.contains('\r'),
        "no redrawn bar off a terminal: {err:?}"
    );
    assert_eq!(v["path"], p("b.zip"), "{v}");
    assert_eq!(
        v["bytes"].as_u64(),
        Some(std::fs::metadata(p("b.zip")).unwrap().len()),
        "{v}"
    );
    assert_eq!(
        v["manifest"]["binary_sha256"].as_str().map(str::len),
        Some(64),
        "{v}"
    );
    assert!(v["manifest"]["schema"]["needs"].is_array(), "{v}");

    // What a worker would verify, before a rolling upgrade: the same manifest; refused
    // with a key it was not signed with.
    let info = json_of(&artex(
        None,
        None,
        &[
            "bundle",
            "info",
            &p("b.zip"),
            "--public-key",
            &p("key.pub"),
            "--json",
        ],
    ));
    assert_eq!(info["manifest"], v["manifest"], "{info}");
    assert_eq!(info["bytes"], v["bytes"], "{info}");
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "keygen",
            "--secret",
            &p("other"),
            "--public",
            &p("other.pub"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "info",
            &p("b.zip"),
            "--public-key",
            &p("other.pub"),
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert!(stderr(&out).contains("signature"), "{}", stderr(&out));
}

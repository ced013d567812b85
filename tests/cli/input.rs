//! Input: bad input refused with exit 2 and nothing written, kinds accepted when a
//! worker declared them, payloads up to the database's limit, from a file or stdin.

use std::process::{Command, Output};

use crate::common;
use crate::common::fixtures;
use crate::common::TestDb;
use crate::{artex, stderr, stdout};

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

#[tokio::test]
async fn kinds_a_worker_declared_are_accepted_and_others_only_when_allowed() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    fixtures::worker(&db.bb, "w1", &["echo", "resize.v2"], 1).await;
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
    fixtures::worker(&db.bb, "w1", &["echo"], 1).await;
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
    fixtures::worker(&db.bb, "w1", &["echo"], 1).await;
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
async fn a_unique_key_prints_the_existing_task_and_submits_nothing() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    fixtures::worker(&db.bb, "w1", &["send-receipt"], 1).await;
    let args = ["submit", "send-receipt", "--unique-key", "receipt-42"];
    let first = artex(url, None, &args);
    assert!(first.status.success(), "{}", stderr(&first));
    let id = stdout(&first).trim().to_string();
    assert!(stderr(&first).is_empty(), "{}", stderr(&first));
    let again = artex(url, None, &args);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(stdout(&again).trim(), id, "the existing task's id");
    assert!(
        stderr(&again).contains(&format!(
            "{id} is the existing task with unique key \"receipt-42\""
        )),
        "{}",
        stderr(&again)
    );
    let json = artex(url, None, &[&args[..], &["--json"]].concat());
    let printed: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(printed, serde_json::json!({"id": id, "duplicate": true}));
    assert_eq!(task_count(&db).await, 1);
    let shown = artex(url, None, &["task", "show", &id]);
    assert!(
        stdout(&shown).contains("unique key:  receipt-42"),
        "{}",
        stdout(&shown)
    );
    // A window needs a key, and a bad one is refused naming the option.
    let out = artex(
        url,
        None,
        &["submit", "send-receipt", "--unique-for", "10m"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--unique-key"), "{}", stderr(&out));
    let out = artex(
        url,
        None,
        &[
            "submit",
            "send-receipt",
            "--unique-key",
            "k",
            "--unique-for",
            "soon",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--unique-for"), "{}", stderr(&out));
    let out = artex(url, None, &["submit", "send-receipt", "--unique-key", ""]);
    assert_refused(&out, "", "--unique-key: must not be empty");
    assert_eq!(task_count(&db).await, 1);
}

//! Output into a pipe whose reader has gone (`artex tasks | head -1`): every command that
//! prints ends quietly — exit 141, as a program SIGPIPE ended, no panic, nothing on
//! standard error — and one that follows a feed stops as soon as its reader goes, not at
//! its next write (which may be hours away).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use serde_json::json;

use crate::common::bundles::Keys;
use crate::common::fixtures;
use crate::common::procs::exit_within;
use crate::common::TestDb;
use crate::{artex, artex_command, stderr, stdout, submit_flow_file};

/// How long a command may take to end once its reader has gone. Generous for a loaded
/// machine: a command that misses it does not notice at all (it would wait for a write).
const DEADLINE: Duration = Duration::from_secs(20);

/// Tasks in the test's database: `tasks --limit` and `events tail` print several times a
/// pipe's buffer (64 KiB) with them, so their writes still fail once `head` has gone.
const MANY: usize = 2000;

/// How a command ended: its exit code (None: killed by a signal) and standard error.
#[derive(Debug)]
pub(crate) struct Ended {
    pub code: Option<i32>,
    pub stderr: String,
}

/// `artex ARGS…` writing into a pipe whose reader was closed before artex started: its
/// first write fails.
pub(crate) fn into_closed_pipe(url: Option<&str>, data_dir: Option<&Path>, args: &[&str]) -> Ended {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = artex_command(url, data_dir, args)
        .stdout(writer)
        .output()
        .expect("run artex");
    Ended {
        code: out.status.code(),
        stderr: stderr(&out),
    }
}

/// `artex ARGS…` read as `| head -N` reads it: `lines` lines, then the reader goes away.
/// Panics if artex has not ended [`DEADLINE`] later.
fn read_then_close(url: Option<&str>, args: &[&str], lines: usize) -> Ended {
    let mut child = artex_command(url, None, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run artex");
    let mut err = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    for n in 0..lines {
        let mut line = String::new();
        let read = out.read_line(&mut line).expect("read artex's output");
        assert!(read > 0, "{args:?}: output ended after {n} lines");
    }
    drop(out);
    let Some(status) = exit_within(&mut child, DEADLINE) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{args:?} still runs {DEADLINE:?} after its reader went away");
    };
    let code = status.code();
    Ended {
        code,
        stderr: err.join().expect("stderr read"),
    }
}

/// Ended as the reader going away should end a command: exit 141, not a panic (101) nor a
/// signal, and nothing said about it.
#[track_caller]
pub(crate) fn assert_quiet(args: &[&str], ended: &Ended) {
    assert_eq!(ended.code, Some(141), "{args:?}: {ended:?}");
    assert_eq!(ended.stderr, "", "{args:?}: said something");
}

/// As [`assert_quiet`], for a command whose progress goes to standard error anyway:
/// whatever it says is not a panic, a backtrace or the closed pipe.
#[track_caller]
fn assert_ended_without_complaint(args: &[&str], ended: &Ended) {
    assert_eq!(ended.code, Some(141), "{args:?}: {ended:?}");
    for sign in ["panicked", "backtrace", "Broken pipe", "error"] {
        assert!(!ended.stderr.contains(sign), "{args:?}: {ended:?}");
    }
}

/// A database with [`MANY`] tasks, one with a payload of 200 KB, a flow, a worker that
/// declared `echo`, and a consumer of the feed. Returns (the big task, the flow).
async fn filled(db: &TestDb, dir: &Path) -> (String, String) {
    let url = Some(db.url.as_str());
    fixtures::worker(&db.bb, "w1", &["echo"], 1).await;
    let tasks: Vec<NewTask> = (0..MANY).map(|_| NewTask::new("echo", json!({}))).collect();
    db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let big = NewTask::new("echo", json!({ "s": "y".repeat(200_000) }));
    let big = db
        .bb
        .operator()
        .submit(&big, "test")
        .await
        .unwrap()
        .to_string();
    let flow = submit_flow_file(
        url,
        dir,
        r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
            {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    );
    // The consumer's cursor is written once it has read an event: right after the
    // inserts the feed may show none yet (transactions still in flight hold it back), so
    // read again until the cursor is there.
    let c = db.client().await;
    for tries in 0.. {
        let out = artex(
            url,
            None,
            &["events", "tail", "--consumer", "c", "--batch", "10000"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let cursors = crate::common::count(
            &c,
            "select count(*) from artex.event_cursors where consumer = 'c'",
        )
        .await;
        if cursors == 1 {
            break;
        }
        assert!(tries < 100, "the consumer's cursor was never written");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    (big, flow)
}

/// Every command that prints data, its output a pipe nobody reads: exit 141 and silence.
/// (`db url` and `db start` are in `embedded_cluster`, `upload` in the uploads tests.)
#[tokio::test]
async fn every_command_that_prints_ends_quietly_when_its_reader_has_gone() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let dir = tempfile::tempdir().unwrap();
    let (big, flow) = filled(&db, dir.path()).await;
    let flow_file = dir.path().join("flow.json");
    let flow_file = flow_file.to_str().unwrap();
    let keys = Keys::new();
    let bundle = keys.script_bundle("b", "#!/bin/sh\n");
    let bundle = bundle.to_str().unwrap();
    let public = keys.path("public");
    let public = public.to_str().unwrap();
    let (secret2, public2) = (dir.path().join("s2"), dir.path().join("p2"));
    let (secret2, public2) = (secret2.to_str().unwrap(), public2.to_str().unwrap());
    let (secret3, public3) = (dir.path().join("s3"), dir.path().join("p3"));
    let (secret3, public3) = (secret3.to_str().unwrap(), public3.to_str().unwrap());
    let paused = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap()
        .to_string();
    let no_cluster = dir.path().join("no-cluster");
    let no_cluster = no_cluster.to_str().unwrap();

    for args in [
        &["tasks"][..],
        &["tasks", "--json"],
        &["task", "show", &big],
        &["task", "show", &big, "--json"],
        &["submit", "echo"],
        &["submit", "echo", "--json"],
        &["submit", "echo", "--wait"],
        &["flow", "submit", flow_file],
        &["flow", "submit", flow_file, "--json"],
        &["flow", "show", &flow],
        &["flow", "show", &flow, "--json"],
        &["flow", "show", &flow, "--follow"],
        &["flow", "show", &flow, "--follow", "--json"],
        &["flow", "list"],
        &["flow", "list", "--json"],
        &["pause", &paused],
        &["resume", &paused, "--json"],
        &["cancel", &flow],
        &["workers"],
        &["workers", "--json"],
        &["stats"],
        &["stats", "--json"],
        &["kinds"],
        &["kinds", "--json"],
        &["limits"],
        &["limits", "--json"],
        &["events", "tail"],
        &["events", "tail", "--follow"],
        &["events", "retention"],
        &["events", "retention", "--json"],
        &["events", "prune"],
        &["events", "prune", "--json"],
        &["events", "forget", "--consumer", "c"],
        &["migrate"],
        &["migrate", "--json"],
        &["schema"],
        &["schema", "--json"],
        &["db", "status", "--data-dir", no_cluster],
        &["db", "status", "--data-dir", no_cluster, "--json"],
        &["bundle", "keygen", "--secret", secret2, "--public", public2],
        &[
            "bundle", "keygen", "--secret", secret3, "--public", public3, "--json",
        ],
        &["bundle", "info", bundle, "--public-key", public],
        &["bundle", "info", bundle, "--public-key", public, "--json"],
    ] {
        assert_quiet(args, &into_closed_pipe(url, None, args));
    }
    // It says its steps on standard error, as it goes.
    let script = dir.path().join("bin");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let out = dir.path().join("b.zip");
    let secret = keys.path("secret");
    let args = [
        "bundle",
        "create",
        "--binary",
        script.to_str().unwrap(),
        "--key",
        secret.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--no-schema",
    ];
    assert_ended_without_complaint(&args, &into_closed_pipe(url, None, &args));
}

/// `| head -1` on output several times a pipe's buffer: artex is still writing when
/// `head` goes, and its next write fails.
#[tokio::test]
async fn head_takes_its_line_and_the_rest_is_not_written() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let dir = tempfile::tempdir().unwrap();
    let (big, _) = filled(&db, dir.path()).await;
    let many = MANY.to_string();
    for args in [
        &["tasks", "--limit", &many][..],
        &["tasks", "--limit", &many, "--json"],
        &["task", "show", &big, "--full"],
        &["task", "show", &big, "--full", "--json"],
        &["events", "tail"],
    ] {
        let whole = stdout(&artex(url, None, args)).len();
        assert!(whole > 3 * 64 * 1024, "{args:?}: only {whole} bytes");
        assert_quiet(args, &read_then_close(url, args, 1));
    }
}

/// A follower waiting for what may never come (no worker runs the tasks) stops when its
/// reader goes away, without a write to tell it.
#[tokio::test]
async fn followers_stop_as_soon_as_their_reader_has_gone() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let dir = tempfile::tempdir().unwrap();
    fixtures::worker(&db.bb, "w1", &["echo"], 1).await;
    let flow = submit_flow_file(
        url,
        dir.path(),
        r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"}]}"#,
    );
    for args in [
        &["events", "tail", "--follow"][..],
        &["events", "tail", "--follow", "--consumer", "c"],
        &["flow", "show", &flow, "--follow"],
        &["flow", "show", &flow, "--follow", "--json"],
    ] {
        assert_quiet(args, &read_then_close(url, args, 1));
    }
    // The id, then the wait for a task no worker runs, told on standard error.
    let args = &["submit", "echo", "--wait"];
    let ended = read_then_close(url, args, 1);
    assert_ended_without_complaint(args, &ended);
    assert!(ended.stderr.ends_with(": pending\n"), "{ended:?}");
}

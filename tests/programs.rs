//! Programs as task kinds (`--tasks-dir`, docs/programs.md), with real planner and worker
//! processes and real shell, Python and Node programs: the task in on stdin, lines on
//! descriptor 3, the exit status as the outcome; nothing a program starts outlives its
//! task; a folder the worker cannot trust stops it at start, naming the path.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use artex_actors::blackboard::{Control, NewTask, TaskRow};
use common::procs::{wait_for, wait_status, Proc};
use common::{run_cli, TestDb};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::{json, Value};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

/// The programs of the first test, by file name.
const PROGRAMS: &[(&str, &str)] = &[
    (
        "echo-in.sh",
        r#"#!/bin/sh
input=$(cat)
echo "to stdout"
printf '{"progress": 0.5, "message": "echoing"}\n' >&3
printf '{"result": %s}\n' "$input" >&3
"#,
    ),
    (
        "env.py",
        r#"#!/usr/bin/env python3
import json, os, sys
task = json.load(sys.stdin)
out = os.fdopen(3, "w")
names = ["ARTEX_TASK_ID", "ARTEX_TASK_KIND", "ARTEX_TASK_ATTEMPT", "ARTEX_PROTOCOL",
         "ARTEX_TEST_PASSED", "ARTEX_TEST_SECRET", "ARTEX_DATABASE_URL", "PATH"]
out.write(json.dumps({"checkpoint": {"seen": task["payload"]}}) + "\n"); out.flush()
out.write(json.dumps({"result": {"task": task, "env": {n: os.environ.get(n) for n in names}}}) + "\n")
"#,
    ),
    (
        "greet.js",
        r#"#!/usr/bin/env node
const fs = require("fs");
const task = JSON.parse(fs.readFileSync(0, "utf8"));
const name = task.payload.name;
fs.writeSync(3, JSON.stringify(name ? { result: { greeting: "hello, " + name } }
                                    : { discard: "payload.name is missing" }) + "\n");
"#,
    ),
    (
        "fails.sh",
        "#!/bin/sh\necho 'first line' >&2\necho 'what went wrong' >&2\nexit 3\n",
    ),
    (
        "bad-line.sh",
        "#!/bin/sh\necho '{\"progress\": 0.1}' >&3\necho '{\"progres\": 1}' >&3\nexec sleep 300\n",
    ),
    ("killed.sh", "#!/bin/sh\nkill -9 $$\n"),
    (
        "later.sh",
        r#"#!/bin/sh
# Snoozed the first time (no attempt counted), put off to a time already past the second
# (an attempt counted), then it succeeds.
marker=$(cat | sed 's/.*"marker":"\([^"]*\)".*/\1/')
if [ ! -e "$marker.1" ]; then : > "$marker.1"; echo '{"snooze_ms": 10}' >&3; exit 0; fi
if [ ! -e "$marker.2" ]; then : > "$marker.2"
  echo '{"retry_at": "2020-01-01T00:00:00Z", "reason": "not yet"}' >&3; exit 1; fi
echo "{\"result\": {\"attempt\": $ARTEX_TASK_ATTEMPT}}" >&3
"#,
    ),
    (
        "forks.sh",
        r#"#!/bin/sh
# Leaves a child running in its group, writes both pids, then exits or waits.
pidfile=$(cat | sed 's/.*"pidfile":"\([^"]*\)".*/\1/')
sleep 300 &
echo "$$ $!" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
case "$ARTEX_TASK_KIND" in forks) exit 0 ;; esac
wait
"#,
    ),
];

fn write_program(dir: &Path, name: &str, text: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a program");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A tasks folder a worker accepts (mode 755): as root, programs run as `nobody`, who
/// must reach them.
fn tasks_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tasks dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// A folder any user may write in, for what programs write (pids, markers).
fn writable_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a folder for programs' files");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

async fn submit(db: &TestDb, kind: &str, payload: Value, timeout_ms: Option<i32>) -> Uuid {
    let task = NewTask {
        timeout_ms,
        max_retries: Some(2),
        ..NewTask::new(kind, payload)
    };
    db.bb
        .operator()
        .submit(&task, "test")
        .await
        .expect("submit")
}

/// A task of `kind` submitted (with no timeout) and ended `status`.
async fn outcome(db: &TestDb, kind: &str, payload: Value, status: &str) -> TaskRow {
    let id = submit(db, kind, payload, None).await;
    ended(db, id, status).await
}

async fn ended(db: &TestDb, id: Uuid, status: &str) -> TaskRow {
    wait_status(&db.bb, id, status, WAIT).await;
    db.bb.operator().task(id).await.expect("the task")
}

/// The two pids a `forks.sh`-like program wrote to `pidfile`.
async fn pids(pidfile: &Path) -> [i32; 2] {
    wait_for("the program's pids", WAIT, || async {
        let text = std::fs::read_to_string(pidfile).ok()?;
        let v: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        <[i32; 2]>::try_from(v).ok()
    })
    .await
}

/// Both processes are gone, killed and reaped (not zombies: no such process at all).
async fn gone(what: &str, pids: [i32; 2], within: Duration) {
    wait_for(what, within, || async {
        pids.iter()
            .all(|p| kill(Pid::from_raw(*p), None).is_err())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn programs_in_three_languages_run_their_tasks_and_nothing_outlives_them() {
    let db = TestDb::new().await;
    let dir = tasks_dir();
    let out = writable_dir();
    for (name, text) in PROGRAMS {
        write_program(dir.path(), name, text, 0o755);
    }
    // Not kinds: a file that is not executable, and a bounds file.
    write_program(dir.path(), "notes.txt", "not a program", 0o644);
    write_program(dir.path(), "fails.toml", "timeout = \"1s\"", 0o644);
    // `hangs` is `forks` that waits for its child instead of exiting.
    std::os::unix::fs::symlink(dir.path().join("forks.sh"), dir.path().join("hangs.sh"))
        .expect("symlink");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let tasks_dir = dir.path().to_str().expect("a UTF-8 path");
    let _worker = Proc::start(
        "worker",
        &db.url,
        &[
            "worker",
            "--http",
            "127.0.0.1:0",
            "--heartbeat-ms",
            "200",
            "--retry-base-ms",
            "20",
            "--retry-cap-ms",
            "200",
            "--cancel-grace-ms",
            "1000",
            "--tasks-dir",
            tasks_dir,
            "--tasks-env",
            "ARTEX_TEST_PASSED",
        ],
        &[
            ("ARTEX_TEST_PASSED", "yes"),
            ("ARTEX_TEST_SECRET", "s3cret"),
        ],
    );
    let c = db.client().await;
    wait_for("the programs' kinds declared", WAIT, || async {
        let kinds: Vec<String> = c
            .query_one(
                "select coalesce(array_agg(k order by k), '{}') from artex.workers, unnest(kinds) k
                 where state = 'online'",
                &[],
            )
            .await
            .ok()?
            .get(0);
        let want = [
            "bad-line", "echo-in", "env", "fails", "forks", "greet", "hangs", "killed", "later",
        ];
        want.iter()
            .all(|k| kinds.contains(&k.to_string()))
            .then_some(kinds)
    })
    .await;

    // Shell: the task in on stdin, its result and progress out on descriptor 3.
    let t = outcome(&db, "echo-in", json!({"n": 7}), "succeeded").await;
    assert_eq!(
        (t.progress, t.progress_message.as_deref()),
        (Some(0.5), Some("echoing"))
    );
    let result = t.result.expect("a result");
    assert_eq!(result["id"], json!(t.id.to_string()));
    assert_eq!(result["kind"], json!("echo-in"));
    assert_eq!(result["payload"], json!({"n": 7}));
    assert_eq!(
        (result["attempt"].clone(), result["max_attempts"].clone()),
        (json!(1), json!(3))
    );
    assert_eq!(result["checkpoint"], Value::Null);

    // Python: its environment is the protocol's and what --tasks-env passes, nothing
    // else of the worker's; its checkpoint is saved.
    let t = outcome(&db, "env", json!({"x": 1}), "succeeded").await;
    assert_eq!(t.checkpoint, Some(json!({"seen": {"x": 1}})));
    let result = t.result.expect("a result");
    let env = &result["env"];
    assert_eq!(env["ARTEX_TASK_ID"], json!(t.id.to_string()));
    assert_eq!(env["ARTEX_TASK_KIND"], json!("env"));
    assert_eq!(env["ARTEX_TASK_ATTEMPT"], json!("1"));
    assert_eq!(env["ARTEX_PROTOCOL"], json!("1"));
    assert_eq!(env["ARTEX_TEST_PASSED"], json!("yes"));
    assert_eq!(env["ARTEX_TEST_SECRET"], Value::Null, "{env}");
    assert_eq!(env["ARTEX_DATABASE_URL"], Value::Null, "{env}");
    assert_eq!(env["PATH"], json!("/usr/local/bin:/usr/bin:/bin"));

    // Node: a result, and a discard (failed now, no retry).
    let t = outcome(&db, "greet", json!({"name": "ada"}), "succeeded").await;
    assert_eq!(t.result, Some(json!({"greeting": "hello, ada"})));
    let t = outcome(&db, "greet", json!({}), "failed").await;
    assert_eq!(
        t.error.as_deref(),
        Some("discarded: payload.name is missing")
    );
    assert_eq!(t.retries, 1, "a discard ends the task at its first attempt");

    // A failing program: its status and the end of its stderr are the error; retried.
    let t = outcome(&db, "fails", json!({}), "failed").await;
    assert_eq!(
        t.error.as_deref(),
        Some("exited with status 3: first line\nwhat went wrong")
    );
    assert_eq!(t.retries, 3, "retried by the kind's policy: {t:?}");

    // A bad line on descriptor 3 fails the attempt at once, naming the line.
    let t = outcome(&db, "bad-line", json!({}), "failed").await;
    assert!(
        t.error.as_deref().is_some_and(
            |e| e.starts_with("fd 3 line 2: unknown key \"progres\"; expected one of progress")
        ),
        "{:?}",
        t.error
    );

    // Killed by a signal.
    let t = outcome(&db, "killed", json!({}), "failed").await;
    assert_eq!(t.error.as_deref(), Some("killed by signal SIGKILL"));

    // Snoozed (no attempt counted), then retried at a time of its own (one counted).
    let marker = out.path().join("later-marker");
    let t = outcome(&db, "later", json!({"marker": marker}), "succeeded").await;
    assert_eq!(t.result, Some(json!({"attempt": 2})));

    // What a program leaves running in its group is killed when it exits.
    let pidfile = out.path().join("forks.pids");
    let id = submit(&db, "forks", json!({"pidfile": pidfile}), None).await;
    ended(&db, id, "succeeded").await;
    let both = pids(&pidfile).await;
    gone(
        "the child a program left behind",
        both,
        Duration::from_secs(2),
    )
    .await;

    // A cancel stops a program and its child within the grace (1 s).
    let pidfile = out.path().join("cancel.pids");
    let id = submit(&db, "hangs", json!({"pidfile": pidfile}), None).await;
    let both = pids(&pidfile).await;
    db.bb
        .operator()
        .control(Control::Cancel, id, "test", Some("stop it"))
        .await
        .expect("cancel");
    gone(
        "a canceled program and its child",
        both,
        Duration::from_secs(5),
    )
    .await;
    ended(&db, id, "canceled").await;

    // So does a timeout.
    let pidfile = out.path().join("timeout.pids");
    let id = submit(&db, "hangs", json!({"pidfile": pidfile}), Some(500)).await;
    let both = pids(&pidfile).await;
    gone(
        "a program past its timeout and its child",
        both,
        Duration::from_secs(5),
    )
    .await;
    let t = ended(&db, id, "timeout").await;
    assert!(t.error.is_some_and(|e| e.contains("timeout")));
}

/// The worker stops at start on a folder it cannot trust, naming the path and why.
#[tokio::test]
async fn a_tasks_dir_the_worker_cannot_trust_stops_it_at_start() {
    let db = TestDb::new().await;
    type Setup = fn(&Path);
    let cases: [(&str, Setup, &str); 6] = [
        (
            "a bounds file with a misspelt key",
            |d| {
                write_program(d, "x.sh", "#!/bin/sh\n", 0o755);
                write_program(d, "x.toml", "timeout = \"1s\"\nmemroy = 5\n", 0o644);
            },
            "x.toml: line 2: unknown key \"memroy\"; expected timeout, memory, cpu_seconds",
        ),
        (
            "two files, one kind",
            |d| {
                write_program(d, "resize.py", "#!/bin/sh\n", 0o755);
                write_program(d, "resize.sh", "#!/bin/sh\n", 0o755);
            },
            "kind 'resize' is defined twice: by ",
        ),
        (
            "a kind compiled in",
            |d| write_program(d, "echo.sh", "#!/bin/sh\n", 0o755),
            "kind 'echo' is defined twice: by ",
        ),
        (
            "a world-writable program",
            |d| write_program(d, "open.sh", "#!/bin/sh\n", 0o757),
            "open.sh: writable by its group or by everyone (mode 757); refused",
        ),
        (
            "a group-writable folder",
            |d| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o775)).unwrap(),
            ": writable by its group or by everyone (mode 775); refused",
        ),
        (
            "a name that is not a kind name",
            |d| write_program(d, "-x.sh", "#!/bin/sh\n", 0o755),
            "-x.sh: its name without extension, \"-x\" is not a kind name",
        ),
    ];
    for (case, setup, says) in cases {
        let dir = tempfile::tempdir().expect("tasks dir");
        setup(dir.path());
        let mut worker = Proc::worker(
            "worker",
            &db.url,
            &["--tasks-dir", dir.path().to_str().unwrap()],
        );
        let status = worker
            .wait_exit(WAIT)
            .unwrap_or_else(|| panic!("{case}: the worker did not stop"));
        let log = worker.log_text();
        assert!(!status.success(), "{case}: {log}");
        assert!(log.contains(says), "{case}: expected {says:?} in\n{log}");
    }
}

/// The example programs of docs/programs.md (examples/programs/) run as documented.
#[tokio::test]
async fn the_example_programs_run_as_their_page_says() {
    let db = TestDb::new().await;
    let dir = tasks_dir();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs");
    for name in ["echo-input.sh", "resize.py", "greet.js"] {
        let text = std::fs::read_to_string(examples.join(name)).expect("an example");
        write_program(dir.path(), name, &text, 0o755);
    }
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _worker = Proc::worker(
        "worker",
        &db.url,
        &["--tasks-dir", dir.path().to_str().unwrap()],
    );
    wait_for("a worker online", WAIT, || async {
        let c = db.client().await;
        let n: i64 = c
            .query_one(
                "select count(*) from artex.workers where state = 'online' and 'resize' = any(kinds)",
                &[],
            )
            .await
            .ok()?
            .get(0);
        (n > 0).then_some(())
    })
    .await;
    // Listed as any kind is.
    let (code, out, err) = run_cli(&db.url, &["kinds"]);
    assert_eq!(code, 0, "{err}");
    for kind in ["echo-input", "resize", "greet"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{kind} "))),
            "{kind} not in `artex kinds`:\n{out}"
        );
    }
    let t = outcome(&db, "echo-input", json!({"a": [1, 2]}), "succeeded").await;
    assert_eq!(t.result.expect("a result")["payload"], json!({"a": [1, 2]}));
    let t = outcome(&db, "resize", json!({"ms": 10}), "succeeded").await;
    assert_eq!(t.result, Some(json!({"steps": 5, "resumed_from": 0})));
    assert_eq!(t.checkpoint, Some(json!({"done": 5})));
    let t = outcome(&db, "greet", json!({"name": "ada"}), "succeeded").await;
    assert_eq!(t.result, Some(json!({"greeting": "hello, ada"})));
    let t = outcome(&db, "greet", json!({}), "failed").await;
    assert_eq!(
        t.error.as_deref(),
        Some("discarded: payload.name is missing")
    );
}

/// The bounds of `NAME.toml`: a timeout, CPU seconds, an address space and open files
/// hold the program, each failure saying which; a worker running as root runs programs
/// as `nobody` unless the file says `user = "root"`.
#[tokio::test]
async fn bounds_beside_a_program_hold_it() {
    let db = TestDb::new().await;
    let dir = tasks_dir();
    let root = nix::unistd::geteuid().is_root();
    let mut programs = vec![
        (
            "slow.sh",
            "#!/bin/sh\nexec sleep 30\n",
            Some("timeout = \"300ms\""),
        ),
        (
            "spin.sh",
            "#!/bin/sh\nwhile :; do :; done\n",
            Some("cpu_seconds = 1"),
        ),
        (
            "hog.py",
            "#!/usr/bin/env python3\nx = bytearray(400 * 1024 * 1024)\n",
            Some("memory = \"200MiB\""),
        ),
        (
            "files.py",
            "#!/usr/bin/env python3\nfs = [open('/dev/null') for _ in range(64)]\n",
            Some("open_files = 16"),
        ),
        (
            "whoami.sh",
            "#!/bin/sh\necho \"{\\\"result\\\": $(id -u)}\" >&3\n",
            None,
        ),
    ];
    if root {
        programs.push((
            "asroot.sh",
            "#!/bin/sh\necho \"{\\\"result\\\": $(id -u)}\" >&3\n",
            Some("user = \"root\""),
        ));
    }
    for (name, text, bounds) in &programs {
        write_program(dir.path(), name, text, 0o755);
        if let Some(b) = bounds {
            let kind = name.split('.').next().unwrap();
            write_program(dir.path(), &format!("{kind}.toml"), b, 0o644);
        }
    }
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _worker = Proc::worker(
        "worker",
        &db.url,
        &["--tasks-dir", dir.path().to_str().unwrap()],
    );
    let once = |kind: &str| NewTask {
        max_retries: Some(0),
        ..NewTask::new(kind, json!({}))
    };
    let mut ids = Vec::new();
    for kind in ["slow", "spin", "hog", "files", "whoami"] {
        // Submitted once its worker declared it.
        let id = wait_for(&format!("kind {kind} to be accepted"), WAIT, || async {
            db.bb.operator().submit(&once(kind), "test").await.ok()
        })
        .await;
        ids.push(id);
    }
    let t = ended(&db, ids[0], "timeout").await;
    assert!(
        t.error
            .as_deref()
            .is_some_and(|e| e.contains("timeout of 300 ms")),
        "{:?}",
        t.error
    );
    let t = ended(&db, ids[1], "failed").await;
    assert_eq!(
        t.error.as_deref(),
        Some("killed by signal SIGXCPU: over its CPU bound of 1 s")
    );
    let t = ended(&db, ids[2], "failed").await;
    let e = t.error.unwrap_or_default();
    assert!(
        e.starts_with("exited with status 1 (its memory bound: 200 MiB of address space): ")
            && e.contains("MemoryError"),
        "{e}"
    );
    let t = ended(&db, ids[3], "failed").await;
    let e = t.error.unwrap_or_default();
    assert!(e.contains("Too many open files"), "{e}");
    let t = ended(&db, ids[4], "succeeded").await;
    let me = nix::unistd::geteuid().as_raw();
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    assert_eq!(t.result, Some(json!(if root { nobody } else { me })));
    if root {
        let id = db
            .bb
            .operator()
            .submit(&once("asroot"), "test")
            .await
            .unwrap();
        let t = ended(&db, id, "succeeded").await;
        assert_eq!(t.result, Some(json!(0)), "user = \"root\" runs it as root");
    }
}

/// A worker that loses a task's lease (the task sent back to the queue behind its back)
/// stops that task's program and what it started: nothing runs on for a task the worker
/// no longer holds.
#[tokio::test]
async fn a_lost_lease_stops_the_program_and_its_children() {
    let db = TestDb::new().await;
    let dir = tasks_dir();
    let out = writable_dir();
    let (_, forks) = PROGRAMS
        .iter()
        .find(|(name, _)| *name == "forks.sh")
        .expect("forks.sh");
    write_program(dir.path(), "hangs.sh", forks, 0o755);
    let planner = Proc::planner("planner", &db.url, &[]);
    // Leases of 3 s, renewed every second; stopped programs get 1 s before SIGKILL.
    let _worker = Proc::worker(
        "worker",
        &db.url,
        &[
            "--tasks-dir",
            dir.path().to_str().unwrap(),
            "--cancel-grace-ms",
            "1000",
        ],
    );
    let pidfile = out.path().join("lost.pids");
    let id = wait_for("kind hangs to be accepted", WAIT, || async {
        let task = NewTask::new("hangs", json!({ "pidfile": pidfile }));
        db.bb.operator().submit(&task, "test").await.ok()
    })
    .await;
    let c = db.client().await;
    let send_back = || async {
        // Once running: a new attempt's pids are written after its start.
        wait_status(&db.bb, id, "running", WAIT).await;
        let n = c
            .execute(
                "update artex.tasks set status = 'pending' where id = $1 and status = 'running'",
                &[&id],
            )
            .await
            .expect("sending the task back");
        assert_eq!(n, 1, "the task was running");
    };
    // The planner assigns it here again at once: the newer attempt stops the older one.
    let both = pids(&pidfile).await;
    std::fs::remove_file(&pidfile).expect("the first attempt's pids");
    send_back().await;
    gone(
        "the program of an attempt superseded on its own worker, and its child",
        both,
        Duration::from_secs(10),
    )
    .await;
    // No planner hands it out again: the worker's renewal finds the lease gone.
    let both = pids(&pidfile).await;
    drop(planner);
    send_back().await;
    gone(
        "the program of a task whose lease was lost, and its child",
        both,
        Duration::from_secs(10),
    )
    .await;
}

/// A worker cut off from PostgreSQL (the server stopped under it) stops its programs
/// before their lease ends, even one that ignores SIGTERM with a grace far longer than
/// the lease: the SIGKILL comes within what is left of the lease, so no other worker can
/// be running the task by then.
#[tokio::test]
async fn a_worker_cut_off_from_postgres_kills_its_programs_before_their_lease_ends() {
    let private = common::PrivateCluster::start().await;
    let (cluster, url, bb) = (private.cluster.clone(), private.url.clone(), &private.bb);
    let dir = tasks_dir();
    let out = writable_dir();
    write_program(
        dir.path(),
        "stubborn.sh",
        r#"#!/bin/sh
# SIGTERM ignored, by this shell and the sleeps it starts.
trap '' TERM
pidfile=$(cat | sed 's/.*"pidfile":"\([^"]*\)".*/\1/')
sleep 300 &
echo "$$ $!" > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
wait
"#,
        0o755,
    );
    let _planner = Proc::planner("planner", &url, &[]);
    // Leases of 3 s; a grace of 30 s, which would outlive the lease tenfold.
    let _worker = Proc::worker(
        "worker",
        &url,
        &[
            "--tasks-dir",
            dir.path().to_str().unwrap(),
            "--cancel-grace-ms",
            "30000",
        ],
    );
    let pidfile = out.path().join("stubborn.pids");
    let task = NewTask::new("stubborn", json!({ "pidfile": pidfile }));
    let id = wait_for("kind stubborn to be accepted", WAIT, || async {
        bb.operator().submit(&task, "test").await.ok()
    })
    .await;
    let both = pids(&pidfile).await;
    // Right after a renewal (the lease's end moved), the server goes: the next renewal,
    // a second away, never comes, and the lease ends no earlier than it says now.
    let c = common::connect(&url).await;
    let first = lease_until(&c, id).await;
    let lease_end = wait_for("a renewal", WAIT, || async {
        let now = lease_until(&c, id).await;
        (now != first).then_some(now)
    })
    .await;
    tokio::task::spawn_blocking(move || cluster.stop().unwrap())
        .await
        .unwrap();
    gone(
        "the program that ignores SIGTERM, and its child",
        both,
        Duration::from_secs(40),
    )
    .await;
    let dead_at = chrono::Utc::now();
    assert!(
        dead_at < lease_end,
        "the program was still running at {dead_at}, past its lease's end at {lease_end}"
    );
}

async fn lease_until(c: &tokio_postgres::Client, id: Uuid) -> chrono::DateTime<chrono::Utc> {
    c.query_one("select lease_until from artex.tasks where id = $1", &[&id])
        .await
        .expect("the task's lease")
        .get(0)
}

/// A program's progress lines reach `/events` as progress events, live, as a Rust
/// handler's reports do (and `task show` has the last one: the first test).
#[tokio::test]
async fn a_programs_progress_reaches_server_sent_events() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let dir = tasks_dir();
    write_program(
        dir.path(),
        "steps.py",
        r#"#!/usr/bin/env python3
import json, os, sys, time
json.load(sys.stdin)
out = os.fdopen(3, "w")
for step in range(1, 4):
    # A step a second and more: each of the worker's periodic writes has a new value.
    time.sleep(1.1)
    out.write(json.dumps({"progress": step / 3, "message": f"step {step} of 3"}) + "\n")
    out.flush()
"#,
        0o755,
    );
    let _planner = Proc::planner("planner", &db.url, &[]);
    let worker = Proc::worker(
        "worker",
        &db.url,
        &["--tasks-dir", dir.path().to_str().unwrap()],
    );
    let http = common::procs::worker_http(&c, &worker).await;
    let mut stream = artex_testkit::http::Request::get("/events")
        .header("Accept", "text/event-stream")
        .bearer(common::READ_TOKEN)
        .start(&http)
        .unwrap();
    assert_eq!(stream.head().unwrap().status, 200);
    let id = submit(&db, "steps", json!({}), None).await;
    let mut event = None;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let mut line = String::new();
        assert!(stream.read_line(&mut line).unwrap() > 0, "the stream ended");
        let line = line.trim_end();
        if line.is_empty() {
            event = None;
        } else if let Some(e) = line.strip_prefix("event: ") {
            event = Some(e.to_string());
        } else if let Some(data) = line.strip_prefix("data: ") {
            if event.as_deref() == Some("progress") {
                let v: Value = serde_json::from_str(data).unwrap();
                if v["task_id"] == json!(id.to_string()) {
                    seen.push(v);
                }
            }
        }
    }
    assert_eq!(seen[0]["kind"], json!("steps"));
    let step = (seen[0]["progress"].as_f64().unwrap() * 3.0).round() as i64;
    assert_eq!(
        seen[0]["message"],
        json!(format!("step {step} of 3")),
        "{seen:?}"
    );
    assert!(
        seen[1]["progress"].as_f64() > seen[0]["progress"].as_f64(),
        "{seen:?}"
    );
    ended(&db, id, "succeeded").await;
}

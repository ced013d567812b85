//! The spans of a task's life, exported by real processes (the CLI, `artex serve`, a
//! planner, a worker) to a real OTLP/HTTP receiver: one trace per submission, every span
//! a child of the submission's, with the attributes an on-call reads; a retry is a
//! second attempt span in the same trace; a program gets `TRACEPARENT`; a collector
//! that is down fails and stalls nothing, and the spans it lost are counted.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use artex_testkit::http::Request;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::procs::{
    http_get, planner_metrics, planner_rounds_pass, serve_address, wait_for, wait_status,
    with_defaults, worker_http, Proc, FAST_PLANNER, FAST_WORKER,
};
use crate::common::TestDb;
use crate::receiver::{exporting_to, Got, Receiver};

const WAIT: Duration = Duration::from_secs(60);
const WRITE_TOKEN: &str = "traces-write-token";
/// The context a traced client submits in: the CLI's task joins its trace.
const GIVEN: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// A program that answers with the `TRACEPARENT` it was given.
const TP_PROGRAM: &str =
    "#!/bin/sh\ncat >/dev/null\nprintf '{\"result\": {\"traceparent\": \"%s\"}}\\n' \"$TRACEPARENT\" >&3\n";

async fn wait_kinds(c: &tokio_postgres::Client, kinds: &[&str]) {
    wait_for("the worker's kinds declared", WAIT, || async {
        let known: Vec<String> = c
            .query("select kind from artex.kinds", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        kinds
            .iter()
            .all(|k| known.iter().any(|n| n == k))
            .then_some(())
    })
    .await;
}

/// The spans received for `task` (by their `artex.task.id`, or the submission's ids).
fn of_task(spans: &[Got], task: Uuid) -> Vec<Got> {
    let id = task.to_string();
    spans
        .iter()
        .filter(|s| s.attr("artex.task.id") == id || s.attr("artex.task.ids").contains(&id))
        .cloned()
        .collect()
}

/// Waits until `task`'s spans include the submission, a queue and an assignment span per
/// attempt, and `attempts` attempts, the last one `succeeded`.
async fn trace_of(rx: &Receiver, task: Uuid, attempts: usize) -> Vec<Got> {
    wait_for(&format!("the spans of task {task}"), WAIT, || async {
        let spans = of_task(&rx.spans(), task);
        let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
        let done = count("artex.submit") == 1
            && count("artex.queue") == attempts
            && count("artex.assign") == attempts
            && count("artex.attempt") == attempts
            && spans.iter().any(|s| {
                s.name == "artex.attempt"
                    && s.attr("artex.attempt") == attempts.to_string()
                    && s.attr("artex.outcome") == "succeeded"
            });
        done.then_some(spans)
    })
    .await
}

/// An `echo` task of `payload` submitted by `artex submit` in the context [`GIVEN`] of a
/// traced client, its spans exported to `rx`.
fn submit_by_cli(url: &str, rx: &Receiver, payload: &str) -> Uuid {
    let out = std::process::Command::new(crate::common::artex_bin())
        .args(["submit", "echo", "--payload", payload])
        .env("ARTEX_DATABASE_URL", url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("TRACEPARENT", GIVEN)
        .output()
        .expect("artex submit");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Checks the tree of one task's trace: one trace id, the submission made by
/// `submitter`, every other span its child, made by the planner or the worker: the time
/// in queue and the assignment by whoever assigned (a planner's round, or the worker's
/// own claim), each attempt by the worker.
fn check_tree(spans: &[Got], task: Uuid, kind: &str, submitter: &str, worker: &str) -> Got {
    let submit = spans.iter().find(|s| s.name == "artex.submit").unwrap();
    assert_eq!(submit.role, submitter, "{submit:?}");
    for s in spans {
        assert_eq!(s.trace, submit.trace, "one trace: {spans:#?}");
        if s.name != "artex.submit" {
            assert_eq!(s.parent, submit.span, "a child of the submission: {s:?}");
            assert_eq!(s.attr("artex.task.id"), task.to_string(), "{s:?}");
            assert_eq!(s.attr("artex.task.kind"), kind, "{s:?}");
            assert!(s.start_ns <= s.end_ns, "{s:?}");
        }
        match (s.name.as_str(), s.role.as_str()) {
            ("artex.queue", "planner" | "worker") => {}
            ("artex.assign", "planner") => {
                assert_eq!(s.attr("artex.worker"), worker, "{s:?}");
                assert!(s.attr("artex.planner").starts_with("planner"), "{s:?}");
                assert!(s.attr("artex.round").parse::<u64>().unwrap() >= 1, "{s:?}");
            }
            ("artex.assign", "worker") => {
                assert_eq!(s.attr("artex.worker"), worker, "{s:?}");
                assert_eq!(s.attr("artex.claimed"), "true", "{s:?}");
                assert_eq!(s.attr("artex.planner"), "", "{s:?}");
            }
            ("artex.attempt", "worker") => {
                assert_eq!(s.attr("artex.worker"), worker, "{s:?}");
            }
            ("artex.submit", _) => {}
            (other, role) => panic!("an unexpected span {other} by the {role}: {s:?}"),
        }
    }
    // An attempt's time in queue and its assignment are made by one maker.
    let made_by = |name: &str| {
        let mut roles: Vec<&str> = spans
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.role.as_str())
            .collect();
        roles.sort();
        roles
    };
    assert_eq!(
        made_by("artex.queue"),
        made_by("artex.assign"),
        "{spans:#?}"
    );
    // One process per role: the submitter, the worker, and the planner if it assigned.
    let pids: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.pid.as_str()).collect();
    let roles: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.role.as_str()).collect();
    assert_eq!(pids.len(), roles.len(), "{spans:#?}");
    submit.clone()
}

#[tokio::test]
async fn one_trace_runs_from_the_submitter_through_the_planner_to_the_handler() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let rx = Receiver::start();
    let otel = exporting_to(&rx.url);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = dir.path().join("tp.sh");
    std::fs::write(&program, TP_PROGRAM).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tokens = tempfile::tempdir().unwrap();
    let token_file = tokens.path().join("write");
    std::fs::write(&token_file, WRITE_TOKEN).unwrap();

    let _planner = Proc::start(
        "planner",
        &db.url,
        &with_defaults("planner", FAST_PLANNER, &[]),
        &otel,
    );
    let tasks_dir = dir.path().to_str().unwrap();
    let worker = Proc::start(
        "worker",
        &db.url,
        &with_defaults("worker", FAST_WORKER, &["--tasks-dir", tasks_dir]),
        &otel,
    );
    let mut serve_env = otel.to_vec();
    serve_env.push(("ARTEX_WRITE_TOKEN_FILE", token_file.to_str().unwrap()));
    let serve = Proc::start(
        "serve",
        &db.url,
        &["serve", "--http", "127.0.0.1:0"],
        &serve_env,
    );
    let addr = serve_address(&serve).await;
    wait_kinds(&c, &["echo", "fail", "tp"]).await;
    let worker_id = crate::common::procs::worker_id(&c, &worker).await;

    // The CLI, in the context of a traced client.
    let by_cli = submit_by_cli(&db.url, &rx, "{\"n\": 1}");

    // The API, without a context (a new trace): a task that fails once, and a program.
    let post = |body: &str| {
        let r = Request::new("POST", "/api/v1/tasks")
            .bearer(WRITE_TOKEN)
            .json_text(body)
            .send(&addr)
            .expect("POST /api/v1/tasks");
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["id"].as_str().unwrap().parse::<Uuid>().unwrap()
    };
    let retried = post(r#"{"kind": "fail", "payload": {"times": 1}}"#);
    let program = post(r#"{"kind": "tp"}"#);
    for id in [by_cli, retried, program] {
        wait_status(&db.bb, id, "succeeded", WAIT).await;
    }

    // The CLI's task: its submission is a child of the client's span, in its trace.
    let spans = trace_of(&rx, by_cli, 1).await;
    let submit = check_tree(&spans, by_cli, "echo", "cli", &worker_id);
    assert_eq!(submit.trace, GIVEN[3..35], "{submit:?}");
    assert_eq!(submit.parent, GIVEN[36..52], "{submit:?}");
    let stored: Option<String> = c
        .query_one(
            "select traceparent from artex.tasks where id = $1",
            &[&by_cli],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stored.unwrap(),
        format!("00-{}-{}-01", submit.trace, submit.span),
        "the task stores its submission's context"
    );

    // The retried task: a new trace made by serve, two attempts in it.
    let spans = trace_of(&rx, retried, 2).await;
    let submit = check_tree(&spans, retried, "fail", "serve", &worker_id);
    assert!(submit.parent.is_empty(), "a new trace's root: {submit:?}");
    let mut attempts: Vec<(String, String)> = spans
        .iter()
        .filter(|s| s.name == "artex.attempt")
        .map(|s| {
            (
                s.attr("artex.attempt").into(),
                s.attr("artex.outcome").into(),
            )
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts,
        [
            ("1".into(), "failed".into()),
            ("2".into(), "succeeded".into())
        ]
    );

    // The program got the attempt's span as its TRACEPARENT.
    let spans = trace_of(&rx, program, 1).await;
    check_tree(&spans, program, "tp", "serve", &worker_id);
    let attempt = spans.iter().find(|s| s.name == "artex.attempt").unwrap();
    let result: Value = c
        .query_one("select result from artex.tasks where id = $1", &[&program])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        result["traceparent"],
        json!(format!("00-{}-{}-01", attempt.trace, attempt.span))
    );
}

/// A task submitted while the fleet is quiet is claimed by its worker at the planner's
/// wake-up, not assigned by a round: the worker makes its time in queue and its
/// assignment, in the same trace.
#[tokio::test]
async fn a_task_its_worker_claimed_has_the_worker_s_queue_and_assignment_spans() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let rx = Receiver::start();
    let otel = exporting_to(&rx.url);
    let planner = Proc::start(
        "planner",
        &db.url,
        &with_defaults("planner", FAST_PLANNER, &["--metrics", "127.0.0.1:0"]),
        &otel,
    );
    // Its poll never comes: what it holds came by a round or by its claim at a wake-up.
    let worker = Proc::start(
        "worker",
        &db.url,
        &with_defaults("worker", FAST_WORKER, &["--worker-poll-ms", "600000"]),
        &otel,
    );
    let worker_id = crate::common::procs::worker_id(&c, &worker).await;
    let metrics = planner_metrics(&planner).await;
    let mut claimed = None;
    for n in 0..6 {
        let id = submit_by_cli(&db.url, &rx, &format!("{{\"n\": {n}}}"));
        wait_status(&db.bb, id, "succeeded", WAIT).await;
        let spans = trace_of(&rx, id, 1).await;
        check_tree(&spans, id, "echo", "cli", &worker_id);
        if spans
            .iter()
            .any(|s| s.name == "artex.assign" && s.role == "worker")
        {
            claimed = Some(spans);
            break;
        }
        // Two more rounds: the second began after this task ended, and saw the worker
        // idle and nothing waiting.
        planner_rounds_pass(&metrics, 2.0).await;
    }
    let spans = claimed.expect("no task was claimed by the idle worker: rounds assigned all six");
    let queue = spans.iter().find(|s| s.name == "artex.queue").unwrap();
    let assign = spans.iter().find(|s| s.name == "artex.assign").unwrap();
    // The time in queue runs from when the task became runnable to the claim.
    assert_eq!(queue.end_ns, assign.start_ns, "{queue:?} {assign:?}");
    assert!(queue.start_ns <= queue.end_ns, "{queue:?}");
}

#[tokio::test]
async fn a_collector_that_is_down_fails_and_stalls_nothing_and_its_lost_spans_are_counted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // A port nothing listens on.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let otel = exporting_to(&down);
    let _planner = Proc::start(
        "planner",
        &db.url,
        &with_defaults("planner", FAST_PLANNER, &[]),
        &otel,
    );
    let worker = Proc::start(
        "worker",
        &db.url,
        &with_defaults("worker", FAST_WORKER, &[]),
        &otel,
    );
    wait_kinds(&c, &["echo"]).await;
    let tasks: Vec<NewTask> = (0..20)
        .map(|i| NewTask {
            traceparent: Some(format!("00-{:032x}-{:016x}-01", 0xabc0 + i, 0x10 + i)),
            ..NewTask::new("echo", json!({ "i": i }))
        })
        .collect();
    let ids = db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    for id in &ids {
        wait_status(&db.bb, *id, "succeeded", WAIT).await;
    }
    // Every attempt's span was made and lost: the worker's /metrics counts them.
    let http = worker_http(&c, &worker).await;
    wait_for("the worker's lost spans counted", WAIT, || async {
        let (code, text) = http_get(&http, "/metrics").ok()?;
        assert_eq!(code, 200, "{text}");
        let lost: f64 = text
            .lines()
            .find(|l| l.starts_with("artex_trace_spans_dropped_total{reason=\"export_failed\"}"))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()?;
        (lost >= ids.len() as f64).then_some(())
    })
    .await;
}

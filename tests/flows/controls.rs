//! Operator controls: pause, resume and cancel, a running handler included.

use std::time::Duration;

use artex_actors::blackboard::{FlowState, TaskStatus};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common;
use crate::common::procs::{http_get, wait_for, wait_status, Proc};
use crate::common::{count, run_cli as artex, TestDb};
use crate::{probe_runs, submit_cli, task, wait_flow};

fn control(url: &str, verb: &str, id: Uuid, reason: Option<&str>) -> (i32, String, String) {
    let id = id.to_string();
    let mut args = vec![verb, id.as_str()];
    if let Some(r) = reason {
        args.extend_from_slice(&["--reason", r]);
    }
    artex(url, &args)
}

#[tokio::test]
async fn pause_holds_and_resume_releases_tasks_and_flows() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // No planner yet: nothing runs while the flow is paused.
    let id = submit_cli(
        &db.url,
        &json!({"name": "held", "tasks": [
            {"name": "A", "kind": "echo"},
            {"name": "B", "kind": "echo", "depends_on": ["A"]}]}),
    );
    let f = db.bb.operator().flow(id).await.unwrap();
    let (a, b) = (task(&f, "A").id, task(&f, "B").id);
    let (code, out, err) = control(&db.url, "pause", id, Some("maintenance window"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused 2 task(s) of flow"), "{out}");
    assert_eq!(
        db.bb.operator().flow(id).await.unwrap().state,
        FlowState::Paused
    );
    let history = db.bb.operator().transitions(a).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.from_status, last.to_status),
        (Some(TaskStatus::Pending), TaskStatus::Paused)
    );
    assert_eq!(last.reason.as_deref(), Some("maintenance window"));
    assert!(last.actor.starts_with("cli:"), "{}", last.actor);
    // Paused twice: refused, saying why.
    let (code, _, err) = control(&db.url, "pause", a, None);
    assert_eq!(code, 2);
    assert!(err.contains("it is paused"), "{err}");

    // The runtime dispatches (a task submitted now runs) but the paused flow waits.
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    probe_runs(&db, Duration::from_secs(20)).await;
    assert_eq!(
        db.bb.operator().task(a).await.unwrap().status,
        TaskStatus::Paused
    );
    assert_eq!(
        db.bb.operator().task(b).await.unwrap().status,
        TaskStatus::Paused
    );

    // Resuming B alone: its upstream has not run, so it is blocked again, not pending.
    let (code, out, err) = control(&db.url, "resume", b, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("blocked"), "{out}");
    assert_eq!(
        db.bb.operator().task(b).await.unwrap().status,
        TaskStatus::Blocked
    );
    // Resuming the flow releases A (B is no longer paused); the flow completes.
    let (code, _, err) = control(&db.url, "resume", id, Some("window over"));
    assert_eq!(code, 0, "{err}");
    wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(20)).await;
    let resumed = db.bb.operator().transitions(a).await.unwrap();
    assert!(resumed
        .iter()
        .any(|t| t.from_status == Some(TaskStatus::Paused)
            && t.to_status == TaskStatus::Pending
            && t.reason.as_deref() == Some("window over")));

    // Illegal controls are refused clearly, with exit code 2, and change nothing.
    let before = count(&c, "select count(*) from artex.task_transitions").await;
    let (code, _, err) = control(&db.url, "resume", a, None);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("cannot resume task {a}: it is succeeded")),
        "{err}"
    );
    let (code, _, err) = control(&db.url, "pause", id, None);
    assert_eq!(code, 2);
    assert!(
        err.contains("none of its tasks is affected (2 succeeded)"),
        "{err}"
    );
    let (code, _, err) = control(&db.url, "cancel", b, None);
    assert_eq!(code, 2);
    assert!(err.contains("it is succeeded"), "{err}");
    let (code, _, err) = control(&db.url, "cancel", Uuid::now_v7(), None);
    assert_eq!(code, 2);
    assert!(err.contains("no task or flow with id"), "{err}");
    let (code, _, err) = artex(&db.url, &["pause", "not-a-uuid"]);
    assert_eq!(code, 2);
    assert!(err.contains("not an id"), "{err}");
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        before
    );
}

#[tokio::test]
async fn cancel_stops_a_running_handler_and_its_downstream() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    // A 60 s lease is renewed every 20 s: only the cancel's notification can stop the
    // handler within the few seconds waited for below.
    let w = Proc::worker("worker", &db.url, &["--lease-ms", "60000"]);
    let http = common::procs::worker_http(&c, &w).await;
    let id = submit_cli(
        &db.url,
        &json!({"name": "long", "tasks": [
            {"name": "S", "kind": "sleep", "payload": {"ms": 120000}},
            {"name": "T", "kind": "echo", "depends_on": ["S"]},
            {"name": "U", "kind": "sleep", "payload": {"ms": 120000}},
            {"name": "V", "kind": "echo", "depends_on": ["U"]}]}),
    );
    let f = db.bb.operator().flow(id).await.unwrap();
    let (s, t) = (task(&f, "S").id, task(&f, "T").id);
    wait_status(&db.bb, s, TaskStatus::Running, Duration::from_secs(20)).await;
    let running = |http: String| async move {
        let (_, body) = http_get(&http, "/status").ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        Some(
            v["running"]
                .as_array()?
                .iter()
                .filter_map(|r| r["id"].as_str().map(str::to_string))
                .collect::<Vec<String>>(),
        )
    };
    wait_for("S to run in the worker", Duration::from_secs(10), || {
        let http = http.clone();
        async move { running(http).await.filter(|r| r.contains(&s.to_string())) }
    })
    .await;

    let (code, out, err) = control(&db.url, "cancel", s, Some("operator stop"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("canceled task {s}")), "{out}");
    wait_for(
        "the worker to stop S's handler",
        Duration::from_secs(5),
        || {
            let http = http.clone();
            let s = s.to_string();
            async move { running(http).await.filter(|r| !r.contains(&s)) }
        },
    )
    .await;
    let st = db.bb.operator().task(s).await.unwrap();
    assert_eq!(st.status, TaskStatus::Canceled);
    assert_eq!(st.assigned_to, None);
    let last = db
        .bb
        .operator()
        .transitions(s)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(
        (last.from_status, last.to_status),
        (Some(TaskStatus::Running), TaskStatus::Canceled)
    );
    assert_eq!(last.reason.as_deref(), Some("operator stop"));
    assert!(last.actor.starts_with("cli:"));
    let tt = db
        .bb
        .operator()
        .transitions(t)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(tt.to_status, TaskStatus::Canceled);
    assert_eq!(
        tt.reason.as_deref(),
        Some(format!("upstream task 'S' ({s}) ended canceled").as_str())
    );

    // The whole flow: U (running) and V (blocked) end; nothing is left to cancel then.
    let (code, out, err) = control(&db.url, "cancel", id, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("canceled 2 task(s) of flow"), "{out}");
    assert_eq!(
        db.bb.operator().flow(id).await.unwrap().state,
        FlowState::Canceled
    );
    let (code, _, err) = control(&db.url, "cancel", id, None);
    assert_eq!(code, 2);
    assert!(
        err.contains("none of its tasks is affected (4 canceled)"),
        "{err}"
    );
    wait_for("the worker to run nothing", Duration::from_secs(5), || {
        let http = http.clone();
        async move { running(http).await.filter(|r| r.is_empty()) }
    })
    .await;
    // The worker is free for new work, and the canceled handlers never wrote an outcome.
    probe_runs(&db, Duration::from_secs(10)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where flow_id is not null and status <> 'canceled'"
        )
        .await,
        0
    );
}

/// The `journal` file's end line of task `id`: (unix ms, how it ended).
fn journal_end(file: &std::path::Path, id: Uuid) -> Option<(u128, String)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6 && f[0] == id.to_string() && f[3] == "end")
            .then(|| (f[4].parse().unwrap(), f[5].to_string()))
    })
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test]
async fn a_cancel_reaches_the_handler_and_one_that_ignores_it_is_stopped_at_the_grace() {
    use artex_actors::blackboard::NewTask;
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    // A 60 s lease is renewed every 20 s: only the cancel's push can reach the handlers
    // within the waits below. The grace is 3 s.
    let w = Proc::worker(
        "worker",
        &db.url,
        &["--lease-ms", "60000", "--cancel-grace-ms", "3000"],
    );
    let _http = common::procs::worker_http(&c, &w).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let journal = |ignore: bool| {
        NewTask::new(
            "journal",
            json!({"file": file.to_str().unwrap(), "steps": 600, "ms": 100,
                   "ignore_cancel": ignore}),
        )
    };
    let heeds = db
        .bb
        .operator()
        .submit(&journal(false), "test")
        .await
        .unwrap();
    let ignores = db
        .bb
        .operator()
        .submit(&journal(true), "test")
        .await
        .unwrap();
    for id in [heeds, ignores] {
        wait_status(&db.bb, id, TaskStatus::Running, Duration::from_secs(20)).await;
    }

    // Told: the handler sees ctx.cancelled() and ends on its own, well before the grace.
    let asked = unix_ms();
    let (code, _, err) = control(&db.url, "cancel", heeds, Some("customer left"));
    assert_eq!(code, 0, "{err}");
    let (ended, how) = wait_for("the handler to end", Duration::from_secs(10), || {
        let file = file.clone();
        async move { journal_end(&file, heeds) }
    })
    .await;
    assert_eq!(how, "canceled", "it stopped itself, told of the cancel");
    let took = ended.saturating_sub(asked);
    println!("cancel to the handler's own stop: {took} ms (the CLI's start included)");
    assert!(took < 3000, "ended at the grace ({took} ms), not when told");

    // Not heeded: stopped when the grace is over.
    let asked = unix_ms();
    let (code, _, err) = control(&db.url, "cancel", ignores, Some("too slow"));
    assert_eq!(code, 0, "{err}");
    let (ended, how) = wait_for("the grace to stop it", Duration::from_secs(15), || {
        let file = file.clone();
        async move { journal_end(&file, ignores) }
    })
    .await;
    assert_eq!(
        how, "stopped",
        "stopped by its worker, not ended on its own"
    );
    assert!(
        ended.saturating_sub(asked) >= 3000,
        "stopped {} ms after the cancel, before the grace of 3 s",
        ended.saturating_sub(asked)
    );

    // Both canceled with the operator's reason; nothing the handlers returned recorded.
    for (id, reason) in [(heeds, "customer left"), (ignores, "too slow")] {
        let t = db.bb.operator().task(id).await.unwrap();
        assert_eq!(t.status, TaskStatus::Canceled);
        assert_eq!(t.result, None);
        let last = db
            .bb
            .operator()
            .transitions(id)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(last.reason.as_deref(), Some(reason));
    }
}

//! Flows that wait for signals (issue 37): a signal completes a reached wait and its
//! payload reaches the downstream task; a signal sent before the wait is reached is kept
//! and used; a paused wait keeps its signal until resumed; a wait is never handed to a
//! worker, even one that declares its kind; refusals of bad signals and bad waits, with
//! nothing written; the SQL function does what the CLI does.

use std::time::Duration;

use artex_actors::blackboard::{FlowState, FlowView, TaskStatus};
use artex_actors::Blackboard;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::procs::{wait_for, Proc};
use crate::common::{count, run_cli as artex, TestDb};
use crate::{assert_no_double_success, probe_runs, submit_cli, task, wait_flow};

/// `artex flow signal FLOW NAME [--payload P] --json`: exit code, answer, stderr.
fn signal(url: &str, flow: Uuid, name: &str, payload: Option<&str>) -> (i32, Value, String) {
    let flow = flow.to_string();
    let mut args = vec!["flow", "signal", flow.as_str(), name, "--json"];
    if let Some(p) = payload {
        args.extend_from_slice(&["--payload", p]);
    }
    let (code, out, err) = artex(url, &args);
    (code, serde_json::from_str(&out).unwrap_or(Value::Null), err)
}

/// Waits until the wait `name` of flow `id` is reached (its upstream tasks succeeded).
pub(crate) async fn wait_reached(bb: &Blackboard, id: Uuid, name: &str) -> FlowView {
    wait_for(
        &format!("wait {name} of flow {id} to be reached"),
        Duration::from_secs(30),
        || async move {
            let f = bb.operator().flow(id).await.ok()?;
            task(&f, name).wait.as_ref()?.reached_at.map(|_| f)
        },
    )
    .await
}

#[tokio::test]
async fn a_signal_completes_a_reached_wait_and_downstream_reads_its_payload() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &["--concurrency", "2"]);
    let id = submit_cli(
        &db.url,
        &json!({"name": "approval", "tasks": [
            {"name": "prepare", "kind": "echo", "payload": {"n": 1}},
            {"name": "approval", "wait": {"signal": "approved", "timeout": "24h"},
             "depends_on": ["prepare"]},
            {"name": "ship", "kind": "gather", "depends_on": ["approval", "prepare"]}]}),
    );
    let f = wait_reached(&db.bb, id, "approval").await;
    let approval = task(&f, "approval");
    assert_eq!(approval.kind, "artex:wait");
    assert_eq!(approval.status, TaskStatus::Blocked, "{f:#?}");
    let w = approval.wait.as_ref().unwrap();
    assert_eq!(w.spec, json!({"signal": "approved", "timeout": "24h"}));
    let due = w.due_at.unwrap() - w.reached_at.unwrap();
    assert_eq!(due.num_seconds(), 86_400, "{w:?}");
    // `flow show` tells what it waits for.
    let (code, out, err) = artex(&db.url, &["flow", "show", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("waits for signal 'approved' (timeout 24h, then fails); reached"),
        "{out}"
    );

    // A name the flow does not wait for, and an unknown flow: refused, nothing kept.
    let (code, _, err) = signal(&db.url, id, "aproved", None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("has no wait for signal 'aproved'; it waits for 'approved'"),
        "{err}"
    );
    let (code, _, err) = signal(&db.url, Uuid::now_v7(), "approved", None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no flow with id"), "{err}");
    let (code, _, err) = signal(&db.url, id, "bad name", None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("signal name: \"bad name\" is not a kind name"),
        "{err}"
    );
    let (code, _, err) = signal(&db.url, id, "approved", Some("{not json"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--payload: not valid JSON"), "{err}");
    assert_eq!(
        count(&c, "select count(*) from artex.flow_signals").await,
        0
    );

    let (code, answer, err) = signal(&db.url, id, "approved", Some(r#"{"by": "ana"}"#));
    assert_eq!(code, 0, "{err}");
    assert_eq!(answer["outcome"], "completed", "{answer}");
    assert_eq!(answer["task"], approval.id.to_string());
    assert_eq!(answer["task_name"], "approval");
    let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
    // The payload is the wait's result, read downstream as any upstream result.
    let ship = db.bb.operator().task(task(&f, "ship").id).await.unwrap();
    assert_eq!(
        ship.result.unwrap()["upstream"],
        json!({"approval": {"by": "ana"}, "prepare": {"n": 1}})
    );
    // Audited: created blocked, then succeeded by the signal's sender.
    let history = db.bb.operator().transitions(approval.id).await.unwrap();
    let steps: Vec<_> = history
        .iter()
        .map(|h| (h.from_status, h.to_status))
        .collect();
    assert_eq!(
        steps,
        [
            (None, TaskStatus::Blocked),
            (Some(TaskStatus::Blocked), TaskStatus::Succeeded)
        ]
    );
    assert_eq!(history[1].reason.as_deref(), Some("signal 'approved'"));
    assert!(history[1].actor.starts_with("cli:"), "{}", history[1].actor);
    // The feed delivers it: once no transaction older than it is in flight anywhere in
    // the cluster (the feed's horizon), which another test's database can hold back for
    // a while when tests run side by side.
    wait_for(
        "the signal's transition in the feed",
        Duration::from_secs(30),
        || {
            let (code, out, err) = artex(&db.url, &["events", "tail", "--batch", "1000"]);
            assert_eq!(code, 0, "{err}");
            let found = out
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .any(|e| {
                    e["task_id"] == approval.id.to_string()
                        && e["to"] == "succeeded"
                        && e["reason"] == "signal 'approved'"
                });
            std::future::ready(found.then_some(()))
        },
    )
    .await;

    // A second signal of the name: refused; the wait keeps its result.
    let (code, _, err) = signal(&db.url, id, "approved", Some(r#"{"by": "bob"}"#));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("received signal 'approved' already"), "{err}");
    let kept = db.bb.operator().task(approval.id).await.unwrap();
    assert_eq!(kept.result, Some(json!({"by": "ana"})));
    assert_no_double_success(&c).await;
}

#[tokio::test]
async fn a_signal_sent_before_the_wait_is_reached_is_kept_and_used() {
    let db = TestDb::new().await;
    // No planner or worker yet: `first` cannot run, so the wait is not reached.
    let id = submit_cli(
        &db.url,
        &json!({"name": "early", "tasks": [
            {"name": "first", "kind": "echo"},
            {"name": "go", "wait": {"signal": "go"}, "depends_on": ["first"]},
            {"name": "after", "kind": "gather", "depends_on": ["go"]}]}),
    );
    let (code, answer, err) = signal(&db.url, id, "go", Some(r#"[1, 2]"#));
    assert_eq!(code, 0, "{err}");
    assert_eq!(answer["outcome"], "stored", "{answer}");
    let f = db.bb.operator().flow(id).await.unwrap();
    let go = task(&f, "go");
    assert_eq!(go.status, TaskStatus::Blocked);
    let w = go.wait.as_ref().unwrap();
    assert!(
        w.reached_at.is_none() && w.signal_received_at.is_some(),
        "{w:?}"
    );
    let (code, out, _) = artex(&db.url, &["flow", "show", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("not reached yet; signal received"), "{out}");

    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
    let after = db.bb.operator().task(task(&f, "after").id).await.unwrap();
    assert_eq!(after.result.unwrap()["upstream"], json!({"go": [1, 2]}));
    let history = db.bb.operator().transitions(go.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.to_status, TaskStatus::Succeeded);
    assert_eq!(last.reason.as_deref(), Some("signal 'go'"));
    assert!(last.actor.starts_with("cli:"), "{}", last.actor);
}

#[tokio::test]
async fn a_paused_wait_keeps_its_signal_until_resumed() {
    let db = TestDb::new().await;
    // A wait without upstream tasks is reached at submission: no planner is needed.
    let id = submit_cli(
        &db.url,
        &json!({"name": "paused", "tasks": [{"name": "w", "wait": {"signal": "s"}}]}),
    );
    let w = task(&db.bb.operator().flow(id).await.unwrap(), "w").id;
    let (code, _, err) = artex(&db.url, &["pause", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    let (code, answer, err) = signal(&db.url, id, "s", None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(answer["outcome"], "stored", "{answer}");
    assert_eq!(
        db.bb.operator().task(w).await.unwrap().status,
        TaskStatus::Paused
    );
    // Resumed: blocked (a wait is never pending), and the kept signal completes it.
    let (code, _, err) = artex(&db.url, &["resume", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    let t = db.bb.operator().task(w).await.unwrap();
    assert_eq!(t.status, TaskStatus::Succeeded);
    assert_eq!(t.result, None);
    let steps: Vec<_> = db
        .bb
        .operator()
        .transitions(w)
        .await
        .unwrap()
        .iter()
        .map(|h| h.to_status)
        .collect();
    assert_eq!(
        steps,
        [
            TaskStatus::Blocked,
            TaskStatus::Paused,
            TaskStatus::Blocked,
            TaskStatus::Succeeded
        ]
    );
    // A signal to an ended wait is refused.
    let id2 = submit_cli(
        &db.url,
        &json!({"name": "over", "tasks": [{"name": "w", "wait": {"signal": "s"}}]}),
    );
    let (code, _, err) = artex(&db.url, &["cancel", &id2.to_string()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = signal(&db.url, id2, "s", None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("has ended canceled; the signal is not kept"),
        "{err}"
    );
}

#[tokio::test]
async fn a_wait_is_never_handed_to_a_worker_even_one_declaring_its_kind() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &["--concurrency", "4"]);
    let worker = crate::common::procs::worker_id(&c, &w).await;
    let id = submit_cli(
        &db.url,
        &json!({"name": "idle", "tasks": [
            {"name": "w", "wait": {"signal": "never"}},
            {"name": "t", "wait": {"for": "1h"}}]}),
    );
    // The worker declares every kind there is, the waits' included, and has free slots.
    c.execute(
        "update artex.workers set kinds = kinds || '{artex:wait}' where id = $1",
        &[&worker],
    )
    .await
    .unwrap();
    // Rounds run (new work is dispatched around the waits), and the waits stay put.
    for _ in 0..3 {
        probe_runs(&db, Duration::from_secs(20)).await;
    }
    let f = db.bb.operator().flow(id).await.unwrap();
    for name in ["w", "t"] {
        let t = task(&f, name);
        assert_eq!(t.status, TaskStatus::Blocked, "{f:#?}");
        assert!(t.started_at.is_none());
    }
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.task_transitions where kind = 'artex:wait'
             and to_status <> 'blocked'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'artex:wait' and lease_epoch <> 0"
        )
        .await,
        0
    );
    // The status machine refuses to make a wait runnable, whoever writes.
    let e = c
        .execute(
            "update artex.tasks set status = 'pending' where kind = 'artex:wait'",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        e.as_db_error()
            .unwrap()
            .message()
            .contains("it ends by its signal or timer, never runs"),
        "{e}"
    );
}

#[tokio::test]
async fn bad_waits_are_refused_with_nothing_written() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let cases = [
        (
            json!({"name": "w", "kind": "echo", "wait": {"signal": "s"}}),
            "task 'w': kind: a wait has no kind",
        ),
        (
            json!({"name": "w", "wait": {"signal": "s", "until": "2026-12-24T18:00:00Z"}}),
            "task 'w': wait: expected one of signal (with an optional timeout), until or for; \
             got signal and until",
        ),
        (
            json!({"name": "w", "wait": {"for": "an hour"}}),
            "task 'w': wait: for: \"an hour\": expected a number with a unit",
        ),
        (
            json!({"name": "w", "wait": {"signal": "s", "timeout": "0s"}}),
            "task 'w': wait: timeout: \"0s\": must be longer than zero",
        ),
        (
            json!({"name": "w", "wait": {"until": "24/12/2026"}}),
            "task 'w': wait: until: \"24/12/2026\" is not an RFC 3339 time",
        ),
        (
            json!({"name": "w", "wait": {"for": "1h", "on_timeout": "succeed"}}),
            "on_timeout: needs a timeout",
        ),
        (
            json!({"name": "w", "wait": {"signal": "s", "after": "1h"}}),
            "unknown field `after`",
        ),
    ];
    for (t, message) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("flow.json");
        std::fs::write(&file, json!({"name": "bad", "tasks": [t]}).to_string()).unwrap();
        let (code, out, err) = artex(&db.url, &["flow", "submit", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{t}: {out} {err}");
        assert!(err.contains(message), "expected '{message}' in: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    let two = json!({"name": "two", "tasks": [
        {"name": "a", "wait": {"signal": "s"}}, {"name": "b", "wait": {"signal": "s"}}]});
    std::fs::write(&file, two.to_string()).unwrap();
    let (code, _, err) = artex(&db.url, &["flow", "submit", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("tasks 'a' and 'b' both wait for signal 's'"),
        "{err}"
    );
    assert_eq!(count(&c, "select count(*) from artex.flows").await, 0);
    assert_eq!(count(&c, "select count(*) from artex.flow_waits").await, 0);
}

#[tokio::test]
async fn plain_sql_signals_a_flow_as_the_cli_does() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = submit_cli(
        &db.url,
        &json!({"name": "sql", "tasks": [
            {"name": "w", "wait": {"signal": "paid"}},
            {"name": "later", "wait": {"signal": "shipped"}, "depends_on": ["w"]}]}),
    );
    // Not reached yet: kept.
    let row = c
        .query_one(
            "select outcome, task_name from artex.signal_flow($1, 'shipped', '{\"n\": 2}', 'billing')",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "stored");
    assert_eq!(row.get::<_, &str>(1), "later");
    // Reached: completed, and `later` (reached in the same transaction) takes its kept
    // signal at once.
    let row = c
        .query_one(
            "select outcome from artex.signal_flow($1, 'paid', '{\"n\": 1}', 'billing')",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "completed");
    let f = db.bb.operator().flow(id).await.unwrap();
    assert_eq!(f.state, FlowState::Succeeded, "{f:#?}");
    let later = db
        .bb
        .operator()
        .transitions(task(&f, "later").id)
        .await
        .unwrap();
    let last = later.last().unwrap();
    assert_eq!(
        (last.actor.as_str(), last.reason.as_deref()),
        ("billing", Some("signal 'shipped'"))
    );
    let e = c
        .query(
            "select * from artex.signal_flow($1, 'paid')",
            &[&Uuid::now_v7()],
        )
        .await
        .unwrap_err();
    assert_eq!(e.code().unwrap().code(), "P0002", "{e}");
}

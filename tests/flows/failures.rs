//! A failing task cancels exactly its downstream; bad flows are refused with nothing
//! inserted.

use std::collections::HashMap;
use std::time::Duration;

use artex_actors::blackboard::{FlowSpec, FlowState, TaskStatus};
use serde_json::{json, Value};

use crate::common::procs::Proc;
use crate::common::{count, run_cli as artex, TestDb};
use crate::{submit_cli, task, wait_flow};

#[tokio::test]
async fn a_failing_task_cancels_exactly_its_downstream() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    //        ┌→ B (fails) → C → E
    //   A ───┤             ↘
    //        └→ D ─────────→ G      D → F;   H stands alone.
    let id = submit_cli(
        &db.url,
        &json!({"name": "partial", "tasks": [
            {"name": "A", "kind": "echo"},
            {"name": "B", "kind": "fail", "max_retries": 0, "depends_on": ["A"]},
            {"name": "C", "kind": "echo", "depends_on": ["B"]},
            {"name": "E", "kind": "echo", "depends_on": ["C"]},
            {"name": "D", "kind": "echo", "depends_on": ["A"]},
            {"name": "F", "kind": "echo", "depends_on": ["D"]},
            {"name": "G", "kind": "echo", "depends_on": ["B", "D"]},
            {"name": "H", "kind": "echo"}
        ]}),
    );
    let f = wait_flow(&db.bb, id, FlowState::Failed, Duration::from_secs(30)).await;
    let status: HashMap<&str, TaskStatus> = f
        .tasks
        .iter()
        .map(|t| (t.name.as_str(), t.status))
        .collect();
    use TaskStatus::*;
    let expected: HashMap<&str, TaskStatus> = [
        ("A", Succeeded),
        ("B", Failed),
        ("C", Canceled),
        ("E", Canceled),
        ("G", Canceled),
        ("D", Succeeded),
        ("F", Succeeded),
        ("H", Succeeded),
    ]
    .into_iter()
    .collect();
    assert_eq!(status, expected);
    let b = task(&f, "B").id;
    for name in ["C", "E", "G"] {
        let history = db
            .bb
            .operator()
            .transitions(task(&f, name).id)
            .await
            .unwrap();
        let last = history.last().unwrap();
        assert_eq!(
            (last.from_status, last.to_status),
            (Some(Blocked), Canceled),
            "{name}: {history:?}"
        );
        assert_eq!(
            last.reason.as_deref(),
            Some(format!("upstream task 'B' ({b}) ended failed").as_str()),
            "{name}"
        );
    }
    // Canceled tasks never ran.
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'canceled' and started_at is not null"
        )
        .await,
        0
    );
    // The cancellations are in the feed too, with their reason.
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.task_transitions where to_status = 'canceled'
             and from_status <> 'canceled' and reason like 'upstream task ''B''%'"
        )
        .await,
        3
    );
}

#[tokio::test]
async fn cycles_bad_references_and_duplicates_are_refused_with_nothing_inserted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let cases: &[(Value, &str)] = &[
        (
            json!({"name": "cyc", "tasks": [
                {"name": "a", "kind": "echo", "depends_on": ["c"]},
                {"name": "b", "kind": "echo", "depends_on": ["a"]},
                {"name": "c", "kind": "echo", "depends_on": ["b"]},
                {"name": "ok", "kind": "echo"}]}),
            "task 'a' is part of a dependency cycle: a -> c -> b -> a",
        ),
        (
            json!({"name": "self", "tasks": [{"name": "a", "kind": "echo", "depends_on": ["a"]}]}),
            "task 'a' depends on itself",
        ),
        (
            json!({"name": "ref", "tasks": [
                {"name": "extract", "kind": "echo"},
                {"name": "load", "kind": "echo", "depends_on": ["extrct"]}]}),
            "task 'load' depends on 'extrct', which is not a task of flow 'ref'",
        ),
        (
            json!({"name": "dup", "tasks": [
                {"name": "a", "kind": "echo"}, {"name": "a", "kind": "noop"}]}),
            "task 'a' is defined twice",
        ),
        (
            json!({"name": "empty", "tasks": []}),
            "flow 'empty' has no tasks",
        ),
        (
            json!({"name": "typo", "tasks": [{"name": "a", "kind": "echo", "dependson": []}]}),
            "unknown field `dependson`",
        ),
        (
            json!({"name": "kind", "tasks": [{"name": "a", "kind": ""}]}),
            "task 'a': kind: must not be empty",
        ),
    ];
    for (flow, message) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("flow.json");
        std::fs::write(&file, flow.to_string()).unwrap();
        let (code, out, err) = artex(&db.url, &["flow", "submit", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{flow}: {out} {err}");
        assert!(err.contains(message), "expected '{message}' in: {err}");
        assert!(out.is_empty(), "{out}");
        // Through the library API as well.
        if let Ok(spec) = serde_json::from_value::<FlowSpec>(flow.clone()) {
            let e = db
                .bb
                .operator()
                .submit_flow(&spec, "test")
                .await
                .unwrap_err();
            assert!(e.to_string().contains(message), "{e}");
        }
    }
    // A flow file that is not there is bad input, like a bad flow (exit 2).
    let (code, _, err) = artex(&db.url, &["flow", "submit", "/nonexistent/flow.json"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/flow.json"), "{err}");
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);
    assert_eq!(count(&c, "select count(*) from artex.flows").await, 0);
    assert_eq!(
        count(&c, "select count(*) from artex.task_dependencies").await,
        0
    );
}

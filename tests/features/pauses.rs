//! Paused kinds (`artex kind pause|resume`, migrations/V38): a paused kind's tasks stay
//! pending while the others are assigned — through the Assigner's rounds, and through
//! two real planner processes and a worker driven from the CLI — and run once resumed;
//! each pause and resume is audited.

use std::time::Duration;

use artex_actors::assigner::Assigner;
use artex_actors::blackboard::{LimitSpec, NewTask};
use serde_json::json;

use crate::common::procs::{wait_status, Proc};
use crate::common::{fixtures, run_cli, TestDb};

/// A paused kind's tasks stay pending while the others are assigned, whether the kind
/// is limited or not, and are assigned once it is resumed; a pause and a resume are
/// audited with their reason and actor, a second pause (or resume) writes nothing, and
/// bad input is refused naming it.
#[tokio::test]
async fn a_paused_kind_s_tasks_stay_pending_until_it_is_resumed() {
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w1", &["a", "b", "lim"], 100).await;
    let spec = LimitSpec {
        fair: false,
        concurrency: Some(50),
        key_concurrency: None,
        rate_per_sec: None,
    };
    ops.set_kind_limit("lim", &spec, "test").await.unwrap();
    let tasks: Vec<NewTask> = ["a", "b", "lim"]
        .iter()
        .flat_map(|k| (0..3).map(move |_| NewTask::new(*k, json!({}))))
        .collect();
    ops.submit_many(&tasks, "test").await.unwrap();
    assert!(ops
        .pause_kind("a", Some("incident 42"), "alice")
        .await
        .unwrap());
    assert!(ops.pause_kind("lim", None, "alice").await.unwrap());
    assert!(
        !ops.pause_kind("a", Some("again"), "bob").await.unwrap(),
        "a second pause changes nothing"
    );
    let client = db.client().await;
    let assigned = || async {
        client
            .query(
                "select kind, count(*) from artex.tasks where assigned_to is not null
                 group by kind order by kind",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect::<Vec<(String, i64)>>()
    };
    Assigner::run_once(&db.bb.planner(), &crate::round_config())
        .await
        .unwrap();
    assert_eq!(assigned().await, [("b".to_string(), 3)]);
    let paused = ops.paused_kinds(None).await.unwrap();
    assert_eq!(
        paused
            .iter()
            .map(|p| (p.kind.as_str(), p.reason.as_deref(), p.paused_by.as_str()))
            .collect::<Vec<_>>(),
        [("a", Some("incident 42"), "alice"), ("lim", None, "alice")]
    );
    assert!(ops.resume_kind("a", Some("fixed"), "carol").await.unwrap());
    assert!(ops.resume_kind("lim", None, "carol").await.unwrap());
    assert!(!ops.resume_kind("a", None, "carol").await.unwrap());
    Assigner::run_once(&db.bb.planner(), &crate::round_config())
        .await
        .unwrap();
    assert_eq!(
        assigned().await,
        [
            ("a".to_string(), 3),
            ("b".to_string(), 3),
            ("lim".to_string(), 3)
        ]
    );
    let changes = ops.kind_changes("a", 10).await.unwrap();
    assert_eq!(
        changes
            .iter()
            .map(|c| (c.change.as_str(), c.reason.as_deref(), c.actor.as_str()))
            .collect::<Vec<_>>(),
        [
            ("resumed", Some("fixed"), "carol"),
            ("paused", Some("incident 42"), "alice")
        ]
    );
    for (kind, reason, says) in [
        ("no such kind!", None, "kind:"),
        ("a", Some("x\0y"), "reason:"),
        ("a", Some(&*"r".repeat(10_001)), "reason:"),
    ] {
        let e = ops.pause_kind(kind, reason, "alice").await.unwrap_err();
        assert!(e.to_string().starts_with(says), "{kind:?}: {e}");
    }
}

/// `artex kind pause|resume` against two running planners and a worker: a paused kind's
/// task stays pending while a task of another kind submitted after it runs, `artex
/// kinds` lists the pause, and once resumed the task runs; a kind that is no kind name
/// is refused naming it.
#[tokio::test]
async fn a_kind_paused_from_the_cli_waits_while_the_fleet_runs_the_others() {
    let db = TestDb::new().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _p2 = Proc::planner("planner-2", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let (code, out, err) = run_cli(
        &db.url,
        &["kind", "pause", "echo", "--reason", "incident 42"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kind echo paused"), "{out}");
    let ops = db.bb.operator();
    let held = ops
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    let other = ops
        .submit(&NewTask::new("sleep", json!({ "ms": 1 })), "test")
        .await
        .unwrap();
    wait_status(&db.bb, other, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(ops.task(held).await.unwrap().status.to_string(), "pending");
    let (code, out, err) = run_cli(&db.url, &["kinds"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("paused:") && out.contains("echo: since") && out.contains("(incident 42)"),
        "{out}"
    );
    let (code, out, err) = run_cli(&db.url, &["kind", "resume", "echo", "--json"]);
    assert_eq!(code, 0, "{err}");
    let answer: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        answer,
        json!({ "kind": "echo", "changed": true, "paused": null })
    );
    wait_status(&db.bb, held, "succeeded", Duration::from_secs(30)).await;
    let (code, _, err) = run_cli(&db.url, &["kind", "pause", "no kind"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("kind"), "{err}");
}

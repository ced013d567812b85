//! Flows and operator controls end to end (issue 6), with real planner and worker
//! processes and the real CLI on real PostgreSQL: a diamond runs in order and its join
//! sees its upstream results; killed workers and a PostgreSQL restart mid-flow; a failing
//! task cancels exactly its downstream; bad flows are refused with nothing inserted;
//! pause, resume and cancel (a running handler included); concurrent completions of
//! siblings; a flow canceled while an upload's task joins it; a 10,000-task flow.

mod common;

use common::count;
use common::run_cli as artex;

use std::collections::HashMap;
use std::time::Duration;

use artex_actors::blackboard::{
    Control, FlowSpec, FlowState, FlowView, NewTask, NewUpload, TaskStatus,
};
use artex_actors::Blackboard;
use common::procs::{http_get, wait_for, wait_status, Proc};
use common::TestDb;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

/// Writes `flow` to a file and submits it with `artex flow submit`; returns the flow id.
fn submit_cli(url: &str, flow: &Value) -> Uuid {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    std::fs::write(&file, flow.to_string()).unwrap();
    // Some tests submit before their workers start (or register).
    let (code, out, err) = artex(
        url,
        &[
            "flow",
            "submit",
            file.to_str().unwrap(),
            "--allow-unregistered-kind",
        ],
    );
    assert_eq!(code, 0, "flow submit failed: {err}");
    Uuid::parse_str(out.trim()).unwrap_or_else(|e| panic!("flow id '{out}': {e}"))
}

async fn wait_flow(bb: &Blackboard, id: Uuid, state: FlowState, timeout: Duration) -> FlowView {
    // Polls the cheap summary (the full view of a 10,000-task flow is not free).
    wait_for(
        &format!("flow {id} to be {state}"),
        timeout,
        || async move { (bb.operator().flow(id).await.ok()?.state == state).then_some(()) },
    )
    .await;
    bb.operator().flow(id).await.unwrap()
}

/// Submits an `echo` task and waits for it to succeed: the runtime dispatches new work.
async fn probe_runs(db: &TestDb, timeout: Duration) {
    let probe = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, probe, TaskStatus::Succeeded, timeout).await;
}

fn task<'a>(f: &'a FlowView, name: &str) -> &'a artex_actors::blackboard::FlowTaskView {
    f.tasks
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no task {name} in {f:?}"))
}

/// No downstream task ever started before an upstream task had succeeded: its every
/// `running` transition comes after the upstream's `succeeded` one (transition ids are
/// drawn in real time, and the downstream task only becomes runnable once the upstream's
/// success committed).
async fn assert_started_after_upstream(c: &Client) {
    let early = count(
        c,
        "select count(*) from artex.task_dependencies d
         join artex.task_transitions r on r.task_id = d.task_id and r.to_status = 'running'
         left join artex.task_transitions s on s.task_id = d.depends_on
              and s.to_status = 'succeeded'
         where s.id is null or r.id < s.id",
    )
    .await;
    assert_eq!(
        early, 0,
        "downstream attempts that started before their upstream succeeded"
    );
}

async fn assert_no_double_success(c: &Client) {
    let twice = count(
        c,
        "select count(*) from (select task_id from artex.task_transitions
         where to_status = 'succeeded' group by task_id having count(*) > 1) x",
    )
    .await;
    assert_eq!(twice, 0, "tasks that succeeded twice");
}

#[tokio::test]
async fn a_diamond_runs_in_order_and_its_join_sees_the_upstream_results() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &["--concurrency", "4"]);
    let id = submit_cli(
        &db.url,
        &json!({"name": "diamond", "tasks": [
            {"name": "D", "kind": "gather", "payload": {"d": true}, "depends_on": ["B", "C"]},
            {"name": "A", "kind": "sleep", "payload": {"ms": 50}},
            {"name": "B", "kind": "echo", "payload": {"b": 1}, "depends_on": ["A"]},
            {"name": "C", "kind": "echo", "payload": {"c": 2}, "depends_on": ["A"]}
        ]}),
    );
    let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
    let (a, b, cc, d) = (task(&f, "A"), task(&f, "B"), task(&f, "C"), task(&f, "D"));
    let fin = |t: &artex_actors::blackboard::FlowTaskView| t.finished_at.unwrap();
    let start = |t: &artex_actors::blackboard::FlowTaskView| t.started_at.unwrap();
    assert!(fin(a) <= start(b) && fin(a) <= start(cc), "{f:#?}");
    assert!(fin(b) <= start(d) && fin(cc) <= start(d), "{f:#?}");
    assert_eq!(d.depends_on, vec!["B".to_string(), "C".to_string()]);
    assert_started_after_upstream(&c).await;

    // The join read its upstream results.
    let result = db.bb.operator().task(d.id).await.unwrap().result.unwrap();
    assert_eq!(
        result,
        json!({"payload": {"d": true}, "upstream": {"B": {"b": 1}, "C": {"c": 2}}})
    );
    // Promotion is audited with its reason.
    let history = db.bb.operator().transitions(b.id).await.unwrap();
    assert_eq!(history[0].to_status, TaskStatus::Blocked);
    assert_eq!(history[1].to_status, TaskStatus::Pending);
    assert_eq!(
        history[1].reason.as_deref(),
        Some("all upstream tasks succeeded")
    );

    // `artex flow show`, for people and programs.
    let (code, out, err) = artex(&db.url, &["flow", "show", &id.to_string(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded");
    assert_eq!(v["name"], "diamond");
    assert_eq!(v["tasks"].as_array().unwrap().len(), 4);
    assert!(v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["status"] == "succeeded" && t["id"].is_string() && t["name"].is_string()));
    let (code, out, _) = artex(&db.url, &["flow", "show", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("state:    succeeded"), "{out}");
    assert!(out.contains(&d.id.to_string()), "{out}");
    let (code, _, err) = artex(&db.url, &["flow", "show", &Uuid::now_v7().to_string()]);
    assert_eq!(code, 2);
    assert!(err.contains("no flow with id"), "{err}");
}

#[tokio::test]
async fn a_flow_survives_killed_workers_and_a_postgres_restart() {
    // A private cluster: restarting the shared one would cut every other test off.
    let private = common::PrivateCluster::start().await;
    let (cluster, url, bb) = (&private.cluster, private.url.clone(), &private.bb);
    let c = common::connect(&url).await;
    let _p = Proc::planner("planner", &url, &[]);
    let w1 = Proc::worker("worker1", &url, &["--concurrency", "8"]);
    let _w2 = Proc::worker("worker2", &url, &["--concurrency", "8"]);
    common::procs::worker_id(&c, &w1).await;

    // root → 40 in parallel → join → a chain of 40 → end: 83 tasks.
    let mut tasks = vec![json!({"name": "root", "kind": "sleep", "payload": {"ms": 20}})];
    let wide: Vec<String> = (0..40).map(|i| format!("wide{i}")).collect();
    for w in &wide {
        tasks.push(
            json!({"name": w, "kind": "sleep", "payload": {"ms": 1000}, "depends_on": ["root"]}),
        );
    }
    tasks.push(json!({"name": "join", "kind": "gather", "depends_on": wide}));
    let mut prev = "join".to_string();
    for i in 0..40 {
        let name = format!("chain{i}");
        tasks.push(
            json!({"name": name, "kind": "sleep", "payload": {"ms": 20}, "depends_on": [prev]}),
        );
        prev = name;
    }
    tasks.push(json!({"name": "end", "kind": "echo", "depends_on": [prev]}));
    let spec: FlowSpec = serde_json::from_value(json!({"name": "crashy", "tasks": tasks})).unwrap();
    let id = bb.operator().submit_flow(&spec, "test").await.unwrap();

    // Mid-flow: some of the wide tasks ran, some run on the worker about to die.
    let w1_id = common::procs::worker_id(&c, &w1).await;
    let c2 = &c;
    // A 1 s task that started on worker1 less than 0.5 s ago is still running when the
    // kill lands.
    wait_for(
        "wide tasks running on worker1",
        Duration::from_secs(30),
        || {
            let w1_id = w1_id.clone();
            async move {
                let n: i64 = c2
                    .query_one(
                        "select count(*) from artex.tasks where status = 'running'
                     and assigned_to = $1 and flow_task like 'wide%'
                     and started_at > now() - interval '500 milliseconds'",
                        &[&w1_id],
                    )
                    .await
                    .ok()?
                    .get(0);
                (n > 0).then_some(())
            }
        },
    )
    .await;
    w1.signal(Signal::SIGKILL);
    cluster.restart().unwrap();
    let _w3 = Proc::worker("worker3", &url, &["--concurrency", "8"]);
    let bb = Blackboard::connect(&url, 2).unwrap();
    let f = wait_flow(&bb, id, FlowState::Succeeded, Duration::from_secs(90)).await;
    assert_eq!(f.tasks.len(), 83);
    assert!(f.tasks.iter().all(|t| t.status == TaskStatus::Succeeded));
    let c = common::connect(&url).await;
    assert_started_after_upstream(&c).await;
    assert_no_double_success(&c).await;
    // The kill cost attempts (retried elsewhere), not tasks.
    let retried: i64 = c
        .query_one(
            "select count(*) from artex.tasks where retries > 0 and error = $1",
            &[&format!("lease lost by worker {w1_id}")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        retried > 0,
        "the killed worker's tasks should have been retried elsewhere"
    );
    let join = bb.operator().task(task(&f, "join").id).await.unwrap();
    assert_eq!(
        join.result.unwrap()["upstream"].as_object().unwrap().len(),
        40
    );
}

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

/// 200 siblings finishing in concurrent transactions: their join is promoted exactly
/// once (a check-then-promote would leave it blocked forever when the last two finish at
/// the same moment), and two joins over the same siblings never deadlock.
#[tokio::test]
async fn concurrent_completions_of_siblings_promote_their_joins_exactly_once() {
    let db = TestDb::new().await;
    let mut tasks: Vec<Value> = (0..200)
        .map(|i| json!({"name": format!("s{i}"), "kind": "echo"}))
        .collect();
    let names: Vec<String> = (0..200).map(|i| format!("s{i}")).collect();
    let mut reversed = names.clone();
    reversed.reverse();
    tasks.push(json!({"name": "join1", "kind": "echo", "depends_on": names}));
    tasks.push(json!({"name": "join2", "kind": "echo", "depends_on": reversed}));
    let spec: FlowSpec = serde_json::from_value(json!({"name": "fanin", "tasks": tasks})).unwrap();
    let id = db.bb.operator().submit_flow(&spec, "test").await.unwrap();
    let f = db.bb.operator().flow(id).await.unwrap();
    let siblings: Vec<Uuid> = f
        .tasks
        .iter()
        .filter(|t| t.name.starts_with('s'))
        .map(|t| t.id)
        .collect();
    // Eight sessions, each finishing its share one task per transaction, all at once.
    let mut handles = Vec::new();
    for part in 0..8 {
        let mine: Vec<Uuid> = siblings.iter().skip(part).step_by(8).copied().collect();
        let url = db.url.clone();
        handles.push(tokio::spawn(async move {
            let mut c = common::connect(&url).await;
            for t in mine {
                let tx = c.transaction().await.unwrap();
                tx.execute(
                    "update artex.tasks set status = 'assigned', assigned_to = 'w',
                         lease_until = now() + interval '1 minute' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.execute(
                    "update artex.tasks set status = 'running' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.execute(
                    "update artex.tasks set status = 'succeeded', result = '{}' where id = $1",
                    &[&t],
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.expect("a session failed (deadlock?)");
    }
    let c = db.client().await;
    for join in ["join1", "join2"] {
        let j = task(&f, join).id;
        assert_eq!(
            db.bb.operator().task(j).await.unwrap().status,
            TaskStatus::Pending
        );
        let promotions: i64 = c
            .query_one(
                "select count(*) from artex.task_transitions
                 where task_id = $1 and to_status = 'pending'",
                &[&j],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(promotions, 1, "{join}");
    }
    assert_eq!(
        count(
            &c,
            "select coalesce(sum(upstream_left), -1) from artex.task_waits"
        )
        .await,
        0
    );
}

/// How many sessions of this test's database wait for a lock.
async fn lock_waiters(c: &Client) -> i64 {
    count(
        c,
        "select count(*) from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'",
    )
    .await
}

/// Waits until `job` has ended or `n` sessions wait for a lock: a side that does not
/// wait in one build (it runs through) does in another (it waits for the other side).
async fn ended_or_waiting<T>(c: &Client, job: &tokio::task::JoinHandle<T>, n: i64, what: &str) {
    wait_for(what, Duration::from_secs(30), || async move {
        (job.is_finished() || lock_waiters(c).await >= n).then_some(())
    })
    .await;
}

/// A one-task flow (its task pending: no worker runs here) and an upload to join it.
async fn flow_and_upload(db: &TestDb) -> (Uuid, Uuid, NewUpload) {
    let spec: FlowSpec = serde_json::from_value(json!({
        "name": "upload-race", "tasks": [{"name": "a", "kind": "echo"}]
    }))
    .unwrap();
    let flow = db.bb.operator().submit_flow(&spec, "test").await.unwrap();
    let a = task(&db.bb.operator().flow(flow).await.unwrap(), "a").id;
    let upload = NewUpload {
        id: Uuid::now_v7(),
        host: "h1".into(),
        path: "/uploads/x".into(),
        size: 1,
        sha256: "0".repeat(64),
        chunks: 1,
        name: None,
        shared: true,
        flow: Some(flow),
    };
    (flow, a, upload)
}

fn record(db: &TestDb, upload: &NewUpload) -> tokio::task::JoinHandle<(Uuid, bool)> {
    let (bb, upload) = (db.bb.clone(), upload.clone());
    tokio::spawn(async move {
        let task = NewTask::new("digest", json!({"upload": {"id": upload.id}}));
        bb.worker()
            .record_upload(&upload, &task, "test")
            .await
            .unwrap()
    })
}

fn cancel(db: &TestDb, flow: Uuid) -> tokio::task::JoinHandle<Vec<(Uuid, TaskStatus)>> {
    let bb = db.bb.clone();
    tokio::spawn(async move {
        bb.operator()
            .control(Control::Cancel, flow, "test", Some("race"))
            .await
            .unwrap()
            .changed
    })
}

/// A flow canceled while an upload's task joins it: whichever commits first, the task
/// never stays runnable in the canceled flow. Each of the two interleavings is forced by
/// a test session holding a lock that one side meets after reading its snapshot: (1) the
/// cancel waits for a task's row, the upload's task joins meanwhile; (2) the upload
/// waits for its own row (the same upload in flight elsewhere), the flow is canceled
/// meanwhile. Without the flow's row lock each ends with a `pending` task that the
/// cancel never saw, in a flow whose every other task it canceled.
#[tokio::test]
async fn a_flow_canceled_while_an_uploads_task_joins_it_leaves_nothing_runnable() {
    let db = TestDb::new().await;
    let watcher = db.client().await;

    // (1) The cancel first: its task lookup waits for `a`, held by the test session.
    let (flow, a, upload) = flow_and_upload(&db).await;
    let mut holder = common::connect(&db.url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute("select 1 from artex.tasks where id = $1 for update", &[&a])
        .await
        .unwrap();
    let canceling = cancel(&db, flow);
    ended_or_waiting(&watcher, &canceling, 1, "the cancel to wait for task a").await;
    assert!(
        !canceling.is_finished(),
        "the cancel went through a held task"
    );
    let recording = record(&db, &upload);
    ended_or_waiting(&watcher, &recording, 2, "the upload to end or wait").await;
    tx.rollback().await.unwrap();
    let changed = canceling.await.unwrap();
    let (joined, wrote) = recording.await.unwrap();
    assert!(wrote);
    assert_eq!(changed, vec![(a, TaskStatus::Canceled)]);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.flow_id, Some(flow));
    assert_eq!(
        t.status,
        TaskStatus::Paused,
        "the flow was canceled before the upload's task joined it: {t:?}"
    );
    assert!(
        t.error.as_deref().unwrap_or("").contains("had ended"),
        "{t:?}"
    );

    // (2) The upload first: its row is in flight in the test session's transaction, so
    // recording it waits; the flow is canceled meanwhile.
    let (flow, a, upload) = flow_and_upload(&db).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "insert into artex.uploads (id, host, path, size, sha256, chunks, task_id)
         values ($1, 'h1', '/uploads/x', 1, repeat('0', 64), 1, $2)",
        &[&upload.id, &Uuid::now_v7()],
    )
    .await
    .unwrap();
    let recording = record(&db, &upload);
    ended_or_waiting(&watcher, &recording, 1, "the upload to wait for its row").await;
    assert!(
        !recording.is_finished(),
        "the upload went through a held row"
    );
    let canceling = cancel(&db, flow);
    ended_or_waiting(&watcher, &canceling, 2, "the cancel to end or wait").await;
    tx.rollback().await.unwrap();
    let (joined, wrote) = recording.await.unwrap();
    let changed = canceling.await.unwrap();
    assert!(wrote);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.flow_id, Some(flow));
    assert_eq!(
        t.status,
        TaskStatus::Canceled,
        "the upload's task joined the flow before it was canceled: {t:?}"
    );
    let mut changed = changed;
    changed.sort_by_key(|c| c.0);
    let mut expected = vec![(a, TaskStatus::Canceled), (joined, TaskStatus::Canceled)];
    expected.sort_by_key(|c| c.0);
    assert_eq!(changed, expected);
}

fn big_flow() -> Value {
    // root → 8,000 in parallel → join → a chain of 1,998: 10,000 no-op tasks.
    let mut tasks = vec![json!({"name": "root", "kind": "noop"})];
    let wide: Vec<String> = (0..8000).map(|i| format!("w{i}")).collect();
    for w in &wide {
        tasks.push(json!({"name": w, "kind": "noop", "depends_on": ["root"]}));
    }
    tasks.push(json!({"name": "join", "kind": "noop", "depends_on": wide}));
    let mut prev = "join".to_string();
    for i in 0..1998 {
        let name = format!("c{i}");
        tasks.push(json!({"name": name, "kind": "noop", "depends_on": [prev]}));
        prev = name;
    }
    json!({"name": "big", "tasks": tasks})
}

#[tokio::test]
async fn a_ten_thousand_task_flow_of_wide_fan_out_and_long_chain_completes() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = submit_cli(&db.url, &big_flow());
    // One transaction: every task has the same creation time.
    assert_eq!(
        count(&c, "select count(distinct created_at) from artex.tasks").await,
        1
    );
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 10_000);
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w1 = Proc::worker(
        "worker1",
        &db.url,
        &["--concurrency", "32", "--prefetch", "32"],
    );
    let _w2 = Proc::worker(
        "worker2",
        &db.url,
        &["--concurrency", "32", "--prefetch", "32"],
    );
    let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(100)).await;
    assert_eq!(f.counts.get("succeeded"), Some(&10_000));
    assert_started_after_upstream(&c).await;
    assert_no_double_success(&c).await;
}

fn chain_flow(n: usize) -> Value {
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            if i == 0 {
                json!({"name": "c0", "kind": "noop"})
            } else {
                json!({"name": format!("c{i}"), "kind": "noop", "depends_on": [format!("c{}", i - 1)]})
            }
        })
        .collect();
    json!({"name": "chain", "tasks": tasks})
}

fn fan_out_flow(n: usize) -> Value {
    let mut tasks = vec![json!({"name": "root", "kind": "noop"})];
    tasks.extend(
        (1..n).map(|i| json!({"name": format!("w{i}"), "kind": "noop", "depends_on": ["root"]})),
    );
    json!({"name": "fan-out", "tasks": tasks})
}

/// Not a test: times `artex flow submit` and completion of 10,000-task no-op flows
/// (mixed, pure fan-out, pure chain) with one planner and two workers. Run with
/// `cargo test --release --test flows -- --ignored --nocapture bench_` (plain `cargo
/// test`: nextest would stop the 10,000-step chain at its two-minute limit).
#[tokio::test]
#[ignore]
async fn bench_ten_thousand_task_flows() {
    for (label, flow) in [
        ("mixed: 1 -> 8,000 -> join -> chain of 1,998", big_flow()),
        ("fan-out: 1 -> 9,999", fan_out_flow(10_000)),
        ("chain of 10,000", chain_flow(10_000)),
    ]
    .into_iter()
    .filter(|(label, _)| {
        std::env::var("ARTEX_BENCH_ONLY").map_or(true, |only| label.starts_with(only.as_str()))
    }) {
        let db = TestDb::new().await;
        let c = db.client().await;
        let _p = Proc::planner("planner", &db.url, &[]);
        let w1 = Proc::worker(
            "worker1",
            &db.url,
            &["--concurrency", "32", "--prefetch", "32"],
        );
        let w2 = Proc::worker(
            "worker2",
            &db.url,
            &["--concurrency", "32", "--prefetch", "32"],
        );
        common::procs::worker_id(&c, &w1).await;
        common::procs::worker_id(&c, &w2).await;
        let t0 = std::time::Instant::now();
        let id = submit_cli(&db.url, &flow);
        let submitted = t0.elapsed();
        wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(900)).await;
        let done = t0.elapsed();
        // Per dependency edge: upstream finished -> downstream started.
        let r = c
            .query_one(
                "select percentile_cont(0.5) within group (order by ms),
                        percentile_cont(0.99) within group (order by ms)
                 from (select extract(epoch from (t.started_at - u.finished_at)) * 1000 as ms
                       from artex.task_dependencies d
                       join artex.tasks t on t.id = d.task_id
                       join artex.tasks u on u.id = d.depends_on) x",
                &[],
            )
            .await
            .unwrap();
        let (p50, p99): (f64, f64) = (r.get(0), r.get(1));
        println!(
            "{label}: submit {:.2} s, submit to all succeeded {:.2} s; upstream finished -> downstream started: median {p50:.1} ms, p99 {p99:.1} ms",
            submitted.as_secs_f64(),
            done.as_secs_f64()
        );
    }
}

/// An upload's task joining a flow an operator paused is held paused with it (reason
/// given), and resuming the flow runs it with the rest; joining a running flow it is
/// pending at once.
#[tokio::test]
async fn an_uploads_task_joining_a_paused_flow_waits_for_the_flows_resume() {
    let db = TestDb::new().await;
    let (flow, a, upload) = flow_and_upload(&db).await;
    let paused = db
        .bb
        .operator()
        .control(Control::Pause, flow, "test", None)
        .await
        .unwrap();
    assert_eq!(paused.changed, vec![(a, TaskStatus::Paused)]);
    let (joined, wrote) = record(&db, &upload).await.unwrap();
    assert!(wrote);
    let t = db.bb.operator().task(joined).await.unwrap();
    assert_eq!(t.status, TaskStatus::Paused);
    let why = t.error.unwrap_or_default();
    assert!(why.contains("was paused"), "{why}");
    let resumed = db
        .bb
        .operator()
        .control(Control::Resume, flow, "test", None)
        .await
        .unwrap();
    let mut changed = resumed.changed;
    changed.sort_by_key(|c| c.0);
    let mut want = vec![(a, TaskStatus::Pending), (joined, TaskStatus::Pending)];
    want.sort_by_key(|c| c.0);
    assert_eq!(changed, want);

    // A running flow: the task is pending at once.
    let (_, _, upload) = flow_and_upload(&db).await;
    let (joined, _) = record(&db, &upload).await.unwrap();
    assert_eq!(
        db.bb.operator().task(joined).await.unwrap().status,
        TaskStatus::Pending
    );
}

//! Flows that run: a diamond in order, its join seeing its upstream results; killed
//! workers and a PostgreSQL restart midway; a 10,000-task flow.

use std::time::Duration;

use artex_actors::blackboard::{FlowSpec, FlowState, TaskStatus};
use artex_actors::Blackboard;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common;
use crate::common::procs::{wait_for, Proc};
use crate::common::{count, run_cli as artex, TestDb};
use crate::{assert_no_double_success, assert_started_after_upstream, submit_cli, task, wait_flow};

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

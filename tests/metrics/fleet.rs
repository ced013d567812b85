use std::collections::BTreeMap;
use std::time::Duration;

use artex_actors::blackboard::FleetSample;
use artex_actors::submission::NewTask;
use serde_json::json;

use crate::common::procs::wait_for;
use crate::common::{fixtures, TestDb};

/// The samples of `metric`, by (kind, label).
async fn read(db: &TestDb, metric: &str) -> BTreeMap<(Option<String>, Option<String>), f64> {
    let samples: Vec<FleetSample> = db.bb.operator().fleet_metrics().await.unwrap();
    samples
        .into_iter()
        .filter(|s| s.metric == metric)
        .map(|s| ((s.kind, s.label), s.value))
        .collect()
}

fn key(kind: &str, label: &str) -> (Option<String>, Option<String>) {
    (Some(kind.into()), Some(label.into()))
}

async fn submit(db: &TestDb, kind: &str, n: usize) -> Vec<uuid::Uuid> {
    let ops = db.bb.operator();
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            ops.submit(&NewTask::new(kind, json!({})), "test")
                .await
                .unwrap(),
        );
    }
    ids
}

/// Tasks by kind and status, the oldest runnable task's age per kind (0 when none
/// waits), workers by state and per kind, paused kinds and limits, as the database holds
/// them.
#[tokio::test]
async fn the_fleet_is_read_by_kind_and_status() {
    let db = TestDb::new().await;
    fixtures::register(&db.bb, &fixtures::registration("w1", &["echo", "sleep"], 4)).await;
    submit(&db, "echo", 3).await;
    submit(&db, "sleep", 1).await;
    let c = db.client().await;
    c.execute(
        "update artex.tasks set created_at = now() - interval '90 seconds',
                               run_at = now() - interval '90 seconds' where kind = 'sleep'",
        &[],
    )
    .await
    .unwrap();
    let ops = db.bb.operator();
    ops.pause_kind("sleep", Some("test"), "test").await.unwrap();
    let tasks = read(&db, "tasks").await;
    assert_eq!(tasks[&key("echo", "pending")], 3.0);
    assert_eq!(tasks[&key("sleep", "pending")], 1.0);
    assert_eq!(tasks[&key("echo", "running")], 0.0);
    let age = read(&db, "oldest_runnable_age_seconds").await;
    let sleep_age = age[&(Some("sleep".into()), None)];
    assert!((90.0..3600.0).contains(&sleep_age), "{sleep_age}");
    assert!(age[&(Some("echo".into()), None)] < 90.0, "{age:?}");
    let workers = read(&db, "workers").await;
    assert_eq!(workers[&(None, Some("online".into()))], 1.0);
    assert_eq!(workers[&(None, Some("gone".into()))], 0.0);
    let per_kind = read(&db, "kind_workers").await;
    assert_eq!(per_kind[&(Some("echo".into()), None)], 1.0);
    let paused = read(&db, "kind_paused").await;
    assert_eq!(
        paused.keys().collect::<Vec<_>>(),
        [&(Some("sleep".into()), None)]
    );
}

/// Outcomes per kind are counters: they count each end once, keep counting when the
/// history they were folded from is gone (retention), and never pass over an end whose
/// transaction was still in flight when they were read.
#[tokio::test]
async fn outcome_counters_only_grow_and_miss_no_transaction() {
    let db = TestDb::new().await;
    let ids = submit(&db, "echo", 4).await;
    let c = db.client().await;
    let cancel = "update artex.tasks set status = 'canceled' where id = $1";
    for id in &ids[..2] {
        c.execute(cancel, &[id]).await.unwrap();
    }
    canceled_reach(&db, 2.0).await;
    // Read again: nothing counted twice.
    assert_eq!(read(&db, "ended").await[&key("echo", "canceled")], 2.0);
    // The retention drops the history that was counted: the counter stays.
    c.execute("delete from artex.task_history", &[])
        .await
        .unwrap();
    assert_eq!(read(&db, "ended").await[&key("echo", "canceled")], 2.0);
    // An end written by a transaction still open while a read folds is counted once it
    // commits, not skipped.
    let mut open = db.client().await;
    let tx = open.transaction().await.unwrap();
    tx.execute(cancel, &[&ids[2]]).await.unwrap();
    c.execute(cancel, &[&ids[3]]).await.unwrap();
    assert_eq!(read(&db, "ended").await[&key("echo", "canceled")], 2.0);
    tx.commit().await.unwrap();
    canceled_reach(&db, 4.0).await;
}

/// Waits until the fleet's read counts `n` canceled echo tasks. A fold counts only the
/// ends of transactions older than every one in flight in the cluster: another test's
/// open transaction (the tests share one cluster) delays it, never makes it skip one.
async fn canceled_reach(db: &TestDb, n: f64) {
    let what = format!("{n} canceled echo tasks counted");
    wait_for(&what, Duration::from_secs(30), || async {
        let ended = read(db, "ended").await;
        let now = ended.get(&key("echo", "canceled")).copied().unwrap_or(0.0);
        assert!(now <= n, "counted more than {n}: {ended:?}");
        (now == n).then_some(())
    })
    .await
}

/// Whether a plan (EXPLAIN's JSON) walks the index `name` anywhere.
fn uses_index(plan: &serde_json::Value, name: &str) -> bool {
    match plan {
        serde_json::Value::Object(o) => {
            o.get("Index Name").and_then(serde_json::Value::as_str) == Some(name)
                || o.values().any(|v| uses_index(v, name))
        }
        serde_json::Value::Array(a) => a.iter().any(|v| uses_index(v, name)),
        _ => false,
    }
}

/// Whether a plan reads the whole of `relation` (a sequential scan).
fn scans(plan: &serde_json::Value, relation: &str) -> bool {
    match plan {
        serde_json::Value::Object(o) => {
            (o.get("Node Type").and_then(serde_json::Value::as_str) == Some("Seq Scan")
                && o.get("Relation Name").and_then(serde_json::Value::as_str) == Some(relation))
                || o.values().any(|v| scans(v, relation))
        }
        serde_json::Value::Array(a) => a.iter().any(|v| scans(v, relation)),
        _ => false,
    }
}

/// The fleet's read, planned with the settings its function carries, finds waiting tasks
/// through the partial index of listed tasks, never by a walk of the table or of its
/// primary key that would cross every finished task (EXPLAIN, on a table where waiting
/// tasks are many, which made PostgreSQL's own choice a walk of the table).
#[tokio::test]
async fn the_fleet_read_walks_no_finished_task() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.tasks (kind, payload)
             select 'k' || (i % 5), '{}' from generate_series(1, 3000) i;
         update artex.tasks set status = 'canceled';
         insert into artex.tasks (kind, payload)
             select 'k' || (i % 5), '{}' from generate_series(1, 2500) i;
         analyze artex.tasks",
    )
    .await
    .unwrap();
    let statement = crate::common::function_statement(&c, "fleet_metrics").await;
    let settings: Vec<String> = c
        .query_one(
            "select proconfig from pg_proc
             where proname = 'fleet_metrics' and pronamespace = 'artex'::regnamespace",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        settings.iter().any(|s| s == "enable_indexscan=off"),
        "{settings:?}"
    );
    c.batch_execute("begin").await.unwrap();
    for s in &settings {
        let (name, value) = s.split_once('=').unwrap();
        c.batch_execute(&format!("set local {name} = {value}"))
            .await
            .unwrap();
    }
    let statement = statement.replace("p_cap", "$1");
    c.batch_execute(&format!("prepare fleet(int8) as {statement}"))
        .await
        .unwrap();
    for cap in [100i64, 100_000] {
        let plan: serde_json::Value = c
            .query_one(&format!("explain (format json) execute fleet({cap})"), &[])
            .await
            .unwrap()
            .get(0);
        assert!(uses_index(&plan, "tasks_listed"), "cap {cap}: {plan:#}");
        assert!(!uses_index(&plan, "tasks_pkey"), "cap {cap}: {plan:#}");
        assert!(!scans(&plan, "tasks"), "cap {cap}: {plan:#}");
    }
    c.batch_execute("rollback").await.unwrap();
}

/// Scrapes share reads: however many ask at once, one read of the fleet answers them
/// all, and it serves every scrape for its interval; with an interval of 0 each scrape
/// reads anew.
#[tokio::test]
async fn concurrent_scrapes_share_one_read_per_interval() {
    use artex::http::fleet_metrics::FleetMetrics;
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    submit(&db, "echo", 2).await;
    let cached = FleetMetrics::new(std::time::Duration::from_secs(3600));
    let reads = futures_util::future::join_all((0..8).map(|_| cached.text(&ops))).await;
    assert!(
        reads.iter().all(|r| std::sync::Arc::ptr_eq(r, &reads[0])),
        "one read for all"
    );
    let pending = r#"artex_fleet_tasks{kind="echo",status="pending"}"#;
    assert!(reads[0].contains(&format!("{pending} 2\n")), "{}", reads[0]);
    submit(&db, "echo", 1).await;
    let again = cached.text(&ops).await;
    assert!(
        std::sync::Arc::ptr_eq(&again, &reads[0]),
        "the interval's read serves"
    );
    let fresh = FleetMetrics::new(std::time::Duration::ZERO)
        .text(&ops)
        .await;
    assert!(fresh.contains(&format!("{pending} 3\n")), "{fresh}");
}

//! Fleet-wide limits (`artex kind limit`): never more held than the limit with three
//! planners at once; one key's backlog does not hold back the others; a rate spreads the
//! starts; the CLI sets, shows and refuses them.

use std::collections::HashMap;
use std::time::Duration;

use artex_actors::blackboard::{LimitSpec, NewTask};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::procs::{wait_for, Proc};
use crate::common::{count, run_cli as artex, TestDb};

/// One execution's start or end, as the `journal` kind appends them (in file order,
/// which is the order they happened in across processes).
struct Step {
    task: Uuid,
    start: bool,
    at_ms: u128,
}

fn journal(file: &std::path::Path) -> Vec<Step> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Step {
                task: f[0].parse().unwrap(),
                start: f[3] == "start",
                at_ms: f[4].parse().unwrap(),
            }
        })
        .collect()
}

/// The most executions under way at once, per `group` of their task.
fn most_at_once<K: std::hash::Hash + Eq + Clone>(
    steps: &[Step],
    group: impl Fn(Uuid) -> K,
) -> HashMap<K, i64> {
    let mut now: HashMap<K, i64> = HashMap::new();
    let mut most: HashMap<K, i64> = HashMap::new();
    for s in steps {
        let k = group(s.task);
        let n = now.entry(k.clone()).or_default();
        *n += if s.start { 1 } else { -1 };
        let m = most.entry(k).or_default();
        *m = (*m).max(*n);
    }
    most
}

fn journal_task(file: &std::path::Path, ms: u64, key: Option<&str>) -> NewTask {
    NewTask {
        limit_key: key.map(String::from),
        ..NewTask::new("journal", json!({ "file": file, "ms": ms }))
    }
}

async fn wait_all_succeeded(db: &TestDb, n: i64, timeout: Duration) {
    let c = db.client().await;
    wait_for("every task to succeed", timeout, || async {
        (count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'",
        )
        .await
            == n)
            .then_some(())
    })
    .await;
}

/// Three planners, two workers with 10 slots each, 40 tasks of a kind limited to 5:
/// never more than 5 held (sampled in the database) nor running (the handlers' own
/// journal), and the limit is reached.
#[tokio::test]
async fn three_planners_never_hold_more_than_the_kinds_concurrency() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let ops = db.bb.operator();
    // Half the tasks wait before the limit is set (it marks them), half come after (their
    // insert marks them).
    let tasks: Vec<NewTask> = (0..20).map(|_| journal_task(&file, 150, None)).collect();
    ops.submit_many(&tasks, "test").await.unwrap();
    let set = ops
        .set_kind_limit(
            "journal",
            &LimitSpec {
                concurrency: Some(5),
                ..LimitSpec::default()
            },
            "test",
        )
        .await
        .unwrap();
    assert_eq!((set.concurrency, set.held), (Some(5), 0));
    ops.submit_many(&tasks, "test").await.unwrap();
    let c = db.client().await;
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where limited").await,
        40
    );
    let _planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("planner-{i}"), &db.url, &[]))
        .collect();
    let _workers: Vec<Proc> = (0..2)
        .map(|i| Proc::worker(&format!("worker-{i}"), &db.url, &["--concurrency", "10"]))
        .collect();
    let held = "select count(*) from artex.tasks where kind = 'journal'
                and status in ('assigned', 'running')";
    let mut most_held = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while count(
        &c,
        "select count(*) from artex.tasks where status = 'succeeded'",
    )
    .await
        < 40
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the tasks did not finish in 60 s"
        );
        most_held = most_held.max(count(&c, held).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(most_held <= 5, "{most_held} held at once with a limit of 5");
    let steps = journal(&file);
    assert_eq!(steps.len(), 80, "one start and one end per task");
    let most = most_at_once(&steps, |_| ())[&()];
    assert_eq!(most, 5, "at most 5 ran at once, and the limit was reached");
    // Ended tasks count no more; `kinds` shows the limit.
    let (code, out, err) = artex(&db.url, &["kinds", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["limits"][0]["kind"], "journal");
    assert_eq!(v["limits"][0]["concurrency"], 5);
    assert_eq!(v["limits"][0]["held"], 0);
}

/// A per-key limit of 2 with a backlog of 30 tasks of tenant `a` submitted first: `b`
/// and `c` start while `a` still waits, and no key ever has more than 2 at once.
#[tokio::test]
async fn one_keys_backlog_does_not_hold_back_the_other_keys() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let ops = db.bb.operator();
    ops.set_kind_limit(
        "journal",
        &LimitSpec {
            key_concurrency: Some(2),
            ..LimitSpec::default()
        },
        "test",
    )
    .await
    .unwrap();
    let mut tasks: Vec<NewTask> = (0..30)
        .map(|_| journal_task(&file, 100, Some("a")))
        .collect();
    tasks.extend((0..6).map(|_| journal_task(&file, 100, Some("b"))));
    tasks.extend((0..6).map(|_| journal_task(&file, 100, Some("c"))));
    // Unkeyed tasks of the kind are not held back by any key.
    tasks.extend((0..4).map(|_| journal_task(&file, 100, None)));
    let ids = ops.submit_many(&tasks, "test").await.unwrap();
    let key_of: HashMap<Uuid, Option<String>> = ids
        .iter()
        .zip(&tasks)
        .map(|(id, t)| (*id, t.limit_key.clone()))
        .collect();
    let _planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("planner-{i}"), &db.url, &[]))
        .collect();
    let _worker = Proc::worker("worker", &db.url, &["--concurrency", "20"]);
    wait_all_succeeded(&db, 46, Duration::from_secs(60)).await;
    let steps = journal(&file);
    let most = most_at_once(&steps, |t| key_of[&t].clone());
    for key in ["a", "b", "c"] {
        assert_eq!(most[&Some(key.to_string())], 2, "key {key}: {most:?}");
    }
    // `b` and `c` finished while `a` had most of its backlog still to run.
    let a_ends: Vec<usize> = (0..steps.len())
        .filter(|&i| !steps[i].start && key_of[&steps[i].task].as_deref() == Some("a"))
        .collect();
    let last_b_or_c = (0..steps.len())
        .filter(|&i| matches!(key_of[&steps[i].task].as_deref(), Some("b" | "c")))
        .max()
        .unwrap();
    assert!(
        last_b_or_c < a_ends[15],
        "b and c waited behind a's backlog: their last step is after a's 16th end"
    );
}

/// A rate of 20/s: 50 short tasks start over at least ~1.5 s (a full bucket of 20,
/// then 20 a second), where without it they all start at once.
#[tokio::test]
async fn a_rate_spreads_the_starts() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let (code, out, err) = artex(&db.url, &["kind", "limit", "journal", "--rate", "20/s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "journal: rate 20/s (0 held)");
    let tasks: Vec<NewTask> = (0..50).map(|_| journal_task(&file, 1, None)).collect();
    db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let _planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("planner-{i}"), &db.url, &[]))
        .collect();
    let _worker = Proc::worker("worker", &db.url, &["--concurrency", "50"]);
    wait_all_succeeded(&db, 50, Duration::from_secs(60)).await;
    let starts: Vec<u128> = journal(&file)
        .iter()
        .filter(|s| s.start)
        .map(|s| s.at_ms)
        .collect();
    let span = starts.iter().max().unwrap() - starts.iter().min().unwrap();
    assert!(span >= 1200, "50 starts at 20/s took only {span} ms");
    // No second window holds more than a bucket's refill plus what it held.
    for &t0 in &starts {
        let within = starts.iter().filter(|&&t| t >= t0 && t < t0 + 1000).count();
        assert!(within <= 41, "{within} starts within a second of {t0}");
    }
}

#[tokio::test]
async fn the_cli_sets_shows_clears_and_refuses_limits() {
    let db = TestDb::new().await;
    let (code, out, err) = artex(&db.url, &["kind", "limit", "resize"]);
    assert_eq!((code, out.trim()), (0, "resize: no limits"), "{err}");
    let (code, out, err) = artex(
        &db.url,
        &[
            "kind",
            "limit",
            "resize",
            "--concurrency",
            "5",
            "--key-concurrency",
            "2",
            "--rate",
            "30/m",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "resize: concurrency 5, per key 2, rate 30/m (0 held)"
    );
    let (code, out, _) = artex(&db.url, &["kind", "limit", "resize", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["limits"]["rate_per_sec"], 0.5);
    assert!(v["limits"]["updated_by"]
        .as_str()
        .unwrap()
        .starts_with("cli:"));
    for (args, names) in [
        (&["--concurrency", "0"][..], "--concurrency"),
        (&["--rate", "5/d"][..], "--rate"),
        (&["--rate", "0/s"][..], "--rate"),
        (&["--clear", "--concurrency", "3"][..], "--clear"),
    ] {
        let mut all = vec!["kind", "limit", "resize"];
        all.extend_from_slice(args);
        let (code, _, err) = artex(&db.url, &all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
    let (code, _, err) = artex(
        &db.url,
        &["kind", "limit", "bad kind!", "--concurrency", "1"],
    );
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = artex(&db.url, &["kind", "limit", "resize", "--clear"]);
    assert_eq!((code, out.trim()), (0, "resize: no limits"), "{err}");
    let c = db.client().await;
    assert_eq!(count(&c, "select count(*) from artex.kind_limits").await, 0);
    // A submission's limit key is checked like the other keys.
    let (code, _, err) = artex(
        &db.url,
        &[
            "submit",
            "echo",
            "--allow-unregistered-kind",
            "--limit-key",
            "",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--limit-key"), "{err}");
}

/// Two planner writes racing for the last slot of a kind limited to 1, in plain SQL as
/// the planner sends them: the second waits for the first's lock on the kind and, once
/// it commits, counts its task and assigns nothing. (A count from the second's own
/// snapshot, taken before the first committed, would have assigned a second task.)
#[tokio::test]
async fn the_second_of_two_racing_planners_waits_for_the_kind_and_counts_the_first() {
    let db = TestDb::new().await;
    crate::common::fixtures::worker(&db.bb, "w1", &["resize"], 10).await;
    let ops = db.bb.operator();
    ops.set_kind_limit(
        "resize",
        &LimitSpec {
            concurrency: Some(1),
            ..LimitSpec::default()
        },
        "test",
    )
    .await
    .unwrap();
    let tasks = vec![NewTask::new("resize", json!({})); 2];
    let ids = ops.submit_many(&tasks, "test").await.unwrap();
    let assign = "select * from artex.assign_round('planner', array[$1::uuid], array['w1'],
                  60, array[$1::uuid])";
    let mut first = db.client().await;
    let tx = first.transaction().await.unwrap();
    let got = tx.query(assign, &[&ids[0]]).await.unwrap();
    assert_eq!(got.len(), 1, "the first planner assigns its task");
    let second = db.client().await;
    let second_pid: i32 = second
        .query_one("select pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let racing = tokio::spawn(async move { second.query(assign, &[&ids[1]]).await.unwrap().len() });
    let c = db.client().await;
    wait_for(
        "the second planner to wait for the kind's lock",
        Duration::from_secs(10),
        || {
            let c = &c;
            async move {
                let waiting: bool = c
                    .query_one(
                        "select wait_event_type is not distinct from 'Lock'
                     from pg_stat_activity where pid = $1",
                        &[&second_pid],
                    )
                    .await
                    .ok()?
                    .get(0);
                waiting.then_some(())
            }
        },
    )
    .await;
    tx.commit().await.unwrap();
    assert_eq!(
        racing.await.unwrap(),
        0,
        "the second planner assigned past the limit"
    );
    let held = "select count(*) from artex.tasks where status = 'assigned' and limited";
    assert_eq!(count(&c, held).await, 1);
}

/// Cleared limits let the kind's waiting tasks run as any others.
#[tokio::test]
async fn cleared_limits_free_the_waiting_tasks() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let (code, _, err) = artex(&db.url, &["kind", "limit", "journal", "--concurrency", "1"]);
    assert_eq!(code, 0, "{err}");
    let tasks: Vec<NewTask> = (0..6).map(|_| journal_task(&file, 300, None)).collect();
    db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let c = db.client().await;
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where limited").await,
        6
    );
    let (code, _, err) = artex(&db.url, &["kind", "limit", "journal", "--clear"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where limited").await,
        0
    );
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _worker = Proc::worker("worker", &db.url, &["--concurrency", "10"]);
    wait_all_succeeded(&db, 6, Duration::from_secs(30)).await;
    let most = most_at_once(&journal(&file), |_| ())[&()];
    assert!(most > 1, "the tasks still ran one at a time");
}

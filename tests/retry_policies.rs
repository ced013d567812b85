//! Per-kind retry policies with real processes: set by `artex kind retry` (bad input
//! refused with exit code 2, nothing written), shown by `artex kinds`, and followed by a
//! worker's retries — their spacing and how many attempts a task gets.

mod common;

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use chrono::{DateTime, Utc};
use common::procs::{wait_status, Proc};
use common::{run_cli, TestDb};
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

/// (to_status, at) of `id`'s history, oldest first.
async fn history(c: &Client, id: Uuid) -> Vec<(String, DateTime<Utc>)> {
    c.query(
        "select to_status::text, at from artex.task_transitions where task_id = $1
         order by at, id",
        &[&id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// How long each retry of `id` waited: from an attempt's failure (back to pending) to
/// the next attempt's start, milliseconds.
async fn waits_ms(c: &Client, id: Uuid) -> Vec<i64> {
    // After the creation (pending, then its first start).
    let h = history(c, id).await.split_off(1);
    h.iter()
        .zip(h.iter().skip(1))
        .filter(|((from, _), (to, _))| from == "pending" && to == "running")
        .map(|((_, failed), (_, started))| (*started - *failed).num_milliseconds())
        .collect()
}

#[tokio::test]
async fn a_fixed_200_ms_backoff_spaces_retries_200_ms_apart_and_its_attempts_bound_the_task() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Declared as a worker's registration does, so that the policy is set before any
    // worker runs (a running worker reads it within 5 s: see docs/handlers.md).
    c.execute("insert into artex.kinds (kind) values ('fail')", &[])
        .await
        .unwrap();
    let (code, out, err) = run_cli(
        &db.url,
        &[
            "kind",
            "retry",
            "fail",
            "--backoff",
            "fixed",
            "--base",
            "200ms",
            "--max-attempts",
            "4",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("retry fixed 200 ms, 4 attempts"), "{out}");
    let (code, out, err) = run_cli(&db.url, &["kinds"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("fail ") && l.ends_with("retry fixed 200 ms, 4 attempts")),
        "{out}"
    );
    let (code, out, _) = run_cli(&db.url, &["kinds", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["kinds"][0]["retry"],
        json!({"backoff": "fixed", "base_ms": 200, "cap_ms": 200, "max_attempts": 4}),
        "{v}"
    );

    let _p = Proc::planner("planner", &db.url, &[]);
    // The worker's own backoff would wait 2.5 to 5 s: the policy is what makes every
    // wait 200 ms.
    let _w = Proc::worker(
        "worker",
        &db.url,
        &["--retry-base-ms", "5000", "--retry-cap-ms", "5000"],
    );
    let op = db.bb.operator();
    // Fails 3 times, succeeds on the 4th attempt: the last the kind allows.
    let mends = op
        .submit(&NewTask::new("fail", json!({ "times": 3 })), "test")
        .await
        .unwrap();
    // Always fails: ends failed after 4 attempts.
    let never = op
        .submit(&NewTask::new("fail", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, mends, "succeeded", Duration::from_secs(30)).await;
    wait_status(&db.bb, never, "failed", Duration::from_secs(30)).await;
    for id in [mends, never] {
        let t = op.task(id).await.unwrap();
        assert_eq!(t.max_retries, 3, "4 attempts: the kind's");
        let waits = waits_ms(&c, id).await;
        assert_eq!(waits.len(), 3, "three retries: {:?}", history(&c, id).await);
        // Loosely: never before the 200 ms, and not much after (a task due later is
        // found by the planner's poll, every 200 ms in tests, then read and started).
        assert!(
            waits.iter().all(|w| (195..1500).contains(w)),
            "retries waited {waits:?} ms"
        );
        let starts = history(&c, id)
            .await
            .iter()
            .filter(|(to, _)| to == "running")
            .count();
        assert_eq!(starts, 4, "attempts of {id}");
    }
    assert_eq!(op.task(never).await.unwrap().retries, 4);
}

#[tokio::test]
async fn bad_policies_are_refused_with_exit_code_2_and_nothing_is_written() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.execute("insert into artex.kinds (kind) values ('fail')", &[])
        .await
        .unwrap();
    let (code, _, err) = run_cli(
        &db.url,
        &[
            "kind",
            "retry",
            "fail",
            "--backoff",
            "linear",
            "--base",
            "1s",
            "--cap",
            "10m",
        ],
    );
    assert_eq!(code, 0, "{err}");
    for (args, says) in [
        (
            &["--backoff", "steady", "--base", "1s"][..],
            "exponential, linear or fixed",
        ),
        (&["--backoff", "fixed", "--base", "0ms"][..], "--base"),
        (
            &["--backoff", "fixed", "--base", "1fortnight"][..],
            "unknown unit",
        ),
        (
            &["--backoff", "linear", "--base", "2s", "--cap", "1s"][..],
            "--cap",
        ),
        (
            &["--backoff", "linear", "--base", "2s", "--cap", "31d"][..],
            "--cap",
        ),
        (
            &["--backoff", "fixed", "--base", "1s", "--max-attempts", "0"][..],
            "--max-attempts",
        ),
        (
            &[
                "--backoff",
                "fixed",
                "--base",
                "1s",
                "--max-attempts",
                "1002",
            ][..],
            "--max-attempts",
        ),
        (&["--base", "1s"][..], "--backoff"),
        (&["--clear", "--base", "1s"][..], "--clear"),
    ] {
        let mut all = vec!["kind", "retry", "fail"];
        all.extend_from_slice(args);
        let (code, _, err) = run_cli(&db.url, &all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = run_cli(
        &db.url,
        &[
            "kind",
            "retry",
            "nosuch",
            "--backoff",
            "fixed",
            "--base",
            "1s",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("kind 'nosuch': no worker has declared it"),
        "{err}"
    );
    let kinds = db.bb.operator().known_kinds().await.unwrap();
    assert_eq!(kinds.len(), 1, "no kind written");
    assert_eq!(
        kinds[0].retry.as_ref().map(|p| p.to_string()).as_deref(),
        Some("linear 1000 ms .. 600000 ms"),
        "the policy unchanged"
    );
    let (code, out, err) = run_cli(&db.url, &["kind", "retry", "fail", "--clear"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.trim_end().ends_with("retry default"), "{out}");
    assert_eq!(db.bb.operator().known_kinds().await.unwrap()[0].retry, None);
}

#[tokio::test]
async fn a_running_worker_follows_a_policy_set_under_it_within_seconds() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    // Its own backoff: 2.5 to 5 s.
    let _w = Proc::worker(
        "worker",
        &db.url,
        &["--retry-base-ms", "5000", "--retry-cap-ms", "5000"],
    );
    common::procs::wait_for(
        "the worker to declare its kinds",
        Duration::from_secs(30),
        || async {
            (common::count(&c, "select count(*) from artex.kinds where kind = 'fail'").await == 1)
                .then_some(())
        },
    )
    .await;
    let op = db.bb.operator();
    // Read at its start, before this: none.
    op.set_retry_policy(
        "fail",
        Some(&artex_actors::retry::RetryPolicy {
            backoff: artex_actors::retry::Backoff::Fixed,
            base_ms: 100,
            cap_ms: 100,
            max_attempts: None,
        }),
    )
    .await
    .unwrap()
    .expect("declared");
    // Busy meanwhile: a worker reads the policies again while it holds tasks.
    op.submit(&NewTask::new("sleep", json!({ "ms": 30000 })), "test")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let id = op
            .submit(&NewTask::new("fail", json!({ "times": 1 })), "test")
            .await
            .unwrap();
        wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
        let wait = waits_ms(&c, id).await[0];
        seen.push(wait);
        // The worker's own backoff never waits less than 2.5 s.
        if wait < 1000 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the new policy was not followed: retries waited {seen:?} ms"
        );
    }
    assert!(seen.last().is_some_and(|w| *w >= 95), "{seen:?}");
}

//! Retries: a failed or timed-out attempt goes back to pending after its backoff until
//! the budget is spent, and the trigger ends a retry past it; a kind's retry policy
//! (its backoff in SQL and Rust alike, the reaper's retries, the default budget).

use artex_actors::blackboard::{AssignedTask, FlowSpec, NewTask, Outcome};
use artex_actors::retry::{Backoff, RetryPolicy, MAX_BACKOFF_MS};
use chrono::Utc;
use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{self, fixtures, TestDb};
use crate::{finish, msg, pair, reap_params, start, status_of, task_in, transitions};

async fn insert_task_with_budget(c: &Client, max_retries: i32) -> Uuid {
    c.query_one(
        "insert into artex.tasks (kind, payload, max_retries) values ('echo', '{}', $1)
         returning id",
        &[&max_retries],
    )
    .await
    .expect("inserting a task")
    .get(0)
}

/// Starts `id` on worker w1 and records that attempt ending with `outcome`: returns the
/// task as it started (its retries so far) and the ids the record finished.
async fn attempt(db: &TestDb, c: &Client, id: Uuid, outcome: Outcome) -> (AssignedTask, Vec<Uuid>) {
    let t = start(db, c, id, "w1").await;
    let done = db
        .bb
        .worker()
        .record("w1", &[finish(&t, t.epoch, outcome)])
        .await
        .unwrap();
    (t, done)
}

fn failed(error: &str) -> Outcome {
    Outcome::Failed {
        error: error.into(),
        retry_in_ms: 60_000,
    }
}

#[tokio::test]
async fn a_failed_attempt_is_retried_later_until_the_budget_is_spent() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task_with_budget(&c, 1).await;

    let (t, done) = attempt(&db, &c, id, failed("boom 1")).await;
    assert_eq!((t.retries, t.max_retries), (0, 1));
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, retries, error, assigned_to, run_at > now() + interval '30 s'
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "pending");
    assert_eq!(r.get::<_, i32>(1), 1, "retries");
    assert_eq!(r.get::<_, Option<String>>(2).as_deref(), Some("boom 1"));
    assert_eq!(r.get::<_, Option<String>>(3), None, "holder released");
    assert!(
        r.get::<_, bool>(4),
        "run_at is not pushed back by the backoff"
    );
    assert_eq!(
        common::last_reason(&c, id).await.as_deref(),
        Some("boom 1"),
        "the audit says why"
    );
    // Not runnable before its backoff ends, though a worker has free slots for its kind.
    fixtures::worker(&db.bb, "sim", &["echo"], 10).await;
    let dispatch = crate::common::function_statement(&c, "dispatch_round").await;
    let read = c
        .query(
            &dispatch,
            &[
                &600.0f64,
                &10i64,
                &1i32,
                &Vec::<i32>::new(),
                &Vec::<String>::new(),
            ],
        )
        .await
        .unwrap();
    let roster: Vec<String> = read.iter().filter_map(|r| r.get(0)).collect();
    let claimed = read
        .iter()
        .filter(|r| r.get::<_, Option<Uuid>>(5).is_some())
        .count();
    assert_eq!(
        roster,
        ["sim"],
        "a worker with a free slot for it is on the roster"
    );
    assert_eq!(claimed, 0, "claimed during its backoff");

    let (t, done) = attempt(&db, &c, id, failed("boom 2")).await;
    assert_eq!((t.retries, t.max_retries), (1, 1));
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, retries, error, finished_at is not null
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "failed", "at the budget");
    assert_eq!(r.get::<_, i32>(1), 2);
    assert_eq!(r.get::<_, Option<String>>(2).as_deref(), Some("boom 2"));
    assert!(r.get::<_, bool>(3), "finished_at");
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried_and_ends_timeout_at_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let timed_out = || Outcome::TimedOut {
        error: "too slow".into(),
        retry_in_ms: 10,
    };

    let id = insert_task_with_budget(&c, 1).await;
    attempt(&db, &c, id, timed_out()).await;
    assert_eq!(
        status_of(&c, id).await,
        "pending",
        "retried within the budget"
    );
    let (_, done) = attempt(&db, &c, id, timed_out()).await;
    assert_eq!(done, [id]);
    assert_eq!(status_of(&c, id).await, "timeout", "at the budget");

    // Released: back to pending, no attempt counted.
    let id = insert_task_with_budget(&c, 0).await;
    attempt(&db, &c, id, Outcome::Released).await;
    let r = c
        .query_one(
            "select status::text, retries from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, String>(0), r.get::<_, i32>(1)),
        ("pending".into(), 0)
    );
}

#[tokio::test]
async fn the_trigger_ends_a_retry_past_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let cases = [
        ("running", None, "timeout"),
        ("running", Some("boom"), "failed"),
        ("assigned", Some("boom"), "timeout"),
    ];
    for (from, error, expected) in cases {
        let id = task_in(&c, from).await;
        c.execute(
            "update artex.tasks set status = 'pending', retries = max_retries + 1,
                 error = coalesce($2, error)
             where id = $1",
            &[&id, &error],
        )
        .await
        .unwrap_or_else(|e| panic!("{from} -> pending past the budget: {}", msg(&e)));
        let r = c
            .query_one(
                "select status::text, assigned_to, finished_at is not null
                 from artex.tasks where id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(
            r.get::<_, String>(0),
            expected,
            "{from} with error {error:?}"
        );
        assert_eq!(r.get::<_, Option<String>>(1), None);
        assert!(r.get::<_, bool>(2), "finished_at");
        assert_eq!(
            transitions(&c, id).await.last().unwrap(),
            &pair(Some(from), expected),
            "the audit records where it ended"
        );
    }
}

/// A row for `kind` in `artex.kinds`, as a worker's registration writes it.
async fn declare_kind(c: &Client, kind: &str) {
    c.execute(
        "insert into artex.kinds (kind) values ($1) on conflict do nothing",
        &[&kind],
    )
    .await
    .expect("declaring a kind");
}

fn policy(backoff: Backoff, base_ms: i64, cap_ms: i64, max_attempts: Option<i32>) -> RetryPolicy {
    RetryPolicy {
        backoff,
        base_ms,
        cap_ms,
        max_attempts,
    }
}

/// The worker's delays (Rust) and the reaper's (SQL) are one rule.
#[tokio::test]
async fn a_retry_policy_s_delays_are_the_same_in_sql_and_in_rust() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut compared = 0;
    for backoff in Backoff::ALL {
        for (base, cap) in [
            (1, 1),
            (100, 1000),
            (250, 100_000),
            (7, MAX_BACKOFF_MS),
            (MAX_BACKOFF_MS, MAX_BACKOFF_MS),
        ] {
            let p = policy(backoff, base, cap, None);
            for n in [0, 1, 2, 3, 7, 30, 39, 40, 41, 1000, i32::MAX] {
                let sql: f64 = c
                    .query_one(
                        "select artex.policy_delay_ms($1, $2, $3, $4)",
                        &[&backoff.as_str(), &(base as f64), &(cap as f64), &n],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(sql as i64, p.delay_ms(n), "{p} after {n} failures");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 3 * 5 * 11);
    // And the examples of the docs.
    let linear = policy(Backoff::Linear, 1000, 5000, None);
    assert_eq!(
        (0..6).map(|n| linear.delay_ms(n)).collect::<Vec<_>>(),
        [1000, 2000, 3000, 4000, 5000, 5000]
    );
}

/// A lease that expired on a running task of a kind with a policy is retried after the
/// policy's delay (exact); without one, after the reaper's default (with jitter).
#[tokio::test]
async fn the_reaper_retries_an_expired_lease_after_its_kind_s_policy() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare_kind(&c, "echo").await;
    let set = db
        .bb
        .operator()
        .set_retry_policy("echo", Some(&policy(Backoff::Fixed, 90_000, 90_000, None)))
        .await
        .unwrap()
        .expect("a declared kind");
    assert_eq!(set.retry.map(|p| p.base_ms), Some(90_000));
    let later = Utc::now() + chrono::Duration::hours(1);
    let waits = |id: Uuid| {
        let c = &c;
        async move {
            let r = c
                .query_one(
                    "select status::text, retries, run_at from artex.tasks where id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            let run_at: chrono::DateTime<Utc> = r.get(2);
            (
                r.get::<_, String>(0),
                r.get::<_, i32>(1),
                (run_at - later).num_milliseconds(),
            )
        }
    };
    let id = insert_task_with_budget(&c, 3).await;
    start(&db, &c, id, "w1").await;
    let report = db
        .bb
        .planner()
        .reap("reaper", &reap_params(later))
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    // Exact but for the clocks' precisions (PostgreSQL keeps microseconds).
    let (status, retries, wait) = waits(id).await;
    assert_eq!((status.as_str(), retries), ("pending", 1));
    assert!((wait - 90_000).abs() <= 1, "{wait} ms");

    // Cleared: the reaper's default, 1 s·2^0 with jitter (0.5 to 1 s).
    db.bb
        .operator()
        .set_retry_policy("echo", None)
        .await
        .unwrap();
    let id = insert_task_with_budget(&c, 3).await;
    start(&db, &c, id, "w1").await;
    db.bb
        .planner()
        .reap("reaper", &reap_params(later))
        .await
        .unwrap();
    let (status, retries, wait) = waits(id).await;
    assert_eq!((status.as_str(), retries), ("pending", 1));
    assert!((500..=1000).contains(&wait), "{wait} ms");
}

/// A kind's attempts are the retry budget of its new tasks that state none, by every
/// path a task is submitted; a task that states one keeps it; a kind without attempts
/// gives 3.
#[tokio::test]
async fn a_kind_s_attempts_are_the_default_budget_of_its_new_tasks() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare_kind(&c, "echo").await;
    declare_kind(&c, "plain").await;
    let op = db.bb.operator();
    op.set_retry_policy(
        "echo",
        Some(&policy(Backoff::Exponential, 10, 100, Some(5))),
    )
    .await
    .unwrap();
    let budget = |id: Uuid| {
        let c = &c;
        async move {
            c.query_one("select max_retries from artex.tasks where id = $1", &[&id])
                .await
                .unwrap()
                .get::<_, i32>(0)
        }
    };
    let plain = op
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    assert_eq!(budget(plain).await, 4, "a plain submission");
    let keyed = NewTask {
        unique_key: Some("k".into()),
        ..NewTask::new("echo", json!({}))
    };
    let keyed = op.submit(&keyed, "test").await.unwrap();
    assert_eq!(budget(keyed).await, 4, "a keyed submission");
    let own = NewTask {
        max_retries: Some(1),
        ..NewTask::new("echo", json!({}))
    };
    assert_eq!(
        budget(op.submit(&own, "test").await.unwrap()).await,
        1,
        "its own"
    );
    let other = op
        .submit(&NewTask::new("plain", json!({})), "test")
        .await
        .unwrap();
    assert_eq!(budget(other).await, 3, "a kind without a policy");
    let sql: Uuid = c
        .query_one("select id from artex.submit('echo')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(budget(sql).await, 4, "artex.submit");
    let spec: FlowSpec = serde_json::from_value(json!({"name": "f", "tasks": [
        {"name": "a", "kind": "echo"},
        {"name": "b", "kind": "echo", "depends_on": ["a"], "max_retries": 0}]}))
    .unwrap();
    let flow = op.submit_flow(&spec, "test").await.unwrap();
    let budgets: Vec<(String, i32)> = c
        .query(
            "select flow_task, max_retries from artex.tasks where flow_id = $1 order by flow_task",
            &[&flow],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        budgets,
        [("a".into(), 4), ("b".into(), 0)],
        "a flow's tasks"
    );
}

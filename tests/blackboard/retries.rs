//! Retries: a failed or timed-out attempt goes back to pending after its backoff until
//! the budget is spent, and the trigger ends a retry past it.

use artex_actors::blackboard::{AssignedTask, Outcome, DISPATCH_SQL};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{fixtures, TestDb};
use crate::{finish, msg, pair, start, status_of, task_in, transitions};

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
    let reason: Option<String> = c
        .query_one(
            "select reason from artex.task_transitions where task_id = $1 order by id desc limit 1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reason.as_deref(), Some("boom 1"), "the audit says why");
    // Not runnable before its backoff ends, though a worker has free slots for its kind.
    fixtures::worker(&db.bb, "sim", &["echo"], 10).await;
    let read = c
        .query(
            DISPATCH_SQL,
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

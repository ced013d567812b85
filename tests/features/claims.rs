//! A worker claims its own tasks in its read (`artex.claim_and_read`, migrations/V46):
//! only what the Assigner would give it — its kinds but the paused and the limited, due,
//! not bound to another host, within its free slots, and only while it is online — in
//! start order, with the fencing token and its holdings counted; a read of an idle queue
//! writes nothing. A real worker process with no planner at all runs a task (by its
//! poll's claim), and claims again each time its outcomes free slots, not at its poll
//! (a read sent while its outcomes were unwritten is told that tasks wait for its slots,
//! `no_room`, V47).

use std::time::Duration;

use artex_actors::blackboard::{AssignedRead, LimitSpec, NewTask};
use serde_json::json;
use uuid::Uuid;

use crate::common::procs::{
    http_get, metric_value, wait_count, wait_for, wait_status, worker_http, Proc,
};
use crate::common::{fixtures, TestDb};

/// What a claim takes, and what it leaves for the Assigner or for later.
#[tokio::test]
async fn a_worker_claims_what_the_assigner_would_give_it() {
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    let c = db.client().await;
    fixtures::worker(&db.bb, "w1", &["a", "b", "lim", "late"], 4).await;
    let limit = LimitSpec {
        fair: false,
        concurrency: Some(50),
        key_concurrency: None,
        rate_per_sec: None,
    };
    ops.set_kind_limit("lim", &limit, "test").await.unwrap();
    assert!(ops.pause_kind("b", None, "test").await.unwrap());
    let submit = |kind: &'static str, priority: i32| {
        let ops = db.bb.operator();
        async move {
            ops.submit(
                &NewTask {
                    priority,
                    ..NewTask::new(kind, json!({ "p": priority }))
                },
                "test",
            )
            .await
            .unwrap()
        }
    };
    // Claimable, in start order: 9, 8, 7 (bound to its own host), 6; then 5, past its
    // four slots.
    let a9 = submit("a", 9).await;
    let a8 = submit("a", 8).await;
    let own = fixtures::raw::task_on_host(&c, "a", &json!({ "p": 7 }), Some("test")).await;
    c.execute("update artex.tasks set priority = 7 where id = $1", &[&own])
        .await
        .unwrap();
    let a6 = submit("a", 6).await;
    let a5 = submit("a", 5).await;
    // Never claimed: a paused kind, a limited kind, a task bound to another host, one
    // not due yet, and (below) one whose kind was limited after it was submitted.
    let paused = submit("b", 20).await;
    let limited = submit("lim", 20).await;
    let elsewhere =
        fixtures::raw::task_on_host(&c, "a", &json!({ "p": 20 }), Some("another")).await;
    // A kind whose limit was just set, its waiting task not yet marked `limited` (the
    // moment between `set_kind_limit`'s write and its marking batches).
    let late = submit("late", 20).await;
    c.execute(
        "insert into artex.kind_limits (kind, concurrency, updated_by) values ('late', 50, 'test')",
        &[],
    )
    .await
    .unwrap();
    let later = ops
        .submit(
            &NewTask {
                priority: 20,
                run_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
                ..NewTask::new("a", json!({}))
            },
            "test",
        )
        .await
        .unwrap();

    let read = claim(&db, "w1").await;
    assert_eq!(read.claimed, 4);
    assert!(!read.no_room, "it had room for what it took");
    let got: Vec<Uuid> = read.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, [a9, a8, own, a6], "its four slots, in start order");
    assert!(
        read.tasks.iter().all(|t| t.epoch == 1),
        "a fencing token each"
    );
    let status = |id: Uuid| {
        let c = &c;
        async move {
            let r = c
                .query_one(
                    "select status::text, assigned_to from artex.tasks where id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (r.get::<_, String>(0), r.get::<_, Option<String>>(1))
        }
    };
    for id in [a9, a8, own, a6] {
        assert_eq!(status(id).await, ("assigned".into(), Some("w1".into())));
    }
    for id in [a5, paused, limited, late, elsewhere, later] {
        assert_eq!(status(id).await, ("pending".into(), None), "{id}");
    }
    let taken: i64 = c
        .query_one("select taken from artex.workers where id = 'w1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(taken, 4, "its holdings counted as a round counts them");

    // No slot left: the read claims nothing and returns what it holds, and says that a
    // task it may run (the fifth) waits for a slot.
    let read = claim(&db, "w1").await;
    assert_eq!((read.claimed, read.tasks.len()), (0, 4));
    assert!(read.no_room, "a5 waits while its slots are counted taken");

    // A worker that is not online (draining here) claims nothing.
    fixtures::worker(&db.bb, "w2", &["a"], 4).await;
    c.execute(
        "update artex.workers set state = 'draining' where id = 'w2'",
        &[],
    )
    .await
    .unwrap();
    let read = claim(&db, "w2").await;
    assert_eq!(
        (read.claimed, read.tasks.len(), read.no_room),
        (0, 0, false)
    );
    assert_eq!(status(a5).await, ("pending".into(), None));

    // With nothing it may claim, the read writes nothing (no transaction id is drawn).
    fixtures::worker(&db.bb, "w3", &["idle"], 4).await;
    c.batch_execute("begin").await.unwrap();
    c.query(
        "select * from artex.claim_and_read('w3', 10, 1000000, true)",
        &[],
    )
    .await
    .unwrap();
    let xid: Option<String> = c
        .query_one("select pg_current_xact_id_if_assigned()::text", &[])
        .await
        .unwrap()
        .get(0);
    c.batch_execute("commit").await.unwrap();
    assert_eq!(xid, None, "an idle queue's read wrote");
    assert!(!claim(&db, "w3").await.no_room, "nothing waits for w3");

    // The Assigner places what is left to it: the limited kind's task, on a worker with
    // a free slot.
    fixtures::worker(&db.bb, "w4", &["lim"], 1).await;
    fixtures::assign(&db.bb).await;
    assert_eq!(status(limited).await.0, "assigned");
}

/// `worker`'s claim and read, as a worker reads (up to 10 tasks, no byte budget).
async fn claim(db: &TestDb, worker: &str) -> AssignedRead {
    claim_with(db, worker, &[]).await
}

/// A real worker with no planner running takes a task by itself: its poll's read claims
/// the task, it runs it, and its `/metrics` counts the claim.
#[tokio::test]
async fn a_worker_runs_a_task_with_no_planner() {
    let db = TestDb::new().await;
    let worker = Proc::worker("worker", &db.url, &[]);
    let id = wait_for(
        "the worker to declare echo",
        Duration::from_secs(60),
        || async {
            db.bb
                .operator()
                .submit(&NewTask::new("echo", json!({ "n": 1 })), "test")
                .await
                .ok()
        },
    )
    .await;
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(60)).await;
    // Its /metrics counts the task it claimed.
    assert_eq!(claimed_counter(&db, &worker).await, 1.0);
}

/// `artex_worker_tasks_claimed_total` of `worker`'s /metrics.
async fn claimed_counter(db: &TestDb, worker: &Proc) -> f64 {
    let addr = worker_http(&db.client().await, worker).await;
    let (code, text) = http_get(&addr, "/metrics").expect("the worker's /metrics");
    assert_eq!(code, 200, "{text}");
    metric_value(&text, "artex_worker_tasks_claimed_total")
        .unwrap_or_else(|| panic!("no claimed counter in {text}"))
}

/// A worker whose claim found tasks claims again as soon as its outcomes give slots
/// back, not at its next poll: with no planner, a poll a minute apart and two slots,
/// twenty tasks waiting before it starts all run within half a minute. Without the
/// claim after each written outcome, only the first claim's two would run before the
/// poll.
#[tokio::test]
async fn a_worker_claims_again_when_its_outcomes_free_slots() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.execute(
        "insert into artex.tasks (kind, payload) select 'echo', '{}' from generate_series(1, 20)",
        &[],
    )
    .await
    .expect("twenty tasks");
    let worker = Proc::worker(
        "worker",
        &db.url,
        &[
            "--worker-poll-ms",
            "60000",
            "--concurrency",
            "2",
            "--prefetch",
            "0",
        ],
    );
    wait_count(
        &c,
        "select count(*) from artex.tasks where status = 'succeeded'",
        20,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        claimed_counter(&db, &worker).await,
        20.0,
        "every task claimed by the worker"
    );
}

/// A read leaves out the tasks at the epochs the worker knows (migrations/V71): a claim
/// after each written outcome no longer sends back the whole queue. A task given back
/// and assigned to it again, at a new epoch, is read.
#[tokio::test]
async fn a_read_leaves_out_the_tasks_the_worker_knows() {
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    let c = db.client().await;
    fixtures::worker(&db.bb, "w1", &["a"], 4).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            ops.submit(&NewTask::new("a", json!({ "n": n })), "test")
                .await
                .unwrap(),
        );
    }
    let mut known = pairs(&claim(&db, "w1").await);
    known.sort();
    let mut all: Vec<(Uuid, i64)> = ids.iter().map(|id| (*id, 1)).collect();
    all.sort();
    assert_eq!(known, all, "the claim took the three, at their first epoch");
    assert_eq!(
        pairs(&claim_with(&db, "w1", &known).await),
        [],
        "every task it holds left out"
    );
    assert_eq!(
        pairs(&claim_with(&db, "w1", &known[1..]).await),
        [known[0]],
        "the one it does not know, read"
    );
    // The first task given back and assigned to it again: its new epoch is read, though
    // the worker still knows the old one.
    c.execute(
        "update artex.tasks set status = 'pending', assigned_to = null, lease_until = null
         where id = $1",
        &[&known[0].0],
    )
    .await
    .unwrap();
    assert_eq!(
        pairs(&claim_with(&db, "w1", &known[1..]).await),
        [(known[0].0, 2)],
        "given back and claimed again: epoch 2"
    );
    assert_eq!(
        pairs(&claim_with(&db, "w1", &known).await),
        [(known[0].0, 2)]
    );
}

/// The (task, epoch) pairs a read returned, in its order.
fn pairs(read: &AssignedRead) -> Vec<(Uuid, i64)> {
    read.tasks.iter().map(|t| (t.id, t.epoch)).collect()
}

/// `worker`'s claim and read, leaving out the tasks at the epochs `known`.
async fn claim_with(db: &TestDb, worker: &str, known: &[(Uuid, i64)]) -> AssignedRead {
    db.bb
        .worker()
        .claim_and_read(worker, 10, i64::MAX, true, known)
        .await
        .expect("a claim and read")
        .expect("a read with a limit and a budget")
}

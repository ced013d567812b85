//! What a worker's written batch asks of the planners (migrations/V74): a worker with a
//! backlog refills the places it gives back by its own claims, so the planners hear of
//! its write only for what no claim takes: a limited kind's place given back, a limited
//! task waiting for its kinds, a task sent back to pending, dependents to promote. A
//! worker without a backlog wakes them after every write.

use artex_actors::blackboard::{FlowSpec, Outcome};
use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{fixtures, TestDb};
use crate::{finish, start};

/// A pending task of `kind`, inserted by plain SQL.
async fn task_of(c: &Client, kind: &str) -> Uuid {
    c.query_one(
        "insert into artex.tasks (kind) values ($1) returning id",
        &[&kind],
    )
    .await
    .expect("a task")
    .get(0)
}

/// Starts `id` on w1 and writes its attempt ending with `outcome`, w1 refilling what it
/// gives back by its claims (`refills`) or not: whether the planners were woken.
async fn wakes_planners(
    db: &TestDb,
    c: &Client,
    id: Uuid,
    outcome: Outcome,
    refills: bool,
) -> bool {
    let t = start(db, c, id, "w1").await;
    let r = db
        .bb
        .worker()
        .record_batch("w1", &[finish(&t, t.epoch, outcome)], refills)
        .await
        .unwrap();
    assert_eq!(r.ids, vec![id], "the outcome was written");
    r.planners
}

fn done() -> Outcome {
    Outcome::Succeeded(json!(1))
}

#[tokio::test]
async fn a_written_batch_wakes_the_planners_only_for_what_a_worker_s_claim_cannot_take() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w1", &["echo", "lim"], 10).await;
    c.batch_execute(
        "insert into artex.kind_limits (kind, concurrency, updated_by) values ('lim', 5, 'test')",
    )
    .await
    .unwrap();

    // A success: a worker with a backlog claims the place itself; one without has the
    // planners fill it.
    let id = task_of(&c, "echo").await;
    assert!(
        !wakes_planners(&db, &c, id, done(), true).await,
        "a plain success"
    );
    let id = task_of(&c, "echo").await;
    assert!(
        wakes_planners(&db, &c, id, done(), false).await,
        "no backlog"
    );

    // A failure with retries left: the task is pending again, a round's to place.
    let id = task_of(&c, "echo").await;
    let failed = Outcome::Failed {
        error: "no".into(),
        retry_in_ms: 60_000,
    };
    assert!(wakes_planners(&db, &c, id, failed, true).await, "a retry");

    // A success with a dependent to promote.
    let spec: FlowSpec = serde_json::from_value(json!({"name": "f", "tasks": [
        {"name": "a", "kind": "echo"},
        {"name": "b", "kind": "echo", "depends_on": ["a"]}]}))
    .unwrap();
    let flow = db.bb.operator().submit_flow(&spec, "test").await.unwrap();
    let a: Uuid = c
        .query_one(
            "select id from artex.tasks where flow_id = $1 and flow_task = 'a'",
            &[&flow],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        wakes_planners(&db, &c, a, done(), true).await,
        "a dependent"
    );

    // A limited kind's place given back.
    let id = task_of(&c, "lim").await;
    assert!(
        wakes_planners(&db, &c, id, done(), true).await,
        "a limited kind's place"
    );

    // A success while a limited task of its kinds waits: only a planner places it.
    task_of(&c, "lim").await;
    let id = task_of(&c, "echo").await;
    assert!(
        wakes_planners(&db, &c, id, done(), true).await,
        "a limited task waits"
    );
}

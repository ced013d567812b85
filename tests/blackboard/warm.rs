//! A worker's start warms its connections (`WorkerBoard::warm_connections`): each
//! connection of its pool runs the outcomes' write once, on an empty batch, in a
//! transaction rolled back, so that a burst's first writes do not pay for each server
//! process's first look at the tables and functions. Every connection of the pool is
//! open afterwards and none is left inside a transaction; nothing the worker holds moves.

use artex_actors::blackboard::Outcome;
use serde_json::json;
use tokio_postgres::Client;

use crate::common::{fixtures, TestDb};
use crate::{finish, insert_task, start};

/// The rows a write of outcomes touches, as text: the history's size, the task's row,
/// the worker's counters and the released counts.
async fn written(c: &Client, id: uuid::Uuid) -> String {
    c.query_one(
        "select concat_ws(' | ',
            (select count(*) from artex.task_history),
            (select row(status, lease_epoch, assigned_to, updated_at)::text
             from artex.tasks where id = $1),
            (select row(taken, held)::text from artex.workers where id = 'w1'),
            (select count(*) from artex.worker_released))",
        &[&id],
    )
    .await
    .expect("the written rows")
    .get(0)
}

#[tokio::test]
async fn warming_opens_every_connection_of_the_pool_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let id = insert_task(&c).await;
    let t = start(&db, &c, id, "w1").await;
    let before = written(&c, id).await;

    db.bb.worker().warm_connections("w1").await.unwrap();

    assert_eq!(written(&c, id).await, before, "the warm-up wrote nothing");
    // The test pool holds four connections; the test's own client is not the pool's.
    let (open, busy): (i64, i64) = {
        let row = c
            .query_one(
                "select count(*), count(*) filter (where state <> 'idle')
                 from pg_stat_activity
                 where datname = current_database() and application_name = 'artex'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(open >= 4, "every connection of the pool is open: {open}");
    assert_eq!(busy, 0, "none is left inside a transaction");
    // The held task's outcome still writes: the warm-up kept no lock.
    let r = db
        .bb
        .worker()
        .record_batch(
            "w1",
            &[finish(&t, t.epoch, Outcome::Succeeded(json!(1)))],
            false,
        )
        .await
        .unwrap();
    assert_eq!(r.ids, vec![id], "the outcome was written");
}

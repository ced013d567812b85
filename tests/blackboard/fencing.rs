//! The fencing token: the lease epoch bumps at every assignment and handover, never
//! moves back, and a write with a stale epoch changes nothing.

use artex_actors::blackboard::{Outcome, Renewal};
use chrono::Utc;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{start_assigned, TestDb};
use crate::{assign, finish, insert_task, move_to, reap_params, snapshot, status_of};

async fn epoch_of(c: &Client, id: Uuid) -> i64 {
    c.query_one("select lease_epoch from artex.tasks where id = $1", &[&id])
        .await
        .expect("reading an epoch")
        .get(0)
}

#[tokio::test]
async fn lease_epoch_bumps_at_every_assignment_and_handover() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assert_eq!(epoch_of(&c, id).await, 0);

    assign(&c, id, "w1").await;
    assert_eq!(epoch_of(&c, id).await, 1, "first assignment");
    move_to(&c, id, "pending").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 1, "a release is not an assignment");
    assign(&c, id, "w1").await;
    assert_eq!(epoch_of(&c, id).await, 2, "assignment after a release");
    move_to(&c, id, "pending").await.unwrap();
    assign(&c, id, "w2").await;
    assert_eq!(
        epoch_of(&c, id).await,
        3,
        "second assignment after a release"
    );

    c.execute(
        "update artex.tasks set lease_until = lease_until + interval '1 minute' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 3, "a lease renewal keeps the epoch");

    c.execute(
        "update artex.tasks set assigned_to = 'w3' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 4, "handover while assigned");
    move_to(&c, id, "running").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 4, "starting keeps the epoch");
    c.execute(
        "update artex.tasks set assigned_to = 'w4' where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(epoch_of(&c, id).await, 5, "handover while running");

    let audited: Vec<(String, String, String, i64)> = c
        .query(
            "select from_status::text, to_status::text, worker, lease_epoch
             from artex.task_transitions
             where task_id = $1 and to_status in ('assigned', 'running') order by id",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let row = |from: &str, to: &str, worker: &str, epoch: i64| {
        (from.to_string(), to.to_string(), worker.to_string(), epoch)
    };
    assert_eq!(
        audited,
        [
            row("pending", "assigned", "w1", 1),
            row("pending", "assigned", "w1", 2),
            row("pending", "assigned", "w2", 3),
            row("assigned", "assigned", "w3", 4),
            row("assigned", "running", "w3", 4),
            row("running", "running", "w4", 5),
        ],
        "assignments, handovers and the start are audited with their epoch"
    );
}

#[tokio::test]
async fn lease_epoch_never_moves_backwards() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    move_to(&c, id, "pending").await.unwrap();
    assign(&c, id, "w1").await;
    move_to(&c, id, "running").await.unwrap();
    assert_eq!(epoch_of(&c, id).await, 2);
    // Whether refused or ignored, the token must not go back to the earlier lease's.
    let _ = c
        .execute(
            "update artex.tasks set lease_epoch = lease_epoch - 1 where id = $1",
            &[&id],
        )
        .await;
    assert!(
        epoch_of(&c, id).await >= 2,
        "the fencing token moved backwards"
    );
}

#[tokio::test]
async fn writes_with_a_stale_epoch_change_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let bb = &db.bb;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    let e = epoch_of(&c, id).await;
    let started = start_assigned(bb, "w1", 10).await;
    assert_eq!(started.len(), 1);
    let t1 = &started[0];
    assert_eq!((t1.id, t1.epoch), (id, e));
    assert_eq!(status_of(&c, id).await, "running");

    let before = snapshot(&c, id).await;
    for (worker, epoch) in [("w1", e - 1), ("w1", e + 1), ("w2", e)] {
        let done = bb
            .worker()
            .record(worker, &[finish(t1, epoch, Outcome::Succeeded(json!(1)))])
            .await
            .unwrap();
        assert!(
            done.is_empty(),
            "{worker} at epoch {epoch} completed {done:?}"
        );
        assert_eq!(snapshot(&c, id).await, before, "{worker} at epoch {epoch}");
    }

    // The lease runs out; the reaper takes the task back and it goes to w2.
    let report = bb
        .planner()
        .reap(
            "reaper",
            &reap_params(Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    assert_eq!((report.requeued, report.ended), (1, 0), "{report:?}");
    assert_eq!(status_of(&c, id).await, "pending");
    assign(&c, id, "w2").await;
    let started = start_assigned(bb, "w2", 10).await;
    assert_eq!(started.len(), 1);
    let t2 = &started[0];
    assert_eq!(t2.epoch, e + 1);

    let before = snapshot(&c, id).await;
    let done = bb
        .worker()
        .record("w1", &[finish(t1, e, Outcome::Succeeded(json!("old")))])
        .await
        .unwrap();
    assert!(done.is_empty(), "the old holder completed {done:?}");
    let done = bb
        .worker()
        .record("w2", &[finish(t2, e, Outcome::Succeeded(json!("old")))])
        .await
        .unwrap();
    assert!(
        done.is_empty(),
        "the new holder completed with the old epoch"
    );
    assert!(!bb
        .worker()
        .save_checkpoint(id, e, &json!({"step": 1}))
        .await
        .unwrap());
    assert!(bb
        .worker()
        .renew_leases("w1", &[(id, e)], 60.0)
        .await
        .unwrap()
        .is_empty());
    assert!(bb
        .worker()
        .renew_leases("w2", &[(id, e)], 60.0)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        snapshot(&c, id).await,
        before,
        "stale writes changed the task"
    );

    // The current holder's writes go through.
    assert!(bb
        .worker()
        .save_checkpoint(id, t2.epoch, &json!({"step": 2}))
        .await
        .unwrap());
    assert_eq!(
        bb.worker()
            .renew_leases("w2", &[(id, t2.epoch)], 60.0)
            .await
            .unwrap(),
        [(id, Renewal::Renewed)]
    );
    let done = bb
        .worker()
        .record(
            "w2",
            &[finish(t2, t2.epoch, Outcome::Succeeded(json!("new")))],
        )
        .await
        .unwrap();
    assert_eq!(done, [id]);
    let r = c
        .query_one(
            "select status::text, result, checkpoint from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "succeeded");
    assert_eq!(r.get::<_, Option<Value>>(1), Some(json!("new")));
    assert_eq!(r.get::<_, Option<Value>>(2), Some(json!({"step": 2})));
}

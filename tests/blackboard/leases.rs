//! Holders and leases: an assigned or running task has a real holder and a lease, any
//! other names neither, a held task cannot be deleted, and the reaper's sweep refuses a
//! batch that could take nothing back.

use std::time::Duration;

use artex_actors::blackboard::{ReapParams, Renewal};
use chrono::Utc;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::common::TestDb;
use crate::{assign, insert_task, msg, reap_params, snapshot, status_of, task_in};

#[tokio::test]
async fn an_assignment_needs_a_real_holder_and_a_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    let before = snapshot(&c, id).await;
    let refused = [
        (
            "no holder",
            "update artex.tasks set status = 'assigned', lease_until = now() + interval '1 minute'
             where id = $1",
        ),
        (
            "no lease",
            "update artex.tasks set status = 'assigned', assigned_to = 'w1' where id = $1",
        ),
        (
            "empty holder",
            "update artex.tasks set status = 'assigned', assigned_to = '',
                 lease_until = now() + interval '1 minute'
             where id = $1",
        ),
        (
            "holder on a pending task",
            "update artex.tasks set assigned_to = 'w1', lease_until = now() + interval '1 minute'
             where id = $1",
        ),
    ];
    for (what, sql) in refused {
        let e = c
            .execute(sql, &[&id])
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert_eq!(
            e.code(),
            Some(&SqlState::CHECK_VIOLATION),
            "{what}: {}",
            msg(&e)
        );
        assert_eq!(snapshot(&c, id).await, before, "{what}: changed the task");
    }

    // Starting names the holder it was assigned to, and no other.
    assign(&c, id, "w1").await;
    let e = c
        .execute(
            "update artex.tasks set status = 'running', assigned_to = 'w2' where id = $1",
            &[&id],
        )
        .await
        .expect_err("running under another holder was accepted");
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
    assert_eq!(status_of(&c, id).await, "assigned");

    // A new task cannot arrive already held.
    let e = c
        .execute(
            "insert into artex.tasks (kind, assigned_to, lease_until)
             values ('echo', 'w1', now() + interval '1 minute')",
            &[],
        )
        .await
        .expect_err("a task inserted with a holder was accepted");
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
}

#[tokio::test]
async fn a_task_that_is_not_held_names_no_holder_nor_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for status in ["pending", "paused", "succeeded", "canceled"] {
        let id = task_in(&c, status).await;
        let before = snapshot(&c, id).await;
        for set in [
            "assigned_to = 'w1'",
            "lease_until = now() + interval '1 minute'",
        ] {
            let sql = format!("update artex.tasks set {set} where id = $1");
            let e = c
                .execute(&sql, &[&id])
                .await
                .err()
                .unwrap_or_else(|| panic!("{status} task: `{set}` accepted"));
            assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{}", msg(&e));
            assert_eq!(snapshot(&c, id).await, before, "{status}: `{set}`");
        }
    }
}

#[tokio::test]
async fn a_held_task_cannot_be_deleted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for status in ["assigned", "running"] {
        let id = task_in(&c, status).await;
        let before = snapshot(&c, id).await;
        let e = c
            .execute("delete from artex.tasks where id = $1", &[&id])
            .await
            .err()
            .unwrap_or_else(|| panic!("deleting a {status} task was accepted"));
        assert!(msg(&e).contains("cancel it before deleting"), "{}", msg(&e));
        assert_eq!(snapshot(&c, id).await, before);
    }
    for status in ["pending", "succeeded", "canceled"] {
        let id = task_in(&c, status).await;
        let n = c
            .execute("delete from artex.tasks where id = $1", &[&id])
            .await
            .unwrap_or_else(|e| panic!("deleting a {status} task: {}", msg(&e)));
        assert_eq!(n, 1, "a {status} task can be deleted");
    }
}

/// A sweep that may take back nothing per statement would loop forever: a batch below 1
/// is refused at once, saying what was wrong, before the sweep changes anything.
#[tokio::test]
async fn a_reap_with_an_empty_batch_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    assign(&c, id, "w1").await;
    let before = snapshot(&c, id).await;
    // An hour on, the lease has expired: a real sweep would take the task back.
    let params = ReapParams {
        batch: 0,
        ..reap_params(Utc::now() + chrono::Duration::hours(1))
    };
    let reaped = tokio::time::timeout(
        Duration::from_secs(5),
        db.bb.planner().reap("reaper", &params),
    )
    .await
    .expect("reap with batch 0 did not return within 5 s");
    match reaped {
        Err(artex_actors::Error::Invalid(m)) => {
            assert_eq!(m, "reap batch: 0; expected at least 1")
        }
        other => panic!("reap with batch 0: expected it refused as invalid, got {other:?}"),
    }
    assert_eq!(snapshot(&c, id).await, before);
}

/// A task assigned to a worker that has not read it yet (its memory budget reads big
/// payloads one at a time) keeps its lease while the worker renews what it holds: the
/// worker is alive. Before, the lease ran out while the task waited its turn, the reaper
/// sent it back with a retry counted, and eight 50 MB tasks could run out of retries
/// without starting. A worker holding nothing renews them too. Another worker's tasks,
/// and a task the worker read with another epoch, are not renewed.
#[tokio::test]
async fn a_task_its_worker_has_not_read_yet_keeps_its_lease_while_the_worker_renews() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let renew = |held: &[(Uuid, i64)]| {
        let held = held.to_vec();
        let worker = db.bb.worker();
        async move { worker.renew_leases("w1", &held, 60.0).await.unwrap() }
    };
    let (read, unread, other) = (
        insert_task(&c).await,
        insert_task(&c).await,
        insert_task(&c).await,
    );
    assign(&c, read, "w1").await;
    assign(&c, unread, "w1").await;
    assign(&c, other, "w2").await;
    c.execute(
        "update artex.tasks set lease_until = now() + interval '2 seconds'",
        &[],
    )
    .await
    .unwrap();
    let epoch: i64 = c
        .query_one(
            "select lease_epoch from artex.tasks where id = $1",
            &[&read],
        )
        .await
        .unwrap()
        .get(0);
    let kept = renew(&[(read, epoch)]).await;
    assert_eq!(
        kept,
        vec![(read, Renewal::Renewed)],
        "only what it read is reported"
    );
    let lease_left = |id| {
        let c = &c;
        async move {
            c.query_one(
                "select extract(epoch from lease_until - now())::float8 from artex.tasks
                 where id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get::<_, f64>(0)
        }
    };
    assert!(lease_left(read).await > 50.0);
    assert!(
        lease_left(unread).await > 50.0,
        "the unread task's lease was renewed"
    );
    assert!(
        lease_left(other).await < 5.0,
        "another worker's task is not renewed"
    );

    // Renewed a moment ago, neither lease is due: nothing is written, and the worker is
    // told what is left of the one it read.
    let versions = |ids: [Uuid; 2]| {
        let c = &c;
        async move {
            c.query_one(
                "select array_agg(xmin::text order by id) from artex.tasks where id = any($1)",
                &[&ids.to_vec()],
            )
            .await
            .unwrap()
            .get::<_, Vec<String>>(0)
        }
    };
    let written = versions([read, unread]).await;
    let kept = renew(&[(read, epoch)]).await;
    match kept.as_slice() {
        [(id, Renewal::Kept { left_secs })] if *id == read && *left_secs > 50.0 => {}
        other => panic!("a lease renewed a moment ago: expected it kept, got {other:?}"),
    }
    assert_eq!(
        versions([read, unread]).await,
        written,
        "a renewal rewrote leases that were not due"
    );

    // Read with a stale epoch, a task is not the worker's to renew.
    c.execute(
        "update artex.tasks set lease_until = now() + interval '2 seconds' where id = $1",
        &[&read],
    )
    .await
    .unwrap();
    let kept = renew(&[(read, epoch - 1)]).await;
    assert!(kept.is_empty(), "{kept:?}");
    assert!(lease_left(read).await < 5.0);

    // Holding nothing, a worker's renewal still keeps what waits for it unread.
    c.execute(
        "update artex.tasks set lease_until = now() + interval '2 seconds'",
        &[],
    )
    .await
    .unwrap();
    let kept = renew(&[]).await;
    assert!(kept.is_empty(), "{kept:?}");
    assert!(
        lease_left(unread).await > 50.0,
        "the unread task's lease was renewed by a worker holding nothing"
    );
    assert!(lease_left(other).await < 5.0);
}

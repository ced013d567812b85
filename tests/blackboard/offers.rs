//! A task born assigned (V62): an idle worker offers a slot (`artex.offer_slot`), and the
//! next insert it may run takes it — written `assigned` to that worker, its history a
//! claimed task's, the worker told on its channel. What may not run there, or must wait
//! its turn, takes none; an open insert locks only its offer; a claim that finds tasks
//! waiting, and a drain, give the offer back.

use std::time::Duration;

use tokio_postgres::Client;
use uuid::Uuid;

use artex_actors::blackboard::carried::parse_carried;
use artex_actors::blackboard::{parse_given, Registration};

use crate::common::{fixtures, TestDb};

/// Worker `w`'s counters: the slots the planners count taken, its offers out, and
/// `held` as the workers' list shows it.
async fn counted(c: &Client) -> (i64, i64, i32) {
    let r = c
        .query_one(
            "select w.taken - coalesce((select r.released from artex.worker_released r
                                        where r.worker = w.id), 0),
                    (select count(*) from artex.worker_offers o where o.worker = w.id),
                    w.held
             from artex.workers w where w.id = 'w'",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// The first two of [`counted`]: slots counted taken, offers out.
async fn slots(c: &Client) -> (i64, i64) {
    let (taken, offers, _) = counted(c).await;
    (taken, offers)
}

async fn offer(c: &Client) -> bool {
    c.query_one("select artex.offer_slot('w')", &[])
        .await
        .unwrap()
        .get(0)
}

/// Inserts a task with `columns` = `values` (plain SQL); its status and holder.
async fn insert(c: &Client, columns: &str, values: &str) -> (Uuid, String, Option<String>) {
    let r = c
        .query_one(
            &format!(
                "insert into artex.tasks (kind{columns}) values ('echo'{values})
                 returning id, status::text, assigned_to"
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("insert ({columns}) ({values}): {e}"));
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn an_idle_workers_offer_gives_it_the_next_task_born_assigned() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w", &["echo"], 4).await;
    let mut told = db
        .bb
        .feed()
        .listen(&["artex_w_w".to_string()])
        .await
        .unwrap();

    assert!(offer(&c).await);
    assert!(offer(&c).await, "a second call finds the offer out");
    assert_eq!(slots(&c).await, (1, 1), "one slot offered, counted taken");
    db.bb.worker().heartbeat("w", 0, 4).await.unwrap();
    assert_eq!(
        counted(&c).await.2,
        0,
        "held, as shown, leaves the offer out"
    );

    let (id, status, holder) = insert(&c, "", "").await;
    assert_eq!(
        (status.as_str(), holder.as_deref()),
        ("assigned", Some("w"))
    );
    let r = c
        .query_one(
            "select lease_epoch, extract(epoch from lease_until - now())::float8,
                    created_at = updated_at
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 1, "an assignment's fencing token");
    let lease: f64 = r.get(1);
    assert!(
        (25.0..=30.0).contains(&lease),
        "30 s for a worker that states no lease, as a claim gives: {lease} s"
    );
    assert!(r.get::<_, bool>(2));
    assert_eq!(slots(&c).await, (1, 0), "the offer is the task's slot now");
    let got = tokio::time::timeout(Duration::from_secs(10), told.recv())
        .await
        .expect("the worker is told on its channel within 10 s")
        .expect("a notification");
    assert_eq!(got.channel, "artex_w_w");
    let carried = parse_carried(&got.payload).unwrap();
    assert_eq!(
        carried
            .iter()
            .map(|c| (c.task.id, c.task.epoch))
            .collect::<Vec<_>>(),
        [(id, 1)],
        "the wake-up carries the task, as a round's: {}",
        got.payload
    );

    let (_, second, _) = insert(&c, "", "").await;
    assert_eq!(second, "pending", "one offer, one task");

    // The worker reads it and runs it: the history is a claimed task's, its assignment
    // dated at the insert.
    let read = c
        .query_one(
            "select id, lease_epoch from artex.read_assigned('w', 4, 1000000, true) where n = 1",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(read.get::<_, Uuid>(0), id);
    c.execute(
        "select artex.record_attempts('w', array[$1::uuid], array[1::int8], array['succeeded'],
             array['{}'::jsonb], array[null::text], array[false], array[null::float8],
             array[1.0::float8])",
        &[&id],
    )
    .await
    .unwrap();
    let steps: Vec<(Option<String>, String, Option<String>, bool)> = c
        .query(
            "select h.from_status::text, h.to_status::text, h.reason,
                    h.assigned_at is not distinct from t.created_at
             from artex.task_transitions h join artex.tasks t on t.id = h.task_id
             where h.task_id = $1 order by h.id",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let step = |from: Option<&str>, to: &str, reason: Option<&str>, at_insert: bool| {
        (
            from.map(str::to_string),
            to.to_string(),
            reason.map(str::to_string),
            at_insert,
        )
    };
    assert_eq!(
        steps,
        [
            step(None, "pending", Some("submitted"), false),
            step(Some("assigned"), "running", Some("started"), true),
            step(Some("running"), "succeeded", None, false),
        ]
    );
    assert_eq!(counted(&c).await.0, 0, "its slot is free again");
}

/// Each case: a worker or a task that must not meet through an offer; the task stays
/// pending, the offer out.
#[tokio::test]
async fn a_task_that_may_not_run_there_or_must_wait_its_turn_takes_no_offer() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w", &["echo", "other"], 4).await;
    assert!(offer(&c).await);
    // Made runnable by an update, which takes no offer.
    let runnable_echo =
        "insert into artex.tasks (kind, run_at) values ('echo', now() + interval '1 h');
        update artex.tasks set run_at = now() - interval '1 s' where status = 'pending'";
    // (what, set-up, the insert's columns and values, undo)
    let cases: [(&str, &str, &str, &str, &str); 9] = [
        ("due later", "", ", run_at", ", now() + interval '1 h'", ""),
        ("traced", "", ", traceparent", ", '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'", ""),
        ("bound to another host", "", ", host", ", 'elsewhere'", ""),
        ("blocked", "", ", status", ", 'blocked'", ""),
        (
            "of a limited kind",
            "insert into artex.kind_limits (kind, concurrency, updated_by) values ('echo', 5, 'test')",
            "", "",
            "delete from artex.kind_limits",
        ),
        (
            "of a paused kind",
            "select artex.pause_kind('echo', 'test')",
            "", "",
            "select artex.resume_kind('echo', 'test')",
        ),
        (
            "behind a runnable task of its kind",
            runnable_echo,
            "", "",
            "update artex.tasks set status = 'canceled', finished_at = now() where status = 'pending'",
        ),
        (
            "for a worker that drains",
            "update artex.workers set state = 'draining'",
            "", "",
            "update artex.workers set state = 'online'",
        ),
        (
            "for a worker no push reaches",
            "update artex.workers set wake_failed_at = now()",
            "", "",
            "update artex.workers set wake_failed_at = null",
        ),
    ];
    for (what, setup, columns, values, undo) in cases {
        if !setup.is_empty() {
            c.batch_execute(setup)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        let (id, status, _) = insert(&c, columns, values).await;
        assert_ne!(status, "assigned", "{what}");
        assert_eq!(counted(&c).await.1, 1, "{what}: the offer stays out");
        c.execute(
            "update artex.tasks set status = 'canceled', finished_at = now()
             where id = $1 and status in ('pending', 'blocked')",
            &[&id],
        )
        .await
        .unwrap();
        if !undo.is_empty() {
            c.batch_execute(undo)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    // A kind it does not run, and a worker silent past its lease.
    let (_, status, _) = insert_kind(&c, "unknown_kind").await;
    assert_eq!(status, "pending", "a kind the worker does not run");
    c.batch_execute("update artex.workers set last_seen = now() - interval '31 s'")
        .await
        .unwrap();
    assert_eq!(
        insert(&c, "", "").await.1,
        "pending",
        "a worker silent past its lease"
    );
    c.batch_execute(
        "update artex.workers set last_seen = now();
         update artex.tasks set status = 'canceled', finished_at = now() where status = 'pending'",
    )
    .await
    .unwrap();
    // Every case undone: the next task takes the offer.
    assert_eq!(insert(&c, "", "").await.1, "assigned");
}

async fn insert_kind(c: &Client, kind: &str) -> (Uuid, String, Option<String>) {
    let r = c
        .query_one(
            "insert into artex.tasks (kind) values ($1) returning id, status::text, assigned_to",
            &[&kind],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn an_open_insert_locks_only_its_offer_and_a_rolled_back_one_gives_it_back() {
    let db = TestDb::new().await;
    let (a, b) = (db.client().await, db.client().await);
    fixtures::worker(&db.bb, "w", &["echo"], 4).await;
    assert!(offer(&a).await);
    a.batch_execute("begin").await.unwrap();
    assert_eq!(insert(&a, "", "").await.1, "assigned");
    // Meanwhile the worker's heartbeat, another insert and the worker's claim go on,
    // none waiting for the open transaction.
    b.batch_execute("set statement_timeout = '5s'")
        .await
        .unwrap();
    b.execute(
        "update artex.workers set last_seen = now() where id = 'w'",
        &[],
    )
    .await
    .expect("the worker's row is not locked by the insert");
    assert_eq!(insert(&b, "", "").await.1, "pending", "the offer is taken");
    let claimed: i64 = b
        .query_one(
            "select claimed from artex.claim_and_read('w', 4, 1000000, true) where n = 0",
            &[],
        )
        .await
        .expect("the claim skips the offer the insert holds")
        .get(0);
    assert_eq!(claimed, 1);
    a.batch_execute("rollback").await.unwrap();
    assert_eq!(
        slots(&b).await,
        (2, 1),
        "the offer is back, with the claimed task"
    );
}

#[tokio::test]
async fn a_claim_that_finds_tasks_waiting_and_a_drain_give_the_offer_back() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w", &["echo"], 4).await;
    assert!(offer(&c).await);
    // A task made runnable by an update (here: due later, moved to now) takes no offer.
    let (id, _, _) = insert(&c, ", run_at", ", now() + interval '1 h'").await;
    c.execute(
        "update artex.tasks set run_at = now() where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    let claimed: i64 = c
        .query_one(
            "select claimed from artex.claim_and_read('w', 4, 1000000, true) where n = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 1);
    assert_eq!(slots(&c).await, (1, 0), "the offer's slot took the task");

    // While a task it may claim waits, it claims; it does not offer.
    let (waiting, _, _) = insert(&c, ", run_at", ", now() + interval '1 h'").await;
    c.execute(
        "update artex.tasks set run_at = now() where id = $1",
        &[&waiting],
    )
    .await
    .unwrap();
    assert!(!offer(&c).await, "a task waits for it: nothing offered");
    c.execute(
        "update artex.tasks set status = 'canceled', finished_at = now() where id = $1",
        &[&waiting],
    )
    .await
    .unwrap();

    // Nor while a task of a limited kind it runs waits: the planners place those, and
    // an offer out is given back by its next claim.
    assert!(offer(&c).await);
    c.batch_execute(
        "insert into artex.kind_limits (kind, concurrency, updated_by) values ('echo', 5, 'test');
         insert into artex.tasks (kind) values ('echo')",
    )
    .await
    .unwrap();
    c.query(
        "select * from artex.claim_and_read('w', 4, 1000000, true)",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(slots(&c).await, (1, 0), "the claim gave the offer back");
    assert!(
        !offer(&c).await,
        "a limited kind's task waits: nothing offered"
    );
    c.batch_execute(
        "update artex.tasks set status = 'canceled', finished_at = now() where status = 'pending';
         delete from artex.kind_limits",
    )
    .await
    .unwrap();

    // A drain gives the offer back with the unstarted tasks.
    let drain = || async {
        db.bb
            .worker()
            .release_assigned("w", "released by a draining worker", &[])
            .await
            .unwrap()
    };
    assert!(offer(&c).await);
    assert_eq!(drain().await, [id]);
    assert_eq!(slots(&c).await, (0, 0));
    // And with nothing assigned to give back (the task given back is pending: canceled,
    // so that nothing waits for the worker).
    c.execute(
        "update artex.tasks set status = 'canceled', finished_at = now() where id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert!(offer(&c).await);
    assert!(drain().await.is_empty());
    assert_eq!(slots(&c).await, (0, 0), "a drain with nothing to give back");

    // The last free slot is never offered.
    fixtures::worker(&db.bb, "w", &["echo"], 1).await;
    assert!(!offer(&c).await, "one slot: nothing offered");
}

/// A worker woken over HTTP is told through the planners: `given:` on `artex_wake`, with
/// its push's payload carrying the task.
#[tokio::test]
async fn a_worker_woken_over_http_is_told_through_the_planners_channel() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::register(
        &db.bb,
        &Registration {
            wake_addr: Some("127.0.0.1:9".into()),
            ..fixtures::registration("w", &["echo"], 4)
        },
    )
    .await;
    let mut planners = db
        .bb
        .feed()
        .listen(&["artex_wake".to_string()])
        .await
        .unwrap();
    assert!(offer(&c).await);
    let (id, status, _) = insert(&c, "", "").await;
    assert_eq!(status, "assigned");
    let got = tokio::time::timeout(Duration::from_secs(10), planners.recv())
        .await
        .expect("the planners are told within 10 s")
        .expect("a notification");
    let (worker, payload) = parse_given(&got.payload).unwrap_or_else(|| panic!("{got:?}"));
    assert_eq!(worker, "w");
    let carried = parse_carried(&payload).unwrap();
    assert_eq!(carried.len(), 1, "{payload}");
    assert_eq!((carried[0].task.id, carried[0].task.epoch), (id, 1));
}

/// A transaction that found no offer for a task looks for none again: a bulk insert of
/// runnable tasks pays the look once. The next transaction looks again.
#[tokio::test]
async fn a_transaction_that_found_no_offer_looks_for_none_again() {
    let db = TestDb::new().await;
    let (a, b) = (db.client().await, db.client().await);
    fixtures::worker(&db.bb, "w", &["echo"], 4).await;
    a.batch_execute("begin").await.unwrap();
    assert_eq!(insert(&a, "", "").await.1, "pending", "no offer out yet");
    // (The task above is not committed: no task waits for the worker, as `b` sees it.)
    assert!(offer(&b).await);
    assert_eq!(
        insert(&a, "", "").await.1,
        "pending",
        "the transaction looks no more"
    );
    a.batch_execute("rollback").await.unwrap();
    assert_eq!(
        insert(&a, "", "").await.1,
        "assigned",
        "a new transaction looks again"
    );
}

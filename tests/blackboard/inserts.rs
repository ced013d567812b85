//! A task inserted with plain SQL: its defaults, its time-ordered id, its one audit row
//! and the notification that wakes the planner.

use std::time::Duration;

use artex_actors::blackboard::{DUE_AT, NEW_LIMITED_TASKS, NEW_TASKS, TASKS_CHANNEL};
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::common::TestDb;
use crate::{insert_task, FEED_ROWS};

#[tokio::test]
async fn plain_insert_of_kind_and_payload_gets_defaults_and_one_audit_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = insert_task(&c).await;
    let r = c
        .query_one(
            "select status::text, retries, max_retries, lease_epoch, assigned_to, lease_until,
                    result, error, priority,
                    extract(epoch from now() - run_at)::float8, created_at = updated_at,
                    current_user::text
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(id.get_version_num(), 7, "id {id} is not time-ordered");
    assert_eq!(r.get::<_, String>(0), "pending");
    assert_eq!(r.get::<_, i32>(1), 0, "retries");
    assert_eq!(r.get::<_, i32>(2), 3, "max_retries");
    assert_eq!(r.get::<_, i64>(3), 0, "lease_epoch");
    assert_eq!(r.get::<_, Option<String>>(4), None, "assigned_to");
    assert_eq!(r.get::<_, Option<DateTime<Utc>>>(5), None, "lease_until");
    assert_eq!(r.get::<_, Option<Value>>(6), None, "result");
    assert_eq!(r.get::<_, Option<String>>(7), None, "error");
    assert_eq!(r.get::<_, i32>(8), 0, "priority");
    let run_at_age: f64 = r.get(9);
    assert!(
        (0.0..10.0).contains(&run_at_age),
        "run_at is {run_at_age}s before now, expected the insert's time"
    );
    assert!(r.get::<_, bool>(10), "created_at = updated_at");
    let role: String = r.get(11);

    let audit = c
        .query(
            "select from_status::text, to_status::text, actor, reason, lease_epoch
             from artex.task_transitions where task_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "one audit row for the insert");
    assert_eq!(audit[0].get::<_, Option<String>>(0), None);
    assert_eq!(audit[0].get::<_, String>(1), "pending");
    assert_eq!(
        audit[0].get::<_, String>(2),
        role,
        "actor is the database role"
    );
    assert_eq!(
        audit[0].get::<_, Option<String>>(3).as_deref(),
        Some("submitted")
    );
    assert_eq!(audit[0].get::<_, i64>(4), 0);

    let outbox = c
        .query(
            &format!(
                "select from_status::text, to_status::text, kind from artex.task_transitions
                 where task_id = $1 and {FEED_ROWS}"
            ),
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(outbox.len(), 1, "the insert's row is in the feed");
    assert_eq!(outbox[0].get::<_, Option<String>>(0), None);
    assert_eq!(outbox[0].get::<_, String>(1), "pending");
    assert_eq!(outbox[0].get::<_, String>(2), "echo");
}

/// The Unix time in milliseconds a UUIDv7 starts with.
fn unix_ms_of(id: Uuid) -> i64 {
    let b = id.as_bytes();
    b[..6]
        .iter()
        .fold(0i64, |ms, byte| ms << 8 | i64::from(*byte))
}

// A task inserted with plain SQL gets an id like artex's own submits: time-ordered
// (UUIDv7), so new rows land on the right edge of the primary key, not on a random page.
#[tokio::test]
async fn a_plain_insert_gets_a_time_ordered_id_stamped_now() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let clock_ms = "select floor(extract(epoch from clock_timestamp()) * 1000)::int8";
    let mut last: Option<Uuid> = None;
    for _ in 0..50 {
        let before: i64 = c.query_one(clock_ms, &[]).await.unwrap().get(0);
        let id = insert_task(&c).await;
        let after: i64 = c.query_one(clock_ms, &[]).await.unwrap().get(0);
        assert_eq!(id.get_version_num(), 7, "id {id} is not a UUIDv7");
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "id {id}");
        let ms = unix_ms_of(id);
        assert!(
            (before..=after).contains(&ms),
            "id {id} says {ms} ms, inserted between {before} and {after}"
        );
        if let Some(last) = last {
            assert!(id > last, "id {id} inserted after {last} sorts before it");
        }
        last = Some(id);
    }
    // Many in one statement (one transaction): each still gets its own time, not the
    // transaction's, and they are all distinct.
    let ids: Vec<Uuid> = c
        .query(
            "insert into artex.tasks (kind) select 'echo' from generate_series(1, 1000)
             returning id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let distinct: std::collections::HashSet<&Uuid> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "duplicate ids");
    assert!(ids.iter().all(|id| id.get_version_num() == 7));
    assert!(
        ids.iter().all(|id| *id > last.unwrap()),
        "bulk ids sort after earlier ones"
    );
    let flow: Uuid = c
        .query_one(
            "insert into artex.flows (name) values ('plain') returning id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(flow.get_version_num(), 7, "flow id {flow}");
}

/// A LISTEN session on the planners' tasks channel.
async fn tasks_listener(db: &TestDb) -> artex_actors::blackboard::Listener {
    db.bb
        .feed()
        .listen(&[TASKS_CHANNEL.to_string()])
        .await
        .expect("a LISTEN session")
}

#[tokio::test]
async fn a_plain_insert_of_a_pending_task_notifies_listeners() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut listener = tasks_listener(&db).await;
    assert_eq!(TASKS_CHANNEL, "artex_tasks");
    insert_task(&c).await;
    let got = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("no notification within 10 s");
    assert_eq!(got.map(|n| n.channel).as_deref(), Some("artex_tasks"));
}

/// V63: an insert says `new limited` when a runnable row is of a limited kind (no worker
/// claims it; the planners run a round at once), `new` otherwise; a limited row due
/// later changes nothing but its `at:`.
#[tokio::test]
async fn an_insert_of_a_limited_kind_s_runnable_task_asks_for_a_round_at_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.kind_limits (kind, fair, updated_by) values ('fairly', true, 'test')",
    )
    .await
    .unwrap();
    let mut listener = tasks_listener(&db).await;
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("no notification within 10 s")
            .expect("the listener")
            .payload
    };
    for (insert, said) in [
        (
            "insert into artex.tasks (kind) values ('echo')",
            vec![NEW_TASKS],
        ),
        (
            "insert into artex.tasks (kind) values ('fairly')",
            vec![NEW_LIMITED_TASKS],
        ),
        (
            "insert into artex.tasks (kind) values ('echo'), ('fairly')",
            vec![NEW_LIMITED_TASKS],
        ),
        (
            "insert into artex.tasks (kind, run_at)
             values ('echo', now()), ('fairly', now() + interval '1 hour')",
            vec![NEW_TASKS, "at:"],
        ),
        (
            "insert into artex.tasks (kind, run_at)
             values ('fairly', now()), ('echo', now() + interval '1 hour')",
            vec![NEW_LIMITED_TASKS, "at:"],
        ),
    ] {
        c.batch_execute(insert).await.unwrap();
        for want in said {
            let got = next().await;
            if want == "at:" {
                assert!(got.starts_with(DUE_AT), "{insert}: {got:?}");
            } else {
                assert_eq!(got, want, "{insert}");
            }
        }
    }
}

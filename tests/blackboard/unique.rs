//! Unique tasks and the submission path in SQL (migrations/V17): one task per unfinished
//! key whatever the number of concurrent submitters, a window that counts finished ones,
//! `artex.submit`'s checks, and a submission inside the caller's transaction that exists
//! only if the caller commits.

use std::time::Duration;

use artex_actors::blackboard::{submit_in, NewTask};
use serde_json::json;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::common::{connect, count, fixtures, TestDb};

fn keyed(key: &str) -> NewTask {
    NewTask {
        unique_key: Some(key.into()),
        ..NewTask::new("echo", json!({"key": key}))
    }
}

#[tokio::test]
async fn fifty_concurrent_submitters_of_one_key_write_one_task() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    // Half through the library (the API's and the CLI's path), half through SQL, each on
    // a connection of its own, all released at once.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let mut submitters = Vec::new();
    for i in 0..50 {
        let start = start.clone();
        let bb = db.bb.clone();
        let url = db.url.clone();
        submitters.push(tokio::spawn(async move {
            if i % 2 == 0 {
                start.wait().await;
                let s = bb.operator().submit_all(&[keyed("order-7")], "test").await.unwrap();
                (s[0].id, s[0].duplicate)
            } else {
                let c = connect(&url).await;
                start.wait().await;
                let r = c
                    .query_one(
                        "select id, duplicate from artex.submit('echo', '{}', unique_key => 'order-7')",
                        &[],
                    )
                    .await
                    .unwrap();
                (r.get::<_, Uuid>(0), r.get::<_, bool>(1))
            }
        }));
    }
    let mut answers = Vec::new();
    for s in submitters {
        answers.push(s.await.unwrap());
    }
    let c = db.client().await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where unique_key = 'order-7'"
        )
        .await,
        1,
        "one task written"
    );
    let first = answers[0].0;
    assert!(answers.iter().all(|(id, _)| *id == first), "{answers:?}");
    assert_eq!(
        answers.iter().filter(|(_, dup)| !dup).count(),
        1,
        "one submitter wrote, 49 were told it exists: {answers:?}"
    );
}

#[tokio::test]
async fn a_key_is_free_again_when_its_task_ends_unless_a_window_counts_it() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let op = db.bb.operator();
    let c = db.client().await;
    let first = op.submit_all(&[keyed("k")], "test").await.unwrap()[0];
    assert!(!first.duplicate);
    // A batch naming the key twice, beside another key: in order, one new task.
    let batch = op
        .submit_all(&[keyed("k"), keyed("other"), keyed("other")], "test")
        .await
        .unwrap();
    assert_eq!(
        batch.iter().map(|s| s.duplicate).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(batch[0].id, first.id);
    assert_eq!(batch[1].id, batch[2].id);
    // A plain insert of a taken key is refused, naming the task that holds it.
    let err = c
        .batch_execute("insert into artex.tasks (kind, unique_key) values ('echo', 'k')")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::UNIQUE_VIOLATION));
    let db_err = err.as_db_error().unwrap();
    assert_eq!(db_err.detail(), Some(first.id.to_string().as_str()));
    // Ended: the key is free, unless the submission's window reaches back to the end.
    c.batch_execute("update artex.tasks set status = 'canceled' where unique_key = 'k'")
        .await
        .unwrap();
    let windowed = NewTask {
        unique_for: Some(Duration::from_secs(600)),
        ..keyed("k")
    };
    let again = op.submit_all(&[windowed], "test").await.unwrap()[0];
    assert_eq!((again.id, again.duplicate), (first.id, true));
    let fresh = op.submit_all(&[keyed("k")], "test").await.unwrap()[0];
    assert!(!fresh.duplicate);
    assert_ne!(fresh.id, first.id);
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where unique_key = 'k'"
        )
        .await,
        2
    );
    // The key is shown with the task.
    let t = op.task(fresh.id).await.unwrap();
    assert_eq!(t.unique_key.as_deref(), Some("k"));
}

#[tokio::test]
async fn artex_submit_makes_every_check_and_writes_nothing_it_refuses() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let c = db.client().await;
    c.batch_execute("update artex.limits set max_payload_bytes = 100")
        .await
        .unwrap();
    for (call, says) in [
        (
            "artex.submit('nobody-runs-this')",
            "no worker has declared kind",
        ),
        (
            "artex.submit('bad kind!', allow_unregistered_kind => true)",
            "is not a kind name",
        ),
        (
            "artex.submit('echo', max_retries => 5000)",
            "expected 0 to 1000",
        ),
        (
            "artex.submit('echo', timeout_ms => 0)",
            "positive number of milliseconds",
        ),
        (
            "artex.submit('echo', unique_for => '1 hour')",
            "needs a unique_key",
        ),
        ("artex.submit('echo', unique_key => '')", "unique_key_check"),
        ("artex.submit('echo', shard_key => '')", "shard_key_check"),
        (
            "artex.submit('echo', repeat('x', 200)::jsonb)",
            "invalid input syntax",
        ),
        (
            "artex.submit('echo', jsonb_build_object('x', repeat('x', 200)))",
            "more than the limit",
        ),
        ("artex.submit(null)", "kind must not be null"),
    ] {
        let err = c
            .query(&format!("select * from {call}"), &[])
            .await
            .expect_err(call);
        let text = err
            .as_db_error()
            .map(|e| format!("{} {}", e.message(), e.constraint().unwrap_or_default()))
            .unwrap_or_else(|| err.to_string());
        assert!(text.contains(says), "{call}: {text}");
    }
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);
    // What passes every check is written, with its settings.
    let r = c
        .query_one(
            "select id from artex.submit('echo', '{\"n\": 1}', priority => 3, max_retries => 0,
                 timeout_ms => 500, shard_key => 's', actor => 'billing', reason => 'invoice')",
            &[],
        )
        .await
        .unwrap();
    let id: Uuid = r.get(0);
    let t = db.bb.operator().task(id).await.unwrap();
    assert_eq!(
        (
            t.priority,
            t.max_retries,
            t.timeout_ms,
            t.shard_key.as_deref()
        ),
        (3, 0, Some(500), Some("s"))
    );
    let history = db.bb.operator().transitions(id).await.unwrap();
    assert_eq!(
        (history[0].actor.as_str(), history[0].reason.as_deref()),
        ("billing", Some("invoice"))
    );
}

#[tokio::test]
async fn a_submission_in_the_callers_transaction_exists_and_wakes_only_on_commit() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let (listener, mut connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx_notes, mut notes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx_notes.send(n.payload().to_string());
            }
        }
    });
    listener.batch_execute("listen artex_tasks").await.unwrap();

    let mut c = db.client().await;
    c.batch_execute("create table orders (id int primary key)")
        .await
        .unwrap();
    // Rolled back: neither the order nor the task, and no wake-up.
    let tx = c.transaction().await.unwrap();
    tx.execute("insert into orders values (1)", &[])
        .await
        .unwrap();
    let gone = submit_in(&tx, &keyed("receipt-1"), "shop", false)
        .await
        .unwrap();
    assert!(!gone.duplicate);
    tx.rollback().await.unwrap();
    let c2 = db.client().await;
    assert_eq!(count(&c2, "select count(*) from artex.tasks").await, 0);

    // Committed: both, and the planners are woken.
    let tx = c.transaction().await.unwrap();
    tx.execute("insert into orders values (1)", &[])
        .await
        .unwrap();
    let kept = submit_in(&tx, &keyed("receipt-1"), "shop", false)
        .await
        .unwrap();
    // Visible to the caller's transaction at once, to nobody else yet.
    assert_eq!(count(&c2, "select count(*) from artex.tasks").await, 0);
    tx.commit().await.unwrap();
    // Notifications arrive in commit order: everything before this marker is what the
    // rolled-back and the committed submission sent. Only the commit's may be there.
    c.batch_execute("notify artex_tasks, 'marker'")
        .await
        .unwrap();
    let mut before_marker = Vec::new();
    loop {
        let note = tokio::time::timeout(Duration::from_secs(10), notes.recv())
            .await
            .expect("the marker within 10 s")
            .expect("the listener's connection");
        if note == "marker" {
            break;
        }
        before_marker.push(note);
    }
    assert_eq!(
        before_marker.len(),
        1,
        "one wake-up, the committed submission's: {before_marker:?}"
    );
    let t = db.bb.operator().task(kept.id).await.unwrap();
    assert_eq!(t.unique_key.as_deref(), Some("receipt-1"));
    // The rules are checked before anything is sent: the caller's transaction goes on.
    let tx = c.transaction().await.unwrap();
    let bad = NewTask::new("not a kind", json!({}));
    assert!(submit_in(&tx, &bad, "shop", false).await.is_err());
    tx.execute("insert into orders values (2)", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // A kind no worker declared is the database's refusal (as for every entry).
    let tx = c.transaction().await.unwrap();
    let err = submit_in(&tx, &NewTask::new("nobody", json!({})), "shop", false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no worker has declared"), "{err}");
}

/// docs/handlers.md's psql example, run as written with `psql`.
#[tokio::test]
async fn the_documented_psql_example_submits_in_the_applications_transaction() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["send-receipt"], 10).await;
    let c = db.client().await;
    c.batch_execute(
        "create schema shop; create table shop.orders (id int primary key, customer text)",
    )
    .await
    .unwrap();
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/handlers.md")).unwrap();
    let example = page
        .split("<!-- example: psql-submit -->")
        .nth(1)
        .and_then(|rest| rest.split("```sql\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("docs/handlers.md has the psql-submit example");
    let run = |sql: &str| {
        std::process::Command::new("psql")
            .args([
                db.url.as_str(),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql")
    };
    let out = run(example);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where unique_key = 'receipt-42' and kind = 'send-receipt'").await,
        1
    );
    assert_eq!(count(&c, "select count(*) from shop.orders").await, 1);
    // Rolled back instead of committed: nothing of either.
    let rolled = example.replace("commit;", "rollback;").replace("42", "43");
    let out = run(&rolled);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1);
    assert_eq!(count(&c, "select count(*) from shop.orders").await, 1);
}

#[tokio::test]
async fn batches_naming_the_same_keys_in_opposite_orders_never_deadlock() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    for round in 0..20 {
        let keys: Vec<String> = (0..5).map(|k| format!("r{round}-k{k}")).collect();
        let forward: Vec<NewTask> = keys.iter().map(|k| keyed(k)).collect();
        let backward: Vec<NewTask> = keys.iter().rev().map(|k| keyed(k)).collect();
        let op = db.bb.operator();
        let (a, b) = tokio::join!(op.submit_all(&forward, "a"), op.submit_all(&backward, "b"));
        let (a, b) = (a.unwrap(), b.unwrap());
        // Whichever went first wrote all five; the other found them, in its own order.
        let ids_a: Vec<Uuid> = a.iter().map(|s| s.id).collect();
        let ids_b: Vec<Uuid> = b.iter().map(|s| s.id).rev().collect();
        assert_eq!(ids_a, ids_b, "round {round}");
        assert_eq!(
            a.iter().chain(&b).filter(|s| !s.duplicate).count(),
            5,
            "round {round}: five tasks written"
        );
    }
}

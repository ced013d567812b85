//! Workers and statistics, read from the blackboard.

use serde_json::json;

use crate::common::TestDb;
use crate::{declare, Server};

#[tokio::test]
async fn workers_and_statistics_are_read_from_the_blackboard() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    declare(&db.bb, "w2", &["resize"]).await;
    let sha = "ab".repeat(32);
    db.bb
        .worker()
        .set_worker_binary("w2", &sha)
        .await
        .expect("digest");
    // w2 says how many handlers it runs; w1 is of a build that does not.
    c.execute("update artex.workers set slots = 4 where id = 'w2'", &[])
        .await
        .unwrap();
    let api = Server::start(&db.url);
    let workers = api.get("/api/v1/workers").json();
    let w2 = &workers["workers"][1];
    assert_eq!(w2["id"], "w2");
    assert_eq!(w2["binary_sha256"], sha.as_str());
    assert_eq!(
        (
            w2["pid"].as_i64(),
            w2["capacity"].as_i64(),
            w2["held"].as_i64()
        ),
        (Some(4242), Some(10), Some(0))
    );
    assert_eq!(w2["slots"].as_i64(), Some(4));
    assert!(workers["workers"][0]["slots"].is_null(), "{workers}");
    assert_eq!(w2["state"], "online");
    assert!(workers["workers"][0]["binary_sha256"].is_null());
    assert!(w2["last_seen"].is_string() && w2["version"] == "test");
    let one = api.get("/api/v1/workers?limit=1").json();
    assert_eq!(one["workers"].as_array().unwrap().len(), 1);
    assert_eq!(one["more"], true);
    api.get("/api/v1/workers?limit=0").error(400, Some("limit"));

    // Four tasks: three canceled (finished now), one pending. Started 250 ms after they
    // were created, for the latency.
    let ids = api.w(
        "POST",
        "/api/v1/tasks",
        Some(r#"[{"kind": "echo"}, {"kind": "echo"}, {"kind": "resize"}, {"kind": "echo"}]"#),
    );
    let ids = ids.json()["ids"].clone();
    for id in ids.as_array().unwrap().iter().take(3) {
        let id = id.as_str().unwrap();
        assert_eq!(
            api.w("POST", &format!("/api/v1/tasks/{id}/cancel"), None)
                .status,
            200
        );
    }
    // Plain SQL: no API dates a start (only a worker's start does, at its own time).
    c.execute(
        "update artex.tasks set started_at = created_at + interval '250 milliseconds'
         where status = 'canceled'",
        &[],
    )
    .await
    .unwrap();
    let stats = api.get("/api/v1/stats?window_minutes=5").json();
    assert_eq!(stats["by_status"]["canceled"], 3, "{stats}");
    assert_eq!(stats["by_status"]["pending"], 1);
    assert_eq!(stats["by_status"]["succeeded"], 0);
    assert_eq!(stats["capped"], json!([]));
    let recent = &stats["recent"];
    assert_eq!(recent["finished"], 3);
    assert_eq!(recent["sampled"], false);
    assert_eq!(
        recent["by_kind"],
        json!({"echo": {"canceled": 2}, "resize": {"canceled": 1}})
    );
    assert_eq!(recent["queue_ms"]["tasks"], 3);
    let p50 = recent["queue_ms"]["p50"].as_f64().unwrap();
    assert!((p50 - 250.0).abs() < 1.0, "{p50}");
    let minutes = recent["per_minute"].as_array().unwrap();
    assert!((5..=6).contains(&minutes.len()), "{minutes:?}");
    let finished: i64 = minutes
        .iter()
        .map(|m| m["finished"].as_i64().unwrap())
        .sum();
    assert_eq!(finished, 3);
    let per_minute = recent["throughput_per_minute"].as_f64().unwrap();
    assert!(
        (per_minute - 0.6).abs() < 0.01,
        "3 tasks over 5 minutes: {per_minute}"
    );
    for bad in ["window_minutes=0", "window_minutes=61", "window=5"] {
        let field = bad.split('=').next().unwrap();
        api.get(&format!("/api/v1/stats?{bad}"))
            .error(400, Some(field));
    }
}

/// The overview's recent figures read the history back from its end (V69): the walk
/// stops at the feed position from which the history is dated within the window, which
/// `artex.feed_position_at` finds by a search of the feed index.
#[tokio::test]
async fn the_recent_figures_walk_the_history_back_to_the_window_s_start() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Four tasks submitted and canceled, each in transactions of its own, their history
    // and end then dated 3, 2 and 1 hours ago and now (plain SQL: no API dates them).
    // The transaction ids of each task's submission and end.
    let (mut submitted, mut ended) = (Vec::new(), Vec::new());
    for (i, hours) in [3.0f64, 2.0, 1.0, 0.0].into_iter().enumerate() {
        let r = c
            .query_one(
                "insert into artex.tasks (kind, payload) values ('echo', $1)
                 returning id, pg_current_xact_id()::text",
                &[&json!(i)],
            )
            .await
            .unwrap();
        let id: uuid::Uuid = r.get(0);
        submitted.push(r.get::<_, String>(1));
        let r = c
            .query_one(
                "update artex.tasks set status = 'canceled' where id = $1
                 returning pg_current_xact_id()::text",
                &[&id],
            )
            .await
            .unwrap();
        ended.push(r.get::<_, String>(0));
        c.execute(
            "update artex.task_history set at = at - make_interval(secs => $2::float8 * 3600)
             where task_id = $1",
            &[&id, &hours],
        )
        .await
        .unwrap();
        c.execute(
            "update artex.tasks
             set finished_at = finished_at - make_interval(secs => $2::float8 * 3600)
             where id = $1",
            &[&id, &hours],
        )
        .await
        .unwrap();
    }
    let position = |ago: &'static str| {
        let c = &c;
        async move {
            let x: String = c
                .query_one(
                    &format!("select artex.feed_position_at(now() - interval '{ago}')::text"),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            x
        }
    };
    // The first transaction dated within 90 minutes submitted the third task: the walk
    // starts at the one before it (it may straddle the bound), the second task's end.
    assert_eq!(position("90 minutes").await, ended[1]);
    assert_eq!(position("150 minutes").await, ended[0]);
    // Before all: the first submission; past all: the last end.
    assert_eq!(position("4 hours").await, submitted[0]);
    assert_eq!(position("-1 hour").await, ended[3]);
    let board = db.bb.operator();
    let recent = |minutes| {
        let board = &board;
        async move { board.stats(minutes, None).await.unwrap().recent }
    };
    assert_eq!(recent(1).await.finished, 1);
    assert_eq!(recent(90).await.finished, 2);
    assert_eq!(recent(150).await.finished, 3);
    assert_eq!(recent(240).await.finished, 4);
}

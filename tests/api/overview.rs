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

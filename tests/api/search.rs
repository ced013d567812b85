//! Tags, search, bulk actions and kinds' limits through the API (issue 24, features 3, 7
//! and 8): filters by tag, time range and payload containment; retry, cancel and delete
//! of every matching task in batches, audited; limits set, read and refused.

use serde_json::{json, Value};

use crate::common::{count, TestDb};
use crate::{declare, written, Server};

fn ids(page: &Value) -> Vec<String> {
    page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn tasks_are_found_by_tag_time_and_payload() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let sub = |body: Value| {
        let a = api.w("POST", "/api/v1/tasks", Some(&body.to_string()));
        assert_eq!(a.status, 201, "{}", a.text());
        a.json()["id"].as_str().unwrap().to_string()
    };
    let a = sub(
        json!({"kind": "echo", "payload": {"customer": 42, "n": 1}, "tags": ["nightly", "eu"]}),
    );
    let b = sub(json!({"kind": "echo", "payload": {"customer": 7}, "tags": ["nightly"]}));
    let c = sub(json!({"kind": "echo", "payload": {"customer": 42}, "limit_key": "42"}));
    let shown = api.get(&format!("/api/v1/tasks/{a}"));
    assert_eq!(
        shown.json()["task"]["tags"],
        json!(["nightly", "eu"]),
        "{}",
        shown.text()
    );
    assert_eq!(
        api.get(&format!("/api/v1/tasks/{c}")).json()["task"]["limit_key"],
        "42"
    );

    assert_eq!(
        ids(&api.get("/api/v1/tasks?tag=nightly").json()),
        [b.clone(), a.clone()]
    );
    assert_eq!(ids(&api.get("/api/v1/tasks?tag=eu").json()), [a.as_str()]);
    let by_payload = api.get("/api/v1/tasks?where=%7B%22customer%22%3A42%7D");
    assert_eq!(
        ids(&by_payload.json()),
        [c.clone(), a.clone()],
        "{}",
        by_payload.text()
    );
    let both = api.get("/api/v1/tasks?tag=nightly&where=%7B%22customer%22%3A42%7D");
    assert_eq!(ids(&both.json()), [a.as_str()]);
    // A time range: all three are from the last minute, none from the future.
    let since = (chrono::Utc::now() - chrono::Duration::minutes(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let later = (chrono::Utc::now() + chrono::Duration::minutes(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        ids(&api.get(&format!("/api/v1/tasks?since={since}")).json()).len(),
        3
    );
    assert_eq!(
        ids(&api.get(&format!("/api/v1/tasks?until={since}")).json()).len(),
        0
    );
    assert_eq!(
        ids(&api.get(&format!("/api/v1/tasks?since={later}")).json()).len(),
        0
    );

    // Bad filters and tags: 400 naming the field, nothing written.
    let c_db = db.client().await;
    let before = written(&c_db).await;
    for (path, field) in [
        ("/api/v1/tasks?where=%5B1%5D", "where"),
        ("/api/v1/tasks?where=nope", "where"),
        ("/api/v1/tasks?since=yesterday", "since"),
        ("/api/v1/tasks?tag=", "tag"),
    ] {
        let r = api.get(path);
        assert_eq!(
            (r.status, r.json()["field"].as_str()),
            (400, Some(field)),
            "{path}: {}",
            r.text()
        );
    }
    let many: Vec<String> = (0..21).map(|i| format!("t{i}")).collect();
    for (body, field) in [
        (json!({"kind": "echo", "tags": ["ok", ""]}), "tags"),
        (json!({"kind": "echo", "tags": many}), "tags"),
        (json!({"kind": "echo", "tags": ["x".repeat(65)]}), "tags"),
        (json!({"kind": "echo", "tags": "nightly"}), "tags"),
        (json!({"kind": "echo", "limit_key": ""}), "limit_key"),
    ] {
        let r = api.w("POST", "/api/v1/tasks", Some(&body.to_string()));
        assert!(matches!(r.status, 400 | 422), "{body}: {}", r.text());
        assert_eq!(r.json()["field"], field, "{body}: {}", r.text());
    }
    assert_eq!(written(&c_db).await, before);
}

#[tokio::test]
async fn bulk_actions_change_every_match_in_batches_and_audit_each_task() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["resize", "echo"]).await;
    let api = Server::start(&db.url);
    let c = db.client().await;
    // 1,100 resize tasks (three batches of at most 500) and one echo task.
    let batch: Vec<Value> = (0..1100)
        .map(|i| json!({"kind": "resize", "payload": {"n": i}}))
        .collect();
    let r = api.w(
        "POST",
        "/api/v1/tasks",
        Some(&Value::Array(batch).to_string()),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#))
            .status,
        201
    );
    let bulk = |body: Value| api.w("POST", "/api/v1/tasks/bulk", Some(&body.to_string()));

    let dry = bulk(json!({"action": "cancel", "filter": {"kind": "resize"}, "dry_run": true}));
    assert_eq!(dry.status, 200, "{}", dry.text());
    assert_eq!(
        dry.json(),
        json!({"action": "cancel", "matched": 1100, "changed": 0, "batches": 0, "dry_run": true})
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'canceled'"
        )
        .await,
        0
    );

    let canceled =
        bulk(json!({"action": "cancel", "filter": {"kind": "resize"}, "reason": "bad deploy"}));
    assert_eq!(
        canceled.json(),
        json!({"action": "cancel", "matched": 1100, "changed": 1100, "batches": 3, "dry_run": false}),
        "{}",
        canceled.text()
    );
    let audited = "select count(*) from artex.task_transitions
                   where to_status = 'canceled' and reason = 'bad deploy' and actor like 'api@%'";
    assert_eq!(count(&c, audited).await, 1100);
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'echo' and status = 'pending'"
        )
        .await,
        1
    );

    let retried =
        bulk(json!({"action": "retry", "filter": {"status": "canceled", "kind": "resize"}}));
    assert_eq!(retried.json()["changed"], 1100, "{}", retried.text());
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'resize' and status = 'pending'"
        )
        .await,
        1100
    );

    let deleted =
        bulk(json!({"action": "delete", "filter": {"status": "canceled"}, "reason": "cleanup"}));
    assert_eq!(deleted.json()["changed"], 1100, "{}", deleted.text());
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1101);
    let recorded = "select count(*) from artex.task_deletions
                    where status = 'canceled' and reason = 'cleanup' and actor like 'api@%'";
    assert_eq!(count(&c, recorded).await, 1100);
    // Their history stays: the audit trail of what happened to them.
    assert_eq!(count(&c, audited).await, 1100);
    // Deleting unfinished tasks changes nothing.
    let pending = bulk(json!({"action": "delete", "filter": {"status": "pending"}}));
    assert_eq!(
        (
            pending.json()["matched"].as_u64(),
            pending.json()["changed"].as_u64()
        ),
        (Some(1101), Some(0))
    );

    // Refused: no filter without "all", an unknown action or filter.
    let before = written(&c).await;
    for (body, field) in [
        (json!({"action": "cancel"}), "filter"),
        (json!({"action": "cancel", "filter": {}}), "filter"),
        (
            json!({"action": "explode", "filter": {"kind": "resize"}}),
            "action",
        ),
        (
            json!({"action": "cancel", "filter": {"colour": "red"}}),
            "filter.colour",
        ),
        (
            json!({"action": "cancel", "filter": {"since": "soon"}}),
            "filter.since",
        ),
        (json!({"filter": {"kind": "resize"}}), "action"),
    ] {
        let r = bulk(body.clone());
        assert_eq!(
            (r.status, r.json()["field"].as_str()),
            (400, Some(field)),
            "{body}: {}",
            r.text()
        );
    }
    assert_eq!(written(&c).await, before);
    // The read token cannot.
    let r = api.call(
        "POST",
        "/api/v1/tasks/bulk",
        Some(crate::common::READ_TOKEN),
        Some(r#"{"action": "cancel", "all": true}"#),
    );
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn kinds_limits_are_set_read_cleared_and_refused_naming_the_field() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["resize"]).await;
    let api = Server::start(&db.url);
    let none = api.get("/api/v1/kinds/resize/limits");
    assert_eq!((none.status, none.json()), (200, json!({"limits": null})));
    let set = api.w(
        "PUT",
        "/api/v1/kinds/resize/limits",
        Some(r#"{"concurrency": 5, "key_concurrency": 2, "rate": "100/s"}"#),
    );
    assert_eq!(set.status, 200, "{}", set.text());
    let l = &set.json()["limits"];
    assert_eq!(
        (
            l["concurrency"].as_i64(),
            l["key_concurrency"].as_i64(),
            l["rate_per_sec"].as_f64(),
            l["held"].as_i64()
        ),
        (Some(5), Some(2), Some(100.0), Some(0))
    );
    let kinds = api.get("/api/v1/kinds").json();
    assert_eq!(kinds["kinds"][0]["kind"], "resize");
    assert_eq!(kinds["limits"][0]["concurrency"], 5);
    // 400 malformed, 422 refused by a rule.
    for (body, status, field) in [
        (r#"{}"#, 422, "concurrency"),
        (r#"{"concurrency": 0}"#, 422, "concurrency"),
        (r#"{"rate": "5/d"}"#, 400, "rate"),
        (r#"{"rate": 5}"#, 400, "rate"),
        (r#"{"burst": 5}"#, 400, "burst"),
    ] {
        let r = api.w("PUT", "/api/v1/kinds/resize/limits", Some(body));
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert_eq!(r.json()["field"], field, "{body}: {}", r.text());
    }
    let bad_kind = api.w(
        "PUT",
        "/api/v1/kinds/bad%20kind/limits",
        Some(r#"{"concurrency": 1}"#),
    );
    assert_eq!(
        (bad_kind.status, bad_kind.json()["field"].as_str()),
        (400, Some("kind"))
    );
    let cleared = api.w("DELETE", "/api/v1/kinds/resize/limits", None);
    assert_eq!(cleared.json(), json!({"cleared": true}));
    assert_eq!(
        api.w("DELETE", "/api/v1/kinds/resize/limits", None).json(),
        json!({"cleared": false})
    );
}

/// A kind's listing and its bulk actions take its held tasks too, though the kind index
/// holds none (migrations/V28: they are found through the holder index and merged by id),
/// newest first across pages.
#[tokio::test]
async fn a_kind_is_listed_and_acted_on_whole_its_held_tasks_included() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let c = db.client().await;
    // Five echo tasks, oldest first; the second and fourth held by w1, the fifth ended.
    c.batch_execute(
        "insert into artex.tasks (id, kind)
             select ('00000000-0000-7000-8000-00000000000' || i)::uuid, 'echo'
             from generate_series(1, 5) i;
         insert into artex.tasks (kind) values ('other');
         update artex.tasks set status = 'assigned', assigned_to = 'w1',
             lease_until = now() + interval '1 minute'
         where id in ('00000000-0000-7000-8000-000000000002',
                      '00000000-0000-7000-8000-000000000004');
         update artex.tasks set status = 'running'
         where id = '00000000-0000-7000-8000-000000000004';
         update artex.tasks set status = 'canceled'
         where id = '00000000-0000-7000-8000-000000000005';",
    )
    .await
    .unwrap();
    let id = |i: u32| format!("00000000-0000-7000-8000-00000000000{i}");
    let first = api.get("/api/v1/tasks?kind=echo&limit=3").json();
    assert_eq!(ids(&first), vec![id(5), id(4), id(3)], "{first}");
    let rest = api
        .get(&format!("/api/v1/tasks?kind=echo&limit=3&after={}", id(3)))
        .json();
    assert_eq!(ids(&rest), vec![id(2), id(1)], "{rest}");

    let canceled = api.w(
        "POST",
        "/api/v1/tasks/bulk",
        Some(&json!({"action": "cancel", "filter": {"kind": "echo"}}).to_string()),
    );
    assert_eq!(canceled.status, 200, "{}", canceled.text());
    assert_eq!(canceled.json()["matched"], 5, "{}", canceled.text());
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'echo' and status = 'canceled'"
        )
        .await,
        5
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'other' and status = 'pending'"
        )
        .await,
        1
    );
}

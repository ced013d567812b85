//! Tasks through the API: submitted, listed, shown, controlled and retried; bad input
//! refused naming the field, with nothing written.

use artex_actors::blackboard::TaskStatus;
use serde_json::json;

use crate::common::TestDb;
use crate::{declare, id_of, written, Server};

#[tokio::test]
async fn tasks_are_submitted_listed_shown_controlled_and_retried() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo", "resize"]).await;
    let api = Server::start(&db.url);

    // One task: 201, its id and where it lives.
    let one = api.w(
        "POST",
        "/api/v1/tasks",
        Some(
            r#"{"kind": "echo", "payload": {"n": 1}, "priority": 5, "max_retries": 0,
                 "timeout_ms": 1000, "shard_key": "site-1"}"#,
        ),
    );
    assert_eq!(one.status, 201, "{}", one.text());
    let id = id_of(&one);
    let t = db
        .bb
        .operator()
        .task(id.parse().unwrap())
        .await
        .expect("stored");
    assert_eq!(
        (t.kind.as_str(), t.priority, t.max_retries, t.timeout_ms),
        ("echo", 5, 0, Some(1000))
    );
    assert_eq!(t.payload, json!({"n": 1}));

    // A batch: 201 with the ids in order; run_at in the future stays pending.
    let batch = api.w(
        "POST",
        "/api/v1/tasks",
        Some(
            r#"[{"kind": "resize"}, {"kind": "resize", "run_at": "2099-01-01T00:00:00Z"},
                 {"kind": "echo"}]"#,
        ),
    );
    assert_eq!(batch.status, 201, "{}", batch.text());
    let ids: Vec<String> = batch.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let later = db
        .bb
        .operator()
        .task(ids[1].parse().unwrap())
        .await
        .unwrap();
    assert_eq!(later.run_at.to_rfc3339(), "2099-01-01T00:00:00+00:00");

    // Listing: newest first, filtered, paged by keyset.
    let all = api.get("/api/v1/tasks").json();
    let listed: Vec<&str> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [&ids[2], &ids[1], &ids[0], &id]);
    assert!(all["next"].is_null(), "one page: {all}");
    let resize = api.get("/api/v1/tasks?kind=resize&status=pending").json();
    assert_eq!(resize["tasks"].as_array().unwrap().len(), 2);
    let mut seen = Vec::new();
    let mut path = "/api/v1/tasks?limit=3".to_string();
    loop {
        let page = api.get(&path).json();
        for t in page["tasks"].as_array().unwrap() {
            seen.push(t["id"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/api/v1/tasks?limit=3&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 4, "every task once: {seen:?}");
    assert_eq!(seen[3], id);

    // One task with its history.
    let shown = api.get(&format!("/api/v1/tasks/{id}")).json();
    assert_eq!(shown["task"]["status"], "pending");
    assert_eq!(shown["transitions"][0]["to_status"], "pending");
    assert!(
        shown["transitions"][0]["actor"]
            .as_str()
            .unwrap()
            .starts_with("api@127.0.0.1"),
        "{shown}"
    );

    // Controls, each with its reason in the history.
    let paused = api.w(
        "POST",
        &format!("/api/v1/tasks/{id}/pause"),
        Some(r#"{"reason": "hold on"}"#),
    );
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["changed"][0][1], "paused");
    assert_eq!(
        api.w("POST", &format!("/api/v1/tasks/{id}/resume"), None)
            .status,
        200
    );
    let canceled = api.w(
        "POST",
        &format!("/api/v1/tasks/{id}/cancel"),
        Some(r#"{"reason": "not needed"}"#),
    );
    assert_eq!(canceled.status, 200, "{}", canceled.text());
    let history = api.get(&format!("/api/v1/tasks/{id}")).json()["transitions"].clone();
    let reasons: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(&"hold on") && reasons.contains(&"not needed"),
        "{history}"
    );

    // Retry: a new task with the same kind, payload and settings, naming the original.
    let retried = api.w(
        "POST",
        &format!("/api/v1/tasks/{id}/retry"),
        Some(r#"{"reason": "try again"}"#),
    );
    assert_eq!(retried.status, 201, "{}", retried.text());
    assert_eq!(retried.json()["retry_of"], id.as_str());
    let copy = db
        .bb
        .operator()
        .task(id_of(&retried).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(copy.status, TaskStatus::Pending);
    assert_eq!(
        (
            copy.kind.as_str(),
            &copy.payload,
            copy.priority,
            copy.max_retries
        ),
        ("echo", &json!({"n": 1}), 5, 0)
    );
    assert_eq!(copy.shard_key.as_deref(), Some("site-1"));
    let first = &db.bb.operator().transitions(copy.id).await.unwrap()[0];
    assert_eq!(
        first.reason.as_deref(),
        Some(format!("retry of task {id}: try again").as_str())
    );
    // The original stays canceled: its history is not rewritten.
    let original = db.bb.operator().task(id.parse().unwrap()).await.unwrap();
    assert_eq!(original.status, TaskStatus::Canceled);
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_nothing_is_written() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::with(&db.url, true, true, false, 64 * 1024);
    let pending = id_of(&api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#)));
    db.bb
        .operator()
        .set_max_payload_bytes(1000)
        .await
        .expect("a small payload limit");
    let before = written(&c).await;

    let post = |body: &str| api.w("POST", "/api/v1/tasks", Some(body));
    // Not JSON, no body, not a task.
    let m = post("{\"kind\": ").error(400, Some("body"));
    assert!(m.contains("not valid JSON"), "{m}");
    api.w("POST", "/api/v1/tasks", None)
        .error(400, Some("body"));
    post("42").error(400, Some("body"));
    post("[1]").error(400, Some("[0]"));
    // Wrong types, each named.
    let m = post(r#"{"kind": 7}"#).error(400, Some("kind"));
    assert!(m.contains("expected a string, got 7"), "{m}");
    post(r#"{"kind": "echo", "priority": "high"}"#).error(400, Some("priority"));
    post(r#"{"kind": "echo", "priority": 1e12}"#).error(400, Some("priority"));
    post(r#"{"kind": "echo", "run_at": "tomorrow"}"#).error(400, Some("run_at"));
    post(r#"{"kind": "echo", "max_retries": true}"#).error(400, Some("max_retries"));
    post(r#"[{"kind": "echo"}, {"kind": "echo", "timeout_ms": "1s"}]"#)
        .error(400, Some("[1].timeout_ms"));
    post(r#"{"kind": "echo", "allow_unregistered_kind": "yes"}"#)
        .error(400, Some("allow_unregistered_kind"));
    // Missing and unknown fields.
    post(r#"{"payload": {}}"#).error(400, Some("kind"));
    let m = post(r#"{"kind": "echo", "priorty": 1}"#).error(400, Some("priorty"));
    assert!(m.contains("unknown field"), "{m}");
    // Values the blackboard refuses: 422, named.
    post(r#"{"kind": "no such kind"}"#).error(422, Some("kind"));
    post(r#"{"kind": "echo", "max_retries": -1}"#).error(422, Some("max_retries"));
    post(r#"{"kind": "echo", "timeout_ms": 0}"#).error(422, Some("timeout_ms"));
    post(r#"{"kind": "echo", "shard_key": ""}"#).error(422, Some("shard_key"));
    post(r#"{"kind": "echo", "payload": "a\u0000b"}"#).error(422, Some("payload"));
    post("[]").error(422, Some("body"));
    // A kind no worker declared: refused, unless the request says it comes later.
    let m = post(r#"[{"kind": "echo"}, {"kind": "typo"}]"#).error(422, Some("[1].kind"));
    assert!(
        m.contains("never been declared") && m.contains("known kinds: echo"),
        "{m}"
    );
    // A payload over the blackboard's limit (1000 bytes here): 422 on the payload.
    let big = json!({"kind": "echo", "payload": {"s": "x".repeat(2000)}}).to_string();
    let m = post(&big).error(422, Some("payload"));
    assert!(m.contains("more than the limit of 1000 bytes"), "{m}");
    // A body over --max-body-bytes (64 KiB here): 413, whatever it holds.
    let huge = json!({"kind": "echo", "payload": {"s": "x".repeat(100_000)}}).to_string();
    let m = post(&huge).error(413, Some("body"));
    assert!(m.contains("65536 bytes"), "{m}");
    // Bad query parameters.
    api.w(
        "POST",
        "/api/v1/tasks?allow_unregistered_kind=maybe",
        Some("{}"),
    )
    .error(400, Some("allow_unregistered_kind"));
    for (q, field) in [
        ("status=done", "status"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("after=42", "after"),
        ("flow=x", "flow"),
        ("kind=a%20b", "kind"),
        ("worker=", "worker"),
        ("colour=red", "colour"),
        ("limit=1&limit=2", "limit"),
        ("full=yes", "full"),
    ] {
        api.get(&format!("/api/v1/tasks?{q}"))
            .error(400, Some(field));
    }
    // Ids: malformed 400, unknown 404; a flow's route does not take a task's id.
    let unknown = uuid::Uuid::now_v7();
    api.get("/api/v1/tasks/not-a-uuid").error(400, Some("id"));
    api.get(&format!("/api/v1/tasks/{unknown}"))
        .error(404, None);
    for verb in ["pause", "resume", "cancel", "retry"] {
        api.w("POST", &format!("/api/v1/tasks/{unknown}/{verb}"), None)
            .error(404, None);
        api.w("POST", &format!("/api/v1/tasks/xyz/{verb}"), None)
            .error(400, Some("id"));
    }
    api.w("POST", &format!("/api/v1/flows/{pending}/cancel"), None)
        .error(404, None);
    // Control bodies.
    let pause = format!("/api/v1/tasks/{pending}/pause");
    api.w("POST", &pause, Some("[")).error(400, Some("body"));
    api.w("POST", &pause, Some(r#"{"reason": 1}"#))
        .error(400, Some("reason"));
    api.w("POST", &pause, Some(r#"{"why": "x"}"#))
        .error(400, Some("why"));
    api.w("POST", &pause, Some(r#""just because""#))
        .error(400, Some("body"));
    let long = json!({ "reason": "r".repeat(20_000) }).to_string();
    api.w("POST", &pause, Some(&long))
        .error(422, Some("reason"));
    // What the task's state does not allow: 409, saying why.
    let m = api
        .w("POST", &format!("/api/v1/tasks/{pending}/resume"), None)
        .error(409, None);
    assert!(m.contains("it is pending"), "{m}");
    let m = api
        .w("POST", &format!("/api/v1/tasks/{pending}/retry"), None)
        .error(409, None);
    assert!(m.contains("failed, timeout or canceled"), "{m}");

    assert_eq!(written(&c).await, before, "a refusal wrote something");

    // Allowed explicitly, in the body or the query, the unknown kind goes in.
    assert_eq!(
        post(r#"{"kind": "later", "allow_unregistered_kind": true}"#).status,
        201
    );
    let a = api.w(
        "POST",
        "/api/v1/tasks?allow_unregistered_kind=true",
        Some(r#"[{"kind": "later"}]"#),
    );
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(written(&c).await[0], before[0] + 2);
}

#[tokio::test]
async fn a_unique_key_answers_the_existing_task_with_200_and_writes_nothing() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let body = r#"{"kind": "echo", "unique_key": "order-9", "unique_for": "10m"}"#;
    let first = api.w("POST", "/api/v1/tasks", Some(body));
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.json()["duplicate"], false);
    let c = db.client().await;
    let before = written(&c).await;
    let second = api.w("POST", "/api/v1/tasks", Some(body));
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["duplicate"], true);
    assert_eq!(id_of(&second), id_of(&first));
    assert_eq!(written(&c).await, before, "a duplicate writes nothing");
    let shown = api.get(&format!("/api/v1/tasks/{}", id_of(&first))).json();
    assert_eq!(shown["task"]["unique_key"], "order-9");
    // A batch: one flag per task, 201 because one was written.
    let batch = api.w(
        "POST",
        "/api/v1/tasks",
        Some(r#"[{"kind": "echo", "unique_key": "order-9"}, {"kind": "echo", "unique_key": "order-10"}]"#),
    );
    assert_eq!(batch.status, 201, "{}", batch.text());
    assert_eq!(batch.json()["duplicate"], json!([true, false]));
    assert_eq!(
        batch.json()["ids"][0].as_str(),
        Some(id_of(&first).as_str())
    );
    // Bad keys and windows are refused naming the field, with nothing written.
    let before = written(&c).await;
    for (body, field) in [
        (r#"{"kind": "echo", "unique_key": ""}"#, "unique_key"),
        (r#"{"kind": "echo", "unique_key": 7}"#, "unique_key"),
        (
            r#"{"kind": "echo", "unique_key": "k", "unique_for": "soon"}"#,
            "unique_for",
        ),
        (r#"{"kind": "echo", "unique_for": "10m"}"#, "unique_for"),
        (
            r#"[{"kind": "echo"}, {"kind": "echo", "unique_key": ""}]"#,
            "[1].unique_key",
        ),
    ] {
        let r = api.w("POST", "/api/v1/tasks", Some(body));
        assert!(
            r.status == 400 || r.status == 422,
            "{body}: {} {}",
            r.status,
            r.text()
        );
        assert_eq!(r.json()["field"], field, "{body}: {}", r.text());
    }
    assert_eq!(written(&c).await, before);
}

#[tokio::test]
async fn a_task_s_progress_is_in_the_task_shown_and_listed() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let id = id_of(&api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#)));
    // Never reported: null.
    let shown = api.get(&format!("/api/v1/tasks/{id}")).json();
    assert_eq!(shown["task"]["progress"], json!(null), "{shown}");
    assert_eq!(shown["task"]["progress_message"], json!(null));
    // As a worker writes it (`WorkerBoard::save_progress`; the runtime's own path is in
    // tests/progress.rs).
    let c = db.client().await;
    c.execute(
        "update artex.tasks set progress = 0.25, progress_message = 'a quarter',
             progress_at = now() where id = $1::text::uuid",
        &[&id],
    )
    .await
    .unwrap();
    let shown = api.get(&format!("/api/v1/tasks/{id}")).json();
    assert_eq!(shown["task"]["progress"], json!(0.25), "{shown}");
    assert_eq!(shown["task"]["progress_message"], json!("a quarter"));
    assert!(shown["task"]["progress_at"].is_string());
    let listed = api.get("/api/v1/tasks?kind=echo").json();
    assert_eq!(listed["tasks"][0]["progress"], json!(0.25), "{listed}");
    // The database refuses what no worker may write.
    for bad in [
        "update artex.tasks set progress = 1.5",
        "update artex.tasks set progress_message = repeat('x', 201)",
    ] {
        let e = c.execute(bad, &[]).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
            "{bad}: {e:?}"
        );
    }
}

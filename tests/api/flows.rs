//! Flows through the API: submitted and shown with their DAG, controlled, listed
//! newest first a keyset page at a time, and signaled (their waits completed or the
//! signal kept).

use serde_json::{json, Value};

use crate::common::TestDb;
use crate::{declare, id_of, written, Server};

#[tokio::test]
async fn flows_are_submitted_shown_with_their_dag_and_controlled() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let flow = r#"{"name": "etl", "tasks": [
        {"name": "extract", "kind": "echo", "payload": {"src": "a"}},
        {"name": "transform", "kind": "echo", "depends_on": ["extract"]},
        {"name": "load", "kind": "echo", "depends_on": ["transform"], "priority": 3}]}"#;
    let created = api.w("POST", "/api/v1/flows", Some(flow));
    assert_eq!(created.status, 201, "{}", created.text());
    let id = id_of(&created);
    let shown = api.get(&format!("/api/v1/flows/{id}")).json();
    assert_eq!(shown["name"], "etl");
    assert_eq!(shown["state"], "running");
    let deps: Vec<(String, Value)> = shown["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().into(), t["depends_on"].clone()))
        .collect();
    assert_eq!(
        deps,
        [
            ("extract".into(), json!([])),
            ("transform".into(), json!(["extract"])),
            ("load".into(), json!(["transform"]))
        ]
    );
    // Its tasks are listed by flow.
    let listed = api.get(&format!("/api/v1/tasks?flow={id}")).json();
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 3);

    let paused = api.w("POST", &format!("/api/v1/flows/{id}/pause"), None);
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["changed"].as_array().unwrap().len(), 3);
    assert_eq!(
        api.get(&format!("/api/v1/flows/{id}")).json()["state"],
        "paused"
    );
    assert_eq!(
        api.w("POST", &format!("/api/v1/flows/{id}/resume"), None)
            .status,
        200
    );
    let extract = shown["tasks"][0]["id"].as_str().unwrap().to_string();
    // A flow's task is controlled through the task routes, not the flow's.
    api.w("POST", &format!("/api/v1/tasks/{id}/pause"), None)
        .error(404, None);
    assert_eq!(
        api.w(
            "POST",
            &format!("/api/v1/flows/{id}/cancel"),
            Some(r#"{"reason": "stop"}"#)
        )
        .status,
        200
    );
    assert_eq!(
        api.get(&format!("/api/v1/flows/{id}")).json()["state"],
        "canceled"
    );
    // A canceled flow task is not retried on its own: its flow is over.
    let m = api
        .w("POST", &format!("/api/v1/tasks/{extract}/retry"), None)
        .error(409, None);
    assert!(m.contains("submit the flow again"), "{m}");
    api.w("POST", &format!("/api/v1/flows/{id}/cancel"), None)
        .error(409, None);

    let before = written(&c).await;
    let post = |body: &str| api.w("POST", "/api/v1/flows", Some(body));
    post("{").error(400, Some("body"));
    post("[]").error(400, Some("body"));
    post(r#"{"tasks": []}"#).error(400, Some("name"));
    post(r#"{"name": "x", "tasks": {}}"#).error(400, Some("tasks"));
    post(r#"{"name": "x", "tasks": [], "owner": "me"}"#).error(400, Some("owner"));
    post(r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo", "priority": "hi"}]}"#)
        .error(400, Some("tasks[0].priority"));
    post(r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo", "after": []}]}"#)
        .error(400, Some("tasks[0].after"));
    post(r#"{"name": "x", "tasks": [{"name": "a"}]}"#).error(400, Some("tasks[0].kind"));
    post(r#"{"name": "x", "tasks": []}"#).error(422, Some("tasks"));
    let m = post(
        r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo", "depends_on": ["b"]},
                                   {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    )
    .error(422, Some("tasks[0]"));
    assert!(m.contains("cycle"), "{m}");
    post(r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo", "depends_on": ["zz"]}]}"#)
        .error(422, Some("tasks[0]"));
    post(r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo", "max_retries": -2}]}"#)
        .error(422, Some("tasks[0].max_retries"));
    post(
        r#"{"name": "x", "tasks": [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "nope"}]}"#,
    )
    .error(422, Some("tasks[1].kind"));
    api.get("/api/v1/flows/nope").error(400, Some("id"));
    api.get(&format!("/api/v1/flows/{}", uuid::Uuid::now_v7()))
        .error(404, None);
    api.get(&format!("/api/v1/flows/{extract}"))
        .error(404, None);
    assert_eq!(written(&c).await, before, "a refusal wrote something");
    let allowed = post(
        r#"{"name": "x", "allow_unregistered_kind": true,
            "tasks": [{"name": "b", "kind": "nope"}]}"#,
    );
    assert_eq!(allowed.status, 201, "{}", allowed.text());
}

#[tokio::test]
async fn flows_are_listed_newest_first_a_keyset_page_at_a_time() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let mut ids = Vec::new();
    for name in ["one", "two", "three"] {
        let body = format!(r#"{{"name": "{name}", "tasks": [{{"name": "a", "kind": "echo"}}]}}"#);
        let created = api.w("POST", "/api/v1/flows", Some(&body));
        assert_eq!(created.status, 201, "{}", created.text());
        ids.push(id_of(&created));
    }
    let first = api.get("/api/v1/flows?limit=2").json();
    let names: Vec<&str> = first["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["three", "two"], "{first}");
    assert_eq!(first["flows"][0]["state"], "running", "{first}");
    assert_eq!(first["flows"][0]["counts"]["pending"], 1, "{first}");
    assert_eq!(first["next"], ids[1].as_str(), "{first}");
    let rest = api
        .get(&format!("/api/v1/flows?limit=2&after={}", ids[1]))
        .json();
    assert_eq!(rest["flows"].as_array().unwrap().len(), 1, "{rest}");
    assert_eq!(rest["flows"][0]["id"], ids[0].as_str(), "{rest}");
    assert_eq!(rest["next"], Value::Null, "{rest}");

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=two", "limit"),
        ("after=not-a-uuid", "after"),
        ("colour=red", "colour"),
    ] {
        let m = api
            .get(&format!("/api/v1/flows?{query}"))
            .error(400, Some(field));
        assert!(!m.is_empty(), "{query}");
    }
    let head = api.get("/api/v1/events/head").json();
    assert!(
        head["after"].as_str().is_some_and(|a| a.contains('-')),
        "{head}"
    );
    api.get("/api/v1/events/head?from=0")
        .error(400, Some("from"));
}

#[tokio::test]
async fn a_signal_completes_a_flows_wait_or_is_kept_for_it() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    // `ready` has no upstream task: reached at once. `later` waits for `first`, which
    // no planner runs here.
    let flow = r#"{"name": "waits", "tasks": [
        {"name": "ready", "wait": {"signal": "go", "timeout": "1h", "on_timeout": "succeed"}},
        {"name": "first", "kind": "echo"},
        {"name": "later", "wait": {"signal": "late"}, "depends_on": ["first"]},
        {"name": "timer", "wait": {"for": "1h"}}]}"#;
    let created = api.w("POST", "/api/v1/flows", Some(flow));
    assert_eq!(created.status, 201, "{}", created.text());
    let id = id_of(&created);
    let shown = api.get(&format!("/api/v1/flows/{id}")).json();
    let ready = &shown["tasks"][0];
    assert_eq!(ready["kind"], "artex:wait", "{shown}");
    assert_eq!(ready["status"], "blocked", "{shown}");
    assert_eq!(
        ready["wait"]["spec"],
        json!({"signal": "go", "timeout": "1h", "on_timeout": "succeed"})
    );
    assert!(ready["wait"]["reached_at"].is_string(), "{shown}");
    assert!(ready["wait"]["due_at"].is_string(), "{shown}");
    assert!(shown["tasks"][2]["wait"]["reached_at"].is_null(), "{shown}");
    assert!(shown["tasks"][1].get("wait").is_none(), "{shown}");

    let signal = |name: &str, body: Option<&str>| {
        api.w("POST", &format!("/api/v1/flows/{id}/signals/{name}"), body)
    };
    let before = written(&c).await;
    signal("go", Some("{")).error(400, Some("body"));
    signal("go", Some("[1]")).error(400, Some("body"));
    signal("go", Some(r#"{"payload": 1, "extra": 2}"#)).error(400, Some("extra"));
    let m = signal("nope", None).error(404, None);
    assert!(
        m.contains("has no wait for signal 'nope'; it waits for 'go', 'late'"),
        "{m}"
    );
    signal("bad%20name", None).error(400, Some("name"));
    signal("go", Some(r#"{"payload": "a\u0000b"}"#)).error(422, Some("payload"));
    api.w(
        "POST",
        &format!("/api/v1/flows/{}/signals/go", uuid::Uuid::now_v7()),
        None,
    )
    .error(404, None);
    api.w("POST", "/api/v1/flows/x/signals/go", None)
        .error(400, Some("id"));
    assert_eq!(written(&c).await, before, "a refusal wrote something");

    let done = signal("go", Some(r#"{"payload": {"ok": true}}"#));
    assert_eq!(done.status, 200, "{}", done.text());
    let done = done.json();
    assert_eq!(done["outcome"], "completed", "{done}");
    assert_eq!(done["task_name"], "ready");
    assert_eq!(done["signal"], "go");
    let kept = signal("late", None).json();
    assert_eq!(kept["outcome"], "stored", "{kept}");
    let m = signal("go", None).error(409, None);
    assert!(m.contains("received signal 'go' already"), "{m}");

    let shown = api.get(&format!("/api/v1/flows/{id}")).json();
    assert_eq!(shown["tasks"][0]["status"], "succeeded", "{shown}");
    assert_eq!(shown["tasks"][2]["status"], "blocked", "{shown}");
    assert!(shown["tasks"][2]["wait"]["signal_received_at"].is_string());
    let task = api
        .get(&format!(
            "/api/v1/tasks/{}",
            shown["tasks"][0]["id"].as_str().unwrap()
        ))
        .json();
    assert_eq!(task["task"]["result"], json!({"ok": true}), "{task}");
    // A wait with a kind: refused, naming the task's field.
    let bad = r#"{"name": "x", "tasks": [{"name": "w", "kind": "echo", "wait": {"for": "1h"}}]}"#;
    api.w("POST", "/api/v1/flows", Some(bad))
        .error(422, Some("tasks[0].kind"));
    let bad = r#"{"name": "x", "tasks": [{"name": "w", "wait": {"for": 3600}}]}"#;
    api.w("POST", "/api/v1/flows", Some(bad))
        .error(400, Some("tasks[0].wait.for"));
    let bad = r#"{"name": "x", "tasks": [{"name": "w", "wait": {"for": "1h", "at": "x"}}]}"#;
    api.w("POST", "/api/v1/flows", Some(bad))
        .error(400, Some("tasks[0].wait.at"));
    let bad = r#"{"name": "x", "tasks": [{"name": "w", "wait": {"until": "soon"}}]}"#;
    let m = api
        .w("POST", "/api/v1/flows", Some(bad))
        .error(422, Some("tasks[0].wait"));
    assert!(m.contains("is not an RFC 3339 time"), "{m}");
}

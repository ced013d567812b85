//! `docs/openapi.json` held to the routes the servers register and answer: `artex serve`'s,
//! and the uploads every worker adds (they are on its disk).

use artex::http::api::{serve_routes, worker_routes, RouteList};
use serde_json::Value;

use crate::common::procs::{worker_http, Proc};
use crate::common::TestDb;
use crate::{call, declare, id_of, Server, WRITE_TOKEN};

/// A small upload's declaration.
const UPLOAD: &str = r#"{"size": 10, "task": {"kind": "echo"}}"#;

/// `docs/openapi.json` names every route the servers register, with its method; every
/// route it documents answers (no 404 for want of a route, no 405) with a status code
/// it documents for that route.
#[tokio::test]
async fn the_openapi_description_matches_the_routes_served() {
    let doc: Value = serde_json::from_str(artex::http::api::OPENAPI).expect("valid JSON");
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    let paths = doc["paths"].as_object().expect("paths");
    let (mut by_serve, mut by_worker) = (RouteList::default(), RouteList::default());
    serve_routes(&mut by_serve);
    worker_routes(&mut by_worker);
    let listed = |list: &RouteList| -> Vec<(String, String)> {
        list.0
            .iter()
            .map(|(method, path)| (method.as_str().to_ascii_lowercase(), path.to_string()))
            .collect()
    };
    let (by_serve, by_worker) = (listed(&by_serve), listed(&by_worker));
    let registered: Vec<&(String, String)> = by_serve.iter().chain(&by_worker).collect();
    for (method, path) in &registered {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is served but not in docs/openapi.json"
        );
    }

    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let task = id_of(&api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#)));
    let flow = id_of(&api.w(
        "POST",
        "/api/v1/flows",
        // Its wait takes the signal of `/signals/{name}` (a flow without it answers 404).
        Some(
            r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
                {"name": "w", "wait": {"signal": "nightly"}}]}"#,
        ),
    ));
    let schedule = r#"{"name": "nightly", "cron": "0 2 * * *", "kind": "echo"}"#;
    api.w("POST", "/api/v1/schedules", Some(schedule));
    // The uploads are a worker's: asked of one, with an upload of its own.
    let dir = tempfile::tempdir().expect("a folder");
    let token = dir.path().join("write-token");
    std::fs::write(&token, WRITE_TOKEN).expect("write token");
    let uploads = dir.path().join("uploads");
    let worker = Proc::worker(
        "openapi-worker",
        &db.url,
        &[
            "--write-token-file",
            token.to_str().unwrap(),
            "--upload-dir",
            uploads.to_str().unwrap(),
        ],
    );
    let worker_addr = worker_http(&db.client().await, &worker).await;
    let upload = id_of(&call(
        &worker_addr,
        "POST",
        "/api/v1/uploads",
        Some(WRITE_TOKEN),
        Some(UPLOAD.as_bytes()),
    ));

    let mut documented = 0;
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            let route = (method.clone(), path.clone());
            assert!(
                registered.contains(&&route),
                "{method} {path} is in docs/openapi.json but not served"
            );
            let (addr, id) = if by_worker.contains(&route) {
                (&worker_addr, &upload)
            } else if path.starts_with("/api/v1/flows/") {
                (&api.addr, &flow)
            } else {
                (&api.addr, &task)
            };
            if path.contains("{name}") {
                // Whatever an earlier call did to it (a DELETE), the schedule is there
                // (409 when it still is).
                api.w("POST", "/api/v1/schedules", Some(schedule));
            }
            let concrete = path
                .replace("{id}", id)
                .replace("{n}", "0")
                .replace("{name}", "nightly")
                .replace("{kind}", "echo");
            let body = match (method.as_str(), path.as_str()) {
                ("post", "/api/v1/tasks") => Some(r#"{"kind": "echo"}"#),
                ("post", "/api/v1/flows") => {
                    Some(r#"{"name": "g", "tasks": [{"name": "a", "kind": "echo"}]}"#)
                }
                ("post", "/api/v1/uploads") => Some(UPLOAD),
                ("put", "/api/v1/kinds/{kind}/retry") => {
                    Some(r#"{"backoff": "fixed", "base_ms": 100}"#)
                }
                ("post", "/api/v1/schedules") => {
                    Some(r#"{"name": "hourly", "cron": "@hourly", "kind": "echo"}"#)
                }
                _ => None,
            };
            let a = call(
                addr,
                &method.to_ascii_uppercase(),
                &concrete,
                Some(WRITE_TOKEN),
                body.map(str::as_bytes),
            );
            assert!(
                a.status != 404 && a.status != 405 && a.status != 0,
                "{method} {concrete}: {} {}",
                a.status,
                a.text()
            );
            assert!(
                operation["responses"].get(a.status.to_string()).is_some(),
                "{method} {concrete} answered {}, which docs/openapi.json does not list: {}",
                a.status,
                a.text()
            );
            documented += 1;
        }
    }
    assert_eq!(documented, registered.len());
    // An undocumented route is a JSON 404 that points at the description.
    let m = api.get("/api/v1/nothing").error(404, None);
    assert!(m.contains("openapi.json"), "{m}");
    // Served as documented.
    let served_doc = api.call("GET", "/api/v1/openapi.json", None, None);
    assert_eq!(served_doc.json(), doc);
}

/// A method the document does not list on a path it does is answered 405, with `Allow`
/// naming the ones it lists and the API's error body (they were 404s: found by
/// schemathesis, issue 25) — `GET /api/v1/tasks/bulk` too, which the route of one task
/// would otherwise take for an id.
#[tokio::test]
async fn an_undocumented_method_on_a_documented_path_is_405_naming_the_allowed_ones() {
    let doc: Value = serde_json::from_str(artex::http::api::OPENAPI).expect("valid JSON");
    let db = TestDb::new().await;
    let api = Server::start(&db.url);
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        if path.starts_with("/api/v1/uploads") {
            continue; // a worker's, on its own disk
        }
        let concrete = path
            .replace("{id}", "0192f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b")
            .replace("{kind}", "echo")
            .replace("{name}", "nightly");
        let mut documented: Vec<String> = ops
            .as_object()
            .expect("operations")
            .keys()
            .map(|m| m.to_ascii_uppercase())
            .collect();
        documented.sort();
        let a = api.w("TRACE", &concrete, None);
        assert_eq!(a.status, 405, "TRACE {path}: {}", a.text());
        let mut allowed: Vec<String> = a
            .header("allow")
            .unwrap_or_else(|| panic!("TRACE {path}: no Allow header"))
            .split(", ")
            .map(String::from)
            .collect();
        allowed.sort();
        assert_eq!(allowed, documented, "{path}");
        assert!(
            a.json()["error"]
                .as_str()
                .is_some_and(|e| e.contains("TRACE")),
            "{}",
            a.text()
        );
    }
    let a = api.w("GET", "/api/v1/tasks/bulk", None);
    assert_eq!(
        (a.status, a.header("allow")),
        (405, Some("POST")),
        "{}",
        a.text()
    );
}

/// The control routes' refusal of a reason (over 10,000 characters, or holding `\u0000`) is
/// a 422 the document lists for each of them (it did not: found by schemathesis).
#[tokio::test]
async fn a_refused_reason_is_a_422_the_document_lists_on_every_control_route() {
    let doc: Value = serde_json::from_str(artex::http::api::OPENAPI).expect("valid JSON");
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let task = id_of(&api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#)));
    let flow = id_of(&api.w(
        "POST",
        "/api/v1/flows",
        // Its wait takes the signal of `/signals/{name}` (a flow without it answers 404).
        Some(
            r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
                {"name": "w", "wait": {"signal": "nightly"}}]}"#,
        ),
    ));
    let schedule = r#"{"name": "nightly", "cron": "0 2 * * *", "kind": "echo"}"#;
    assert_eq!(
        api.w("POST", "/api/v1/schedules", Some(schedule)).status,
        201
    );
    let long = serde_json::json!({ "reason": "x".repeat(10_001) }).to_string();
    for (path, id) in [
        ("/api/v1/tasks/{id}/pause", task.as_str()),
        ("/api/v1/tasks/{id}/cancel", task.as_str()),
        ("/api/v1/flows/{id}/pause", flow.as_str()),
        ("/api/v1/schedules/{name}/pause", "nightly"),
    ] {
        let concrete = path.replace("{id}", id).replace("{name}", id);
        for body in [r#"{"reason": "a\u0000b"}"#, long.as_str()] {
            let a = api.w("POST", &concrete, Some(body));
            assert_eq!(
                (a.status, a.json()["field"].as_str()),
                (422, Some("reason")),
                "{path}: {}",
                a.text()
            );
        }
        assert!(
            doc["paths"][path]["post"]["responses"].get("422").is_some(),
            "{path}: 422 not in docs/openapi.json"
        );
    }
}

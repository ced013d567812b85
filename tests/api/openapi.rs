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
        Some(r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"}]}"#),
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

//! `docs/openapi.json` held to the routes the server registers and answers.

use artex::http::api::{serve_routes, RouteList};
use serde_json::Value;

use crate::common::TestDb;
use crate::{declare, id_of, Server};

/// `docs/openapi.json` names every route the server registers, with its method, and
/// every route it documents answers (no 404 for want of a route, no 405).
#[tokio::test]
async fn the_openapi_description_matches_the_routes_served() {
    let doc: Value = serde_json::from_str(artex::http::api::OPENAPI).expect("valid JSON");
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    let paths = doc["paths"].as_object().expect("paths");
    let mut served = RouteList::default();
    serve_routes(&mut served);
    let mut registered = Vec::new();
    for (method, path) in &served.0 {
        let m = method.as_str().to_ascii_lowercase();
        assert!(
            paths.get(*path).and_then(|p| p.get(&m)).is_some(),
            "{method} {path} is served but not in docs/openapi.json"
        );
        registered.push((m, path.to_string()));
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
    let mut documented = 0;
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            assert!(
                registered.contains(&(method.clone(), path.clone())),
                "{method} {path} is in docs/openapi.json but not served"
            );
            let id = if path.starts_with("/api/v1/flows/") {
                &flow
            } else {
                &task
            };
            let concrete = path.replace("{id}", id);
            let body = match (method.as_str(), path.as_str()) {
                ("post", "/api/v1/tasks") => Some(r#"{"kind": "echo"}"#),
                ("post", "/api/v1/flows") => {
                    Some(r#"{"name": "g", "tasks": [{"name": "a", "kind": "echo"}]}"#)
                }
                _ => None,
            };
            let a = api.w(&method.to_ascii_uppercase(), &concrete, body);
            assert!(
                a.status != 404 && a.status != 405 && a.status != 0,
                "{method} {concrete}: {} {}",
                a.status,
                a.text
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

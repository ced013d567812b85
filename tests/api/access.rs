//! Tokens and scopes: reads need the read scope, changes the write scope, and with no
//! token configured the API is closed unless reads are made public.

use crate::common::{TestDb, READ_TOKEN};
use crate::{declare, id_of, written, Server, WRITE_TOKEN};

#[tokio::test]
async fn reads_need_the_read_scope_and_changes_the_write_scope() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let task = r#"{"kind": "echo"}"#;
    let before = written(&c).await;
    for token in [None, Some("wrong"), Some(READ_TOKEN)] {
        let m = api
            .call("POST", "/api/v1/tasks", token, Some(task))
            .error(401, None);
        assert!(m.contains("write scope"), "{m}");
    }
    assert_eq!(written(&c).await, before, "a refused token wrote something");
    for path in [
        "/api/v1/tasks",
        "/api/v1/workers",
        "/api/v1/stats",
        "/api/v1/flows",
        "/api/v1/events/head",
        "/events",
    ] {
        api.call("GET", path, None, None).error(401, None);
        api.call("GET", path, Some("wrong"), None).error(401, None);
        assert_eq!(
            api.call("GET", path, Some(READ_TOKEN), None).status,
            200,
            "{path}"
        );
        assert_eq!(
            api.call("GET", path, Some(WRITE_TOKEN), None).status,
            200,
            "{path}"
        );
    }
    assert_eq!(api.call("GET", "/health", None, None).status, 200);
    let id = id_of(&api.w("POST", "/api/v1/tasks", Some(task)));
    api.call(
        "POST",
        &format!("/api/v1/tasks/{id}/cancel"),
        Some(READ_TOKEN),
        None,
    )
    .error(401, None);

    // No token configured: closed, saying how to open it.
    let closed = Server::with(&db.url, false, false, false, 1 << 20);
    let m = closed
        .call("GET", "/api/v1/tasks", Some(READ_TOKEN), None)
        .error(401, None);
    assert!(m.contains("--public-read"), "{m}");
    closed
        .call("POST", "/api/v1/tasks", Some(WRITE_TOKEN), Some(task))
        .error(401, None);
    // --public-read opens reads, never writes.
    let public = Server::with(&db.url, false, false, true, 1 << 20);
    assert_eq!(public.call("GET", "/api/v1/tasks", None, None).status, 200);
    public
        .call("POST", "/api/v1/tasks", None, Some(task))
        .error(401, None);
    assert_eq!(written(&c).await[0], before[0] + 1);
}

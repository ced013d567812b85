//! The API's answers where schemathesis found them off `docs/openapi.json` (issue 25), one
//! regression test per fix of the server: a request the document allows is not refused
//! for what the document does not say, nor answered 500; one it does not allow is refused
//! with the API's error body, not ignored.

use artex_testkit::http::Request;
use serde_json::json;

use crate::common::procs::{worker_http, Proc};
use crate::common::TestDb;
use crate::{call, declare, id_of, written, Server, WRITE_TOKEN};

/// A reason of 10,000 characters is taken however many bytes they make: the document's
/// `maxLength` counts characters (the server counted bytes: 5,000 `é` were refused).
#[tokio::test]
async fn a_reason_is_limited_in_characters_as_the_document_says() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let task = id_of(&api.w("POST", "/api/v1/tasks", Some(r#"{"kind": "echo"}"#)));
    let reason = |n: usize| json!({ "reason": "é".repeat(n) }).to_string();
    let pause = format!("/api/v1/tasks/{task}/pause");
    let a = api.w("POST", &pause, Some(&reason(10_000)));
    assert_eq!(a.status, 200, "{}", a.text());
    let m = api
        .w(
            "POST",
            &format!("/api/v1/tasks/{task}/resume"),
            Some(&reason(10_001)),
        )
        .error(422, Some("reason"));
    assert!(m.contains("10001 characters"), "{m}");
}

/// A filter holding `\u0000`, which no stored value can, matches no task (they were 500:
/// PostgreSQL refused the value); a bulk action with one changes nothing.
#[tokio::test]
async fn filters_holding_nul_match_no_task_instead_of_failing() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    api.w(
        "POST",
        "/api/v1/tasks",
        Some(r#"{"kind": "echo", "tags": ["a"], "payload": {"a": "b"}}"#),
    );
    assert_eq!(
        api.get("/api/v1/tasks?tag=a").json()["tasks"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    for query in [
        "worker=w%001",
        "tag=a%00",
        // {"a": "\u0000"}
        "where=%7B%22a%22%3A%22%5Cu0000%22%7D",
        "where=%7B%22%5Cu0000%22%3A1%7D",
    ] {
        let a = api.get(&format!("/api/v1/tasks?{query}"));
        assert_eq!(a.status, 200, "{query}: {}", a.text());
        assert_eq!(a.json(), json!({"tasks": [], "next": null}), "{query}");
    }
    let before = written(&db.client().await).await;
    for filter in [json!({"tag": "a\u{0}"}), json!({"where": {"a": "\u{0}"}})] {
        let body = json!({"action": "cancel", "filter": filter}).to_string();
        let a = api.w("POST", "/api/v1/tasks/bulk", Some(&body));
        assert_eq!(a.status, 200, "{body}: {}", a.text());
        assert_eq!(
            (a.json()["matched"].clone(), a.json()["changed"].clone()),
            (json!(0), json!(0)),
            "{body}"
        );
    }
    assert_eq!(written(&db.client().await).await, before);
}

/// A flow whose name or a task's name holds `\u0000` is refused (422) naming it, and
/// nothing is written (it was 500: PostgreSQL refused the insert).
#[tokio::test]
async fn a_flow_naming_with_nul_is_refused_not_a_server_error() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let api = Server::start(&db.url);
    let before = written(&db.client().await).await;
    for (flow, field) in [
        (
            json!({"name": "a\u{0}", "tasks": [{"name": "t", "kind": "echo"}]}),
            "name",
        ),
        (
            json!({"name": "f", "tasks": [{"name": "t\u{0}", "kind": "echo"}]}),
            "tasks[0]",
        ),
    ] {
        let m = api
            .w("POST", "/api/v1/flows", Some(&flow.to_string()))
            .error(422, Some(field));
        assert!(m.contains("\\u0000"), "{m}");
    }
    assert_eq!(written(&db.client().await).await, before);
}

/// A malformed `Artex-After-Lsn` is refused (400) with a replica or without one (it was
/// ignored without one); an empty one is as none.
#[tokio::test]
async fn a_malformed_artex_after_lsn_is_refused_without_a_replica_too() {
    let db = TestDb::new().await;
    let api = Server::start(&db.url);
    let read = |lsn: &str| {
        Request::new("GET", "/api/v1/tasks")
            .bearer(WRITE_TOKEN)
            .header("Artex-After-Lsn", lsn)
            .send(&api.addr)
            .expect("an answer")
    };
    read("TRUE").error(400, Some("Artex-After-Lsn"));
    assert_eq!(read("").status, 200);
    assert_eq!(read("0/16B3748").status, 200);
}

/// The feed's position is checked wherever it comes from: `after` even when
/// `Last-Event-ID` is given, a `Last-Event-ID` that is not text (it was taken for none),
/// and `after` twice or another parameter are the API's JSON 400 (actix answered them in
/// plain text).
#[tokio::test]
async fn the_feed_refuses_a_malformed_position_wherever_it_comes_from() {
    let db = TestDb::new().await;
    let api = Server::start(&db.url);
    let events = |query: &str, last: Option<&str>| {
        let mut r = Request::new("GET", &format!("/api/v1/events{query}")).bearer(WRITE_TOKEN);
        if let Some(l) = last {
            r = r.header("Last-Event-ID", l);
        }
        r.send(&api.addr).expect("an answer")
    };
    for (query, last) in [
        ("?after=x", Some("1-1")),
        ("", Some("\u{84}")),
        ("?after=1-1&after=1-2", None),
        ("?from=1-1", None),
        ("?after=", None),
    ] {
        let a = events(query, last);
        assert_eq!(a.status, 400, "{query} {last:?}: {}", a.text());
        a.error(400, None);
    }
    assert_eq!(events("?after=0-0", Some("")).status, 200);
    assert_eq!(events("", Some("1-1")).status, 200);
}

/// An upload's size in more chunks than allowed, and a task payload holding `\u0000`,
/// are refused as the rules they are (422, naming the field; they were 400, malformed,
/// for input the document allows).
#[tokio::test]
async fn an_upload_refused_by_a_rule_across_fields_is_422() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().expect("a folder");
    let token = dir.path().join("write-token");
    std::fs::write(&token, WRITE_TOKEN).expect("write token");
    let uploads = dir.path().join("uploads");
    let worker = Proc::worker(
        "contract-worker",
        &db.url,
        &[
            "--write-token-file",
            token.to_str().unwrap(),
            "--upload-dir",
            uploads.to_str().unwrap(),
        ],
    );
    let addr = worker_http(&db.client().await, &worker).await;
    for (declaration, field) in [
        (
            json!({"size": 1_u64 << 40, "chunk_size": 1024, "task": {"kind": "echo"}}),
            "size",
        ),
        (
            json!({"size": 10, "task": {"kind": "echo", "payload": {"a": "\u{0}"}}}),
            "task.payload",
        ),
    ] {
        let body = declaration.to_string();
        call(
            &addr,
            "POST",
            "/api/v1/uploads",
            Some(WRITE_TOKEN),
            Some(body.as_bytes()),
        )
        .error(422, Some(field));
    }
}

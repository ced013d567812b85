//! The API served by the real `artex serve` and `artex up` processes.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::procs::{serve_address, wait_for, worker_http, Proc};
use crate::common::{TestDb, READ_TOKEN};
use crate::{call, id_of, WRITE_TOKEN};

#[tokio::test]
async fn artex_serve_and_artex_up_serve_the_api() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let tokens = tempfile::tempdir().unwrap();
    let write = tokens.path().join("write");
    std::fs::write(&write, format!("{WRITE_TOKEN}\n")).unwrap();
    let write = write.to_str().unwrap();

    // `artex up` on the test database: planner, worker and the API on the worker port.
    let up = Proc::start(
        "up",
        &db.url,
        &["up", "--http", "127.0.0.1:0", "--write-token-file", write],
        &[],
    );
    let http = worker_http(&c, &up).await;
    let submitted = call(
        &http,
        "POST",
        "/api/v1/tasks",
        Some(WRITE_TOKEN),
        Some(br#"{"kind": "echo", "payload": {"hello": "api"}}"#),
    );
    assert_eq!(submitted.status, 201, "{}", submitted.text());
    let id = id_of(&submitted);
    let done = wait_for(
        "the echo task to succeed",
        Duration::from_secs(30),
        || async {
            let t = call(
                &http,
                "GET",
                &format!("/api/v1/tasks/{id}"),
                Some(READ_TOKEN),
                None,
            )
            .json();
            (t["task"]["status"] == "succeeded").then_some(t)
        },
    )
    .await;
    assert_eq!(done["task"]["result"], json!({"hello": "api"}));
    // The worker recorded which binary it runs.
    let sha = wait_for("the worker's sha256", Duration::from_secs(30), || async {
        let w = call(&http, "GET", "/api/v1/workers", Some(READ_TOKEN), None).json();
        w["workers"][0]["binary_sha256"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert_eq!(sha.len(), 64);

    // `artex serve`, stateless, beside it.
    let serve = Proc::start(
        "serve",
        &db.url,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--write-token-file",
            write,
        ],
        &[],
    );
    let addr = serve_address(&serve).await;
    let health = call(&addr, "GET", "/health", None, None);
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["ready"], true);
    // Which server the process writes to (from the probe's round trip each second): the
    // test cluster, through its Unix socket.
    let host = wait_for(
        "/health to name the database",
        Duration::from_secs(10),
        || {
            let addr = addr.clone();
            async move {
                let h = call(&addr, "GET", "/health", None, None).json();
                h["database_host"].as_str().map(str::to_string)
            }
        },
    )
    .await;
    assert!(host.starts_with("local:"), "database_host: {host}");
    let shown = call(
        &addr,
        "GET",
        &format!("/api/v1/tasks/{id}"),
        Some(READ_TOKEN),
        None,
    );
    assert_eq!(shown.json()["task"]["status"], "succeeded");
    let events = call(&addr, "GET", "/api/v1/events", Some(READ_TOKEN), None);
    assert_eq!(events.status, 200);
    assert!(events
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    // A plain `artex worker` does not serve the API unless asked (--api).
    let worker = Proc::worker("plain", &db.url, &[]);
    let plain = worker_http(&c, &worker).await;
    assert_eq!(
        call(&plain, "GET", "/api/v1/tasks", Some(READ_TOKEN), None).status,
        404
    );
    drop(worker);

    let mut serve = serve;
    serve.signal(Signal::SIGTERM);
    let status = serve
        .wait_exit(Duration::from_secs(20))
        .expect("artex serve stops on SIGTERM");
    assert!(status.success(), "{status:?}");
}

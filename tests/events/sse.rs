//! The feed over HTTP as Server-Sent Events, resumed after the Last-Event-ID it was
//! given.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use artex_actors::maintenance::Maintenance;
use artex_testkit::http::{Exchange, Request};
use chrono::Utc;
use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::common;
use crate::common::procs::{history_settled, wait_for, Proc};
use crate::common::TestDb;

/// A streaming GET: yields SSE events (id, data) as they arrive.
struct Sse {
    reader: Exchange,
    status: u16,
    body: String,
}

impl Sse {
    fn connect(addr: &str, path: &str, last_event_id: Option<&str>) -> Sse {
        let mut request = Request::get(path)
            .header("Accept", "text/event-stream")
            .bearer(common::READ_TOKEN);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let mut reader = request.start(addr).unwrap();
        let head = reader.head().unwrap();
        let mut body = String::new();
        if head.status != 200 {
            body = String::from_utf8_lossy(&reader.read_body().0).into_owned();
        } else {
            assert!(
                head.header("content-type")
                    .is_some_and(|t| t.to_ascii_lowercase().contains("text/event-stream")),
                "{head:?}"
            );
        }
        Sse {
            reader,
            status: head.status,
            body,
        }
    }

    /// The next task event: (id, data). Chunk-size lines and comments are skipped.
    fn next_event(&mut self) -> (String, Value) {
        let mut id = None;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .expect("reading the stream");
            assert!(n > 0, "the stream ended");
            let line = line.trim_end();
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                if let Some(id) = id.take() {
                    return (id, serde_json::from_str(v).unwrap());
                }
            }
        }
    }
}

#[tokio::test]
async fn server_sent_events_resume_after_last_event_id() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The worker serves the stream and runs none of its tasks (it claims what it runs
    // by itself: a claim between two submissions would slip its events in between).
    let mut w = Proc::worker("worker", &db.url, &["--kinds", "noop"]);
    let pid = w.pid();
    let http: String = wait_for("the worker to register", Duration::from_secs(30), || {
        let c = &c;
        async move {
            c.query_opt(
                "select http_addr from artex.workers where pid = $1",
                &[&pid],
            )
            .await
            .ok()
            .flatten()
            .map(|r| r.get(0))
        }
    })
    .await;
    let ids = db
        .bb
        .operator()
        .submit_many(
            &(0..5)
                .map(|i| NewTask::new("echo", json!({ "i": i })))
                .collect::<Vec<_>>(),
            "test",
        )
        .await
        .unwrap();
    let h = http.clone();
    let got = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, "/events", None);
        assert_eq!(sse.status, 200, "{}", sse.body);
        (0..5).map(|_| sse.next_event()).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let task_ids: Vec<String> = got
        .iter()
        .map(|(_, d)| d["task_id"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(task_ids, expected);
    assert!(got
        .iter()
        .all(|(id, d)| d["position"] == id.as_str() && d["to"] == "pending"));

    // Reconnecting with the third event's id: the fourth comes first, then live events.
    let third = got[2].0.clone();
    let h = http.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, "/events", Some(&third));
        assert_eq!(sse.status, 200, "{}", sse.body);
        (0..3).map(|_| sse.next_event()).collect::<Vec<_>>()
    });
    let live = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({ "live": true })), "test")
        .await
        .unwrap();
    let resumed = reader.await.unwrap();
    assert_eq!(resumed[0].0, got[3].0);
    assert_eq!(resumed[1].0, got[4].0);
    assert_eq!(resumed[2].1["task_id"], live.to_string());
    // `?after=` works the same for a first connection.
    let h = http.clone();
    let fifth = got[4].0.clone();
    let after = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, &format!("/events?after={fifth}"), None);
        sse.next_event()
    })
    .await
    .unwrap();
    assert_eq!(after.1["task_id"], live.to_string());

    // A malformed id is a bad request that says what was wrong.
    let h = http.clone();
    let bad = tokio::task::spawn_blocking(move || Sse::connect(&h, "/events", Some("nope")))
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("Last-Event-ID"), "{}", bad.body);
    // A position older than pruned events: 410 Gone rather than a silent gap. (The
    // clock moved past the retention: every partition of this history goes.)
    history_settled(&c).await;
    let later = Utc::now() + chrono::Duration::days(30);
    let report = Maintenance::run_once(&db.bb.maintenance(), Some(later))
        .await
        .unwrap();
    assert!(!report.partitions_dropped.is_empty());
    let h = http.clone();
    let gone = tokio::task::spawn_blocking(move || Sse::connect(&h, "/events", Some("1-1")))
        .await
        .unwrap();
    assert_eq!(gone.status, 410, "{}", gone.body);
    assert!(gone.body.contains("pruned"), "{}", gone.body);

    // Stopping the worker ends an open stream at once (its client reconnects to whoever
    // serves the port next) instead of holding the shutdown back.
    let mut sse = Sse::connect(&http, "/events", None);
    assert_eq!(sse.status, 200);
    w.signal(Signal::SIGTERM);
    let ended = tokio::task::spawn_blocking(move || loop {
        let mut line = String::new();
        match sse.reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line.contains("this process is stopping") => return true,
            Ok(_) => {}
        }
    })
    .await
    .unwrap();
    assert!(ended, "the stream should say it ends");
    let status = w
        .wait_exit(Duration::from_secs(8))
        .expect("the worker exits although a stream was open");
    assert!(status.success());
}

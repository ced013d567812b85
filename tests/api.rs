//! The HTTP API (`artex serve`, and `artex up` on its worker port): every route with good
//! and bad input, tokens and scopes, nothing written on a refusal, every listing on an
//! index (the plans are printed), and `docs/openapi.json` held to the routes served.
//!
//! Most tests run the server in-process (`runtime::run_api` on a listener bound here, on
//! a thread with its own actix system) and talk plain HTTP/1.1 to it; the last ones run
//! the real `artex serve` and `artex up` processes.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use artex::config::{AccessArgs, ServeArgs};
use artex::http::api::{serve_routes, RouteList};
use artex_actors::blackboard::{Registration, TaskFilter, TaskStatus};
use artex_actors::Blackboard;
use common::procs::{dechunk, wait_for, worker_http, Proc};
use common::{count, read_token_file, TestDb, READ_TOKEN};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio_postgres::Client;

const WRITE_TOKEN: &str = "test-write-token";

/// An `artex serve` running in this process; stopped (and waited for) when dropped.
struct Server {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _tokens: tempfile::TempDir,
}

impl Server {
    /// Serves `url` with the tests' read token and [`WRITE_TOKEN`].
    fn start(url: &str) -> Server {
        Server::with(url, true, true, false, 1 << 20)
    }

    fn with(url: &str, read: bool, write: bool, public_read: bool, max_body: u64) -> Server {
        let tokens = tempfile::tempdir().expect("token folder");
        let write_file = tokens.path().join("write");
        std::fs::write(&write_file, WRITE_TOKEN).expect("write token");
        let args = ServeArgs {
            http: "127.0.0.1:0".into(),
            access: AccessArgs {
                read_token_file: read.then(read_token_file),
                write_token_file: write.then_some(write_file),
                public_read,
                max_event_streams: 10,
            },
            max_body_bytes: max_body,
        };
        // Bound here: requests wait in the backlog until the server accepts them.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let url = url.to_string();
        let thread = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let bb = Blackboard::connect(&url, 4).expect("pool");
                artex::runtime::run_api(bb, &args, listener, async {
                    let _ = stopped.await;
                })
                .await
                .expect("the API server failed");
            })
        });
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
            _tokens: tokens,
        }
    }

    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Answer {
        call(&self.addr, method, path, token, body.map(str::as_bytes))
    }

    /// With the write token (which reads too).
    fn w(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        self.call(method, path, Some(WRITE_TOKEN), body)
    }

    fn get(&self, path: &str) -> Answer {
        self.call("GET", path, Some(READ_TOKEN), None)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An HTTP answer: status, content type and body (JSON parsed when it is JSON).
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text))
    }

    /// Asserts a JSON error with `status` naming `field`; returns the message.
    fn error(&self, status: u16, field: Option<&str>) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        assert!(
            self.content_type.starts_with("application/json"),
            "{self:?}"
        );
        let v = self.json();
        assert_eq!(v["field"].as_str(), field, "{}", self.text);
        v["error"].as_str().expect("an error message").to_string()
    }
}

/// One request on a fresh connection. An event stream's body is not read (it never
/// ends): only its status and headers are.
fn call(addr: &str, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let length = body
        .map(|b| {
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            )
        })
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}{length}\r\n"
    );
    s.write_all(head.as_bytes()).expect("send head");
    if let Some(b) = body {
        // The server may answer (413) and close before reading it all.
        let _ = s.write_all(b);
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if raw.is_empty() => panic!("{method} {path}: {e}"),
            Err(_) => break,
        }
        // The head says so (a body, such as the OpenAPI document, may name the type).
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, _)) = text.split_once("\r\n\r\n") {
            if head.to_ascii_lowercase().contains("text/event-stream") {
                break;
            }
        }
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    let text = if header("transfer-encoding").eq_ignore_ascii_case("chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Answer {
        status,
        content_type: header("content-type"),
        text,
    }
}

/// Registers a worker that declares `kinds` (so they are known kinds).
async fn declare(bb: &Blackboard, id: &str, kinds: &[&str]) {
    bb.register_worker(&Registration {
        id: id.into(),
        host: "test".into(),
        pid: 4242,
        version: "test".into(),
        http_addr: None,
        channel: format!("artex_w_{id}"),
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
        capacity: 10,
        session: None,
        lease_ms: None,
    })
    .await
    .expect("register a worker");
}

/// What the blackboard holds: tasks, flows, history rows, consumers' cursors.
async fn written(c: &Client) -> [i64; 4] {
    [
        count(c, "select count(*) from artex.tasks").await,
        count(c, "select count(*) from artex.flows").await,
        count(c, "select count(*) from artex.task_transitions").await,
        count(c, "select count(*) from artex.event_cursors").await,
    ]
}

fn id_of(a: &Answer) -> String {
    a.json()["id"].as_str().expect("an id").to_string()
}

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
    assert_eq!(one.status, 201, "{}", one.text);
    let id = id_of(&one);
    let t = db.bb.task(id.parse().unwrap()).await.expect("stored");
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
    assert_eq!(batch.status, 201, "{}", batch.text);
    let ids: Vec<String> = batch.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let later = db.bb.task(ids[1].parse().unwrap()).await.unwrap();
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
    assert_eq!(paused.status, 200, "{}", paused.text);
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
    assert_eq!(canceled.status, 200, "{}", canceled.text);
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
    assert_eq!(retried.status, 201, "{}", retried.text);
    assert_eq!(retried.json()["retry_of"], id.as_str());
    let copy = db.bb.task(id_of(&retried).parse().unwrap()).await.unwrap();
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
    let first = &db.bb.transitions(copy.id).await.unwrap()[0];
    assert_eq!(
        first.reason.as_deref(),
        Some(format!("retry of task {id}: try again").as_str())
    );
    // The original stays canceled: its history is not rewritten.
    let original = db.bb.task(id.parse().unwrap()).await.unwrap();
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
    post("42").error(400, None);
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
    assert_eq!(a.status, 201, "{}", a.text);
    assert_eq!(written(&c).await[0], before[0] + 2);
}

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
    assert_eq!(created.status, 201, "{}", created.text);
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
    assert_eq!(paused.status, 200, "{}", paused.text);
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
    assert_eq!(allowed.status, 201, "{}", allowed.text);
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
        assert_eq!(created.status, 201, "{}", created.text);
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

#[tokio::test]
async fn workers_and_statistics_are_read_from_the_blackboard() {
    let db = TestDb::new().await;
    let c = db.client().await;
    declare(&db.bb, "w1", &["echo"]).await;
    declare(&db.bb, "w2", &["resize"]).await;
    let sha = "ab".repeat(32);
    db.bb.set_worker_binary("w2", &sha).await.expect("digest");
    let api = Server::start(&db.url);
    let workers = api.get("/api/v1/workers").json();
    let w2 = &workers["workers"][1];
    assert_eq!(w2["id"], "w2");
    assert_eq!(w2["binary_sha256"], sha.as_str());
    assert_eq!(
        (
            w2["pid"].as_i64(),
            w2["capacity"].as_i64(),
            w2["held"].as_i64()
        ),
        (Some(4242), Some(10), Some(0))
    );
    assert_eq!(w2["state"], "online");
    assert!(workers["workers"][0]["binary_sha256"].is_null());
    assert!(w2["last_seen"].is_string() && w2["version"] == "test");
    let one = api.get("/api/v1/workers?limit=1").json();
    assert_eq!(one["workers"].as_array().unwrap().len(), 1);
    assert_eq!(one["more"], true);
    api.get("/api/v1/workers?limit=0").error(400, Some("limit"));

    // Four tasks: three canceled (finished now), one pending. Started 250 ms after they
    // were created, for the latency.
    let ids = api.w(
        "POST",
        "/api/v1/tasks",
        Some(r#"[{"kind": "echo"}, {"kind": "echo"}, {"kind": "resize"}, {"kind": "echo"}]"#),
    );
    let ids = ids.json()["ids"].clone();
    for id in ids.as_array().unwrap().iter().take(3) {
        let id = id.as_str().unwrap();
        assert_eq!(
            api.w("POST", &format!("/api/v1/tasks/{id}/cancel"), None)
                .status,
            200
        );
    }
    c.execute(
        "update artex.tasks set started_at = created_at + interval '250 milliseconds'
         where status = 'canceled'",
        &[],
    )
    .await
    .unwrap();
    let stats = api.get("/api/v1/stats?window_minutes=5").json();
    assert_eq!(stats["by_status"]["canceled"], 3, "{stats}");
    assert_eq!(stats["by_status"]["pending"], 1);
    assert_eq!(stats["by_status"]["succeeded"], 0);
    assert_eq!(stats["capped"], json!([]));
    let recent = &stats["recent"];
    assert_eq!(recent["finished"], 3);
    assert_eq!(recent["sampled"], false);
    assert_eq!(
        recent["by_kind"],
        json!({"echo": {"canceled": 2}, "resize": {"canceled": 1}})
    );
    assert_eq!(recent["queue_ms"]["tasks"], 3);
    let p50 = recent["queue_ms"]["p50"].as_f64().unwrap();
    assert!((p50 - 250.0).abs() < 1.0, "{p50}");
    let minutes = recent["per_minute"].as_array().unwrap();
    assert!((5..=6).contains(&minutes.len()), "{minutes:?}");
    let finished: i64 = minutes
        .iter()
        .map(|m| m["finished"].as_i64().unwrap())
        .sum();
    assert_eq!(finished, 3);
    let per_minute = recent["throughput_per_minute"].as_f64().unwrap();
    assert!(
        (per_minute - 0.6).abs() < 0.01,
        "3 tasks over 5 minutes: {per_minute}"
    );
    for bad in ["window_minutes=0", "window_minutes=61", "window=5"] {
        let field = bad.split('=').next().unwrap();
        api.get(&format!("/api/v1/stats?{bad}"))
            .error(400, Some(field));
    }
}

/// Every listing the API makes, planned by PostgreSQL on a table large enough that a
/// scan of all of it would be chosen if no index served: none is a sequential scan.
#[tokio::test]
async fn every_list_query_walks_an_index() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.flows (id, name)
             select ('00000000-0000-7000-8000-' || lpad(to_hex(f), 12, '0'))::uuid, 'f' || f
             from generate_series(1, 100) f;
         insert into artex.tasks (id, kind, status, flow_id, flow_task)
             select ('00000000-0000-7000-9000-' || lpad(to_hex(i), 12, '0'))::uuid,
                    'k' || (i % 20),
                    case when i % 10 = 0 then 'paused' else 'pending' end::artex.task_status,
                    case when i % 50 = 0
                         then ('00000000-0000-7000-8000-'
                               || lpad(to_hex(1 + i % 100), 12, '0'))::uuid end,
                    case when i % 50 = 0 then 't' || i end
             from generate_series(1, 100000) i;
         update artex.tasks set status = 'canceled' where status = 'paused' and kind = 'k0';
         insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
             select 'w' || i, 'h', 1, 'v', 'c' || i, '{}', 1 from generate_series(1, 20000) i;
         analyze artex.tasks; analyze artex.workers; analyze artex.task_transitions;",
    )
    .await
    .expect("filling the tables");
    let flow: uuid::Uuid = "00000000-0000-7000-8000-000000000033".parse().unwrap();
    let after: uuid::Uuid = "00000000-0000-7000-9000-000000001000".parse().unwrap();
    let mut filters = Vec::new();
    for status in [None, Some(TaskStatus::Pending), Some(TaskStatus::Canceled)] {
        for kind in [None, Some("k7".to_string())] {
            for flow in [None, Some(flow)] {
                for worker in [None, Some("w1".to_string())] {
                    for after in [None, Some(after)] {
                        filters.push(TaskFilter {
                            status,
                            kind: kind.clone(),
                            flow,
                            worker: worker.clone(),
                            after,
                            limit: 50,
                        });
                    }
                }
            }
        }
    }
    let mut plans = Vec::new();
    for f in &filters {
        let plan = db.bb.explain_tasks_page(f).await.expect("explain");
        plans.push((format!("tasks page {f:?}"), plan));
    }
    for (name, plan) in db.bb.explain_overview().await.expect("explain") {
        plans.push((name.to_string(), plan));
    }
    let mut scans = Vec::new();
    for (name, plan) in &plans {
        let text = plan.join("\n");
        // Printed for `scripts/test.sh -E 'binary(api)' --no-capture`, and on failure.
        println!("---- {name}\n{text}");
        // An empty history partition (made ahead, or left by an upgrade) is scanned, not
        // probed: nothing to read either way.
        let empty_partition = |l: &str| {
            l.contains("Seq Scan on task_transitions_")
                && l.split("..")
                    .nth(1)
                    .and_then(|c| c.split_whitespace().next())
                    .and_then(|c| c.parse::<f64>().ok())
                    .is_some_and(|cost| cost < 1.0)
        };
        let seq = plan
            .iter()
            .any(|l| l.contains("Seq Scan") && !empty_partition(l));
        if seq || !text.contains("Index") {
            scans.push(format!("{name}:\n{text}"));
        }
        // Counting a rare status walks that status's entries, not the whole table (a
        // common one may walk the primary key: it reaches the cap after a few more).
        // (`assigned` and `running` have partial indexes of their own.)
        if name == "stats: by status" {
            for rare in ["succeeded", "failed", "timeout", "blocked"] {
                let walk = format!("Index Cond: (status = '{rare}'::artex.task_status)");
                assert!(text.contains(&walk), "{rare}: {text}");
            }
            assert!(text.matches("tasks_pkey").count() <= 1, "{text}");
        }
    }
    assert!(
        scans.is_empty(),
        "listings not on an index:\n{}",
        scans.join("\n\n")
    );
    assert!(plans.len() > 48, "{}", plans.len());
}

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

/// Waits for `artex serve`'s line naming its address; returns `host:port`.
async fn serve_address(p: &Proc) -> String {
    wait_for(
        "artex serve to say where it listens",
        Duration::from_secs(30),
        || async {
            p.log_text().lines().find_map(|l| {
                let rest = l.split("the HTTP API on http://").nth(1)?;
                rest.split('/').next().map(str::to_string)
            })
        },
    )
    .await
}

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
    assert_eq!(submitted.status, 201, "{}", submitted.text);
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
    assert_eq!(health.status, 200, "{}", health.text);
    assert_eq!(health.json()["ready"], true);
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
    assert!(events.content_type.starts_with("text/event-stream"));
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

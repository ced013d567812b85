//! The HTTP API (`artex serve`, and `artex up` on its worker port): every route with good
//! and bad input, tokens and scopes, nothing written on a refusal, every listing on an
//! index (the plans are printed), and `docs/openapi.json` held to the routes served.
//!
//! Most tests run the server in-process (`runtime::run_api` on a listener bound here, on
//! a thread with its own actix system) and talk plain HTTP/1.1 to it; those in
//! `processes` run the real `artex serve` and `artex up`.
//!
//! # Layout
//! - `tasks`: tasks submitted, listed, shown, controlled and retried; bad input refused.
//! - `submit_fuzz`: random and mutated submissions of tasks and flows: written, or a 4xx
//!   naming the field with nothing written; never a 5xx.
//! - `flows`: flows submitted with their DAG, shown, controlled and listed.
//! - `schedules`: cron schedules added, listed, paused, resumed, removed; bad ones refused.
//! - `access`: the read and write scopes and their tokens.
//! - `contract`: answers held to `docs/openapi.json` where schemathesis found them off.
//! - `kinds`: kinds and their retry policies.
//! - `overview`: workers and statistics.
//! - `indexes`: every listing's plan walks an index.
//! - `openapi`: the description matches the routes served.
//! - `processes`: the API served by `artex serve` and `artex up`.
//! - `schemathesis`: an off-the-shelf tester holds the API to `docs/openapi.json`.

#[path = "../common/mod.rs"]
mod common;

mod access;
mod contract;
mod flows;
mod indexes;
mod kinds;
mod openapi;
mod overview;
mod processes;
mod schedules;
mod schemathesis;
mod search;
mod submit_fuzz;
mod tasks;
mod tokens;

use std::net::TcpListener;

use artex::config::{AccessArgs, ServeArgs};
use artex_actors::blackboard::Registration;
use artex_actors::Blackboard;
use artex_testkit::http::{Request, Response};
use common::fixtures;
use common::{count, read_token_file, READ_TOKEN};
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
            // Each scrape reads the fleet anew: the tests check /metrics right after a change.
            metrics_every: std::time::Duration::ZERO,
        };
        // Bound here: requests wait in the backlog until the server accepts them.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let url = url.to_string();
        let thread = std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let bb = Blackboard::connect(&url, 4).expect("pool");
                artex::runtime::run_api(bb, None, &args, listener, async {
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

    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Response {
        call(&self.addr, method, path, token, body.map(str::as_bytes))
    }

    /// With the write token (which reads too).
    fn w(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.call(method, path, Some(WRITE_TOKEN), body)
    }

    fn get(&self, path: &str) -> Response {
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

/// One request on a fresh connection, with `token` as the bearer token and `body` as
/// JSON. An event stream's body is not read (it never ends): only its status and headers
/// are.
fn call(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> Response {
    let mut request = Request::new(method, path).bearer(token);
    if let Some(b) = body {
        request = request.header("Content-Type", "application/json").body(b);
    }
    request
        .send(addr)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Registers a worker that declares `kinds` (so they are known kinds), pid 4242.
async fn declare(bb: &Blackboard, id: &str, kinds: &[&str]) {
    let r = fixtures::registration(id, kinds, 10);
    fixtures::register(bb, &Registration { pid: 4242, ..r }).await;
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

fn id_of(a: &Response) -> String {
    a.json()["id"].as_str().expect("an id").to_string()
}

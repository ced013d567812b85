//! The web dashboard in a real headless Chromium (Debian's `chromium` driven through
//! `chromedriver`): live counts, an operator action with its confirmation and the
//! token asked for in the page (whose it is shown, what its scope cannot do hidden), a
//! schedule listed and paused with its button, a
//! flow's graph, a hot upgrade on the workers page,
//! and a browser upload (with the page's SHA-256 checked against known vectors), then one
//! cut off midway and resumed from a new page, and one resumed from a file that changed
//! (refused whole, then sent anew). Every test ends by asserting that the page
//! logged no error, and the page is never reloaded (but for that resume, whose point is
//! a closed tab): what changes, changes live. Without a browser: the page and its assets
//! are served under a strict Content-Security-Policy, and cached by their digest.
//!
//! # Layout
//! - this file: the harness (a cluster, `serve`, calls), the page and its live pages.
//! - `uploads`: the upload page: chunks, interrupted and resumed uploads, changed files.
//! - `no_placeholders`: every page, with tasks in every status, a flow, a schedule and an
//!   upload, shows no `null`, `undefined`, `NaN` or `[object Object]`.
//! - `waits`: a flow's waits on its page, and a signal sent from its form.

#[path = "../common/browser.rs"]
mod browser;
#[path = "../common/mod.rs"]
mod common;

mod no_placeholders;
mod uploads;
mod waits;

use std::path::Path;
use std::time::Duration;

use artex_testkit::http::{Request, Response};
use browser::Browser;
use common::bundles::{Keys, TOKEN as UPGRADE_TOKEN};
use common::procs::{serve_address, worker_http, worker_id, Proc};
use common::{count, TestDb, READ_TOKEN};
use serde_json::{json, Value};

const WRITE_TOKEN: &str = "dashboard-write-token";

/// A token file holding [`WRITE_TOKEN`].
fn write_token_file(dir: &Path) -> String {
    let f = dir.join("write-token");
    std::fs::write(&f, WRITE_TOKEN).expect("write token file");
    f.to_string_lossy().into_owned()
}

/// `method path` to `addr` with the write token and `body` as JSON, answered within two
/// minutes; (HTTP code, JSON body, else its text). The code is 0 when no answer came.
fn call(method: &str, addr: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = Request::new(method, path)
        .bearer(WRITE_TOKEN)
        .timeout(Duration::from_secs(120));
    if let Some(b) = &body {
        request = request.json(b);
    }
    match request.send(addr) {
        Ok(r) => {
            let body = serde_json::from_slice(&r.body).unwrap_or(Value::String(r.text()));
            (r.status, body)
        }
        Err(e) => (0, Value::String(e.to_string())),
    }
}

/// `GET http://{addr}{path}` with `extra` request headers, no token.
fn get(addr: &str, path: &str, extra: &[(&str, &str)]) -> Response {
    let mut request = Request::get(path).timeout(Duration::from_secs(120));
    for (k, v) in extra {
        request = request.header(k, v);
    }
    request
        .send(addr)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `artex serve` with public reads and the write token in `dir`: the page needs no token
/// to look, and asks for the write token when the operator acts. Its process and
/// address.
async fn public_serve(db: &TestDb, dir: &Path) -> (Proc, String) {
    let token = write_token_file(dir);
    let serve = Proc::start(
        "serve",
        &db.url,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--public-read",
            "--write-token-file",
            &token,
        ],
        &[],
    );
    let addr = serve_address(&serve).await;
    (serve, addr)
}

fn created(r: (u16, Value)) -> Value {
    assert_eq!(r.0, 201, "{}", r.1);
    r.1
}

/// A worker serving the API (and so the dashboard) on its port, and a planner.
struct Cluster {
    _planner: Proc,
    worker: Proc,
    addr: String,
    /// The worker's flags, to start it again alike.
    args: Vec<String>,
    /// The write token's file and the upload folder (`uploads`).
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(db: &TestDb, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let token = write_token_file(dir.path());
        let uploads = dir.path().join("uploads").to_string_lossy().into_owned();
        let mut args = vec![
            "--api",
            "--write-token-file",
            &token,
            "--upload-dir",
            &uploads,
        ];
        args.extend_from_slice(extra);
        let planner = Proc::planner("planner", &db.url, &[]);
        let worker = Proc::worker("worker", &db.url, &args);
        let c = db.client().await;
        let addr = worker_http(&c, &worker).await;
        Cluster {
            _planner: planner,
            worker,
            addr,
            args: args.iter().map(|a| a.to_string()).collect(),
            dir,
        }
    }

    /// Kills the worker (SIGKILL: nothing it held in memory survives) and starts another
    /// alike, on the same address and upload folder, as a supervisor would.
    async fn restart_worker(&mut self, db: &TestDb) {
        self.worker.signal(nix::sys::signal::Signal::SIGKILL);
        self.worker
            .wait_exit(Duration::from_secs(10))
            .expect("the worker killed");
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend(["--http", &self.addr]);
        let worker = Proc::worker("worker-2", &db.url, &args);
        let addr = worker_http(&db.client().await, &worker).await;
        assert_eq!(
            addr, self.addr,
            "the new worker listens where the old one did"
        );
        self.worker = worker;
    }
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_under_a_strict_policy_and_cached_by_digest() {
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let addr = &cluster.addr;
    // Open: the page holds no data, and asks for a token itself.
    let page = get(addr, "/", &[]);
    assert_eq!(page.status, 200, "{page:?}");
    let page = page.text();
    let strict = |h: &Response| {
        h.header("content-security-policy").is_some_and(|p| {
            p.contains("default-src 'none'")
                && p.contains("script-src 'self'")
                && p.contains("frame-ancestors 'none'")
        }) && h.header("x-content-type-options") == Some("nosniff")
    };
    let h = get(addr, "/", &[]);
    assert_eq!(h.status, 200, "{h:?}");
    assert!(strict(&h), "{h:?}");
    assert_eq!(h.header("cache-control"), Some("no-cache"), "{h:?}");
    let etag = h.header("etag").expect("the page's ETag");
    let h = get(addr, "/", &[("If-None-Match", etag)]);
    assert_eq!(h.status, 304, "{h:?}");

    // An asset by the URL the page names (its digest): kept for good; by any other URL,
    // checked again every time.
    let versioned = page
        .split('"')
        .find(|s| s.starts_with("/ui/core.js?v="))
        .unwrap_or_else(|| panic!("core.js named by its digest: {page}"));
    let h = get(addr, versioned, &[]);
    assert_eq!(h.status, 200, "{h:?}");
    assert!(strict(&h), "{h:?}");
    assert!(
        h.header("cache-control")
            .is_some_and(|c| c.contains("immutable")),
        "{h:?}"
    );
    assert!(
        h.header("content-type")
            .is_some_and(|t| t.starts_with("text/javascript")),
        "{h:?}"
    );
    for other in ["/ui/core.js", "/ui/core.js?v=0123456789abcdef"] {
        let h = get(addr, other, &[]);
        assert_eq!(h.status, 200, "{other}: {h:?}");
        assert_eq!(
            h.header("cache-control"),
            Some("no-cache"),
            "{other}: {h:?}"
        );
    }
    let h = get(addr, "/ui/nothing.js", &[]);
    assert_eq!(h.status, 404, "{h:?}");
    assert!(strict(&h), "{h:?}");
}

/// The number the overview shows for `status`.
fn count_of(status: &str) -> String {
    format!("const n = document.querySelector('[data-count={status}] .n'); return n ? n.textContent : null")
}

#[tokio::test]
async fn the_overview_counts_follow_tasks_submitted_through_the_api() {
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let b = Browser::start().await;
    // A fresh tab has no token: the page asks for the read token.
    b.goto(&format!("http://{}/", cluster.addr)).await;
    b.give_token(READ_TOKEN).await;
    b.until("the counts", &count_of("pending")).await;
    assert_eq!(b.eval(&count_of("pending")).await, json!("0"));
    b.mark_page().await;

    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    created(call(
        "POST",
        &cluster.addr,
        "/api/v1/tasks",
        Some(json!([
            {"kind": "echo", "run_at": later},
            {"kind": "echo", "run_at": later},
            {"kind": "echo", "run_at": later},
        ])),
    ));
    for i in 0..2 {
        created(call(
            "POST",
            &cluster.addr,
            "/api/v1/tasks",
            Some(json!({"kind": "echo", "payload": {"n": i}})),
        ));
    }
    b.until(
        "3 pending and 2 succeeded",
        &format!(
            "const p = (() => {{ {} }})(), s = (() => {{ {} }})(); return p === '3' && s === '2'",
            count_of("pending"),
            count_of("succeeded")
        ),
    )
    .await;
    b.until(
        "echo in the by-kind table",
        "return !!document.querySelector('[data-kind=echo]')",
    )
    .await;
    b.finish_on_the_marked_page().await;

    // The reads the overview makes: a sample as small as asked, the backlog of due tasks
    // only (the three pending ones are due in an hour), the feed's head.
    let (code, s) = call("GET", &cluster.addr, "/api/v1/stats?sample=1", None);
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["recent"]["finished"], json!(1), "{s}");
    assert_eq!(s["recent"]["sampled"], json!(true), "{s}");
    assert!(s["backlog"]["oldest_due_at"].is_null(), "{s}");
    assert_eq!(
        call("GET", &cluster.addr, "/api/v1/stats?sample=0", None).0,
        400
    );
    created(call(
        "POST",
        &cluster.addr,
        "/api/v1/tasks",
        Some(json!({"kind": "nobody-runs-this", "allow_unregistered_kind": true})),
    ));
    let (_, s) = call("GET", &cluster.addr, "/api/v1/stats", None);
    assert!(s["backlog"]["oldest_due_at"].is_string(), "{s}");
    assert!(
        s["backlog"]["age_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{s}"
    );
    let (code, head) = call("GET", &cluster.addr, "/api/v1/events/head", None);
    assert_eq!(code, 200, "{head}");
    let after = head["after"].as_str().unwrap_or_default();
    assert!(
        after.split_once('-').is_some_and(|(x, i)| x.parse::<u64>().is_ok() && i.parse::<i64>().is_ok_and(|i| i > 0)),
        "{head}"
    );
}

#[tokio::test]
async fn a_paused_task_is_resumed_with_its_button_and_runs_to_success_live() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (_serve, addr) = public_serve(&db, dir.path()).await;
    let _planner = Proc::planner("planner", &db.url, &[]);
    let id = created(call(
        "POST",
        &addr,
        "/api/v1/tasks?allow_unregistered_kind=true",
        Some(json!({"kind": "sleep", "payload": {"ms": 2500}})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, body) = call("POST", &addr, &format!("/api/v1/tasks/{id}/pause"), None);
    assert_eq!(code, 200, "{body}");

    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/tasks/{id}")).await;
    b.until(
        "the task shown paused",
        "return !!document.querySelector('#task-status [data-status=paused]')",
    )
    .await;
    b.mark_page().await;
    // Every status the page shows from now on, in order.
    b.eval(
        "window.__seen = [];
         const look = () => { const s = document.querySelector('#task-status [data-status]');
           if (s && __seen[__seen.length - 1] !== s.dataset.status) __seen.push(s.dataset.status); };
         new MutationObserver(look).observe(document.getElementById('main'), {childList: true, subtree: true});
         look(); return null",
    )
    .await;
    // A worker that runs it, only now: nothing ran the task while it was paused.
    let worker = Proc::worker("worker", &db.url, &[]);
    worker_id(&db.client().await, &worker).await;

    b.click("button[data-action=resume]").await;
    b.confirm().await;
    // Reads are public, so the page has no token yet: it asks for the write token.
    b.give_token(WRITE_TOKEN).await;
    b.until(
        "the task shown succeeded",
        "return !!document.querySelector('#task-status [data-status=succeeded]')",
    )
    .await;
    let seen = b.eval("return __seen").await;
    let seen: Vec<&str> = seen
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let running = seen.iter().position(|s| *s == "running");
    let succeeded = seen.iter().position(|s| *s == "succeeded");
    assert!(
        matches!((running, succeeded), (Some(r), Some(s)) if r < s),
        "the page showed {seen:?}"
    );
    b.until(
        "the timeline to show the run",
        "return ['paused', 'pending', 'running', 'succeeded'].every(s => document.querySelector('#timeline [data-to=' + s + ']'))",
    )
    .await;
    b.finish_on_the_marked_page().await;
}

#[tokio::test]
async fn a_running_task_s_progress_shows_as_a_bar_on_its_page_and_in_the_list_live() {
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    // Five steps, two seconds apart: the bars move while the page is open.
    let id = created(call(
        "POST",
        &cluster.addr,
        "/api/v1/tasks",
        Some(json!({"kind": "progress", "payload": {"steps": 5, "ms": 20000}})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Browser::start().await;
    b.open_with_token(&cluster.addr, &format!("#/tasks/{id}"), READ_TOKEN)
        .await;
    b.until(
        "the task shown running with a first value",
        "const p = document.querySelector('#task-progress progress');
         return !!document.querySelector('#task-status [data-status=running]') && p && p.value > 0",
    )
    .await;
    b.mark_page().await;
    // Every value the bar shows from now on: it moves by `event: progress`, which
    // changes only the bar (a task event reads the whole task again).
    b.eval(
        "window.__values = [];
         const look = () => { const p = document.querySelector('#task-progress progress');
           if (p && __values[__values.length - 1] !== p.value) __values.push(p.value); };
         new MutationObserver(look).observe(document.getElementById('main'), {childList: true, subtree: true});
         look(); return null",
    )
    .await;
    let text = b
        .until(
            "the bar to move on while the task runs",
            "return __values.length >= 2 && !!document.querySelector('#task-status [data-status=running]')
               && document.getElementById('task-progress').innerText",
        )
        .await;
    let text = text.as_str().unwrap();
    assert!(
        text.contains('%') && text.contains("step ") && text.contains(" of 5"),
        "{text}"
    );
    let values = b.eval("return __values").await;
    let values: Vec<f64> = values
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    b.finish_on_the_marked_page().await;

    // The list: a small bar in the task's row.
    let b = Browser::start().await;
    b.open_with_token(&cluster.addr, "#/tasks", READ_TOKEN)
        .await;
    let shown = b
        .until(
            "a small bar in the task's row",
            &format!(
                "const p = document.querySelector('#task-rows tr[data-task=\"{id}\"] .progress.small progress');
                 return p && p.value > 0 && p.value"
            ),
        )
        .await;
    assert!(
        shown.as_f64().is_some_and(|v| v > 0.0 && v <= 1.0),
        "{shown}"
    );
    b.close().await;
}

#[tokio::test]
async fn the_overview_lists_the_kinds_with_their_retry_policies() {
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let (code, body) = call(
        "PUT",
        &cluster.addr,
        "/api/v1/kinds/fail/retry",
        Some(json!({"backoff": "fixed", "base_ms": 200, "max_attempts": 4})),
    );
    assert_eq!(code, 200, "{body}");
    let b = Browser::start().await;
    b.open_with_token(&cluster.addr, "#/", READ_TOKEN).await;
    let shown = b
        .until(
            "the kinds with their policies",
            "const f = document.querySelector('#kinds tr[data-kind=fail] td.retry');
             const e = document.querySelector('#kinds tr[data-kind=echo] td.retry');
             return f && e && [f.dataset.backoff, f.innerText, e.dataset.backoff]",
        )
        .await;
    assert_eq!(
        shown,
        json!(["fixed", "fixed 200 ms, 4 attempts", "default"]),
        "{shown}"
    );
    b.assert_no_errors().await;
    b.close().await;
}

#[tokio::test]
async fn the_schedules_page_shows_a_schedules_slots_and_pauses_it_with_its_button() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (_serve, addr) = public_serve(&db, dir.path()).await;
    let added = created(call(
        "POST",
        &addr,
        "/api/v1/schedules",
        Some(
            json!({"name": "nightly-report", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
                    "kind": "report", "allow_unregistered_kind": true}),
        ),
    ));
    let next = added["next_slot"]
        .as_str()
        .expect("a next slot")
        .to_string();

    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/schedules")).await;
    b.until(
        "the schedule listed with its next slot",
        &format!(
            "const r = document.querySelector('#schedule-rows [data-schedule=\"nightly-report\"]');
             return !!r && r.querySelector('[data-col=next]').title === {next:?}
               && r.textContent.includes('0 2 * * *') && r.textContent.includes('Europe/Berlin')"
        ),
    )
    .await;
    b.mark_page().await;
    b.click("[data-schedule=\"nightly-report\"] button[data-action=pause]")
        .await;
    b.confirm().await;
    b.give_token(WRITE_TOKEN).await;
    b.until(
        "the schedule shown paused",
        "const r = document.querySelector('[data-schedule=\"nightly-report\"]');
         return !!r && r.dataset.paused === 'true'
           && !!r.querySelector('[data-col=next] [data-status=paused]')
           && !!r.querySelector('button[data-action=resume]')",
    )
    .await;
    let paused: bool = db
        .client()
        .await
        .query_one(
            "select paused from artex.schedules where name = 'nightly-report'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(paused, "the page's button paused the schedule");
    b.finish_on_the_marked_page().await;
}

#[tokio::test]
async fn a_flows_graph_shows_its_nodes_edges_and_their_states() {
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let flow = created(call(
        "POST",
        &cluster.addr,
        "/api/v1/flows",
        Some(json!({"name": "diamond", "tasks": [
            {"name": "a", "kind": "echo"},
            {"name": "b", "kind": "fail", "depends_on": ["a"], "max_retries": 0},
            {"name": "c", "kind": "sleep", "payload": {"ms": 300}, "depends_on": ["a"]},
            {"name": "d", "kind": "echo", "depends_on": ["b", "c"]},
        ]})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Browser::start().await;
    b.open_with_token(&cluster.addr, "#/flows", READ_TOKEN)
        .await;
    b.until(
        "the flow listed",
        &format!("return !!document.querySelector('[data-flow=\"{flow}\"]')"),
    )
    .await;
    b.click(&format!("[data-flow=\"{flow}\"] a")).await;
    b.mark_page().await;
    let states = b
        .until(
            "every node in its final state",
            "const s = {}; for (const g of document.querySelectorAll('#dag [data-node]')) s[g.dataset.node] = g.dataset.status;
             return s.a === 'succeeded' && s.b === 'failed' && s.c === 'succeeded' && s.d === 'canceled' ? s : null",
        )
        .await;
    assert_eq!(states.as_object().unwrap().len(), 4, "{states}");
    let mut edges: Vec<String> = b
        .eval("return [...document.querySelectorAll('#dag .edge')].map(e => e.dataset.from + '>' + e.dataset.to)")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    edges.sort();
    assert_eq!(edges, ["a>b", "a>c", "b>d", "c>d"]);
    b.finish_on_the_marked_page().await;
}

/// Kills the processes of later generations (not the test's children) at the end.
struct Generations(Vec<i32>);

impl Drop for Generations {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn a_hot_upgrade_shows_on_the_workers_page_as_a_new_generation() {
    let db = TestDb::new().await;
    let keys = Keys::new();
    let flags = keys.flags("upgrades");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::start(&db, &flags).await;
    let old = cluster.worker.pid();
    let (bundle, sha) = keys.variant_bundle(1);
    let b = Browser::start().await;
    b.open_with_token(&cluster.addr, "#/workers", READ_TOKEN)
        .await;
    let current = format!(
        "[data-address=\"{}\"] [data-generation=current]",
        cluster.addr
    );
    b.until(
        "the worker shown as the current generation",
        &format!(
            "const g = document.querySelector({current:?}); return g && g.dataset.pid === '{old}'"
        ),
    )
    .await;
    b.mark_page().await;

    let upgrade = Request::new("PUT", "/upgrade")
        .bearer(UPGRADE_TOKEN)
        .body(std::fs::read(&bundle).expect("the bundle"))
        .timeout(Duration::from_secs(120))
        .send(&cluster.addr)
        .expect("an answer to the upgrade");
    let (code, text) = (upgrade.status, upgrade.text());
    assert_eq!(code, 200, "upgrade: {text}");
    let c = db.client().await;
    let new: i32 = c
        .query_one(
            "select pid from artex.workers where http_addr = $1 and pid <> $2 order by started_at desc limit 1",
            &[&cluster.addr, &old],
        )
        .await
        .expect("the new generation's row")
        .get(0);
    let _later = Generations(vec![new]);
    let shown = b
        .until(
            "the new generation replacing the old one",
            &format!(
                "const g = document.querySelector({current:?});
                 const old = document.querySelector('[data-address=\"{addr}\"] [data-generation=replaced][data-pid=\"{old}\"]');
                 return g && g.dataset.pid === '{new}' && old ? [g.innerText, old.innerText] : null",
                addr = cluster.addr
            ),
        )
        .await;
    // The new generation runs the bundle's binary (its sha256), the old one another.
    let (current, replaced) = (shown[0].as_str().unwrap(), shown[1].as_str().unwrap());
    assert!(current.contains(&sha[..16]), "{current}");
    assert!(!replaced.contains(&sha[..16]), "{replaced}");
    assert!(
        replaced.contains(&format!("replaced by pid {new}")),
        "{replaced}"
    );
    b.finish_on_the_marked_page().await;
}

#[tokio::test]
async fn tagged_tasks_are_filtered_and_canceled_in_bulk_after_a_counted_confirmation() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (_serve, addr) = public_serve(&db, dir.path()).await;
    for tags in [json!(["nightly", "eu"]), json!(["nightly"]), json!(null)] {
        created(call(
            "POST",
            &addr,
            "/api/v1/tasks?allow_unregistered_kind=true",
            Some(json!({"kind": "resize", "tags": tags, "run_at": "2099-01-01T00:00:00Z"})),
        ));
    }
    let (code, body) = call(
        "PUT",
        &addr,
        "/api/v1/kinds/resize/limits",
        Some(json!({"concurrency": 3, "rate": "30/m"})),
    );
    assert_eq!(code, 200, "{body}");

    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/tasks?tag=nightly")).await;
    b.until(
        "the two tagged tasks listed with their tags",
        "return document.querySelectorAll('#task-rows tr[data-task]').length === 2
            && document.querySelectorAll('#task-rows .tag').length === 3",
    )
    .await;
    b.mark_page().await;
    b.click("button[data-bulk=cancel]").await;
    // Reads are public: counting the matches (a dry run) asks for the write token.
    b.give_token(WRITE_TOKEN).await;
    b.until(
        "the confirmation to say how many",
        "return document.getElementById('confirm-dialog').open
            && document.getElementById('confirm-title').textContent === 'cancel 2 task(s)?'",
    )
    .await;
    b.confirm().await;
    b.until(
        "the report",
        "return document.getElementById('flash').textContent
            === 'canceled 2 of 2 matching task(s) in 1 batch(es)'",
    )
    .await;
    let c = db.client().await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'canceled'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'pending' and tags is null"
        )
        .await,
        1
    );
    b.until(
        "the rows shown canceled",
        "return [...document.querySelectorAll('#task-rows [data-status]')].every(s => s.dataset.status === 'canceled')",
    )
    .await;
    b.finish_on_the_marked_page().await;

    // The kinds page shows the limits and what they count.
    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/kinds")).await;
    let row = b
        .until(
            "the kind's limits",
            "const r = document.querySelector('#kinds-table tr[data-kind=resize]');
             return r && [...r.children].slice(1, 5).map(td => td.textContent).join(' ')",
        )
        .await;
    assert_eq!(row, json!("0 3 - 30/m"));
    // Paused with its button (the write token asked for), shown paused, then resumed;
    // the overview lists it while paused.
    b.click("#kinds-table tr[data-kind=resize] button[data-action=pause]")
        .await;
    b.confirm().await;
    b.give_token(WRITE_TOKEN).await;
    b.until(
        "the kind shown paused",
        "return !!document.querySelector('#kinds-table tr[data-kind=resize][data-paused=true] [data-status=paused]')",
    )
    .await;
    let paused = db.bb.operator().paused_kinds(Some("resize")).await.unwrap();
    assert_eq!(paused.len(), 1, "{paused:?}");
    b.goto(&format!("http://{addr}/#/")).await;
    b.until(
        "the overview's paused kinds",
        "const c = document.querySelector('[data-metric=paused-kinds]'); return c && c.textContent.includes('resize')",
    )
    .await;
    b.goto(&format!("http://{addr}/#/kinds")).await;
    b.click("#kinds-table tr[data-kind=resize] button[data-action=resume]")
        .await;
    b.confirm().await;
    b.until(
        "the kind shown handed out again",
        "return !!document.querySelector('#kinds-table tr[data-kind=resize][data-paused=false]')",
    )
    .await;
    assert!(db
        .bb
        .operator()
        .paused_kinds(None)
        .await
        .unwrap()
        .is_empty());
    b.assert_no_errors().await;
    b.close().await;
}

/// Waits until `addr` knows the named token `secret` (a server reads them every 2 s).
async fn until_known(addr: &str, secret: &str) {
    let auth = format!("Bearer {secret}");
    common::procs::wait_for(
        "the named token honored",
        Duration::from_secs(20),
        || async {
            // A public-read server answers an unknown token as a public read: 200 alone
            // does not say the server knows it yet.
            let r = get(addr, "/api/v1/whoami", &[("Authorization", &auth)]);
            let who: Value = serde_json::from_slice(&r.body).unwrap_or_default();
            (r.status == 200 && who["by"] == "named").then_some(())
        },
    )
    .await
}

/// The page asks for one token, shows whose it is, and hides what its scope cannot do:
/// a named read token hides the pause buttons, a named admin token given in its place
/// (from the header) shows them, and what it pauses is audited under its name; the
/// Kinds page's button makes the kind fair, keeping its other limit.
#[tokio::test]
async fn the_page_shows_whose_token_it_uses_and_hides_what_its_scope_cannot_do() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (_serve, addr) = public_serve(&db, dir.path()).await;
    let (code, body) = call(
        "PUT",
        &addr,
        "/api/v1/kinds/resize/limits",
        Some(json!({"concurrency": 3})),
    );
    assert_eq!(code, 200, "{body}");
    let secret = |name: &str, scope: &str| {
        let (code, out, err) = common::run_cli(
            &db.url,
            &["token", "create", name, "--scope", scope, "--json"],
        );
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Value>(&out).unwrap()["secret"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (viewer, ops) = (secret("viewer", "read"), secret("ops", "admin"));
    until_known(&addr, &viewer).await;
    until_known(&addr, &ops).await;

    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/kinds")).await;
    let pause =
        "document.querySelector('#kinds-table tr[data-kind=resize] button[data-action=pause]')";
    let shown = |yes: bool| {
        format!(
            "const b = {pause}; return !!b && (getComputedStyle(b).display !== 'none') === {yes}"
        )
    };
    b.until(
        "public reads: the who and a pause button",
        &format!(
        "return document.getElementById('who').textContent === 'public read' && (() => {{ {} }})()",
        shown(true)
    ),
    )
    .await;
    b.mark_page().await;
    // A token the server does not know is said to be so, not shown as a plain public read.
    b.click("#who").await;
    b.give_token("artex_not_a_token").await;
    b.until(
        "the unknown token named as such",
        "return document.getElementById('who').textContent === 'token not known · public read'",
    )
    .await;
    b.click("#who").await;
    b.give_token(&viewer).await;
    b.until("the viewer named, its pause button hidden", &format!(
        "return document.getElementById('who').textContent === 'viewer · read' && (() => {{ {} }})()",
        shown(false)
    ))
    .await;
    assert_eq!(
        b.eval("return getComputedStyle(document.querySelector('nav a[data-nav=upload]')).display")
            .await,
        json!("none")
    );
    b.click("#who").await;
    b.give_token(&ops).await;
    b.until(
        "ops named, the pause button shown",
        &format!(
        "return document.getElementById('who').textContent === 'ops · admin' && (() => {{ {} }})()",
        shown(true)
    ),
    )
    .await;
    b.click("#kinds-table tr[data-kind=resize] button[data-action=pause]")
        .await;
    b.confirm().await;
    b.until(
        "the kind shown paused",
        "return !!document.querySelector('#kinds-table tr[data-kind=resize][data-paused=true]')",
    )
    .await;
    let paused = db.bb.operator().paused_kinds(Some("resize")).await.unwrap();
    assert_eq!(paused[0].paused_by, "token:ops", "{paused:?}");
    // Made fair with its button, its other limit kept.
    b.click("#kinds-table tr[data-kind=resize] button[data-action=fair]")
        .await;
    b.confirm().await;
    b.until(
        "the kind shown fair",
        "const c = document.querySelector('#kinds-table tr[data-kind=resize] [data-col=fair]');
         return !!c && c.textContent.startsWith('round-robin')",
    )
    .await;
    let limits = db.bb.operator().kind_limits(Some("resize")).await.unwrap();
    assert!(
        limits[0].fair && limits[0].concurrency == Some(3),
        "{limits:?}"
    );
    assert_eq!(limits[0].updated_by, "token:ops");
    b.finish_on_the_marked_page().await;
}

//! Every page of the dashboard, with tasks in every status, flows, a schedule and an
//! upload in the blackboard, shows no placeholder a script leaks when it prints a value
//! that is not there: `null`, `undefined`, `NaN`, `[object Object]`. A finished task
//! names the worker that finished it, on its page and in the list.

use std::time::Duration;

use serde_json::{json, Value};

use crate::browser::Browser;
use crate::common::procs::wait_for;
use crate::common::{TestDb, READ_TOKEN};
use crate::{call, created, Cluster};

/// What a page shows when a script prints a missing value.
const PLACEHOLDERS: &str = r"\b(null|undefined|NaN)\b|\[object Object\]";

/// Submits `task` through the API at `addr`; its id.
fn submit(addr: &str, task: Value) -> String {
    created(call("POST", addr, "/api/v1/tasks", Some(task)))["id"]
        .as_str()
        .expect("a task id")
        .to_string()
}

/// The status of task `id` as the API shows it.
fn status_of(addr: &str, id: &str) -> String {
    let (code, v) = call("GET", addr, &format!("/api/v1/tasks/{id}"), None);
    assert_eq!(code, 200, "{v}");
    v["task"]["status"].as_str().unwrap_or_default().to_string()
}

/// Waits until task `id` is in `status`.
async fn wait_status(addr: &str, id: &str, status: &str) {
    wait_for(
        &format!("task {id} {status}"),
        Duration::from_secs(60),
        || async move { (status_of(addr, id) == status).then_some(()) },
    )
    .await;
}

/// Opens `hash`, waits until `ready` (a script's condition) holds, and fails if the
/// page's text holds a placeholder, naming the page and the text around it.
async fn assert_clean(b: &Browser, hash: &str, ready: &str) {
    b.eval(&format!("location.hash = {hash:?}; return null"))
        .await;
    b.until(
        &format!("page {hash} shown"),
        &format!(
            "const main = document.getElementById('main');
             return !!main && !main.textContent.includes('Loading…') && ({ready})"
        ),
    )
    .await;
    let found = b
        .eval(&format!(
            "const text = document.body.innerText; const m = text.match(/{PLACEHOLDERS}/);
             return m ? text.slice(Math.max(0, m.index - 80), m.index + 40) : null"
        ))
        .await;
    assert!(
        found.is_null(),
        "page {hash} shows a placeholder in its text: …{}…",
        found.as_str().unwrap_or_default()
    );
}

#[tokio::test]
async fn no_page_shows_null_undefined_nan_or_an_object_s_name() {
    let db = TestDb::new().await;
    // Two handlers and two queued: long tasks fill both, so some stay `assigned`.
    let cluster = Cluster::start(&db, &["--concurrency", "2", "--prefetch", "2"]).await;
    let addr = cluster.addr.as_str();
    let later = "2030-01-01T00:00:00Z";

    // Finished ones first, while slots are free.
    let succeeded = submit(addr, json!({"kind": "echo", "payload": {"hello": "world"}}));
    let nothing = submit(addr, json!({"kind": "noop"}));
    let failed = submit(addr, json!({"kind": "fail", "max_retries": 0}));
    let timed_out = submit(
        addr,
        json!({"kind": "sleep", "payload": {"ms": 60000}, "timeout_ms": 100, "max_retries": 0}),
    );
    let canceled_flow = created(call(
        "POST",
        addr,
        "/api/v1/flows",
        Some(json!({"name": "doomed", "tasks": [
            {"name": "first", "kind": "fail", "max_retries": 0},
            {"name": "then", "kind": "echo", "depends_on": ["first"]}]})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    for (id, status) in [
        (&succeeded, "succeeded"),
        (&nothing, "succeeded"),
        (&failed, "failed"),
        (&timed_out, "timeout"),
    ] {
        wait_status(addr, id, status).await;
    }
    // An upload whose task ran.
    let bytes = vec![42u8; 1000];
    let sha = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(&bytes))
    };
    let upload = created(call(
        "POST",
        addr,
        "/api/v1/uploads",
        Some(
            json!({"size": bytes.len(), "sha256": sha, "chunk_size": 65536,
                    "task": {"kind": "digest"}}),
        ),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Its only chunk completes it: its task is submitted.
    assert_eq!(crate::uploads::put_chunk(addr, &upload, 0, &bytes), 200);
    // Unfinished ones: waiting, held, canceled by hand, blocked behind a running one.
    submit(addr, json!({"kind": "echo", "run_at": later}));
    let paused = submit(addr, json!({"kind": "echo", "run_at": later}));
    assert_eq!(
        call(
            "POST",
            addr,
            &format!("/api/v1/tasks/{paused}/pause"),
            Some(json!({}))
        )
        .0,
        200
    );
    let canceled = submit(addr, json!({"kind": "echo", "run_at": later}));
    assert_eq!(
        call(
            "POST",
            addr,
            &format!("/api/v1/tasks/{canceled}/cancel"),
            Some(json!({}))
        )
        .0,
        200
    );
    let waiting_flow = created(call(
        "POST",
        addr,
        "/api/v1/flows",
        Some(json!({"name": "waiting", "tasks": [
            {"name": "long", "kind": "sleep", "payload": {"ms": 120000}},
            {"name": "after", "kind": "echo", "depends_on": ["long"]},
            // Waits, one reached and one not, each shown with what it waits for.
            {"name": "approval", "wait": {"signal": "ok", "timeout": "1h"}},
            {"name": "later", "wait": {"until": "2030-01-01T00:00:00Z"},
             "depends_on": ["long"]}]})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    for _ in 0..3 {
        submit(addr, json!({"kind": "sleep", "payload": {"ms": 120000}}));
    }
    created(call(
        "POST",
        addr,
        "/api/v1/schedules",
        Some(json!({"name": "nightly", "cron": "0 2 * * *", "kind": "echo"})),
    ));
    // Every status is in the blackboard before the pages are read.
    let c = db.client().await;
    wait_for(
        "a task in every status",
        Duration::from_secs(60),
        || async {
            let n: i64 = c
                .query_one("select count(distinct status) from artex.tasks", &[])
                .await
                .ok()?
                .get(0);
            (n == 9).then_some(())
        },
    )
    .await;

    let b = Browser::start().await;
    b.open_with_token(addr, "#/", READ_TOKEN).await;
    assert_clean(&b, "#/", "!!document.getElementById('overview')").await;
    assert_clean(
        &b,
        "#/tasks",
        "!!document.querySelector('#task-rows tr[data-task]')",
    )
    .await;
    for status in [
        "pending",
        "assigned",
        "running",
        "succeeded",
        "failed",
        "timeout",
        "paused",
        "blocked",
        "canceled",
    ] {
        let rows = "document.querySelectorAll('#task-rows tr[data-task]').length > 0";
        assert_clean(&b, &format!("#/tasks?status={status}"), rows).await;
    }
    let rows = c
        .query(
            "select distinct on (status) id from artex.tasks order by status, id",
            &[],
        )
        .await
        .unwrap();
    for r in rows {
        let id: uuid::Uuid = r.get(0);
        assert_clean(
            &b,
            &format!("#/tasks/{id}"),
            "!!document.getElementById('task-status')",
        )
        .await;
    }
    for id in [&nothing, &failed, &timed_out] {
        assert_clean(
            &b,
            &format!("#/tasks/{id}"),
            "!!document.getElementById('task-status')",
        )
        .await;
    }
    assert_clean(&b, "#/flows", "!!document.getElementById('flows')").await;
    for flow in [&canceled_flow, &waiting_flow] {
        assert_clean(
            &b,
            &format!("#/flows/{flow}"),
            "!!document.getElementById('dag')",
        )
        .await;
    }
    assert_clean(&b, "#/workers", "!!document.querySelector('[data-worker]')").await;
    assert_clean(&b, "#/kinds", "!!document.getElementById('kinds-page')").await;
    assert_clean(
        &b,
        "#/schedules",
        "!!document.querySelector('#schedule-rows [data-schedule]')",
    )
    .await;
    assert_clean(&b, "#/upload", "!!document.getElementById('upload-file')").await;
    // The feed, with a transition that happened while it was open.
    b.eval("location.hash = '#/feed'; return null").await;
    b.until("the feed page", "return !!document.getElementById('feed')")
        .await;
    let fresh = submit(addr, json!({"kind": "echo", "payload": {"n": 1}}));
    assert_clean(
        &b,
        "#/feed",
        &format!("!!document.querySelector('#feed [data-task=\"{fresh}\"]')"),
    )
    .await;

    // A finished task names the worker that finished it, as `task show` does.
    let worker = crate::common::procs::worker_id(&c, &cluster.worker).await;
    let (_, shown) = call("GET", addr, &format!("/api/v1/tasks/{succeeded}"), None);
    assert_eq!(shown["task"]["worker"], json!(worker), "{shown}");
    assert_eq!(shown["task"]["assigned_to"], Value::Null, "{shown}");
    b.eval(&format!(
        "location.hash = '#/tasks/{succeeded}'; return null"
    ))
    .await;
    b.until(
        "the finished task's page names its worker",
        &format!("const w = document.getElementById('task-worker'); return !!w && w.textContent === {worker:?}"),
    )
    .await;
    b.eval("location.hash = '#/tasks?status=succeeded'; return null")
        .await;
    b.until(
        "the list names the worker of every finished task",
        &format!(
            "const rows = [...document.querySelectorAll('#task-rows tr[data-task]')];
             return rows.length >= 2 && rows.every((r) => r.children[3].textContent === {worker:?})"
        ),
    )
    .await;
    b.assert_no_errors().await;
    b.close().await;
}

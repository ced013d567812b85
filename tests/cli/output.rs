//! Output: what one-shot commands print and only that, large values cut unless
//! `--full`, and `--json` as one document with the API's field names.

use crate::common;
use crate::common::fixtures;
use crate::common::TestDb;
use crate::{artex, json_of, stderr, stdout, submit_flow_file};

#[tokio::test]
async fn show_and_list_cut_large_values_unless_full() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let big = format!(r#"{{"s":"{}"}}"#, "y".repeat(5000));
    let out = artex(
        url,
        None,
        &[
            "submit",
            "echo",
            "--payload",
            &big,
            "--allow-unregistered-kind",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let whole = 5000 + r#"{"s": ""}"#.len();

    let text = stdout(&artex(url, None, &["task", "show", &id]));
    let line = text.lines().find(|l| l.starts_with("payload:")).unwrap();
    assert!(
        line.ends_with(&format!("… ({whole} bytes; --full to see all)")),
        "{line}"
    );
    assert!(line.len() < 1200, "{} bytes shown", line.len());
    let text = stdout(&artex(url, None, &["task", "show", &id, "--full"]));
    assert!(text.contains(&"y".repeat(5000)), "--full shows all");

    let v: serde_json::Value =
        serde_json::from_str(&stdout(&artex(url, None, &["task", "show", &id, "--json"]))).unwrap();
    assert_eq!(v["task"]["cut"][0]["field"], "payload");
    assert_eq!(v["task"]["cut"][0]["bytes"], whole);
    assert_eq!(v["task"]["payload"].as_str().unwrap().len(), 1024);
    let v: serde_json::Value = serde_json::from_str(&stdout(&artex(
        url,
        None,
        &["task", "show", &id, "--json", "--full"],
    )))
    .unwrap();
    assert_eq!(v["task"]["payload"]["s"].as_str().unwrap().len(), 5000);
    assert!(v["task"].get("cut").is_none());

    let v = json_of(&artex(url, None, &["tasks", "--json"]));
    assert_eq!(v["tasks"][0]["cut"][0]["bytes"], whole);
    let v = json_of(&artex(url, None, &["tasks", "--json", "--full"]));
    assert_eq!(v["tasks"][0]["payload"]["s"].as_str().unwrap().len(), 5000);
    let text = stdout(&artex(url, None, &["tasks"]));
    assert!(text.contains(&id), "{text}");
}

#[tokio::test]
async fn submit_show_and_list_a_task() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let out = artex(
        url,
        None,
        &[
            "submit",
            "echo",
            "--payload",
            r#"{"hello":"world"}"#,
            "--priority",
            "5",
            "--max-retries",
            "1",
            "--run-at",
            "2030-01-01T00:00:00Z",
            // No worker runs in this test.
            "--allow-unregistered-kind",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    uuid::Uuid::parse_str(&id).expect("submit prints the task id");
    let out = artex(url, None, &["task", "show", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["task"]["status"], "pending");
    assert_eq!(v["task"]["payload"]["hello"], "world");
    assert_eq!(v["task"]["priority"], 5);
    assert_eq!(v["task"]["max_retries"], 1);
    assert_eq!(v["task"]["run_at"], "2030-01-01T00:00:00Z");
    assert_eq!(v["transitions"][0]["to_status"], "pending");
    let out = artex(url, None, &["task", "show", &id]);
    let text = stdout(&out);
    assert!(text.contains("status:      pending"), "{text}");
    assert!(text.contains("(new) -> pending"), "{text}");
    let out = artex(url, None, &["tasks", "--status", "pending"]);
    assert!(stdout(&out).contains(&id), "{}", stdout(&out));
    let out = artex(url, None, &["tasks", "--status", "succeeded"]);
    assert!(!stdout(&out).contains(&id));
}

/// What a newcomer reads: one-shot commands print their result and nothing else, a task
/// that failed once and then succeeded shows its error as history and the worker that
/// finished it, `tasks` has a header, and a missing flow file is bad input.
#[tokio::test]
async fn one_shot_output_says_what_happened_and_only_that() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let c = db.client().await;
    let w = common::procs::Proc::worker("w", &db.url, &[]);
    let worker = common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", &db.url, &[]);
    let out = artex(
        url,
        None,
        &["submit", "fail", "--payload", r#"{"times": 1}"#],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "a one-shot command logged");
    let id = stdout(&out).trim().to_string();
    let task: uuid::Uuid = id.parse().unwrap();
    common::procs::wait_status(
        &db.bb,
        task,
        "succeeded",
        std::time::Duration::from_secs(20),
    )
    .await;
    let text = stdout(&artex(url, None, &["task", "show", &id]));
    assert!(text.contains("status:      succeeded"), "{text}");
    assert!(text.contains("last error:  "), "{text}");
    assert!(!text.contains("\nerror:"), "{text}");
    assert!(text.contains(&format!("worker:      {worker}")), "{text}");
    let list = stdout(&artex(url, None, &["tasks"]));
    assert!(list.starts_with("ID "), "{list}");
    let out = artex(url, None, &["flow", "submit", "/nonexistent/flow.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no such flow file"),
        "{}",
        stderr(&out)
    );
}

/// Every command that prints data prints one JSON document with --json, with the HTTP
/// API's field names where the API has the same thing.
#[tokio::test]
async fn json_output_is_one_document_with_the_apis_fields() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    fixtures::worker(&db.bb, "w1", &["echo"], 1).await;

    let v = json_of(&artex(url, None, &["submit", "echo", "--json"]));
    let id = v["id"].as_str().expect("submit: id").to_string();
    let v = json_of(&artex(url, None, &["tasks", "--json", "--limit", "1"]));
    assert_eq!(v["tasks"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["tasks"][0]["status"], "pending", "{v}");
    assert_eq!(v["next"], id.as_str(), "a full page names the next: {v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--after", &id]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(0), "{v}");
    assert!(v["next"].is_null(), "{v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--kind", "echo"]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(1), "{v}");
    let v = json_of(&artex(url, None, &["task", "show", &id, "--json"]));
    assert_eq!(v["task"]["kind"], "echo", "{v}");
    assert_eq!(v["transitions"][0]["to_status"], "pending", "{v}");
    let v = json_of(&artex(url, None, &["pause", &id, "--json"]));
    assert_eq!(v["changed"][0][1], "paused", "{v}");

    let dir = tempfile::tempdir().unwrap();
    let flow = submit_flow_file(
        url,
        dir.path(),
        r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo"},
            {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    );
    let v = json_of(&artex(url, None, &["flow", "show", &flow, "--json"]));
    assert_eq!(v["id"], flow.as_str(), "{v}");
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["tasks"][1]["depends_on"][0], "a", "{v}");
    let v = json_of(&artex(url, None, &["flow", "list", "--json"]));
    assert_eq!(v["flows"][0]["id"], flow.as_str(), "{v}");
    assert_eq!(v["flows"][0]["state"], "running", "{v}");
    assert_eq!(v["flows"][0]["counts"]["blocked"], 1, "{v}");
    assert!(v["next"].is_null(), "one flow, one page: {v}");
    let v = json_of(&artex(url, None, &["tasks", "--json", "--flow", &flow]));
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(2), "{v}");

    let v = json_of(&artex(url, None, &["kinds", "--json"]));
    assert_eq!(v["kinds"][0]["kind"], "echo", "{v}");
    let v = json_of(&artex(url, None, &["workers", "--json"]));
    assert_eq!(v["workers"][0]["id"], "w1", "{v}");
    for field in [
        "state",
        "pid",
        "version",
        "capacity",
        "slots",
        "held",
        "last_seen",
    ] {
        assert!(
            v["workers"][0].get(field).is_some(),
            "workers: {field}: {v}"
        );
    }
    assert_eq!(v["more"], false, "{v}");
    let v = json_of(&artex(url, None, &["stats", "--json"]));
    // The paused task, the flow's first (pending) and second (blocked).
    for status in ["paused", "pending", "blocked"] {
        assert_eq!(v["by_status"][status], 1, "{status}: {v}");
    }
    assert!(v["recent"]["queue_ms"].is_object(), "{v}");
    let v = json_of(&artex(url, None, &["limits", "--json"]));
    assert!(v["max_payload_bytes"].as_i64().unwrap_or(0) > 0, "{v}");
    let v = json_of(&artex(url, None, &["events", "retention", "--json"]));
    assert!(v["keep_secs"].as_f64().is_some(), "{v}");
    let v = json_of(&artex(url, None, &["events", "prune", "--json"]));
    assert_eq!(v["tasks_pruned"], 0, "{v}");
    assert!(v["partitions_dropped"].is_array(), "{v}");
    let v = json_of(&artex(url, None, &["migrate", "--json"]));
    assert!(
        v["already"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );
    assert_eq!(v["applied"], serde_json::json!([]), "{v}");
    // The feed is JSON lines: one event a line. It gives only events no transaction in
    // flight can precede, and the test cluster is shared: a transaction another test
    // holds open holds them back for a moment, so the tail is read again until then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = artex(url, None, &["events", "tail"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let lines: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        if lines.iter().any(|e| e["task_id"] == id.as_str()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{lines:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Where `USER` is not set (cron, systemd units, CI), the history names the process's
/// user by its uid's name, not `unknown`.
#[tokio::test]
async fn without_user_set_the_audit_name_is_the_uid_s_name() {
    let db = TestDb::new().await;
    let url = Some(db.url.as_str());
    let out = artex(url, None, &["submit", "echo", "--allow-unregistered-kind"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let out = crate::artex_command(url, None, &["pause", &id])
        .env_remove("USER")
        .output()
        .expect("run artex");
    assert!(out.status.success(), "{}", stderr(&out));
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let me = String::from_utf8_lossy(&me.stdout).trim().to_string();
    assert!(!me.is_empty());
    let history = db
        .bb
        .operator()
        .transitions(id.parse().unwrap())
        .await
        .unwrap();
    let actor = &history.last().unwrap().actor;
    assert!(actor.starts_with(&format!("cli:{me}@")), "{actor}");
}

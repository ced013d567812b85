//! Commands that wait: `submit --wait` and `flow show --follow` end with the outcome as
//! their exit code.

use std::process::Command;

use crate::common;
use crate::common::TestDb;
use crate::{artex, json_of, stderr, stdout};

/// An `artex` run in the background, its standard output read line by line as it comes;
/// killed if the test ends first.
struct Background {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Background {
    fn start(url: &str, args: &[&str]) -> Background {
        let mut child = Command::new(common::artex_bin())
            .args(args)
            .env("ARTEX_DATABASE_URL", url)
            .env("ARTEX_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run artex");
        let out = child.stdout.take().expect("its standard output");
        let lines = std::io::BufRead::lines(std::io::BufReader::new(out));
        Background { child, lines }
    }

    /// Its next line of output (the test waits for it: a hung command hangs the test,
    /// which names it).
    fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("a line of output before the end")
            .expect("readable output")
    }

    /// The rest of its output, its exit code and its standard error, once it has exited.
    fn finish(mut self) -> (Vec<String>, Option<i32>, String) {
        let rest: Vec<String> = self.lines.by_ref().map_while(|l| l.ok()).collect();
        let status = self.child.wait().expect("wait for artex");
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        (rest, status.code(), err)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `submit --wait` waits for the task to end, says how it went on standard error, and
/// exits with its outcome: 0 succeeded, 4 failed, 5 canceled.
#[tokio::test]
async fn submit_wait_exits_with_the_tasks_outcome() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let c = db.client().await;
    // Submitted before any worker runs: the wait follows it from pending to the end.
    let mut wait = Background::start(
        url,
        &[
            "submit",
            "fail",
            "--payload",
            r#"{"times": 1}"#,
            "--allow-unregistered-kind",
            "--wait",
        ],
    );
    let id = wait.line();
    uuid::Uuid::parse_str(&id).expect("the id comes first");
    let w = common::procs::Proc::worker("w", url, &[]);
    common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", url, &[]);
    let (rest, code, err) = wait.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(rest.is_empty(), "only the id on standard output: {rest:?}");
    assert!(err.contains(&format!("task {id}: pending")), "{err}");
    assert!(
        err.contains("failing on purpose (attempt 1)"),
        "the retry: {err}"
    );
    assert!(err.contains("succeeded after"), "{err}");
    assert!(err.contains("succeeded_on_attempt"), "the result: {err}");

    let out = artex(
        Some(url),
        None,
        &["submit", "fail", "--max-retries", "0", "--wait"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("failed after"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: task") && stderr(&out).contains("failing on purpose"),
        "{}",
        stderr(&out)
    );

    let out = artex(Some(url), None, &["submit", "echo", "--wait", "--json"]);
    let v = json_of(&out);
    assert_eq!(v["task"]["status"], "succeeded", "{v}");
    assert!(
        v["transitions"].as_array().is_some_and(|t| t.len() >= 3),
        "{v}"
    );

    // Canceled while it runs: the wait ends with 5.
    let mut wait = Background::start(
        url,
        &["submit", "sleep", "--payload", r#"{"ms": 60000}"#, "--wait"],
    );
    let id = wait.line();
    let task: uuid::Uuid = id.parse().unwrap();
    common::procs::wait_status(&db.bb, task, "running", std::time::Duration::from_secs(20)).await;
    let out = artex(Some(url), None, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (_, code, err) = wait.finish();
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("canceled"), "{err}");
}

/// `flow show --follow` shows the flow, then its tasks' changes as they happen, and ends
/// when the flow has finished, with its outcome as exit code.
#[tokio::test]
async fn flow_show_follow_ends_when_the_flow_finishes() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let c = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.json");
    std::fs::write(
        &file,
        r#"{"name": "etl", "tasks": [{"name": "extract", "kind": "echo"},
            {"name": "load", "kind": "echo", "depends_on": ["extract"]}]}"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = artex(
        Some(url),
        None,
        &["flow", "submit", path, "--allow-unregistered-kind"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let flow = stdout(&out).trim().to_string();

    // Followed before anything runs: the first line is the flow as it stands.
    let mut json = Background::start(url, &["flow", "show", &flow, "--follow", "--json"]);
    let mut text = Background::start(url, &["flow", "show", &flow, "--follow"]);
    let first: serde_json::Value = serde_json::from_str(&json.line()).unwrap();
    assert_eq!(first["state"], "running", "{first}");
    assert_eq!(first["tasks"][1]["status"], "blocked", "{first}");
    assert!(text.line().starts_with("flow:"), "the table first");
    let w = common::procs::Proc::worker("w", url, &[]);
    common::procs::worker_id(&c, &w).await;
    let _p = common::procs::Proc::planner("p", url, &[]);

    let (rest, code, err) = json.finish();
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<serde_json::Value> = rest
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let last = lines.last().expect("a line after the start");
    assert_eq!(last["state"], "succeeded", "{last}");
    assert_eq!(last["counts"]["succeeded"], 2, "{last}");
    assert!(
        lines.iter().all(|l| l["id"] == flow.as_str()),
        "each line is the whole flow: {lines:?}"
    );
    let (rest, code, err) = text.finish();
    assert_eq!(code, Some(0), "{err}");
    let shown = rest.join("\n");
    assert!(
        shown.lines().any(|l| l.contains(" load ")
            && l.ends_with("blocked -> pending: all upstream tasks succeeded")),
        "the promotion, as it happened: {shown}"
    );
    assert!(
        shown.contains(&format!("flow {flow}: succeeded (2 succeeded)")),
        "{shown}"
    );

    // A flow that fails: exit 4, whether followed or already over.
    std::fs::write(
        &file,
        r#"{"name": "bad", "tasks": [{"name": "a", "kind": "fail", "max_retries": 0},
            {"name": "b", "kind": "echo", "depends_on": ["a"]}]}"#,
    )
    .unwrap();
    let out = artex(Some(url), None, &["flow", "submit", path]);
    let flow = stdout(&out).trim().to_string();
    let out = artex(Some(url), None, &["flow", "show", &flow, "--follow"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("flow {flow}: failed")),
        "{}",
        stdout(&out)
    );
}

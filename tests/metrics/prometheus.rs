use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use artex_actors::metrics::parse::{parse, Sample};
use artex_actors::submission::NewTask;
use artex_testkit::http::Request;
use serde_json::{json, Value};

use crate::common::procs::{http_get, serve_address, wait_for, wait_status, worker_http, Proc};
use crate::common::{count, read_token_file, TestDb};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new(PROMTOOL)
        .args(args)
        .current_dir(docs())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test.sh installs it)");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("promtool's stdin");
    drop(input);
    let out = child.wait_with_output().expect("promtool ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The shipped rules are valid, and fire as their unit tests say (docs/alerts.test.yml).
#[test]
fn promtool_checks_and_tests_the_shipped_alert_rules() {
    let (ok, out) = promtool(&["check", "rules", "alerts.yml"], None);
    assert!(ok && out.contains("SUCCESS: 6 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"], None);
    assert!(ok, "{out}");
    let dashboard: Value = serde_json::from_slice(
        &std::fs::read(docs().join("grafana-dashboard.json")).expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| !p.is_empty()));
}

/// A Prometheus server of its own, on a port below the ephemeral range (Prometheus
/// takes no port 0); killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn start(jobs: &[(&str, &str, bool)]) -> Prometheus {
        let dir = tempfile::tempdir().expect("Prometheus' folder");
        let token = read_token_file();
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{:?}]\nscrape_configs:\n",
            docs().join("alerts.yml")
        );
        for (job, target, authorized) in jobs {
            config.push_str(&format!("  - job_name: {job}\n"));
            if *authorized {
                config.push_str(&format!(
                    "    authorization: {{ type: Bearer, credentials_file: {token:?} }}\n"
                ));
            }
            config.push_str(&format!(
                "    static_configs: [{{ targets: [{target:?}] }}]\n"
            ));
        }
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, &config).expect("Prometheus' configuration");
        for _ in 0..10 {
            let port = free_port();
            let addr = format!("127.0.0.1:{port}");
            let log = std::fs::File::create(dir.path().join("log")).expect("log");
            let mut child = Command::new(PROMETHEUS)
                .arg(format!("--config.file={}", config_file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("prometheus (Debian's package; scripts/test.sh installs it)");
            let ready = wait_for(
                "Prometheus to be ready or to exit",
                Duration::from_secs(60),
                || {
                    let exited = child.try_wait().ok().flatten().is_some();
                    let ready = Request::get("/-/ready")
                        .timeout(Duration::from_secs(2))
                        .send(&addr)
                        .and_then(|r| r.complete())
                        .is_ok_and(|r| r.status == 200);
                    async move { (exited || ready).then_some(ready) }
                },
            )
            .await;
            if ready {
                return Prometheus {
                    child,
                    addr,
                    _dir: dir,
                };
            }
            // Its port was taken meanwhile: another.
            let _ = child.wait();
        }
        panic!(
            "Prometheus did not start: {}",
            read(&dir.path().join("log"))
        );
    }

    /// The instant vector of `query`, as (labels, value) pairs.
    fn query(&self, query: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let path = format!("/api/v1/query?query={}", encode(query));
        let r = Request::get(&path)
            .timeout(Duration::from_secs(10))
            .send(&self.addr)
            .and_then(|r| r.complete())
            .expect("Prometheus' HTTP API");
        let body: Value = serde_json::from_str(&r.text()).expect("JSON");
        assert_eq!(body["status"], "success", "{query}: {body}");
        body["data"]["result"]
            .as_array()
            .expect("a vector")
            .iter()
            .map(|s| {
                let labels = serde_json::from_value(s["metric"].clone()).expect("labels");
                let value = s["value"][1]
                    .as_str()
                    .expect("a value")
                    .parse()
                    .expect("a number");
                (labels, value)
            })
            .collect()
    }

    /// Waits until `query` gives exactly one sample; its value.
    async fn one(&self, what: &str, query: &str) -> f64 {
        wait_for(what, Duration::from_secs(60), || {
            let v = self.query(query);
            async move { (v.len() == 1).then(|| v[0].1) }
        })
        .await
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A port below Linux's ephemeral range, free when it was tried.
fn free_port() -> u16 {
    loop {
        let port = 20_000 + fastrand::u16(..12_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Percent-encodes a query parameter's value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The labels a scrape may carry: bounded sets (kinds, statuses, outcomes, states,
/// actors, reasons, bucket bounds), never a task's or a worker's id.
const LABELS: [&str; 8] = [
    "kind",
    "status",
    "outcome",
    "state",
    "actor",
    "reason",
    "direction",
    "le",
];

/// A process's `/metrics` is valid text format (our strict reader and promtool's lint),
/// no series twice, every label one of [`LABELS`] and no value an id.
fn check_scrape(who: &str, text: &str) -> Vec<Sample> {
    let samples = parse(text).unwrap_or_else(|e| panic!("{who}'s /metrics: {e}\n{text}"));
    let (ok, out) = promtool(&["check", "metrics"], Some(text));
    assert!(
        ok,
        "{who}'s /metrics, promtool check metrics: {out}\n{text}"
    );
    let labels: BTreeSet<&str> = samples
        .iter()
        .flat_map(|s| s.labels.keys())
        .map(String::as_str)
        .collect();
    assert!(
        labels.iter().all(|l| LABELS.contains(l)),
        "{who}: labels {labels:?}"
    );
    for s in &samples {
        for v in s.labels.values() {
            assert!(
                uuid::Uuid::parse_str(v).is_err(),
                "{who}: an id as a label value: {s:?}"
            );
        }
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// A real Prometheus scrapes `artex serve`, a worker and a planner (each with its real
/// token, or on loopback) while a paused kind's tasks wait and others run: every scrape
/// is valid and bounded, the shipped rules load, and what its HTTP API answers for the
/// backlog, the outcomes, the worker's attempts and the planner's rounds is what the
/// database and the processes did.
#[tokio::test]
async fn prometheus_scrapes_serve_a_worker_and_a_planner() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let ops = db.bb.operator();
    ops.pause_kind("sleep", Some("test backlog"), "test")
        .await
        .unwrap();
    let planner = Proc::planner("planner", &db.url, &["--metrics", "127.0.0.1:0"]);
    let worker = Proc::worker("worker", &db.url, &[]);
    let serve = Proc::start(
        "serve",
        &db.url,
        &["serve", "--http", "127.0.0.1:0", "--metrics-every", "500ms"],
        &[],
    );
    let (planner_addr, worker_addr, serve_addr) = (
        crate::common::procs::planner_metrics(&planner).await,
        worker_http(&c, &worker).await,
        serve_address(&serve).await,
    );
    for _ in 0..7 {
        ops.submit(&NewTask::new("sleep", json!({ "ms": 1 })), "test")
            .await
            .unwrap();
    }
    let mut echo = Vec::new();
    for i in 0..3 {
        echo.push(
            ops.submit(&NewTask::new("echo", json!({ "n": i })), "test")
                .await
                .unwrap(),
        );
    }
    let fail = ops
        .submit(
            &NewTask {
                max_retries: Some(0),
                ..NewTask::new("fail", json!({}))
            },
            "test",
        )
        .await
        .unwrap();
    for id in &echo {
        wait_status(&db.bb, *id, "succeeded", Duration::from_secs(30)).await;
    }
    wait_status(&db.bb, fail, "failed", Duration::from_secs(30)).await;

    // Each process's own scrape.
    let (code, text) = http_get(&planner_addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    let p = check_scrape("the planner", &text);
    let assigned = value(&p, "artex_planner_assignments_total", &[]).unwrap();
    let planner_text = text;
    let (code, text) = http_get(&worker_addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    let w = check_scrape("the worker", &text);
    // Each of the four tasks reached the worker once: through the planner's round,
    // claimed by the worker itself in a read (migrations/V46), or born assigned to the
    // slot it offered (V62: its assignment dated at its insert), whichever came first.
    let claimed = value(&w, "artex_worker_tasks_claimed_total", &[]).unwrap();
    let born: i64 = c
        .query_one(
            "select count(*) from artex.task_transitions h join artex.tasks t on t.id = h.task_id
             where h.to_status = 'running' and h.assigned_at = t.created_at",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        assigned + claimed + born as f64,
        4.0,
        "planner assigned {assigned}, worker claimed {claimed}, {born} born assigned: \
         {planner_text}\n{text}"
    );
    let echo_ok = [("kind", "echo"), ("outcome", "succeeded")];
    assert_eq!(
        value(&w, "artex_worker_attempts_total", &echo_ok),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(
            &w,
            "artex_worker_attempts_total",
            &[("kind", "fail"), ("outcome", "failed")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &w,
            "artex_worker_task_run_seconds_count",
            &[("kind", "echo")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &w,
            "artex_worker_task_wait_seconds_count",
            &[("kind", "echo")]
        ),
        Some(3.0)
    );
    let (code, text) = http_get(&serve_addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{text}");
    let s = check_scrape("serve", &text);
    assert_eq!(
        value(&s, "artex_fleet_metrics_up", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&s, "artex_kind_paused", &[("kind", "sleep")]),
        Some(1.0),
        "{text}"
    );
    // Without the token, no figures.
    let (code, _) = crate::common::procs::http_get_as(&serve_addr, "/metrics", None).unwrap();
    assert_eq!(code, 401);

    // Prometheus scrapes all three and answers from what it stored.
    let prometheus = Prometheus::start(&[
        ("artex-serve", &serve_addr, true),
        ("artex-worker", &worker_addr, true),
        ("artex-planner", &planner_addr, false),
    ])
    .await;
    let backlog = prometheus
        .one(
            "the sleep backlog",
            r#"artex_fleet_tasks{kind="sleep",status="pending"}"#,
        )
        .await;
    let in_db = count(
        &c,
        "select count(*) from artex.tasks where kind = 'sleep' and status = 'pending'",
    )
    .await;
    assert_eq!((backlog, in_db), (7.0, 7));
    for job in ["artex-serve", "artex-worker", "artex-planner"] {
        let up = prometheus.one(job, &format!(r#"up{{job="{job}"}}"#)).await;
        assert_eq!(up, 1.0, "{job} is not scraped");
    }
    for (what, query, expected) in [
        (
            "echo's outcomes",
            r#"artex_fleet_tasks_ended_total{kind="echo",outcome="succeeded"}"#,
            3.0,
        ),
        (
            "fail's outcomes",
            r#"artex_fleet_tasks_ended_total{kind="fail",outcome="failed"}"#,
            1.0,
        ),
        (
            "the worker's attempts",
            r#"artex_worker_attempts_total{kind="echo",outcome="succeeded"}"#,
            3.0,
        ),
    ] {
        assert_eq!(prometheus.one(what, query).await, expected, "{what}");
    }
    let rounds = prometheus
        .one("the planner's rounds", "artex_planner_round_seconds_count")
        .await;
    assert!(rounds >= 1.0, "{rounds}");
    let age = prometheus
        .one(
            "the backlog's age",
            r#"artex_fleet_oldest_runnable_age_seconds{kind="sleep"}"#,
        )
        .await;
    assert!(age >= 0.0, "{age}");
    // The rules loaded and were evaluated on these series without error.
    let rules = Request::get("/api/v1/rules")
        .send(&prometheus.addr)
        .and_then(|r| r.complete())
        .expect("Prometheus' rules");
    let rules: Value = serde_json::from_str(&rules.text()).expect("JSON");
    let loaded = rules["data"]["groups"][0]["rules"]
        .as_array()
        .expect("rules");
    assert_eq!(loaded.len(), 6, "{rules}");
    assert!(loaded.iter().all(|r| r["health"] != "err"), "{rules}");
}

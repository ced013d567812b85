//! Safe to expose: what a worker serves needs a token of the right scope (`/health`
//! excepted), any number of event streams leave the database to everyone else, `/health`
//! tells the truth about a hung PostgreSQL, and nothing waits for ever on a server that
//! does not answer: the CLI fails in seconds, a pool never gets a transaction back open.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use artex_actors::blackboard::{Assignment, NewTask, Round};
use artex_actors::Blackboard;
use common::fixtures;
use common::procs::{http_get, http_get_as, wait_for, worker_http, worker_id, Proc};
use common::{assert_statement_timeout, count, PrivateCluster, TestDb, READ_TOKEN};
use dev_db_state::freeze;
use futures_util::FutureExt;

/// A dispatch round of planner `p`: 10 tasks, all shards, a 30 s lease, workers heard
/// from within 10 minutes.
const ROUND: Round<'static> = Round {
    actor: "p",
    batch: 10,
    shards: (1, &[]),
    lease_secs: 30.0,
    alive_secs: 600.0,
    unreachable: &[],
    walk: true,
};
use artex_testkit::http::{Exchange, Request};
use serde_json::json;

/// Opens `GET /events` with `token`; returns the status code (0 if none came) and, on
/// 200, the open stream (positioned after the headers).
fn open_stream(addr: &str, token: Option<&str>) -> (u16, Option<Exchange>) {
    let mut stream = Request::get("/events")
        .header("Accept", "text/event-stream")
        .bearer(token)
        .start(addr)
        .expect("connect");
    let status = stream.head().map(|h| h.status).unwrap_or(0);
    (status, (status == 200).then_some(stream))
}

/// Reads the stream until an event about `task` arrives.
fn wait_event(stream: &mut Exchange, task: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = stream
            .read_line(&mut line)
            .expect("reading the event stream");
        assert!(n > 0, "the stream ended before an event of {task}");
        if line.contains(task) {
            return;
        }
    }
}

#[tokio::test]
async fn reads_need_a_token_of_the_read_or_write_scope_and_health_stays_open() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let write_token = dir.path().join("write-token");
    std::fs::write(&write_token, "w-secret\n").unwrap();
    let w = Proc::worker(
        "tokens",
        &db.url,
        &["--write-token-file", write_token.to_str().unwrap()],
    );
    let http = worker_http(&c, &w).await;
    for path in ["/status", "/metrics", "/events"] {
        let (code, body) = http_get_as(&http, path, None).unwrap();
        assert_eq!(code, 401, "{path} without a token: {body}");
        assert!(body.contains("bearer token"), "{path}: {body}");
        let (code, _) = http_get_as(&http, path, Some("wrong")).unwrap();
        assert_eq!(code, 401, "{path} with a wrong token");
        if path != "/events" {
            assert_eq!(http_get(&http, path).unwrap().0, 200, "{path}, read token");
            // The write scope reads too.
            let (code, _) = http_get_as(&http, path, Some("w-secret")).unwrap();
            assert_eq!(code, 200, "{path}, write token");
        }
    }
    assert_eq!(open_stream(&http, Some(READ_TOKEN)).0, 200);
    assert_eq!(http_get_as(&http, "/health", None).unwrap().0, 200);

    // No read token and no --public-read: reads are closed and say how to open them.
    let closed = Proc::start(
        "closed",
        &db.url,
        &["worker", "--concurrency", "1"],
        &[("ARTEX_READ_TOKEN_FILE", "")],
    );
    let closed_http = worker_http(&c, &closed).await;
    let (code, body) = http_get(&closed_http, "/status").unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("--public-read"), "{body}");
    assert_eq!(http_get_as(&closed_http, "/health", None).unwrap().0, 200);

    // --public-read opens reads to anybody.
    let open = Proc::start(
        "public",
        &db.url,
        &["worker", "--concurrency", "1", "--public-read"],
        &[("ARTEX_READ_TOKEN_FILE", "")],
    );
    let open_http = worker_http(&c, &open).await;
    assert_eq!(http_get_as(&open_http, "/status", None).unwrap().0, 200);
    assert_eq!(open_stream(&open_http, None).0, 200);
}

#[tokio::test]
async fn three_hundred_event_streams_leave_the_database_to_everyone_else() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The worker's sessions carry a name of their own, to count them.
    let url = format!("{}&application_name=sse-worker", db.url);
    let w = Proc::worker("sse", &url, &["--max-event-streams", "300"]);
    let http = worker_http(&c, &w).await;
    let streams: Vec<Exchange> = (0..300)
        .map(|i| {
            let (code, stream) = open_stream(&http, Some(READ_TOKEN));
            assert_eq!(code, 200, "stream {i}");
            stream.expect("an open stream")
        })
        .collect();
    // One more is refused, not queued.
    assert_eq!(open_stream(&http, Some(READ_TOKEN)).0, 503);

    // Everyone else still gets in: a submit, a new worker, a plain session.
    let (code, out, err) = common::run_cli(&db.url, &["submit", "echo"]);
    assert_eq!(code, 0, "{out}{err}");
    let task = out.trim().to_string();
    let other = Proc::worker("newcomer", &db.url, &[]);
    worker_id(&c, &other).await;
    let plain = common::connect(&db.url).await;
    assert_eq!(count(&plain, "select 1::bigint").await, 1);

    // Streams are served: the task's events reach them.
    let mut streams = streams;
    for s in streams.iter_mut().step_by(100) {
        wait_event(s, &task);
    }
    // The worker's connections stay within its budget: pool (4) + heartbeats (2) + its
    // own LISTEN session + the feed's one LISTEN session.
    let sessions = count(
        &c,
        "select count(*) from pg_stat_activity where application_name = 'sse-worker'",
    )
    .await;
    assert!(sessions <= 8, "{sessions} sessions for 300 streams");
    drop(streams);
}

#[tokio::test]
async fn health_turns_503_while_postgres_hangs_and_200_when_it_answers_again() {
    let pg = PrivateCluster::start().await;
    let c = common::connect(&pg.url).await;
    let w = Proc::worker("hung-db", &pg.url, &[]);
    let http = worker_http(&c, &w).await;
    assert_eq!(http_get_as(&http, "/health", None).unwrap().0, 200);
    let frozen = freeze(&pg.cluster);
    // Within STALE_AFTER (3 s) of the last answer, which a probe may take up to a second
    // after the stop to see; the bound leaves a loaded host room and still fails a
    // /health that never turns.
    let body = wait_for(
        "/health to say 503 while PostgreSQL is stopped",
        Duration::from_secs(15),
        || {
            let http = http.clone();
            async move {
                let (code, body) = http_get_as(&http, "/health", None).ok()?;
                (code == 503).then_some(body)
            }
        },
    )
    .await;
    drop(frozen);
    // A reason about the database: the probe's verdict, or the worker's own failed
    // statement when that fails first (a connection it was opening as PostgreSQL stopped
    // times out; /health gives the probe's reason only once it is stale).
    assert!(
        body.contains("database: no answer for") || body.contains("database unreachable: "),
        "{body}"
    );
    wait_for(
        "/health to say 200 again once PostgreSQL answers",
        Duration::from_secs(15),
        || {
            let http = http.clone();
            async move { (http_get_as(&http, "/health", None).ok()?.0 == 200).then_some(()) }
        },
    )
    .await;
}

#[tokio::test]
async fn a_cli_command_against_a_server_that_never_answers_fails_within_seconds() {
    // Accepts TCP connections and never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in silent.incoming().take(8).flatten() {
            open.push(conn);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let url = format!("postgresql://artex@127.0.0.1:{port}/artex");
    let started = Instant::now();
    let mut child = std::process::Command::new(common::artex_bin())
        .args(["submit", "echo", "--payload", "{}"])
        .env("ARTEX_DATABASE_URL", &url)
        .env("ARTEX_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            panic!("artex submit still waits on a silent server after 15 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("did not answer"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    drop(held);
}

#[tokio::test]
async fn a_claim_abandoned_mid_transaction_never_goes_back_to_the_pool_open() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // One connection: whatever the next caller gets is the one the claim used.
    let bb = Blackboard::connect(&db.url, 1).unwrap();
    fixtures::worker(&bb, "w", &["echo"], 10).await;
    let task = bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    let planner = bb.planner();
    let claim = planner.dispatch(&ROUND, |_, _| -> Vec<Assignment> {
        panic!("a planning bug")
    });
    let outcome = std::panic::AssertUnwindSafe(claim).catch_unwind().await;
    assert!(outcome.is_err(), "the plan panicked");
    // The pool's connection is usable and outside any transaction; nothing stays
    // locked: the task is still pending and can be claimed again.
    bb.ping().await.unwrap();
    assert_eq!(
        count(
            &c,
            "select count(*) from pg_stat_activity where state like 'idle in transaction%' \
             and datname = current_database()"
        )
        .await,
        0
    );
    assert_eq!(
        bb.operator().task(task).await.unwrap().status.as_str(),
        "pending"
    );
    let again = bb
        .planner()
        .dispatch(&ROUND, |claimed, _| {
            claimed
                .iter()
                .map(|t| Assignment {
                    task: t.id,
                    worker: "w".into(),
                })
                .collect()
        })
        .await
        .unwrap();
    assert_eq!(again.assigned, 1);
    // A statement over the timeout is cancelled by the server, with a message that says
    // so: here an update waiting on a row lock another session holds.
    let limited = Blackboard::connect_with(
        &db.url,
        artex_actors::blackboard::DbLimits {
            statement_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    assert_statement_timeout(&c, &limited, task).await;
}

/// A running cluster held still: its postmaster and every child stopped (SIGSTOP) until
/// the hold is dropped, also when the test fails midway (a stopped postmaster would
/// otherwise make the cluster's shutdown wait out pg_ctl's minute).
mod dev_db_state {
    use artex::dev_db::{Cluster, ClusterState};
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    pub struct Frozen(Vec<i32>);

    /// Stops the postmaster first, so that no child is forked after the children are
    /// listed, then each child (a listing is repeated until it finds none left running).
    pub fn freeze(cluster: &Cluster) -> Frozen {
        let ClusterState::Running(pm) = cluster.status().expect("cluster status") else {
            panic!("the cluster is not running");
        };
        let pm = pm as i32;
        let mut frozen = Frozen(vec![pm]);
        let _ = kill(Pid::from_raw(pm), Signal::SIGSTOP);
        loop {
            let new: Vec<i32> = children(pm)
                .into_iter()
                .filter(|c| !frozen.0.contains(c))
                .collect();
            if new.is_empty() {
                return frozen;
            }
            for pid in new {
                let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
                frozen.0.push(pid);
            }
        }
    }

    impl Drop for Frozen {
        fn drop(&mut self) {
            for pid in &self.0 {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
            }
        }
    }

    fn children(pm: i32) -> Vec<i32> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid …: the fields after the last ')'.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(pm) {
                pids.push(pid);
            }
        }
        pids
    }
}

/// Peak resident memory of process `pid`, bytes (`VmHWM`).
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("VmHWM")
}

/// The worker's memory budget for what it holds (`--queue-max-bytes`, 64 MiB): eight
/// 50 MB payloads at concurrency 2 are read one at a time, not eight at once (2.19 GB).
#[tokio::test]
async fn eight_fifty_megabyte_payloads_keep_the_worker_within_its_memory_bound() {
    const MB: i64 = 1024 * 1024;
    /// The bound for one 50 MB payload held at a time (`--queue-max-bytes`: docs/cli.md).
    const BOUND: u64 = 450 * 1024 * 1024;
    let db = TestDb::new().await;
    let c = db.client().await;
    db.bb
        .operator()
        .set_max_payload_bytes(64 * MB as i32)
        .await
        .unwrap();
    // Made in the database: 400 MB of payloads need not cross the wire twice.
    c.execute(
        "insert into artex.tasks (kind, payload) \
         select 'sleep', jsonb_build_object('ms', 10, 'blob', repeat('x', $1::int)) \
         from generate_series(1, 8)",
        &[&(50 * MB as i32)],
    )
    .await
    .unwrap();
    let w = Proc::worker("big", &db.url, &["--concurrency", "2"]);
    worker_id(&c, &w).await;
    let _p = Proc::planner("planner", &db.url, &[]);
    wait_for(
        "the eight tasks to succeed",
        Duration::from_secs(280),
        || {
            let c = &c;
            async move {
                let done = count(
                    c,
                    "select count(*) from artex.tasks where status = 'succeeded'",
                )
                .await;
                (done == 8).then_some(())
            }
        },
    )
    .await;
    let peak = peak_rss(w.pid());
    println!("FIGURE worker_peak_rss_8x50MB_bytes={peak}");
    assert!(
        peak < BOUND,
        "worker peak RSS {} MB over the bound {} MB",
        peak / 1024 / 1024,
        BOUND / 1024 / 1024
    );
}

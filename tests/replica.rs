//! Operators read from a streaming replica (`--read-database-url`): a private primary and
//! a hot standby made from it with `pg_basebackup` (a physical standby replicates a whole
//! cluster, so the shared test cluster cannot have one per test), real `artex serve` and
//! CLI processes. With the standby's replay paused, lists show what the replica has and
//! the primary has more: reads come from the replica, writes and the feed from the
//! primary, an operator's change is in the next read that asks for it (through the API
//! and on the dashboard's page after a click), and the lag is shown. One pair serves
//! every part (setting one up costs a few seconds).

// The dashboard's tests use the rest of it.
#[allow(dead_code)]
#[path = "common/browser.rs"]
mod browser;
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use artex::dev_db::{find_server_binaries, Cluster, ClusterOptions};
use artex_actors::Blackboard;
use artex_testkit::http::Request;
use browser::Browser;
use common::procs::{serve_address, wait_for, worker_http, Proc};
use common::{connect, run_cli, READ_TOKEN};
use serde_json::{json, Value};
use tokio_postgres::Client;

const WRITE_TOKEN: &str = "replica-test-write-token";

/// A primary (the dev_db cluster code) and a hot standby streaming from it; both stopped
/// when dropped.
struct Pair {
    primary: Cluster,
    /// The migrated `artex` database on the primary.
    primary_url: String,
    /// The same database on the standby (key=value form, as a user may give it).
    replica_url: String,
    standby: PathBuf,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// `program` of the PostgreSQL binaries, as the `postgres` user when we are root (the
/// server refuses to run as root; the harness's clusters run as that user too).
fn server_command(bin: &Path, program: &str) -> Command {
    if nix::unistd::geteuid().is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"])
            .arg(bin.join(program))
            .current_dir("/");
        cmd
    } else {
        Command::new(bin.join(program))
    }
}

/// Runs `cmd` to its end; a failure panics with its standard error and `log`.
fn run(mut cmd: Command, what: &str, log: Option<&Path>) {
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log.map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .unwrap_or_default()
    );
}

impl Pair {
    async fn start() -> Pair {
        let dir = tempfile::tempdir().expect("temp dir");
        // The server's user must reach both clusters' folders.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        // Where pg_ctl really lives holds pg_basebackup too (PATH may have links to the
        // server's programs only).
        let bin = find_server_binaries()
            .expect("PostgreSQL binaries")
            .join("pg_ctl")
            .canonicalize()
            .expect("pg_ctl")
            .parent()
            .expect("its folder")
            .to_path_buf();
        let primary = Cluster::new(ClusterOptions {
            unsafe_fast: true,
            ..ClusterOptions::new(dir.path().join("primary"))
        })
        .expect("PostgreSQL binaries");
        let home = dir.path().join("standby");
        let standby = home.join("pg");
        // Made now, so that a failure below stops what was started.
        let pair = Pair {
            primary_url: primary.url("artex"),
            replica_url: format!(
                "host={} port=5432 user=postgres dbname=artex",
                standby.display()
            ),
            primary,
            standby,
            bin,
            dir,
        };
        pair.primary.start().expect("starting the primary");
        artex_actors::blackboard::admin::create_database(
            &pair.primary.url("postgres"),
            "artex",
            None,
        )
        .await
        .expect("creating the database");
        Blackboard::connect(&pair.primary_url, 1)
            .expect("pool")
            .maintenance()
            .migrate()
            .await
            .expect("migrating the primary");

        std::fs::create_dir(&home).expect("standby folder");
        if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres")
                .expect("users")
                .expect("the postgres user");
            nix::unistd::chown(&home, Some(pg.uid), Some(pg.gid)).expect("chown");
        }
        let mut backup = server_command(&pair.bin, "pg_basebackup");
        backup
            .arg("-D")
            .arg(&pair.standby)
            .args([
                "-R", "-X", "stream", "-c", "fast", "-U", "postgres", "-p", "5432", "-h",
            ])
            .arg(pair.primary.socket_dir());
        run(backup, "pg_basebackup", None);
        // The primary's socket lock lives in its data folder (its socket folder), and
        // comes with the copy: the standby would take it for a live server's.
        let _ = std::fs::remove_file(pair.standby.join(".s.PGSQL.5432.lock"));
        // Its own socket; everything else as the primary's (copied with the data).
        let conf = pair.standby.join("postgresql.auto.conf");
        let mut auto = std::fs::read_to_string(&conf).expect("postgresql.auto.conf");
        auto.push_str(&format!(
            "unix_socket_directories = '{}'\n",
            pair.standby.display()
        ));
        std::fs::write(&conf, auto).expect("postgresql.auto.conf");
        let log = home.join("log");
        let mut start = server_command(&pair.bin, "pg_ctl");
        start
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&pair.standby)
            .arg("-l")
            .arg(&log);
        run(start, "starting the standby", Some(&log));
        pair
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let mut stop = server_command(&self.bin, "pg_ctl");
        stop.args(["stop", "-m", "immediate", "-D"])
            .arg(&self.standby)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = stop.status();
        let _ = self.primary.stop();
    }
}

/// Pauses the standby's replay and waits until it has stopped.
async fn pause_replay(standby: &Client) {
    standby
        .batch_execute("select pg_wal_replay_pause()")
        .await
        .expect("pausing replay");
    wait_for("replay to pause", Duration::from_secs(20), || async {
        let state: String = standby
            .query_one("select pg_get_wal_replay_pause_state()", &[])
            .await
            .ok()?
            .get(0);
        (state == "paused").then_some(())
    })
    .await;
}

/// The primary's WAL insert position now.
async fn insert_position(primary: &Client) -> String {
    primary
        .query_one("select pg_current_wal_insert_lsn()::text", &[])
        .await
        .expect("the WAL insert position")
        .get(0)
}

/// Waits until the standby has received the WAL up to `lsn` (replayed or not).
async fn received(standby: &Client, lsn: &str) {
    standby_at(standby, lsn, "receive").await;
}

/// Waits until the standby has replayed the WAL up to `lsn`.
async fn replayed(standby: &Client, lsn: &str) {
    standby_at(standby, lsn, "replay").await;
}

/// Waits until the standby's WAL position `pg_last_wal_{step}_lsn()` reaches `lsn`.
async fn standby_at(standby: &Client, lsn: &str, step: &str) {
    let sql = format!("select pg_last_wal_{step}_lsn() >= $1::text::pg_lsn");
    wait_for(
        &format!("the standby to {step}"),
        Duration::from_secs(30),
        || async {
            standby
                .query_one(sql.as_str(), &[&lsn])
                .await
                .ok()?
                .get::<_, bool>(0)
                .then_some(())
        },
    )
    .await;
}

fn get(addr: &str, path: &str, after: Option<&str>) -> (Value, Option<String>, u16) {
    let mut req = Request::get(path).bearer(READ_TOKEN);
    if let Some(lsn) = after {
        req = req.header("Artex-After-Lsn", lsn);
    }
    let r = req.send(addr).expect("GET");
    let from = r.header("artex-read-from").map(str::to_string);
    (r.json_or_null(), from, r.status)
}

/// POSTs `body` with the write token; returns the answer and its `Artex-Lsn`.
fn post(addr: &str, path: &str, body: Value) -> (Value, String) {
    let r = Request::new("POST", path)
        .bearer(WRITE_TOKEN)
        .json(&body)
        .send(addr)
        .expect("POST");
    assert!(r.status < 300, "{path}: {} {}", r.status, r.text());
    let lsn = r
        .header("artex-lsn")
        .unwrap_or_else(|| panic!("{path}: no Artex-Lsn on a write's answer"))
        .to_string();
    (r.json(), lsn)
}

fn ids(page: &Value) -> Vec<String> {
    page["tasks"]
        .as_array()
        .expect("a page")
        .iter()
        .map(|t| t["id"].as_str().expect("an id").to_string())
        .collect()
}

#[tokio::test]
async fn operators_read_from_the_replica() {
    let pair = Pair::start().await;
    let standby = connect(&pair.replica_url).await;
    let primary = connect(&pair.primary_url).await;
    let write_file = pair.dir.path().join("write-token");
    std::fs::write(&write_file, WRITE_TOKEN).expect("token");
    let serve = Proc::start(
        "serve",
        &pair.primary_url,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--write-token-file",
            write_file.to_str().expect("path"),
            "--public-read",
            "--read-database-url",
            &pair.replica_url,
            // Its replay stays paused for a while below, and the point is that the
            // replica serves reads meanwhile: no fallback for lag here.
            "--read-max-lag",
            "1h",
        ],
        &[],
    );
    let addr = serve_address(&serve).await;
    let task =
        |n: u32| json!({ "kind": "echo", "payload": { "n": n }, "allow_unregistered_kind": true });

    // Tasks submitted through the API, once replayed, are listed from the replica.
    let (a, _) = post(&addr, "/api/v1/tasks", task(1));
    let a = a["id"].as_str().expect("id").to_string();
    let (c, lsn_c0) = post(&addr, "/api/v1/tasks", task(3));
    let c = c["id"].as_str().expect("id").to_string();
    replayed(&standby, &lsn_c0).await;
    let (page, from, _) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(from.as_deref(), Some("replica"));
    assert_eq!(ids(&page), [c.as_str(), a.as_str()]);

    // Replay paused: the replica stands still while the primary moves on.
    pause_replay(&standby).await;
    let (head, _, _) = get(&addr, "/api/v1/events/head", None);
    let head = head["after"].as_str().expect("a position").to_string();
    let (b, lsn_b) = post(&addr, "/api/v1/tasks", task(2));
    let b = b["id"].as_str().expect("id").to_string();
    // Written to the primary (a standby refuses writes).
    let on_primary: i64 = primary
        .query_one("select count(*) from artex.tasks", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(on_primary, 3);

    // Lists, pages and statistics come from the replica: without B.
    let (page, from, _) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(from.as_deref(), Some("replica"));
    assert_eq!(
        ids(&page),
        [c.as_str(), a.as_str()],
        "the paused replica lists no B"
    );
    let (_, _, status) = get(&addr, &format!("/api/v1/tasks/{b}"), None);
    assert_eq!(status, 404, "the paused replica has no B");
    let (stats, from, _) = get(&addr, "/api/v1/stats", None);
    assert_eq!(from.as_deref(), Some("replica"));
    assert_eq!(stats["by_status"]["pending"], 2);
    // …and say how far behind it is.
    let lag = &stats["replica"];
    assert_eq!(lag["in_recovery"], true, "{stats}");
    assert!(lag["lag_bytes"].as_u64().expect("lag bytes") > 0, "{lag}");
    assert!(lag["lag_ms"].as_f64().expect("lag ms") >= 0.0, "{lag}");
    let (replica, _, _) = get(&addr, "/api/v1/replica", None);
    assert!(replica["replica"]["lag_bytes"].as_u64().expect("lag") > 0);
    for path in ["/api/v1/workers", "/api/v1/flows", "/api/v1/schedules"] {
        let (_, from, status) = get(&addr, path, None);
        assert_eq!((status, from.as_deref()), (200, Some("replica")), "{path}");
    }

    // The read after a write, asking for it, sees it: the replica cannot replay it (its
    // replay is paused), so the primary answers.
    let (shown, from, _) = get(&addr, &format!("/api/v1/tasks/{b}"), Some(&lsn_b));
    assert_eq!(from.as_deref(), Some("primary"));
    assert_eq!(shown["task"]["status"], "pending");
    // An operator's control: cancel A; the next page shows it canceled, while a read
    // that does not ask still gets the replica's older state.
    let (_, lsn_c) = post(&addr, &format!("/api/v1/tasks/{a}/cancel"), json!({}));
    let (shown, from, _) = get(&addr, &format!("/api/v1/tasks/{a}"), Some(&lsn_c));
    assert_eq!(
        (shown["task"]["status"].as_str(), from.as_deref()),
        (Some("canceled"), Some("primary"))
    );
    let (stale, from, _) = get(&addr, &format!("/api/v1/tasks/{a}"), None);
    assert_eq!(
        (stale["task"]["status"].as_str(), from.as_deref()),
        (Some("pending"), Some("replica"))
    );
    let (bad, _, status) = get(&addr, "/api/v1/tasks", Some("not-a-position"));
    assert_eq!(
        (status, bad["field"].as_str()),
        (400, Some("Artex-After-Lsn"))
    );

    // The feed is the primary's: it moved on with B while the replica stood still.
    let (now, _, _) = get(&addr, "/api/v1/events/head", None);
    assert_ne!(now["after"].as_str(), Some(head.as_str()));
    let mut stream = Request::get(&format!("/api/v1/events?after={head}"))
        .bearer(READ_TOKEN)
        .start(&addr)
        .expect("the feed");
    assert_eq!(stream.head().expect("the feed's head").status, 200);
    let mut line = String::new();
    while !line.contains(&b) {
        line.clear();
        assert!(
            stream.read_line(&mut line).expect("an event") > 0,
            "the feed ended without B"
        );
    }
    drop(stream);

    // The CLI's reads: from the replica with --read-database-url, writes from the same
    // command line to the primary.
    let replica_flag = ["--read-database-url", pair.replica_url.as_str()];
    let cli = |args: &[&str], replica: bool| {
        let mut all: Vec<&str> = args.to_vec();
        if replica {
            all.extend(replica_flag);
        }
        let (code, out, err) = run_cli(&pair.primary_url, &all);
        (code, out, err)
    };
    let cli_ids = |out: &str| ids(&serde_json::from_str(out).expect("JSON"));
    let (code, out, err) = cli(&["tasks", "--json"], true);
    assert_eq!(code, 0, "{err}");
    assert_eq!(cli_ids(&out), [c.as_str(), a.as_str()]);
    let (code, out, err) = cli(&["tasks", "--json"], false);
    assert_eq!(code, 0, "{err}");
    assert_eq!(cli_ids(&out), [b.as_str(), c.as_str(), a.as_str()]);
    let (code, _, err) = cli(&["task", "show", &b], true);
    assert_ne!(code, 0, "the replica has no B yet");
    assert!(err.contains("no task"), "{err}");
    let (code, out, err) = cli(&["stats", "--json"], true);
    assert_eq!(code, 0, "{err}");
    let stats: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(stats["by_status"]["pending"], 2);
    assert!(stats["replica"]["lag_bytes"].as_u64().expect("lag") > 0);
    for args in [&["workers", "--json"][..], &["flow", "list", "--json"]] {
        let (code, _, err) = cli(args, true);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    let (code, _, err) = cli(&["cancel", &b], true);
    assert_eq!(code, 0, "a write goes to the primary: {err}");
    let (code, _, err) = run_cli(
        &pair.primary_url,
        &["tasks", "--read-database-url", "mysql://replica/artex"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--read-database-url: 'mysql://' is not PostgreSQL"),
        "{err}"
    );

    // A worker's --api reads the replica too. (It runs kind `fail` only: it would claim
    // the pending echo tasks the dashboard pauses below.)
    let worker = Proc::worker(
        "worker",
        &pair.primary_url,
        &[
            "--kinds",
            "fail",
            "--api",
            "--read-database-url",
            &pair.replica_url,
            "--read-max-lag",
            "1h",
        ],
    );
    let worker_addr = worker_http(&primary, &worker).await;
    let (page, from, _) = get(&worker_addr, "/api/v1/tasks", None);
    assert_eq!(from.as_deref(), Some("replica"));
    assert_eq!(ids(&page), [c.as_str(), a.as_str()], "the paused replica's");
    // Its /health and /metrics say the replica serves its reads.
    let (status, health) = fetch(&worker_addr, "/health");
    let health: Value = serde_json::from_str(&health).expect("JSON");
    assert_eq!(
        (status, health["replica"]["serves_reads"].as_bool()),
        (200, Some(true)),
        "{health}"
    );
    let (_, metrics) = fetch(&worker_addr, "/metrics");
    assert!(
        metrics.contains("artex_replica_serves_reads 1"),
        "{metrics}"
    );
    drop(worker);

    // The dashboard: a task the replica shows pending is paused with its button, and
    // the page after the click shows it paused although the replica still lags; the
    // overview shows the lag.
    let browser = Browser::start().await;
    browser.goto(&format!("http://{addr}/#/tasks/{c}")).await;
    browser
        .until(
            "C shown pending",
            "return !!document.querySelector('#task-status [data-status=pending]')",
        )
        .await;
    browser.click("button[data-action=pause]").await;
    browser.confirm().await;
    browser.give_token(WRITE_TOKEN).await;
    browser
        .until(
            "C shown paused after the click",
            "return !!document.querySelector('#task-status [data-status=paused]')",
        )
        .await;
    let (stale, _, _) = get(&addr, &format!("/api/v1/tasks/{c}"), None);
    assert_eq!(stale["task"]["status"], "pending", "the replica still lags");
    browser.goto(&format!("http://{addr}/#/")).await;
    browser
        .until(
            "the overview's replica lag",
            "return !!document.querySelector('[data-metric=replica-lag]')",
        )
        .await;
    browser.assert_no_errors().await;
    browser.close().await;

    // Replay resumed: once the replica has replayed the cancel, it serves the read that
    // asks for it, and shows both.
    standby
        .batch_execute("select pg_wal_replay_resume()")
        .await
        .expect("resuming replay");
    wait_for(
        "the standby to show B canceled",
        Duration::from_secs(30),
        || async {
            let status: String = standby
                .query_one(
                    "select status::text from artex.tasks where id = $1::text::uuid",
                    &[&b],
                )
                .await
                .ok()?
                .get(0);
            (status == "canceled").then_some(())
        },
    )
    .await;
    let (shown, from, _) = get(&addr, &format!("/api/v1/tasks/{a}"), Some(&lsn_c));
    assert_eq!(
        (shown["task"]["status"].as_str(), from.as_deref()),
        (Some("canceled"), Some("replica"))
    );
    let (page, _, _) = get(&addr, "/api/v1/tasks?status=canceled", None);
    assert_eq!(page["tasks"].as_array().map(Vec::len), Some(2));
}

/// `GET path` (open or read scope): status and body.
fn fetch(addr: &str, path: &str) -> (u16, String) {
    let r = Request::get(path)
        .bearer(READ_TOKEN)
        .send(addr)
        .expect("GET");
    (r.status, r.text())
}

/// The replica's state in `/health` (which must answer 200 whatever it is).
fn replica_state(addr: &str) -> String {
    let (status, body) = fetch(addr, "/health");
    assert_eq!(status, 200, "/health: {body}");
    let health: Value = serde_json::from_str(&body).expect("JSON");
    health["replica"]["state"]
        .as_str()
        .unwrap_or_else(|| panic!("/health has no replica state: {health}"))
        .to_string()
}

/// Waits until `/health` says the replica is `state`.
async fn replica_becomes(addr: &str, state: &str) {
    wait_for(
        &format!("the replica to be {state}"),
        Duration::from_secs(30),
        || async { (replica_state(addr) == state).then_some(()) },
    )
    .await;
}

/// `artex_replica_read_fallbacks_total` for `reason` in `/metrics`.
fn fallbacks(addr: &str, reason: &str) -> u64 {
    let (status, text) = fetch(addr, "/metrics");
    assert_eq!(status, 200, "/metrics: {text}");
    let line = format!("artex_replica_read_fallbacks_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("/metrics has no {line}: {text}"))
        .parse()
        .expect("a count")
}

/// Stops (`stop`) or starts the standby's server.
fn standby_server(pair: &Pair, action: &str) {
    let mut cmd = server_command(&pair.bin, "pg_ctl");
    cmd.args([action, "-w", "-t", "60", "-m", "fast", "-D"])
        .arg(&pair.standby);
    if action == "start" {
        cmd.arg("-l")
            .arg(pair.standby.parent().expect("home").join("log"));
    }
    run(cmd, &format!("pg_ctl {action} (standby)"), None);
}

/// Reads degrade, never fail: while the replica's replay is paused past
/// `--read-max-lag`, while its server is down, and when it cancels a read to replay WAL
/// that conflicts with it, reads come from the primary and say so; `/health` stays 200
/// and tells why; `/metrics` counts each fallback by its reason; the replica serves
/// again once it is well. The CLI reads the primary when the replica is down.
#[tokio::test]
async fn reads_go_to_the_primary_while_the_replica_lags_is_down_or_conflicts() {
    let pair = Pair::start().await;
    let standby = connect(&pair.replica_url).await;
    // The primary's connection on a standby (a failover under way, or a URL naming the
    // replica) reads no WAL position there: the primary unreachable, the API's 503, and
    // not a fault (the fleet soak met it as a 500).
    let on_standby = Blackboard::connect(&pair.replica_url, 1)
        .expect("pool")
        .operator();
    let e = on_standby
        .written_position()
        .await
        .expect_err("a standby has no insert position");
    assert!(
        matches!(e, artex_actors::Error::NotPrimary(_)) && e.is_connection(),
        "{e:?}"
    );
    let primary = connect(&pair.primary_url).await;
    let write_file = pair.dir.path().join("write-token");
    std::fs::write(&write_file, WRITE_TOKEN).expect("token");
    let serve = Proc::start(
        "serve",
        &pair.primary_url,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--write-token-file",
            write_file.to_str().expect("path"),
            "--public-read",
            "--read-database-url",
            &pair.replica_url,
            "--read-max-lag",
            "1s",
        ],
        &[],
    );
    let addr = serve_address(&serve).await;
    let task =
        |n: u32| json!({ "kind": "echo", "payload": { "n": n }, "allow_unregistered_kind": true });
    replica_becomes(&addr, "ok").await;
    let (a, lsn) = post(&addr, "/api/v1/tasks", task(1));
    let a = a["id"].as_str().expect("id").to_string();
    replayed(&standby, &lsn).await;
    let (page, from, _) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(
        (from.as_deref(), ids(&page)),
        (Some("replica"), vec![a.clone()])
    );

    // Lagging: replay paused while the primary moves on.
    pause_replay(&standby).await;
    let (b, _) = post(&addr, "/api/v1/tasks", task(2));
    let b = b["id"].as_str().expect("id").to_string();
    replica_becomes(&addr, "lagging").await;
    let (page, from, status) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(
        (status, from.as_deref(), ids(&page)),
        (200, Some("primary"), vec![b.clone(), a.clone()]),
        "a lagging replica serves no read"
    );
    let (_, health) = fetch(&addr, "/health");
    assert!(
        health.contains("replica: reads go to the primary") && health.contains("\"ready\":true"),
        "{health}"
    );
    assert!(fallbacks(&addr, "lagging") >= 1);
    standby
        .batch_execute("select pg_wal_replay_resume()")
        .await
        .expect("resuming replay");
    replica_becomes(&addr, "ok").await;
    let (page, from, _) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(
        (from.as_deref(), ids(&page)),
        (Some("replica"), vec![b.clone(), a.clone()])
    );

    // Down: its server stopped. The first read after it goes to the primary whether the
    // check or the read itself finds it gone.
    drop(standby);
    standby_server(&pair, "stop");
    for path in [
        "/api/v1/tasks",
        "/api/v1/stats",
        "/api/v1/replica",
        "/api/v1/workers",
    ] {
        let (_, from, status) = get(&addr, path, None);
        assert_eq!(status, 200, "{path} with the replica down");
        if path != "/api/v1/replica" {
            assert_eq!(from.as_deref(), Some("primary"), "{path}");
        }
    }
    replica_becomes(&addr, "unreachable").await;
    assert!(fallbacks(&addr, "unreachable") >= 1);
    let (replica, _, _) = get(&addr, "/api/v1/replica", None);
    assert_eq!(
        (
            &replica["replica"],
            replica["health"]["serves_reads"].as_bool()
        ),
        (&Value::Null, Some(false)),
        "{replica}"
    );
    let (code, out, err) = run_cli(
        &pair.primary_url,
        &["tasks", "--json", "--read-database-url", &pair.replica_url],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("replica of --read-database-url is unreachable"),
        "{err}"
    );
    assert_eq!(
        ids(&serde_json::from_str(&out).expect("JSON")),
        [b.clone(), a.clone()]
    );
    standby_server(&pair, "start");
    replica_becomes(&addr, "ok").await;
    let (_, from, _) = get(&addr, "/api/v1/tasks", None);
    assert_eq!(from.as_deref(), Some("replica"));

    // A conflict: the standby cancels a read at once to replay a lock it conflicts with
    // (max_standby_streaming_delay = 0); the read is made again on the primary. The read
    // walks 300,000 tasks for a payload none has. The lock is taken while the standby's
    // replay is paused, so its WAL is there before the read starts; replay resumes once
    // the read is seen running and cancels it within milliseconds, however slowly WAL
    // travels on a loaded host (a read of ~70 ms used to end before it arrived).
    let standby = connect(&pair.replica_url).await;
    let conf = pair.standby.join("postgresql.auto.conf");
    let mut auto = std::fs::read_to_string(&conf).expect("postgresql.auto.conf");
    auto.push_str("max_standby_streaming_delay = 0\n");
    std::fs::write(&conf, auto).expect("postgresql.auto.conf");
    standby
        .batch_execute("select pg_reload_conf()")
        .await
        .expect("reload");
    primary
        .batch_execute(
            "insert into artex.tasks (kind, payload)
                 select 'echo', jsonb_build_object('n', g) from generate_series(1, 300000) g",
        )
        .await
        .expect("300,000 tasks");
    replayed(&standby, &insert_position(&primary).await).await;
    let mut conflicted = false;
    for _ in 0..10 {
        replica_becomes(&addr, "ok").await;
        let before = fallbacks(&addr, "conflict");
        pause_replay(&standby).await;
        primary
            .batch_execute("begin; lock table artex.tasks in access exclusive mode; commit")
            .await
            .expect("a lock the standby replays");
        received(&standby, &insert_position(&primary).await).await;
        let reader = {
            let addr = addr.clone();
            std::thread::spawn(move || {
                get(
                    &addr,
                    "/api/v1/tasks?where=%7B%22absent%22%3A1%7D&limit=1",
                    None,
                )
            })
        };
        let running = wait_for(
            "the read on the standby",
            Duration::from_secs(10),
            || async {
                if reader.is_finished() {
                    return Some(false);
                }
                let n: i64 = standby
                    .query_one(
                        // A page's statement (its text is cut at 1 kB: the filter is not
                        // in what pg_stat_activity keeps).
                        "select count(*) from pg_stat_activity
                     where state = 'active' and pid <> pg_backend_pid()
                       and query like 'select t.id, t.kind, t.status::text,%'",
                        &[],
                    )
                    .await
                    .ok()?
                    .get(0);
                (n > 0).then_some(true)
            },
        )
        .await;
        standby
            .batch_execute("select pg_wal_replay_resume()")
            .await
            .expect("resuming replay");
        let (page, from, status) = reader.join().expect("the read");
        assert_eq!((status, &page["tasks"]), (200, &json!([])), "{page}");
        if running && fallbacks(&addr, "conflict") > before {
            assert_eq!(from.as_deref(), Some("primary"), "a cancelled read");
            conflicted = true;
            break;
        }
    }
    assert!(
        conflicted,
        "no read was cancelled by a conflict in ten tries"
    );
    drop(serve);
}

//! replica: W1 while a dashboard reads a streaming replica, or the primary. A hot standby
//! of the bench's cluster (pg_basebackup, streaming, asynchronous, on its own socket), a
//! database of ARTEX_BENCH_REPLICA_TASKS finished tasks (default 1,000,000; `--quick`
//! 20,000; as `dash` makes them, its pending ones paused), and two `artex serve`: one with
//! `--read-database-url` on the standby, one on the primary alone. W1 (20,000 no-op tasks,
//! 1 planner + 2 workers; a few seconds each) runs in rounds of three — with no dashboard
//! load, with the dashboard's requests (`dash`'s, one client in a loop, or
//! ARTEX_BENCH_REPLICA_CLIENTS of them) against the replica's serve, against the
//! primary's — after one warm-up run; ARTEX_BENCH_REPLICA_ROUNDS rounds (default 5,
//! `--quick` 1; interleaved, so that the table's growth and the box's other load fall on
//! all three alike). Each as the median tasks/s, and as a ratio to the median without
//! load; the dashboard's requests/s (and any failed request) beside it.
//!
//! With ARTEX_BENCH_REPLICA_PIN=1 (and 2 cores or more) the two sides stand in for two
//! hosts: the primary, its serve, the planner and workers on core 0, the standby, its
//! serve and the dashboard's clients on core 1 (taskset), in all three runs alike; by
//! default everything shares every core, the standby's replay and queries included.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio_postgres::Client;

use crate::dash::{fill_busy_hour, get, PATHS};
use crate::report::{fixed, result, Progress};
use crate::rig::{exec, server_pids};
use crate::w1::unix_now;
use crate::{sql, Bench};

const DB: &str = "bench_replica";
const LABELS: [&str; 3] = [
    "no_dashboard",
    "dashboard_on_replica",
    "dashboard_on_primary",
];

pub async fn run(bench: &mut Bench) {
    let n = if bench.quick {
        20_000
    } else {
        env_number("ARTEX_BENCH_REPLICA_TASKS", 1_000_000)
    };
    let rounds = if bench.quick {
        1
    } else {
        env_number("ARTEX_BENCH_REPLICA_ROUNDS", 5)
    };
    let standby = Standby::start(bench);
    pin("1", &server_pids(&standby.pgdata));
    pin("0", &server_pids(bench.rig.pgdata()));
    let c = bench.rig.new_db(DB).await;
    let sc = crate::common::connect(&standby.url("postgres")).await;
    fill(bench, &c, &sc, n).await;
    let read = format!("--read-database-url={}", standby.url(DB));
    let (on_replica, replica_addr) = bench.rig.serve(DB, &["--public-read", &read]).await;
    pin("1", &on_replica.id().into_iter().collect::<Vec<_>>());
    let (on_primary, primary_addr) = bench.rig.serve(DB, &["--public-read"]).await;
    pin("0", &on_primary.id().into_iter().collect::<Vec<_>>());
    if pinned() {
        println!("# replica: pinned: the primary's side on core 0, the standby's on core 1");
    }
    warm_up(&replica_addr, &primary_addr).await;
    let mut runs = Runs::default();
    w1_round(bench, &c, &sc, "warm_up", None, &mut runs).await;
    for _ in 0..rounds {
        for (label, addr) in LABELS
            .iter()
            .zip([None, Some(&replica_addr), Some(&primary_addr)])
        {
            w1_round(bench, &c, &sc, label, addr.map(String::as_str), &mut runs).await;
        }
    }
    report(&runs, rounds);
    let all = (0..num_cpus())
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    pin(&all, &server_pids(bench.rig.pgdata()));
    let lag = tokio::task::spawn_blocking(move || get(&replica_addr, "/api/v1/replica").1)
        .await
        .expect("the lag");
    println!("# replica: lag at the end: {lag}");
    drop((on_replica, on_primary, sc));
    standby.stop("fast");
    bench.rig.drop_db(DB, c).await;
}

/// `n` tasks as `dash` makes them, the pending ones paused, replayed by the standby.
async fn fill(bench: &Bench, c: &Client, standby: &Client, n: u32) {
    fill_busy_hour(c, n).await;
    exec(c, sql::REPLICA_ROLE).await;
    exec(c, sql::PAUSE_PENDING).await;
    exec(c, sql::REPLICA_ROLE_RESET).await;
    exec(c, sql::VACUUM_ANALYZE_TASKS).await;
    wait_replayed(&bench.rig.admin, standby).await;
    let recovery: String = standby
        .query_one(sql::IN_RECOVERY, &[])
        .await
        .expect("recovery")
        .get(0);
    let w1 = bench.sizes.w1;
    println!(
        "# replica: {n} tasks, a streaming standby ({recovery}), W1 {w1} tasks with 2 workers"
    );
}

fn env_number(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{var}: a number")))
        .unwrap_or(default)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Each W1's tasks/s and the dashboard's requests/s, by label; the failed requests.
#[derive(Default)]
struct Runs {
    w1: BTreeMap<String, Vec<f64>>,
    dash: BTreeMap<String, Vec<f64>>,
    failures: usize,
}

/// Each serve's connections and statements, both servers' caches; the replica's serve
/// must say it reads the replica.
async fn warm_up(replica: &str, primary: &str) {
    let (replica, primary) = (replica.to_string(), primary.to_string());
    tokio::task::spawn_blocking(move || {
        for addr in [&replica, &primary] {
            for (_, path) in PATHS {
                let (status, body) = get(addr, path);
                assert_eq!(status, 200, "replica: warm-up GET {path}: {body}");
            }
        }
        let r = artex_testkit::http::Request::get("/api/v1/tasks?limit=1")
            .send(&replica)
            .expect("a request to the replica's serve");
        assert_eq!(
            r.header("artex-read-from"),
            Some("replica"),
            "replica: the serve does not read the replica"
        );
    })
    .await
    .expect("the warm-up");
}

/// One W1 of the bench's size on 1 planner + 2 workers, the dashboard's load on `load`
/// if any: its tasks/s and the load's requests/s go into `runs` under `label`.
async fn w1_round(
    bench: &mut Bench,
    c: &Client,
    standby: &Client,
    label: &str,
    load: Option<&str>,
    runs: &mut Runs,
) {
    let n = bench.sizes.w1;
    c.execute(sql::INSERT_NOOPS, &[&(n as i32)])
        .await
        .expect("W1's tasks");
    exec(c, sql::VACUUM_ANALYZE_TASKS).await;
    wait_replayed(&bench.rig.admin, standby).await;
    let dash = load.map(DashLoad::start);
    if dash.is_some() {
        // The load running before W1 starts.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let counted_from = dash.as_ref().map(DashLoad::count);
    let t0 = unix_now();
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(DB, 2, "artex", &args);
    pin("0", &bench.rig.pids());
    let mut progress = Progress::new(&format!("replica {label}"), n.into());
    bench.rig.drained(c, &mut progress).await;
    let secs = unix_now() - t0;
    bench.rig.stop_runtime().await;
    let (reqs, failed) = match dash {
        Some(d) => {
            let (count, failed) = d.stop();
            (count - counted_from.unwrap_or(0), failed)
        }
        None => (0, Vec::new()),
    };
    let rate: f64 = c
        .query_one(sql::REPLICA_W1_RATE, &[&(n as i32), &t0])
        .await
        .expect("W1's rate")
        .get(0);
    println!(
        "# replica: W1 {label}: {} tasks/s; dashboard requests: {reqs} in {} s",
        fixed(rate, 0),
        fixed(secs, 1)
    );
    if !failed.is_empty() {
        println!("# replica: failed dashboard requests ({label}):");
        for f in &failed {
            println!("#   {f}");
        }
        runs.failures += failed.len();
    }
    runs.w1.entry(label.into()).or_default().push(rate);
    let per_s: f64 = fixed(reqs as f64 / secs, 2).parse().unwrap_or(0.0);
    runs.dash.entry(label.into()).or_default().push(per_s);
}

fn report(runs: &Runs, rounds: u32) {
    let w1 = |label: &str| median(&runs.w1[label]);
    let dash = |label: &str| median(&runs.dash[label]);
    let (base, replica, primary) = (w1(LABELS[0]), w1(LABELS[1]), w1(LABELS[2]));
    let unit = format!("tasks/s (median of {rounds})");
    result("replica_w1_tasks_per_s_no_dashboard", fixed(base, 0), &unit);
    result(
        "replica_w1_tasks_per_s_dashboard_on_replica",
        fixed(replica, 0),
        &unit,
    );
    result(
        "replica_w1_tasks_per_s_dashboard_on_primary",
        fixed(primary, 0),
        &unit,
    );
    let reqs = "requests/s (median)";
    result(
        "replica_dash_requests_per_s_on_replica",
        dash(LABELS[1]),
        reqs,
    );
    result(
        "replica_dash_requests_per_s_on_primary",
        dash(LABELS[2]),
        reqs,
    );
    result(
        "replica_w1_ratio_dashboard_on_replica",
        fixed(replica / base, 2),
        "ratio (target >= 0.9)",
    );
    result(
        "replica_w1_ratio_dashboard_on_primary",
        fixed(primary / base, 2),
        "ratio",
    );
    result("replica_dash_failed_requests", runs.failures, "requests");
}

/// The middle value, or the mean of the two middle ones.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Until the standby has replayed everything the primary has written.
async fn wait_replayed(admin: &Client, standby: &Client) {
    let target: String = admin
        .query_one(sql::WAL_LSN, &[])
        .await
        .expect("the WAL position")
        .get(0);
    for _ in 0..1200 {
        let done: Option<bool> = standby
            .query_one(sql::REPLAYED, &[&target])
            .await
            .expect("replay")
            .get(0);
        if done == Some(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the standby did not replay up to {target}");
}

/// ARTEX_BENCH_REPLICA_PIN=1 on 2 cores or more.
fn pinned() -> bool {
    std::env::var("ARTEX_BENCH_REPLICA_PIN").as_deref() == Ok("1") && num_cpus() >= 2
}

/// When pinned: processes (all their threads; what they start later inherits it) or
/// threads (a thread id) moved to `cores`; nothing otherwise.
fn pin(cores: &str, pids: &[u32]) {
    if !pinned() {
        return;
    }
    for pid in pids {
        let _ = Command::new("taskset")
            .args(["-a", "-cp", cores, &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The dashboard's requests, one after the other, from ARTEX_BENCH_REPLICA_CLIENTS
/// threads (default 1), until stopped: answers 200 counted, every other kept.
struct DashLoad {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl DashLoad {
    fn start(addr: &str) -> DashLoad {
        let clients = env_number("ARTEX_BENCH_REPLICA_CLIENTS", 1);
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|_| {
                let (addr, stop, ok, failed) =
                    (addr.to_string(), stop.clone(), ok.clone(), failed.clone());
                std::thread::spawn(move || {
                    pin("1", &[nix::unistd::gettid().as_raw() as u32]);
                    while !stop.load(Ordering::Relaxed) {
                        for (_, path) in PATHS {
                            match get(&addr, path) {
                                (200, _) => ok.fetch_add(1, Ordering::Relaxed),
                                (code, body) => {
                                    let body: String = body.chars().take(300).collect();
                                    failed
                                        .lock()
                                        .expect("failures")
                                        .push(format!("{code} {path}: {body}"));
                                    0
                                }
                            };
                        }
                    }
                })
            })
            .collect();
        DashLoad {
            stop,
            ok,
            failed,
            threads,
        }
    }

    /// Requests answered so far.
    fn count(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Stops the clients: requests answered, failures.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let failed = std::mem::take(&mut *self.failed.lock().expect("failures"));
        (self.ok.load(Ordering::Relaxed), failed)
    }
}

/// A hot standby of the bench's cluster on a socket of its own; stopped when dropped.
struct Standby {
    pgdata: PathBuf,
    bin: PathBuf,
    stopped: bool,
}

impl Standby {
    fn start(bench: &Bench) -> Standby {
        let pg_ctl = artex::dev_db::find_server_binaries()
            .expect("replica: PostgreSQL's programs")
            .join("pg_ctl");
        // Where pg_ctl really lives holds pg_basebackup too.
        let bin = pg_ctl
            .canonicalize()
            .expect("pg_ctl")
            .parent()
            .expect("its folder")
            .to_path_buf();
        let home = bench.rig.tmp.path().join("standby");
        std::fs::create_dir(&home).expect("the standby's folder");
        if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("the postgres user");
            nix::unistd::chown(&home, Some(pg.uid), Some(pg.gid)).expect("chown");
        }
        let standby = Standby {
            pgdata: home.join("pg"),
            bin,
            stopped: false,
        };
        let mut backup = standby.command("pg_basebackup");
        backup.arg("-D").arg(&standby.pgdata);
        backup.args([
            "-R", "-X", "stream", "-c", "fast", "-p", "5432", "-U", "postgres", "-h",
        ]);
        run_to_end(backup.arg(bench.rig.pgdata()), "pg_basebackup");
        // The primary's socket lock lives in its data folder and comes with the copy.
        let _ = std::fs::remove_file(standby.pgdata.join(".s.PGSQL.5432.lock"));
        let conf = standby.pgdata.join("postgresql.auto.conf");
        let mut auto = std::fs::read_to_string(&conf).expect("postgresql.auto.conf");
        auto.push_str(&format!(
            "unix_socket_directories = '{}'\n",
            standby.pgdata.display()
        ));
        std::fs::write(&conf, auto).expect("postgresql.auto.conf");
        let mut start = standby.command("pg_ctl");
        start
            .args(["start", "-w", "-t", "120", "-D"])
            .arg(&standby.pgdata);
        run_to_end(
            start.arg("-l").arg(home.join("log")),
            "starting the standby",
        );
        standby
    }

    /// Database `db` on the standby.
    fn url(&self, db: &str) -> String {
        format!(
            "host={} port=5432 user=postgres dbname={db}",
            self.pgdata.display()
        )
    }

    /// A program of PostgreSQL's, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let mut cmd = if nix::unistd::geteuid().is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join(program));
            c
        } else {
            Command::new(self.bin.join(program))
        };
        cmd.current_dir("/");
        cmd
    }

    fn stop(mut self, mode: &str) {
        let mut stop = self.command("pg_ctl");
        stop.args(["stop", "-m", mode, "-D"]).arg(&self.pgdata);
        run_to_end(&mut stop, "stopping the standby");
        self.stopped = true;
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if !self.stopped && self.pgdata.join("postmaster.pid").exists() {
            let mut stop = self.command("pg_ctl");
            stop.args(["stop", "-m", "immediate", "-D"])
                .arg(&self.pgdata);
            let _ = stop.stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// Runs `cmd` to its end; a failure panics with its standard error.
fn run_to_end(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

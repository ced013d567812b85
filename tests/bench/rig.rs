//! What every workload stands on: release binaries copied aside (a rebuild by someone
//! else during the run changes nothing), a private durable PostgreSQL cluster started by
//! `artex db start` (fsync and synchronous_commit on: the defaults), a fresh database per
//! workload cloned from the migrated `artex` one, planners and workers as real processes,
//! and the counters a figure is made of (WAL, commits, CPU of PostgreSQL and of artex).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio_postgres::Client;

use crate::report::Progress;
use crate::sql;

/// The binaries the bench runs, from the release folder (`ARTEX_BENCH_BIN_DIR`).
const BINARIES: [&str; 5] = [
    "artex",
    "examples/artex-bench",
    "examples/latency-floor",
    "examples/api-load",
    "examples/upload-sink",
];

/// Clock ticks per second of /proc/PID/stat (USER_HZ, 100 on every Linux).
const TICKS: f64 = 100.0;

/// How often a drain's progress line counts the finished tasks (see [`Rig::wait_until`]).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The bench's folder, cluster and processes; everything is stopped and removed on drop.
pub struct Rig {
    pub tmp: tempfile::TempDir,
    /// `postgresql:///artex?host=…`: the migrated database every workload clones.
    url: String,
    /// The cluster's PGDATA (its socket folder, where postmaster.pid is).
    pgdata: PathBuf,
    /// The `postgres` database, for what must not count against a workload's database.
    pub admin: Client,
    /// Planners and workers of the running workload, in start order.
    pub procs: Vec<Child>,
}

impl Rig {
    /// Copies the binaries, starts the cluster, applies ARTEX_BENCH_PG_SETTINGS,
    /// ARTEX_BENCH_DROP_INDEXES, ARTEX_BENCH_DROP_TRIGGERS and ARTEX_BENCH_EXTRA_SQL (SQL
    /// run on the migrated template, e.g. a table's storage setting: an experiment, as the
    /// drops are), and creates the bench's helpers in `artex`.
    pub async fn start(bin_dir: &Path) -> Rig {
        let tmp = tempfile::Builder::new()
            .prefix("artex-bench.")
            .tempdir()
            .expect("a temporary folder");
        // As root, the server runs as postgres and must reach its folder.
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod the bench folder");
        std::fs::create_dir(tmp.path().join("log")).expect("log folder");
        for bin in BINARIES {
            let from = bin_dir.join(bin);
            let name = Path::new(bin).file_name().expect("a binary's name");
            std::fs::copy(&from, tmp.path().join(name))
                .unwrap_or_else(|e| panic!("copying {}: {e} (build it first)", from.display()));
        }
        let url = db_start(tmp.path()).await;
        let pgdata = socket_dir(&url);
        let admin = connect(&db_url(&url, "postgres")).await;
        let mut rig = Rig {
            tmp,
            url,
            pgdata,
            admin,
            procs: Vec::new(),
        };
        if let Ok(settings) = std::env::var("ARTEX_BENCH_PG_SETTINGS") {
            if !settings.trim().is_empty() {
                for kv in settings.split_whitespace() {
                    let (name, value) = kv.split_once('=').unwrap_or((kv, ""));
                    exec(&rig.admin, &sql::alter_system(name, value)).await;
                }
                rig.restart_cluster().await;
                println!("# server settings: {settings}");
            }
        }
        if crate::report::profiling() {
            exec(&rig.admin, sql::PROFILE_PRELOAD).await;
            rig.restart_cluster().await;
            exec(&rig.admin, sql::PROFILE_TRACK_ALL).await;
            exec(&rig.admin, sql::PROFILE_TRACK_PLANNING).await;
            exec(&rig.admin, sql::RELOAD_CONF).await;
        }
        let artex = rig.client("artex").await;
        if crate::report::profiling() {
            exec(&artex, sql::PROFILE_EXTENSION).await;
        }
        artex
            .batch_execute(sql::BENCH_SCHEMA)
            .await
            .expect("the bench schema");
        for (var, drop) in [
            (
                "ARTEX_BENCH_DROP_INDEXES",
                sql::drop_index as fn(&str) -> String,
            ),
            ("ARTEX_BENCH_DROP_TRIGGERS", sql::drop_trigger),
        ] {
            for name in std::env::var(var).unwrap_or_default().split_whitespace() {
                let statement = drop(name);
                exec(&artex, &statement).await;
                println!("# without it: {statement}");
            }
        }
        if let Ok(extra) = std::env::var("ARTEX_BENCH_EXTRA_SQL") {
            artex
                .batch_execute(&extra)
                .await
                .unwrap_or_else(|e| panic!("ARTEX_BENCH_EXTRA_SQL {extra:?}: {e}"));
            println!("# with: {extra}");
        }
        rig
    }

    async fn restart_cluster(&mut self) {
        self.artex_cmd(&["db", "stop", "--data-dir"]).await;
        db_start(self.tmp.path()).await;
        self.admin = connect(&db_url(&self.url, "postgres")).await;
    }

    async fn artex_cmd(&self, args: &[&str]) {
        let mut cmd = Command::new(self.bin("artex"));
        cmd.args(args).arg(self.tmp.path().join("db"));
        let out = cmd.output().await.expect("running artex");
        assert!(
            out.status.success(),
            "artex {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A copied binary: `artex`, `artex-bench` (the stock kinds and `stamp`) or
    /// `latency-floor`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// A folder `name` in the bench's own (mode 755: a worker running as root runs
    /// programs as `nobody`, who must reach them).
    pub fn dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// The folder of the processes' logs.
    pub fn log(&self, name: &str) -> PathBuf {
        self.tmp.path().join("log").join(name)
    }

    /// The URL of database `db` on the cluster.
    pub fn url(&self, db: &str) -> String {
        db_url(&self.url, db)
    }

    /// A client on database `db`.
    pub async fn client(&self, db: &str) -> Client {
        connect(&self.url(db)).await
    }

    /// A fresh database `db` cloned from the migrated `artex`, and a client on it.
    pub async fn new_db(&self, db: &str) -> Client {
        for s in sql::new_db(db) {
            exec(&self.admin, &s).await;
        }
        self.client(db).await
    }

    /// Drops database `db` (its clients must be gone: pass them in).
    pub async fn drop_db(&self, db: &str, client: Client) {
        drop(client);
        self.wait_idle(db).await;
        exec(&self.admin, &sql::drop_db(db)).await;
    }

    /// Until no session is connected to `db` (its backends have exited and been reaped,
    /// so their CPU time is in the postmaster's and their statistics are flushed).
    pub async fn wait_idle(&self, db: &str) {
        for _ in 0..200 {
            let n: i64 = self
                .admin
                .query_one(sql::SESSIONS, &[&db])
                .await
                .expect("sessions")
                .get(0);
            if n == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sessions still connected to {db}");
    }

    /// Commits in `db`, WAL bytes and WAL flushes so far (read from `postgres`).
    pub async fn counters(&self, db: &str) -> Counters {
        let r = self
            .admin
            .query_one(sql::COUNTERS, &[&db])
            .await
            .expect("counters");
        Counters {
            commits: r.get(0),
            wal: r.get(1),
            syncs: r.get(2),
        }
    }

    /// CPU seconds of the whole cluster so far: the postmaster, its exited children
    /// (reaped into its cutime/cstime) and its live ones.
    pub fn pg_cpu_s(&self) -> f64 {
        let pids = server_pids(&self.pgdata);
        let (&pm, children) = pids.split_first().expect("the postmaster's pid");
        cpu_s(pm) + reaped_cpu_s(pm) + children.iter().map(|&p| cpu_s(p)).sum::<f64>()
    }

    /// The cluster's processes as pg_stat_activity names them, with the CPU seconds each
    /// has spent so far; the postmaster's own and its exited children's (autovacuum
    /// workers, backends closed) as `postmaster` and `exited`. For
    /// [`crate::report::cpu_split_print`].
    pub async fn pg_cpu_by_process(&self) -> Vec<(u32, String, f64)> {
        let rows = self
            .admin
            .query(sql::PROCESSES, &[])
            .await
            .expect("pg_stat_activity");
        let mut out: Vec<(u32, String, f64)> = rows
            .iter()
            .map(|r| {
                let pid = r.get::<_, i32>(0) as u32;
                (pid, r.get(1), cpu_s(pid))
            })
            .collect();
        if let Some(&pm) = server_pids(&self.pgdata).first() {
            out.push((pm, "postmaster".into(), cpu_s(pm)));
            out.push((0, "exited".into(), reaped_cpu_s(pm)));
        }
        out
    }

    /// 1 planner (`artex`) + `workers` workers of `bin` with `worker_args` on `db`.
    /// [`Rig::start_runtime`] of `artex` with `workers` workers, waited for (a minute at
    /// most) until they are online: the idle fleet a workload then feeds.
    pub async fn start_runtime_online(
        &mut self,
        c: &Client,
        db: &str,
        workers: usize,
        worker_args: &[String],
    ) {
        self.start_runtime_online_env(c, db, workers, worker_args, &[])
            .await;
    }

    /// [`Rig::start_runtime_online`] with `env` set for the planner and the workers.
    pub async fn start_runtime_online_env(
        &mut self,
        c: &Client,
        db: &str,
        workers: usize,
        worker_args: &[String],
        env: &[(&str, &str)],
    ) {
        self.start_runtime_env(db, workers, "artex", worker_args, env);
        let online = workers as i64;
        let minute = Duration::from_secs(60);
        self.wait_until(c, sql::ONLINE, &[&online], minute, None)
            .await;
    }

    pub fn start_runtime(&mut self, db: &str, workers: usize, bin: &str, worker_args: &[String]) {
        self.start_runtime_env(db, workers, bin, worker_args, &[]);
    }

    /// [`Rig::start_runtime`] with `env` set for the planner and the workers.
    pub fn start_runtime_env(
        &mut self,
        db: &str,
        workers: usize,
        bin: &str,
        worker_args: &[String],
        env: &[(&str, &str)],
    ) {
        self.spawn_env(db, "planner", "artex", &["planner".to_string()], env);
        for i in 1..=workers {
            let mut args = vec!["worker".to_string()];
            args.extend(worker_args.iter().cloned());
            self.spawn_env(db, &format!("worker{i}"), bin, &args, env);
        }
    }

    /// One artex process on `db`, its output appended to log/<db>.<role>.
    pub fn spawn(&mut self, db: &str, role: &str, bin: &str, args: &[String]) {
        self.spawn_env(db, role, bin, args, &[]);
    }

    /// [`Rig::spawn`] with `env` set too (it may name another `ARTEX_DATABASE_URL`).
    pub fn spawn_env(
        &mut self,
        db: &str,
        role: &str,
        bin: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) {
        let mut cmd = self.command(&format!("{db}.{role}"), self.bin(bin));
        cmd.args(args).env("ARTEX_DATABASE_URL", self.url(db));
        cmd.envs(env.iter().copied());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin} {role}: {e}"));
        self.procs.push(child);
    }

    /// `program`, its output appended to log/`log`, no input, killed when dropped: for
    /// the processes a part holds itself (a serve, a sink, a worker it restarts). Its
    /// `$TMPDIR` is the bench's folder, so what it leaves there (a worker's default
    /// upload folder, one per blackboard) goes with the bench.
    pub fn command(&self, log: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(log))
            .expect("a log file");
        let mut cmd = Command::new(program);
        cmd.env("TMPDIR", self.tmp.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true);
        cmd
    }

    /// `artex serve --http 127.0.0.1:0 ARGS` on `db`, once it says where it listens: the
    /// process and its address.
    pub async fn serve(&self, db: &str, args: &[&str]) -> (Child, String) {
        let name = format!("{db}.serve");
        let mut cmd = self.command(&name, self.bin("artex"));
        cmd.args(["serve", "--http", "127.0.0.1:0"])
            .args(args)
            .env("ARTEX_DATABASE_URL", self.url(db));
        let child = cmd.spawn().expect("artex serve");
        for _ in 0..200 {
            let log = std::fs::read_to_string(self.log(&name)).unwrap_or_default();
            let addr = crate::common::procs::logged_address(&log, "the HTTP API on http://");
            if let Some(addr) = addr {
                return (child, addr);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("artex serve did not say where it listens");
    }

    /// The pids of the running processes, in start order.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().filter_map(Child::id).collect()
    }

    /// The cluster's port (its socket's name: `.s.PGSQL.<port>` in [`Rig::pgdata`]).
    pub fn port(&self) -> String {
        self.url
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix("port="))
            .unwrap_or("5432")
            .to_string()
    }

    /// The cluster's data folder (pg_wal, postmaster.pid).
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// CPU seconds the running processes have spent.
    pub fn procs_cpu_s(&self) -> f64 {
        self.procs_cpu_each_s().iter().sum()
    }

    /// CPU seconds each running process (planners and workers, in start order) has spent.
    pub fn procs_cpu_each_s(&self) -> Vec<f64> {
        self.pids().into_iter().map(cpu_s).collect()
    }

    /// SIGTERM to every process, and their ends awaited.
    pub async fn stop_runtime(&mut self) {
        for c in &self.procs {
            if let Some(pid) = c.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for mut c in self.procs.drain(..) {
            let _ = c.wait().await;
        }
    }

    /// Waits (ten minutes at most) until no task is unfinished, the progress line
    /// following: the end of a drain-rate workload.
    pub async fn drained(&self, c: &Client, progress: &mut Progress) {
        self.drained_within(c, progress, Duration::from_secs(600))
            .await;
    }

    /// [`Rig::drained`] with a timeout of its own (W4's million tasks, the fleet).
    pub async fn drained_within(&self, c: &Client, progress: &mut Progress, timeout: Duration) {
        self.wait_until(c, sql::UNFINISHED_NONE, &[], timeout, Some(progress))
            .await;
    }

    /// Polls `cond` (a one-boolean statement) every 50 ms, each poll its own transaction
    /// (a session holding one snapshot keeps every dead index entry of the task table
    /// alive, and the runtime's claims slow down a hundredfold within a minute). With a
    /// progress line, counts the finished tasks every 10 s beside it: the count walks
    /// the whole table (a parallel scan of W4's 600 MB: ~0.3 s of CPU), which every 2 s
    /// took a tenth of a core from the run it shows.
    pub async fn wait_until(
        &self,
        c: &Client,
        cond: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        timeout: Duration,
        mut progress: Option<&mut Progress>,
    ) {
        let deadline = Instant::now() + timeout;
        let stmt = c.prepare(cond).await.expect("the wait's condition");
        let mut next_count = Instant::now() + PROGRESS_EVERY;
        loop {
            if c.query_one(&stmt, params)
                .await
                .expect("polling")
                .get::<_, bool>(0)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for: {cond}"
            );
            if let Some(p) = progress.as_deref_mut() {
                if Instant::now() >= next_count {
                    let done: i64 = c
                        .query_one(sql::FINISHED, &[])
                        .await
                        .expect("finished")
                        .get(0);
                    p.show(done as u64);
                    next_count = Instant::now() + PROGRESS_EVERY;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(p) = progress {
            p.end();
        }
    }

    /// Every one of `count` tasks succeeded with its audit trail, or the bench fails.
    pub async fn check_all_succeeded(&self, c: &Client, db: &str, count: i64) {
        let ok: bool = c
            .query_one(sql::ALL_SUCCEEDED, &[&count])
            .await
            .expect("check")
            .get(0);
        if !ok {
            let by: String = c
                .query_one(sql::BY_STATUS, &[])
                .await
                .expect("statuses")
                .get(0);
            panic!("{db}: not all {count} tasks succeeded with their audit trail: {by}");
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.start_kill();
        }
        if std::thread::panicking() {
            eprintln!("bench failed; last lines of the logs:");
            if let Ok(dir) = std::fs::read_dir(self.tmp.path().join("log")) {
                for f in dir.flatten() {
                    let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    eprintln!("==> {} <==", f.path().display());
                    for l in &lines[lines.len().saturating_sub(5)..] {
                        eprintln!("{l}");
                    }
                }
            }
        }
        let _ = std::process::Command::new(self.bin("artex"))
            .args(["db", "stop", "--data-dir"])
            .arg(self.tmp.path().join("db"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Commits, WAL bytes, WAL flushes (see [`Rig::counters`]).
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    pub commits: i64,
    pub wal: i64,
    pub syncs: i64,
}

/// /proc/PID/stat's fields from the third (state) on, as numbers (state reads as 0):
/// field N of proc(5) is at index N - 3.
fn stat(pid: u32) -> Option<Vec<f64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect(),
    )
}

/// A `kB` line of /proc/PID/`file` (`VmHWM` of `status`, `Private_Dirty` of
/// `smaps_rollup`…), 0 when the process is gone.
pub fn proc_kb(pid: u32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A PostgreSQL server's postmaster (from `pgdata`'s postmaster.pid) and its processes.
pub fn server_pids(pgdata: &Path) -> Vec<u32> {
    let pid = std::fs::read_to_string(pgdata.join("postmaster.pid")).unwrap_or_default();
    let Some(pm) = pid
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return Vec::new();
    };
    let mut pids = vec![pm];
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = entry.file_name().to_str().and_then(|p| p.parse().ok());
        if let Some(pid) = pid {
            if stat(pid).is_some_and(|f| f[1] as u32 == pm) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// CPU seconds (user + system) process `pid` has spent, 0 when it is gone.
pub fn cpu_s(pid: u32) -> f64 {
    stat(pid).map_or(0.0, |f| (f[11] + f[12]) / TICKS)
}

/// CPU seconds (user + system) the children `pid` reaped had spent, 0 when it is gone.
fn reaped_cpu_s(pid: u32) -> f64 {
    stat(pid).map_or(0.0, |f| (f[13] + f[14]) / TICKS)
}

/// Starts (creating it the first time) the cluster in `<tmp>/db`; its `artex` URL.
async fn db_start(tmp: &Path) -> String {
    let out = Command::new(tmp.join("artex"))
        .args(["db", "start", "--data-dir"])
        .arg(tmp.join("db"))
        .stderr(Stdio::null())
        .output()
        .await
        .expect("artex db start");
    assert!(out.status.success(), "artex db start failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The URL of `db` next to `url`'s `artex`.
fn db_url(url: &str, db: &str) -> String {
    url.replacen("/artex?", &format!("/{db}?"), 1)
}

/// The `host=` of a URL: the cluster's socket folder, which is its PGDATA.
fn socket_dir(url: &str) -> PathBuf {
    let host = url
        .split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("host="))
        .expect("the URL names its socket folder");
    let mut bytes = Vec::new();
    let mut it = host.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex: Vec<u8> = it.by_ref().take(2).collect();
            let s = std::str::from_utf8(&hex).unwrap_or("");
            bytes.push(u8::from_str_radix(s, 16).expect("a percent escape"));
        } else {
            bytes.push(b);
        }
    }
    PathBuf::from(String::from_utf8(bytes).expect("a UTF-8 path"))
}

use crate::common::connect;

/// Runs one statement (or several, as one simple query) or fails the bench saying which.
pub async fn exec(c: &Client, statement: &str) {
    if let Err(e) = c.batch_execute(statement).await {
        // The server's own message: tokio-postgres's Display says only "db error".
        let why = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_string());
        panic!("{statement}: {why}");
    }
}

/// Tasks/s of `n` tasks, from the first start to the last finish (a run's throughput).
pub async fn run_rate(c: &Client, n: u32) -> f64 {
    let secs: f64 = c
        .query_one(sql::FIRST_START_TO_LAST_FINISH_S, &[])
        .await
        .expect("the run's duration")
        .get(0);
    f64::from(n) / secs
}

//! fleet: hundreds of real workers through pgbouncer in transaction mode (issue 22). A
//! real pgbouncer (transaction mode, default_pool_size 40; a session-mode alias of 4 for
//! the planners' LISTEN) in front of the cluster; ARTEX_BENCH_FLEET_WORKERS real `artex
//! worker` processes (default 500, `--quick` 20; concurrency 10, default flags otherwise)
//! and 2 planners, all through it. Reported: RSS per idle worker; what the idle fleet
//! costs PostgreSQL (heartbeats and polls: transactions and CPU per worker per second);
//! W1 from idle (20,000 tasks) with PostgreSQL's client backends sampled every 100 ms
//! throughout; W2 through the pooler; and the same W1 and W2 with 10 workers connected
//! directly, for the ratios. With ARTEX_BENCH_PROFILE=1, the idle fleet's statements.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::report::{fixed, profile_print, profile_reset, result, Progress};
use crate::rig::{cpu_s, exec, proc_kb, run_rate};
use crate::w2::feed;
use crate::{sql, Bench};

/// W1's and W2's figures of one fleet.
struct Figures {
    w1_rate: f64,
    max_backends: i64,
    w2_p50: f64,
    w2_p99: f64,
}

pub async fn run(bench: &mut Bench) {
    let default = if bench.quick { 20 } else { 500 };
    let n: usize = std::env::var("ARTEX_BENCH_FLEET_WORKERS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("ARTEX_BENCH_FLEET_WORKERS: a number of workers")
        })
        .unwrap_or(default);
    raise_open_files();
    let direct = direct(bench).await;
    let db = "bench_fleet";
    let c = bench.rig.new_db(db).await;
    let bouncer = Pgbouncer::start(bench, db).await;
    let t0 = Instant::now();
    let (url, listen) = (bouncer.url(db), bouncer.url(&format!("{db}_session")));
    start_fleet(bench, &c, db, n, &url, &listen).await;
    println!(
        "# fleet: {n} workers online after {} s",
        fixed(t0.elapsed().as_secs_f64(), 1)
    );
    // Past start-up: queues at their minimum, polls slowed by the first pushes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    memory(bench, n);
    idle(bench, &c, db, n).await;
    let pooled = w1_w2(bench, &c, db, "pooled").await;
    bench
        .ceilings
        .throughput(&format!("fleet_{n}_workers_w1_tasks_per_s"), pooled.w1_rate);
    result("fleet_max_backends", pooled.max_backends, "backends");
    result(
        "fleet_w1_vs_direct_10_workers",
        fixed(pooled.w1_rate / direct.w1_rate, 2),
        "ratio",
    );
    result(
        "fleet_w2_enqueue_to_handler_ms_p50",
        fixed(pooled.w2_p50, 2),
        "ms",
    );
    result(
        "fleet_w2_enqueue_to_handler_ms_p99",
        fixed(pooled.w2_p99, 2),
        "ms",
    );
    let p50_ratio = fixed(pooled.w2_p50 / direct.w2_p50, 2);
    result("fleet_w2_p50_vs_direct", p50_ratio, "ratio");
    result("fleet_error_lines", error_lines(bench, db), "lines");
    bench.rig.stop_runtime().await;
    drop(bouncer);
    bench.rig.drop_db(db, c).await;
}

/// 10 workers and 2 planners connected to PostgreSQL itself: W1 and W2, reported.
async fn direct(bench: &mut Bench) -> Figures {
    let db = "bench_fleet_direct";
    let c = bench.rig.new_db(db).await;
    let url = bench.rig.url(db);
    start_fleet(bench, &c, db, 10, &url, &url).await;
    let f = w1_w2(bench, &c, db, "direct").await;
    result(
        "fleet_direct_10_workers_w1_tasks_per_s",
        f.w1_rate,
        "tasks/s",
    );
    result(
        "fleet_direct_10_workers_max_backends",
        f.max_backends,
        "backends",
    );
    result(
        "fleet_direct_w2_enqueue_to_handler_ms_p50",
        fixed(f.w2_p50, 2),
        "ms",
    );
    result(
        "fleet_direct_w2_enqueue_to_handler_ms_p99",
        fixed(f.w2_p99, 2),
        "ms",
    );
    bench.rig.stop_runtime().await;
    bench.rig.drop_db(db, c).await;
    f
}

/// A planner keeps a connection to each worker: the soft limit of open files raised to
/// the hard one, for this process and what it starts.
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// 2 planners (LISTENing through `listen`) and `workers` workers through `url`, started
/// in waves of 50 a second (start-up must not starve what already runs), until every
/// worker is online.
async fn start_fleet(
    bench: &mut Bench,
    c: &Client,
    db: &str,
    workers: usize,
    url: &str,
    listen: &str,
) {
    for p in 1..=2 {
        let env = [
            ("ARTEX_DATABASE_URL", url),
            ("ARTEX_LISTEN_DATABASE_URL", listen),
        ];
        bench.rig.spawn_env(
            db,
            &format!("planner{p}"),
            "artex",
            &["planner".into()],
            &env,
        );
    }
    let args: Vec<String> = ["worker", "--concurrency", "10"]
        .map(str::to_string)
        .to_vec();
    for i in 1..=workers {
        let env = [("ARTEX_DATABASE_URL", url)];
        bench
            .rig
            .spawn_env(db, &format!("worker{i}"), "artex-bench", &args, &env);
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let online = workers as i64;
    bench
        .rig
        .wait_until(c, sql::ONLINE, &[&online], Duration::from_secs(600), None)
        .await;
}

/// RSS per idle worker, and what each adds: its private memory (RSS counts the pages it
/// shares with the others, the binary and the libraries).
fn memory(bench: &Bench, n: usize) {
    let workers = &bench.rig.pids()[2..];
    let sum = |file: &str, fields: &[&str]| -> u64 {
        let per = |&pid: &u32| fields.iter().map(|f| proc_kb(pid, file, f)).sum::<u64>();
        workers.iter().map(per).sum()
    };
    let rss = sum("status", &["VmRSS"]);
    result("fleet_rss_kb_per_idle_worker", rss / n as u64, "kB");
    let private = sum("smaps_rollup", &["Private_Clean", "Private_Dirty"]);
    result("fleet_private_kb_per_idle_worker", private / n as u64, "kB");
}

/// The idle fleet for 20 s: heartbeats (every 2 s), polls (every 2 s once pushed),
/// nothing else; what PostgreSQL commits and spends on it, per worker.
async fn idle(bench: &Bench, c: &Client, db: &str, n: usize) {
    profile_reset(c).await;
    let workers_cpu = || bench.rig.pids()[2..].iter().map(|&p| cpu_s(p)).sum::<f64>();
    let w0 = workers_cpu();
    let commits0 = bench.rig.counters(db).await.commits;
    let pg0 = bench.rig.pg_cpu_s();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let commits1 = bench.rig.counters(db).await.commits;
    let pg1 = bench.rig.pg_cpu_s();
    let w1 = workers_cpu();
    let secs = t0.elapsed().as_secs_f64();
    let per = |x: f64| x / secs / n as f64;
    result(
        "fleet_idle_worker_cpu_us_per_worker_per_s",
        fixed(per((w1 - w0) * 1e6), 0),
        "us",
    );
    let tx = per((commits1 - commits0) as f64);
    result(
        "fleet_idle_pg_transactions_per_worker_per_s",
        fixed(tx, 3),
        "transactions",
    );
    result(
        "fleet_idle_pg_cpu_us_per_worker_per_s",
        fixed(per((pg1 - pg0) * 1e6), 0),
        "us",
    );
    result(
        "fleet_idle_pg_cpu_share",
        fixed((pg1 - pg0) / secs, 3),
        "cores",
    );
    profile_print(c, "the idle fleet, 20 s (per task = per worker)", n as u32).await;
}

/// W1 from idle on the running fleet, the cluster's client backends sampled meanwhile;
/// then W2: 300 `stamp` tasks 20 ms apart.
async fn w1_w2(bench: &Bench, c: &Client, db: &str, label: &str) -> Figures {
    let n = bench.sizes.w1;
    exec(c, sql::CHECKPOINT).await;
    let done = AtomicBool::new(false);
    let run = async {
        c.execute(
            sql::INSERT_NOOPS_AT,
            &[&(n as i32), &bench.sizes.w1idle_lead],
        )
        .await
        .expect("W1's tasks");
        let mut progress = Progress::new(&format!("fleet W1 {label}"), n.into());
        bench
            .rig
            .drained_within(c, &mut progress, Duration::from_secs(900))
            .await;
        done.store(true, Ordering::Relaxed);
    };
    let (_, max_backends) = tokio::join!(run, sample_backends(&bench.rig.admin, &done));
    bench.rig.check_all_succeeded(c, db, n.into()).await;
    let w1_rate = run_rate(c, n).await.round();
    exec(c, sql::DELETE_TASKS).await;
    let (warm, w2) = (bench.sizes.w2_warm, bench.sizes.w2);
    feed(c, sql::INSERT_STAMP, warm, w2).await;
    bench
        .rig
        .wait_until(c, sql::UNFINISHED_NONE, &[], Duration::from_secs(120), None)
        .await;
    let r = c
        .query_one(sql::W2_PERCENTILES, &[])
        .await
        .expect("W2's percentiles");
    Figures {
        w1_rate,
        max_backends,
        w2_p50: r.get(0),
        w2_p99: r.get(2),
    }
}

/// The most client backends seen, every 100 ms until `done` (the asking session not
/// counted: the bench's own `postgres` one).
async fn sample_backends(admin: &Client, done: &AtomicBool) -> i64 {
    let mut most = 0;
    while !done.load(Ordering::Relaxed) {
        let n: i64 = admin
            .query_one(sql::CLIENT_BACKENDS, &[])
            .await
            .expect("backends")
            .get(0);
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    most
}

/// Lines saying ERROR in the fleet's logs.
fn error_lines(bench: &Bench, db: &str) -> usize {
    let dir = bench.rig.log("");
    let prefix = format!("{db}.");
    std::fs::read_dir(dir)
        .expect("the logs")
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().starts_with(&prefix))
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .map(|text| text.lines().filter(|l| l.contains(" ERROR ")).count())
        .sum()
}

/// A pgbouncer of database `db` (pool of 40, transaction mode; `<db>_session`, 4 in
/// session mode) on a free loopback port, as the `postgres` user when we are root (it
/// refuses root); stopped when dropped.
struct Pgbouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Pgbouncer {
    async fn start(bench: &Bench, db: &str) -> Pgbouncer {
        let dir = bench.rig.tmp.path().join("bouncer");
        std::fs::create_dir_all(&dir).expect("pgbouncer's folder");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(&ini, ini_text(bench, db, port, &dir)).expect("pgbouncer.ini");
        // runuser's PAM session sets the soft limit back: raised inside.
        let script = format!("ulimit -n $(ulimit -Hn); exec pgbouncer {}", ini.display());
        let mut cmd = if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("the postgres user");
            nix::unistd::chown(&dir, Some(pg.uid), Some(pg.gid)).expect("chown pgbouncer's folder");
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", &script]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", &script]);
            c
        };
        let log = std::fs::File::create(bench.rig.log("pgbouncer")).expect("a log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("fleet: pgbouncer (apt-get install -y pgbouncer)");
        let bouncer = Pgbouncer { child, port, dir };
        for _ in 0..100 {
            if let Ok((client, conn)) =
                tokio_postgres::connect(&bouncer.url(db), tokio_postgres::NoTls).await
            {
                tokio::spawn(conn);
                if client.simple_query(sql::PING).await.is_ok() {
                    return bouncer;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default();
        panic!("pgbouncer did not start: {log}");
    }

    /// Database `db` (or its session alias) through the pooler.
    fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

fn ini_text(bench: &Bench, db: &str, port: u16, dir: &std::path::Path) -> String {
    let server = format!(
        "host={} port={} user=postgres dbname={db}",
        bench.rig.pgdata().display(),
        bench.rig.port()
    );
    format!(
        "[databases]\n\
         {db} = {server} pool_size=40\n\
         {db}_session = {server} pool_mode=session pool_size=4\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = any\n\
         pool_mode = transaction\n\
         default_pool_size = 40\n\
         max_client_conn = 20000\n\
         logfile = {}\n\
         pidfile = {}\n",
        dir.join("pgbouncer.log").display(),
        dir.join("pgbouncer.pid").display()
    )
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // runuser passes SIGTERM on to pgbouncer and waits for it.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

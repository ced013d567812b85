//! artex through pgbouncer (Debian's 1.18, `scripts/test.sh` installs it): a real
//! pgbouncer in session mode in front of the test's database. Connecting at all used to
//! fail ("unsupported startup parameter: options": artex sent its timeouts at log-in);
//! the session settings now follow the log-in as `set`s, and hold through the pooler.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use artex_actors::blackboard::{DbLimits, NewTask};
use artex_actors::Blackboard;
use common::procs::{wait_count, wait_for, wait_online, wait_status, Proc};
use common::{assert_statement_timeout, cluster, run_cli, TestDb};
use serde_json::json;

/// Where Debian puts the binary.
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// A pgbouncer of this test's own on 127.0.0.1 pooling one database of the test cluster
/// in the pool mode asked for, and in session mode under the name `<database>_session`
/// (for LISTEN); stopped (and its folder removed) when dropped.
struct Pgbouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Pgbouncer {
    /// Starts pgbouncer in `pool_mode` for `database`, at most `pool_size` server
    /// connections for it (and 2 for its session alias), and waits until it accepts.
    async fn start(database: &str, pool_mode: &str, pool_size: u32) -> Pgbouncer {
        assert!(
            Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: apt-get install -y pgbouncer (scripts/test.sh does)"
        );
        // Beside the cluster's folder, which the postgres user can reach (as root the
        // cluster and pgbouncer both run as that user: pgbouncer refuses root too).
        let parent = common::cluster_dir()
            .parent()
            .expect("the cluster folder has a parent")
            .to_path_buf();
        let dir = parent.join(format!("pgbouncer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("pgbouncer folder");
        let root = nix::unistd::geteuid().is_root();
        if root {
            let pg = nix::unistd::User::from_name("postgres")
                .expect("reading the passwd file")
                .expect("the postgres user (Debian's postgresql package makes it)");
            nix::unistd::chown(&dir, Some(pg.uid), Some(pg.gid)).expect("chown pgbouncer folder");
        }
        // A free port, as the kernel hands them out; pgbouncer binds it right after.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let socket = cluster().socket_dir();
        let ini = format!(
            "[databases]\n\
             {database} = host={socket} port=5432 user=postgres dbname={database} \
             pool_size={pool_size}\n\
             {database}_session = host={socket} port=5432 user=postgres dbname={database} \
             pool_mode=session pool_size=2\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = {pool_mode}\n\
             max_client_conn = 200\n\
             default_pool_size = 40\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            socket = socket.display(),
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        let ini_path = dir.join("pgbouncer.ini");
        std::fs::write(&ini_path, ini).expect("writing pgbouncer.ini");
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", PGBOUNCER]);
            c
        } else {
            Command::new(PGBOUNCER)
        };
        let child = cmd
            .arg(&ini_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting pgbouncer");
        let bouncer = Pgbouncer { child, port, dir };
        let url = bouncer.url(database);
        wait_for("pgbouncer to accept", Duration::from_secs(20), || {
            let url = url.clone();
            async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(conn);
                client.simple_query("select 1").await.ok().map(|_| ())
            }
        })
        .await;
        bouncer
    }

    /// A URL to `database` through this pgbouncer.
    fn url(&self, database: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// What pgbouncer logged, for a failing assertion.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // runuser passes SIGTERM on to pgbouncer and waits for it.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn through_pgbouncer_the_blackboard_connects_with_its_timeouts_in_force() {
    let db = TestDb::new().await;
    let bouncer = Pgbouncer::start(&db.name, "session", 40).await;
    let bb = Blackboard::connect_with(
        &bouncer.url(&db.name),
        DbLimits {
            statement_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap();
    let task = bb
        .operator()
        .submit(&NewTask::new("echo", json!({"via": "pgbouncer"})), "test")
        .await
        .unwrap_or_else(|e| panic!("submitting through pgbouncer: {e}\n{}", bouncer.log()));
    assert_eq!(
        db.bb.operator().task(task).await.unwrap().payload["via"],
        "pgbouncer"
    );
    // The statement timeout holds through the pooler: a control that waits on a row lock
    // another session holds is cancelled by the server after 300 ms, saying so.
    assert_statement_timeout(&db.client().await, &bb, task).await;
}

#[tokio::test]
async fn a_planner_and_a_worker_run_a_task_through_pgbouncer() {
    let db = TestDb::new().await;
    let bouncer = Pgbouncer::start(&db.name, "session", 40).await;
    let url = bouncer.url(&db.name);
    let _planner = Proc::planner("pooled-planner", &url, &[]);
    let worker = Proc::worker("pooled-worker", &url, &[]);
    // Registered through the pooler.
    let c = db.client().await;
    wait_online(&c, 1, Duration::from_secs(30)).await;
    let (code, out, err) = run_cli(&url, &["submit", "echo", "--payload", r#"{"n": 1}"#]);
    assert_eq!(
        code,
        0,
        "artex submit through pgbouncer: {err}\n{}",
        bouncer.log()
    );
    let id: uuid::Uuid = out.trim().parse().expect("submit prints the id");
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
    assert!(
        !worker.log_text().contains("unsupported startup parameter"),
        "{}",
        worker.log_text()
    );
}

#[tokio::test]
async fn a_planner_and_workers_run_through_pgbouncer_in_transaction_mode_in_its_budget() {
    let db = TestDb::new().await;
    // Three server connections for every statement of a planner, three workers and the
    // CLI; the planner's LISTEN goes through the session alias.
    let bouncer = Pgbouncer::start(&db.name, "transaction", 3).await;
    let url = bouncer.url(&db.name);
    let listen = bouncer.url(&format!("{}_session", db.name));
    let _planner = Proc::planner("txn-planner", &url, &["--listen-database-url", &listen]);
    let workers: Vec<Proc> = (0..3)
        .map(|i| Proc::worker(&format!("txn-worker-{i}"), &url, &[]))
        .collect();
    let c = db.client().await;
    wait_online(&c, 3, Duration::from_secs(30)).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        let (code, out, err) = run_cli(
            &url,
            &["submit", "echo", "--payload", &format!(r#"{{"n": {n}}}"#)],
        );
        assert_eq!(
            code,
            0,
            "artex submit through pgbouncer: {err}\n{}",
            bouncer.log()
        );
        ids.push(
            out.trim()
                .parse::<uuid::Uuid>()
                .expect("submit prints the id"),
        );
    }
    c.execute(
        "insert into artex.tasks (kind, payload) \
         select 'echo', jsonb_build_object('n', g) from generate_series(20, 499) g",
        &[],
    )
    .await
    .expect("inserting tasks");
    for id in &ids {
        wait_status(&db.bb, *id, "succeeded", Duration::from_secs(60)).await;
    }
    wait_count(
        &c,
        "select count(*) from artex.tasks where status = 'succeeded'",
        500,
        Duration::from_secs(60),
    )
    .await;
    let (once, starts): (i64, i64) = {
        let r = c
            .query_one(
                "select count(distinct task_id), count(*) from artex.task_transitions \
                 where to_status = 'running'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (once, starts),
        (500, 500),
        "every task started exactly once"
    );
    // The budget: the pool's three server connections and the session alias's two (the
    // planner's LISTEN), nothing per worker (no LISTEN session of a worker's own).
    let backends: Vec<String> = c
        .query(
            "select coalesce(application_name, '') from pg_stat_activity \
             where datname = current_database() and pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Plus the test's own: its blackboard's pool (the waits above) and, at times, one
    // more of its sessions.
    assert!(backends.len() <= 3 + 2 + 2, "backends: {backends:?}");
    assert!(
        !backends.iter().any(|a| a.starts_with("artex-listen:")),
        "a worker holds a LISTEN session: {backends:?}"
    );
    // Wake-ups reached the workers over HTTP (a pooler cannot carry their LISTEN).
    for w in &workers {
        let log = w.log_text();
        assert!(log.contains("planners reach this worker"), "{log}");
    }
}

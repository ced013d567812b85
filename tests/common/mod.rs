//! The test harness: one throwaway PostgreSQL cluster per test run, shared by every test
//! process, a template database migrated once per migration set, and a fresh database
//! per test cloned from it (`TestDb`), dropped when the test ends.
//!
//! Works under `cargo nextest run` (one process per test: a file lock and an advisory
//! lock make the set-up happen once) and under plain `cargo test` (threads: a `OnceLock`).
//! The cluster is left running for the next test process; `scripts/test.sh` stops it.
#![allow(dead_code)]

pub mod bundles;
pub mod fixtures;
pub mod fleet;
pub mod formation;
pub mod journal;
pub mod pooler;
pub mod procs;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use artex::dev_db::{Cluster, ClusterOptions};
use artex_actors::Blackboard;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

/// Key of the advisory lock (on the `postgres` database) under which templates are made.
const TEMPLATE_LOCK: i64 = 0x6172_7465_785f_7470; // "artex_tp"

/// The `artex` binary built for these tests.
pub fn artex_bin() -> &'static str {
    env!("CARGO_BIN_EXE_artex")
}

/// The read-scope bearer token of every process the tests start (they read it from
/// [`read_token_file`] through `ARTEX_READ_TOKEN_FILE`); test clients send it.
pub const READ_TOKEN: &str = "test-read-token";

/// The file holding [`READ_TOKEN`], beside the run's cluster (written on first use).
pub fn read_token_file() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = cluster_dir()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&dir).expect("token folder");
        let file = dir.join("read-token");
        // Written aside and renamed: tests of one run start at once and share the file.
        let aside = dir.join(format!("read-token.{}", std::process::id()));
        std::fs::write(&aside, READ_TOKEN).expect("write the read token");
        std::fs::rename(&aside, &file).expect("place the read token");
        file
    })
    .clone()
}

/// `$TMPDIR` of the artex processes the tests start: beside the run's cluster folder
/// (`<cluster>-tmp`), in the folder scripts/test.sh removes at the end, so that what they
/// leave there (a default upload folder per test database) goes with it. Mode 1777, as
/// /tmp.
pub fn process_tmp_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut name = cluster_dir().file_name().unwrap_or_default().to_os_string();
        name.push("-tmp");
        let dir = cluster_dir().with_file_name(name);
        std::fs::create_dir_all(&dir).expect("the processes' temp folder");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
            .expect("chmod the processes' temp folder");
        dir
    })
    .clone()
}

/// The cluster's folder: `$ARTEX_TEST_PG_DIR`, else `<target>/tmp/artex-test-pg`.
pub fn cluster_dir() -> PathBuf {
    match std::env::var_os("ARTEX_TEST_PG_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_TARGET_TMPDIR")).join("artex-test-pg"),
    }
}

/// The test run's cluster, created and started on first use (once per run, whichever
/// process comes first). Tests that stop or restart it must put it back running.
pub fn cluster() -> Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER
        .get_or_init(|| start_cluster().unwrap_or_else(|e| panic!("test cluster: {e}")))
        .clone()
}

fn start_cluster() -> Result<Cluster, String> {
    let dir = cluster_dir();
    let parent = dir
        .parent()
        .ok_or_else(|| format!("{} has no parent folder", dir.display()))?;
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    check_reachable_by_server(parent)?;
    let mut lock_name = dir.file_name().unwrap_or_default().to_os_string();
    lock_name.push(".lock");
    let lock_path = parent.join(lock_name);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    let cluster = Cluster::new(ClusterOptions {
        unsafe_fast: true,
        logical: true,
        ..ClusterOptions::new(&dir)
    })
    .map_err(|e| e.to_string())?;
    cluster.start().map_err(|e| e.to_string())?;
    drop::<File>(lock);
    Ok(cluster)
}

/// As root, PostgreSQL runs as the `postgres` user, which must traverse every folder
/// above the cluster's (a `mktemp -d` folder is 0700): say so rather than let initdb fail
/// with a bare "permission denied".
fn check_reachable_by_server(parent: &Path) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let parent = parent
        .canonicalize()
        .map_err(|e| format!("resolving {}: {e}", parent.display()))?;
    for dir in parent.ancestors() {
        let mode = std::fs::metadata(dir)
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .permissions()
            .mode();
        if mode & 0o001 == 0 {
            return Err(format!(
                "{} (mode {:o}) is not traversable by the postgres user that runs the test \
                 cluster; chmod o+x it or set ARTEX_TEST_PG_DIR elsewhere",
                dir.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

/// URL of the cluster's `postgres` database (for creating and dropping databases).
pub fn admin_url() -> String {
    cluster().url("postgres")
}

/// A plain client on `url`, its connection driven by a task on the current runtime.
pub async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        // Ends when the client is dropped or the server goes away; nothing to report.
        let _ = connection.await;
    });
    client
}

/// The migrated template database of the migrations compiled into this test binary,
/// created once per cluster (under an advisory lock) and once per process checked.
pub async fn template() -> String {
    static TEMPLATE: OnceLock<String> = OnceLock::new();
    if let Some(name) = TEMPLATE.get() {
        return name.clone();
    }
    let name = format!("artex_tpl_{}", artex_actors::blackboard::fingerprint());
    let admin = connect(&admin_url()).await;
    admin
        .execute("select pg_advisory_lock($1)", &[&TEMPLATE_LOCK])
        .await
        .expect("taking the template lock");
    let row = admin
        .query_opt(
            "select datistemplate from pg_database where datname = $1",
            &[&name],
        )
        .await
        .expect("looking up the template");
    // A template is marked `datistemplate` only once migrated; one left half-made by a
    // crashed run is made again.
    if row.as_ref().map(|r| r.get::<_, bool>(0)) != Some(true) {
        if row.is_some() {
            admin
                .batch_execute(&format!("drop database \"{name}\" with (force)"))
                .await
                .expect("dropping a half-made template");
        }
        admin
            .batch_execute(&format!("create database \"{name}\""))
            .await
            .expect("creating the template");
        let bb = Blackboard::connect(&cluster().url(&name), 2).expect("template pool");
        bb.maintenance()
            .migrate()
            .await
            .expect("migrating the template");
        drop(bb);
        admin
            .batch_execute(&format!("alter database \"{name}\" is_template true"))
            .await
            .expect("marking the template");
    }
    admin
        .execute("select pg_advisory_unlock($1)", &[&TEMPLATE_LOCK])
        .await
        .expect("releasing the template lock");
    let _ = TEMPLATE.set(name.clone());
    name
}

/// A database of its own for one test, cloned from the migrated template and dropped
/// (with its connections) when this value is dropped.
pub struct TestDb {
    /// The database's name (`t_<uuid>`).
    pub name: String,
    /// Its URL.
    pub url: String,
    /// A blackboard on it.
    pub bb: Blackboard,
    /// URL of the cluster's `postgres` database.
    pub admin_url: String,
}

impl TestDb {
    /// A fresh, migrated database.
    pub async fn new() -> TestDb {
        let template = template().await;
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin_url = admin_url();
        let admin = connect(&admin_url).await;
        let sql = format!("create database \"{name}\" template \"{template}\"");
        // The template's last connections (its migration pool) close asynchronously on
        // the server: "source database is being accessed by other users" for a moment.
        let mut delay = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        loop {
            match admin.batch_execute(&sql).await {
                Ok(()) => break,
                Err(e)
                    if e.code() == Some(&SqlState::OBJECT_IN_USE)
                        && waited < Duration::from_secs(15) =>
                {
                    tokio::time::sleep(delay).await;
                    waited += delay;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(e) => panic!("{sql}: {e}"),
            }
        }
        let url = cluster().url(&name);
        let bb = Blackboard::connect(&url, 4).expect("test database pool");
        TestDb {
            name,
            url,
            bb,
            admin_url,
        }
    }

    /// A plain client on this database, for raw SQL.
    pub async fn client(&self) -> Client {
        connect(&self.url).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be current-thread: drop the
        // database from a thread of its own with a runtime of its own.
        let sql = format!("drop database if exists \"{}\" with (force)", self.name);
        let admin_url = self.admin_url.clone();
        let outcome = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (client, connection) = tokio_postgres::connect(&admin_url, NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let driver = tokio::spawn(connection);
                let done = client.batch_execute(&sql).await.map_err(|e| e.to_string());
                drop(client);
                let _ = driver.await;
                done
            })
        })
        .join();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: dropping test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}

/// A PostgreSQL cluster of one test's own, migrated, for tests that restart or stop the
/// server (doing that to the shared cluster would cut every other test off). Stopped when
/// dropped.
pub struct PrivateCluster {
    /// The cluster, to restart, stop and start.
    pub cluster: Cluster,
    /// URL of its (migrated) `postgres` database.
    pub url: String,
    /// A blackboard on it.
    pub bb: Blackboard,
    _dir: tempfile::TempDir,
}

impl PrivateCluster {
    /// Creates, starts and migrates a fresh cluster (fast, non-durable settings).
    pub async fn start() -> PrivateCluster {
        let dir = tempfile::tempdir().expect("temp dir for a private cluster");
        let cluster = Cluster::new(ClusterOptions {
            unsafe_fast: true,
            ..ClusterOptions::new(dir.path().join("c"))
        })
        .expect("PostgreSQL binaries");
        cluster.start().expect("starting a private cluster");
        let url = cluster.url("postgres");
        let bb = Blackboard::connect(&url, 2).expect("pool");
        bb.maintenance()
            .migrate()
            .await
            .expect("migrating the private cluster");
        PrivateCluster {
            cluster,
            url,
            bb,
            _dir: dir,
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.cluster.stop();
    }
}

/// Asserts that `bb`'s statement timeout is in force: while `c` holds task `task`'s row
/// lock, a cancel through `bb` (which waits on it) is cancelled (a cancel request: the
/// server ends the statement), saying so.
pub async fn assert_statement_timeout(c: &Client, bb: &Blackboard, task: uuid::Uuid) {
    c.batch_execute(&format!(
        "begin; select 1 from artex.tasks where id = '{task}' for update"
    ))
    .await
    .expect("locking the task's row");
    let refused = bb
        .operator()
        .control(
            artex_actors::blackboard::Control::Cancel,
            task,
            "test",
            None,
        )
        .await;
    c.batch_execute("rollback").await.expect("rollback");
    let err = refused.expect_err("a cancel waiting on a held row lock outlasted the timeout");
    assert!(
        matches!(err, artex_actors::Error::StatementTimeout { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("statement timeout"), "{err}");
}

/// The single `bigint` a query returns (a count, mostly).
pub async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Task `id`'s status.
pub async fn status_of(c: &Client, id: uuid::Uuid) -> String {
    c.query_one("select status::text from artex.tasks where id = $1", &[&id])
        .await
        .expect("reading a status")
        .get(0)
}

/// The reason the last transition of task `id` in its history gives.
pub async fn last_reason(c: &Client, id: uuid::Uuid) -> Option<String> {
    c.query_one(
        "select reason from artex.task_transitions where task_id = $1 order by id desc limit 1",
        &[&id],
    )
    .await
    .expect("the task's last transition")
    .get(0)
}

/// The rows of `sql`'s two columns, as pairs: in a `Vec` (in order) or a map.
pub async fn pairs<A, B, C>(c: &Client, sql: &str) -> C
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
    C: FromIterator<(A, B)>,
{
    c.query(sql, &[])
        .await
        .expect(sql)
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Up to `limit` of the tasks assigned to `worker` and not started, as a worker reads
/// them (a read: nothing is written).
pub async fn assigned(
    bb: &Blackboard,
    worker: &str,
    limit: i64,
) -> Vec<artex_actors::blackboard::AssignedTask> {
    bb.worker()
        .read_assigned(worker, limit, i64::MAX, true)
        .await
        .expect("reading assignments")
        .map(|r| r.tasks)
        .unwrap_or_default()
}

/// Starts up to `limit` of the tasks assigned to `worker` the way a worker does: reads
/// them, then records their starts. Returns the ones started.
pub async fn start_assigned(
    bb: &Blackboard,
    worker: &str,
    limit: i64,
) -> Vec<artex_actors::blackboard::AssignedTask> {
    use artex_actors::blackboard::{AttemptRecord, Step};
    let held = assigned(bb, worker, limit).await;
    let starts: Vec<AttemptRecord> = held
        .iter()
        .map(|t| AttemptRecord {
            id: t.id,
            epoch: t.epoch,
            retries: t.retries,
            max_retries: t.max_retries,
            step: Step::Start,
            started_ago_ms: Some(0.0),
            measured: None,
        })
        .collect();
    let written = bb
        .worker()
        .record(worker, &starts)
        .await
        .expect("recording starts");
    held.into_iter()
        .filter(|t| written.contains(&t.id))
        .collect()
}

/// The statement a plan-cached function of the hot path is about (its first `return
/// query …;`, which ends at the first `;` that ends a line: what follows is upkeep after
/// it), read from the function's own source in `pg_proc`: what a test PREPAREs to EXPLAIN
/// it.
pub async fn function_statement(c: &Client, function: &str) -> String {
    function_statements(c, function)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("artex.{function} runs no `return query …;`"))
}

/// Every `return query …;` statement of function `artex.<function>`, in order.
pub async fn function_statements(c: &Client, function: &str) -> Vec<String> {
    c.query(
        "select m[1] from pg_proc, regexp_matches(prosrc, 'return query (.*?);[ \t]*\n', 'g') m
         where proname = $1 and pronamespace = 'artex'::regnamespace",
        &[&function],
    )
    .await
    .unwrap_or_else(|e| panic!("artex.{function}: {e}"))
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The first column of every row of `sql` about one task (`$1`), as text.
pub async fn lines_of(c: &Client, sql: &str, task: uuid::Uuid) -> Vec<String> {
    c.query(sql, &[&task])
        .await
        .expect(sql)
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Runs the `artex` CLI against `url` to completion; returns (exit code, stdout, stderr).
pub fn run_cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(artex_bin())
        .args(args)
        .env("ARTEX_DATABASE_URL", url)
        .env("ARTEX_LOG", "warn")
        .output()
        .expect("run artex");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

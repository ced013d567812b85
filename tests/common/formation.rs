//! A pg_auto_failover formation on fleet hosts ([`super::fleet`]): a monitor and two
//! PostgreSQL nodes with synchronous replication, run by the real `pg_autoctl` (Debian's
//! `pg-auto-failover-cli` and `postgresql-15-auto-failover`, which scripts/test.sh
//! installs), as the `postgres` user (pg_autoctl refuses root); and, if asked, a read
//! replica outside the formation (see [`Formation::start_with_replica`]). The monitor is
//! tuned to fail over within seconds; the test reaches every server through its Unix
//! socket (one folder, a port each), the fleet's hosts through TCP.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio_postgres::Client;

use super::fleet::Fleet;
use super::procs::wait_for;

/// The database the nodes serve (pg_autoctl's `--dbname`), artex's blackboard.
pub const DATABASE: &str = "artex";
/// The monitor's port; the nodes listen on 5432, 5433 (and the replica on 5434): distinct,
/// as they share the test's socket folder, and so the URL names a port per host.
const MONITOR_PORT: u16 = 5431;
/// How many nodes pg_auto_failover runs (the primary and its standby); a read replica,
/// if there is one, is the node after them.
const PAIR: usize = 2;
/// WAL the pair keeps for the read replica while its host is down (`wal_keep_size`).
const REPLICA_WAL_KEEP: &str = "512MB";

/// How the monitor is tuned (pg_auto_failover's monitor settings, in ms; defaults in
/// brackets): a health check every second [5 s], given up after 1 s [5 s], 1 retry [2]
/// 0.5 s later [2 s]; a node silent for 2 s is unhealthy [20 s]; the old primary gets 3 s
/// to demote before the standby is promoted [30 s]; failovers may start 1 s after the
/// monitor did [10 s].
const MONITOR_SETTINGS: &[(&str, u32)] = &[
    ("health_check_period", 1_000),
    ("health_check_timeout", 1_000),
    ("health_check_max_retries", 1),
    ("health_check_retry_delay", 500),
    ("node_considered_unhealthy_timeout", 2_000),
    ("primary_demote_timeout", 3_000),
    ("startup_grace_period", 1_000),
];

/// A primary cut off from the monitor and its standby demotes itself after this many
/// seconds (keeper setting `timeout.network_partition_timeout`, default 20): less than
/// the monitor's detection plus `primary_demote_timeout`, so two primaries never take
/// writes at once.
const NETWORK_PARTITION_TIMEOUT_S: u32 = 2;

/// One PostgreSQL node of the formation.
pub struct Node {
    /// Its fleet host.
    pub host: String,
    /// Its port (on its host's address, and of its Unix socket).
    pub port: u16,
    pgdata: PathBuf,
    keeper: Mutex<Option<Child>>,
}

/// The monitor and two nodes (and the replica); every process on their hosts is killed
/// with the fleet.
pub struct Formation {
    dir: tempfile::TempDir,
    monitor: Node,
    /// The two nodes, in the order given, then the replica if there is one.
    pub nodes: Vec<Node>,
    /// Their addresses on the fleet, in the same order.
    addrs: Vec<String>,
    /// The network namespaces of the monitor's and the nodes' hosts.
    namespaces: Vec<String>,
    bin: PathBuf,
}

impl Formation {
    /// Creates the monitor on `monitor` and the nodes on `nodes` (the first the primary,
    /// the second its synchronous standby), and waits until they are primary and
    /// secondary.
    pub async fn start(fleet: &Fleet, monitor: &str, nodes: [&str; 2]) -> Formation {
        Formation::start_with_replica(fleet, monitor, nodes, None).await
    }

    /// [`Formation::start`], and a third node on `replica` if given, node index 2: a
    /// plain hot standby outside the formation (a base backup, then `postgres` run
    /// directly), streaming from whichever of the two nodes is a standby now
    /// (`target_session_attrs=standby`): a cascade, so it never holds WAL the node
    /// promoted next lacks, and it follows each promotion onto the new timeline.
    ///
    /// Not a third pg_auto_failover node (`--candidate-priority 0`): with two standbys
    /// every failover is an election, and pg_auto_failover 2.0 (Debian's) can stall one
    /// for good, the old primary sent to fetch WAL from itself (hapostgres/pg_auto_failover
    /// #1060, fixed after 2.0 by #1143); the fleet-topology soak met it after 13
    /// failovers. With one standby a failover is that standby's promotion.
    pub async fn start_with_replica(
        fleet: &Fleet,
        monitor: &str,
        nodes: [&str; 2],
        replica: Option<&str>,
    ) -> Formation {
        // pg_autoctl finds pg_controldata and the others beside pg_ctl: the real folder,
        // not one of symbolic links to some of them (/usr/local/bin on some machines).
        let bin = artex::dev_db::find_server_binaries().expect("PostgreSQL binaries");
        let bin = std::fs::canonicalize(bin.join("pg_ctl"))
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or(bin);
        assert!(
            Path::new("/usr/bin/pg_autoctl").exists(),
            "pg_autoctl is missing: scripts/test.sh installs pg-auto-failover-cli and \
             postgresql-15-auto-failover"
        );
        let dir = tempfile::Builder::new()
            .prefix("artex-formation.")
            .tempdir()
            .expect("temp dir for the formation");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // pg_autoctl runs as postgres: it creates the data folders in `pg`.
        for sub in ["sock", "xdg", "pg"] {
            mkdir_for_postgres(&dir.path().join(sub));
        }
        let node = |host: &str, port: u16, name: &str| Node {
            host: host.to_string(),
            port,
            pgdata: dir.path().join("pg").join(name),
            keeper: Mutex::new(None),
        };
        let hosts: Vec<&str> = nodes.iter().copied().chain(replica).collect();
        let f = Formation {
            monitor: node(monitor, MONITOR_PORT, "monitor"),
            nodes: hosts
                .iter()
                .enumerate()
                .map(|(i, h)| node(h, 5432 + i as u16, &format!("node{}", i + 1)))
                .collect(),
            addrs: hosts.iter().map(|h| fleet.addr(h).to_string()).collect(),
            namespaces: std::iter::once(&monitor)
                .chain(&hosts)
                .map(|h| fleet.netns(h).to_string())
                .collect(),
            bin,
            dir,
        };
        let monitor_addr = fleet.addr(monitor).to_string();
        let create = [
            "create",
            "monitor",
            "--hostname",
            &monitor_addr,
            "--auth",
            "trust",
            "--no-ssl",
            "--run",
        ];
        *f.monitor.keeper.lock().unwrap() = Some(f.autoctl_spawn(fleet, None, &create, "monitor"));
        let monitor_client = f.wait_connect(MONITOR_PORT, "pg_auto_failover").await;
        for (name, value) in MONITOR_SETTINGS {
            monitor_client
                .batch_execute(&format!("alter system set pgautofailover.{name} = {value}"))
                .await
                .expect("tuning the monitor");
        }
        monitor_client
            .batch_execute("select pg_reload_conf()")
            .await
            .unwrap();
        for i in 0..PAIR {
            f.create_node(fleet, i, &monitor_addr);
            if i == 0 {
                f.wait_states(&[(0, "single")], Duration::from_secs(60))
                    .await;
            }
        }
        // The standby's base backup waits for a checkpoint, spread over minutes by
        // default: ask the primary for an immediate one until the standby is there.
        let primary = f.client(0).await;
        let want: Vec<(usize, String)> = (0..PAIR)
            .map(|i| (i, if i == 0 { "primary" } else { "secondary" }.to_string()))
            .collect();
        wait_for(
            "the standby to join (secondary) and the primary to be primary",
            Duration::from_secs(90),
            || {
                let (f, primary, want) = (&f, &primary, &want);
                async move {
                    let _ = primary.batch_execute("checkpoint").await;
                    (f.states().await == *want).then_some(())
                }
            },
        )
        .await;
        // Once created (a reload during `create` breaks it).
        for i in 0..PAIR {
            let (host, pgdata) = (f.nodes[i].host.clone(), f.nodes[i].pgdata.clone());
            f.set_partition_timeout(fleet, &host, &pgdata);
            f.open_to_fleet(i).await;
        }
        if f.nodes.len() > PAIR {
            f.make_replica(fleet);
            f.start_replica(fleet);
            wait_for(
                "the read replica to stream from the standby",
                Duration::from_secs(60),
                || async {
                    let c = f.try_client(PAIR).await?;
                    let r = c
                        .query_one(
                            "select status from pg_stat_wal_receiver where status = 'streaming'",
                            &[],
                        )
                        .await
                        .ok()?;
                    Some(r.get::<_, String>(0))
                },
            )
            .await;
        }
        f
    }

    /// Opens the pair to the fleet beyond what `--pg-hba-lan` does (`--dbname` and
    /// replication between the nodes): `pg_rewind`, which reads the new primary's
    /// `postgres` database as the replication user (without it every rejoin falls back to
    /// a whole base backup), and the read replica's stream. Keeps WAL for the replica
    /// while its host is down, and checks for autovacuum every 2 s, as
    /// docs/operating/notes.md advises for artex's task table (the embedded cluster's
    /// setting; PostgreSQL's 60 s lets dead task rows pile up). A node made later by a
    /// base backup or rewind copies all of it.
    async fn open_to_fleet(&self, i: usize) {
        let hba = self.nodes[i].pgdata.join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
        let lines = "host postgres pgautofailover_replicator 198.18.0.0/15 trust\n\
                     host replication pgautofailover_replicator 198.18.0.0/15 trust\n";
        // Written in place: the file keeps its owner (postgres).
        std::fs::write(&hba, format!("{old}{lines}")).expect("writing pg_hba.conf");
        let c = self.client(i).await;
        // One statement a call: ALTER SYSTEM refuses a transaction block.
        for setting in [
            format!("wal_keep_size = '{REPLICA_WAL_KEEP}'"),
            "autovacuum_naptime = '2s'".to_string(),
        ] {
            c.batch_execute(&format!("alter system set {setting}"))
                .await
                .expect("alter system");
        }
        c.batch_execute("select pg_reload_conf()")
            .await
            .expect("reloading pg_hba.conf");
    }

    /// The read replica's data folder: a base backup of the primary (node 0 at start),
    /// without the primary's server logs.
    fn make_replica(&self, fleet: &Fleet) {
        let n = &self.nodes[PAIR];
        let out = self
            .as_postgres(fleet, &n.host, &self.bin.join("pg_basebackup"))
            .args(["-h", &self.addrs[0], "-p", &self.nodes[0].port.to_string()])
            .args([
                "-U",
                "pgautofailover_replicator",
                "-X",
                "stream",
                "-c",
                "fast",
                "-D",
            ])
            .arg(&n.pgdata)
            .output()
            .expect("spawning pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup for the read replica: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Ok(logs) = std::fs::read_dir(n.pgdata.join("log")) {
            for f in logs.flatten() {
                let _ = std::fs::remove_file(f.path());
            }
        }
        // Owned by postgres: the base backup made the folder as postgres.
        let out = self
            .as_postgres(fleet, &n.host, Path::new("/usr/bin/touch"))
            .arg(n.pgdata.join("standby.signal"))
            .output()
            .expect("touch standby.signal");
        assert!(out.status.success(), "touch standby.signal");
    }

    /// Runs the read replica's server on its host (its "keeper" is the server itself).
    /// Its stream's settings are given on the command line, over whatever the base
    /// backup copied from the primary's configuration.
    fn start_replica(&self, fleet: &Fleet) {
        let n = &self.nodes[PAIR];
        // After its host crashed, the old server's pid file is stale.
        if !self.postgres_runs(PAIR) {
            let _ = std::fs::remove_file(n.pgdata.join("postmaster.pid"));
        }
        let upstream = format!(
            "host={},{} port={},{} user=pgautofailover_replicator \
             application_name=artex_read_replica target_session_attrs=standby \
             connect_timeout=2",
            self.addrs[0], self.addrs[1], self.nodes[0].port, self.nodes[1].port
        );
        let out = self.log_file("node3-run");
        let err = out.try_clone().unwrap();
        let child = self
            .as_postgres(fleet, &n.host, &self.bin.join("postgres"))
            .arg("-D")
            .arg(&n.pgdata)
            .args(["-p", &n.port.to_string()])
            .arg("-c")
            .arg(format!("listen_addresses={}", self.addrs[PAIR]))
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.socket_dir().display()
            ))
            .arg("-c")
            .arg(format!("primary_conninfo={upstream}"))
            .args(["-c", "primary_slot_name=", "-c", "hot_standby=on"])
            .args(["-c", "wal_retrieve_retry_interval=1s"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawning the read replica's postgres");
        *n.keeper.lock().unwrap() = Some(child);
    }

    /// `postgresql://postgres@A:5432,B:5433/artex?target_session_attrs=read-write`: what
    /// every artex process on the fleet is given.
    pub fn url_from_fleet(&self) -> String {
        format!(
            "postgresql://postgres@{}:{},{}:{}/{DATABASE}?target_session_attrs=read-write",
            self.addrs[0], self.nodes[0].port, self.addrs[1], self.nodes[1].port
        )
    }

    /// The same in libpq's key=value form.
    pub fn key_value_url_from_fleet(&self) -> String {
        format!(
            "host={},{} port={},{} user=postgres dbname={DATABASE} \
             target_session_attrs=read-write",
            self.addrs[0], self.addrs[1], self.nodes[0].port, self.nodes[1].port
        )
    }

    /// `host:port` of node `i` on the fleet (what `/health` says as `database_host`).
    pub fn host_port(&self, i: usize) -> String {
        format!("{}:{}", self.addrs[i], self.nodes[i].port)
    }

    /// A URL of node `i`'s `artex` database through its Unix socket, for the test.
    pub fn local_url(&self, i: usize) -> String {
        self.socket_url(self.nodes[i].port, DATABASE)
    }

    fn socket_url(&self, port: u16, db: &str) -> String {
        format!(
            "host={} port={port} user=postgres dbname={db} connect_timeout=2",
            self.dir.path().join("sock").display()
        )
    }

    /// A client of node `i` (its Unix socket).
    pub async fn client(&self, i: usize) -> Client {
        super::connect(&self.local_url(i)).await
    }

    /// A client of node `i`, or `None` if it does not answer.
    pub async fn try_client(&self, i: usize) -> Option<Client> {
        let (client, conn) = tokio_postgres::connect(&self.local_url(i), tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Some(client)
    }

    /// Whether node `i` answers and takes writes now (promoted, and no longer held
    /// read-only by its keeper).
    pub async fn writable(&self, i: usize) -> bool {
        let Some(c) = self.try_client(i).await else {
            return false;
        };
        c.query_one(
            "select not pg_is_in_recovery() \
               and current_setting('default_transaction_read_only') = 'off'",
            &[],
        )
        .await
        .map(|r| r.get::<_, bool>(0))
        .unwrap_or(false)
    }

    /// Each node's state as the monitor reports it: (node index, reported state).
    pub async fn states(&self) -> Vec<(usize, String)> {
        let Ok((c, conn)) = tokio_postgres::connect(
            &self.socket_url(MONITOR_PORT, "pg_auto_failover"),
            tokio_postgres::NoTls,
        )
        .await
        else {
            return Vec::new();
        };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let rows = c
            .query(
                "select nodeport, reportedstate::text, goalstate::text \
                 from pgautofailover.node order by nodeport",
                &[],
            )
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|r| {
                let port = r.get::<_, i32>(0) as u16;
                let i = self.nodes.iter().position(|n| n.port == port)?;
                let (reported, goal): (String, String) = (r.get(1), r.get(2));
                // A node is in a state once it reached the state it was assigned.
                Some((
                    i,
                    if reported == goal {
                        reported
                    } else {
                        format!("{reported}→{goal}")
                    },
                ))
            })
            .collect()
    }

    /// Waits until the monitor reports every `(node, state)` of `want`.
    pub async fn wait_states(&self, want: &[(usize, &str)], timeout: Duration) {
        wait_for(
            &format!("formation states {want:?}"),
            timeout,
            || async move {
                let states = self.states().await;
                want.iter()
                    .all(|(i, s)| states.iter().any(|(j, t)| i == j && s == t))
                    .then_some(())
            },
        )
        .await;
    }

    /// The host crashes: every process on node `i`'s host (its keeper and PostgreSQL,
    /// postmaster first) killed with SIGKILL at once.
    pub fn crash(&self, fleet: &Fleet, i: usize) {
        fleet.signal_host(&self.nodes[i].host, Signal::SIGKILL);
        if let Some(mut k) = self.nodes[i].keeper.lock().unwrap().take() {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    /// The node's keeper starts again (`pg_autoctl run`): it asks the monitor what it is
    /// now, and an old primary rejoins as a standby (pg_rewind or a new base backup).
    /// The read replica's server starts again and finds a standby to stream from.
    pub fn restart(&self, fleet: &Fleet, i: usize) {
        if let Some(mut k) = self.nodes[i].keeper.lock().unwrap().take() {
            let _ = k.kill();
            let _ = k.wait();
        }
        if i == PAIR {
            return self.start_replica(fleet);
        }
        let keeper = self.autoctl_spawn(fleet, Some(i), &["run"], &format!("node{}-run", i + 1));
        *self.nodes[i].keeper.lock().unwrap() = Some(keeper);
    }

    /// Whether node `i`'s PostgreSQL runs (its keeper stops it when it demotes itself).
    pub fn postgres_runs(&self, i: usize) -> bool {
        self.postmaster_pid(i).is_some_and(super::procs::alive)
    }

    /// The pid node `i`'s postmaster.pid names, if the file is there.
    pub fn postmaster_pid(&self, i: usize) -> Option<i32> {
        std::fs::read_to_string(self.nodes[i].pgdata.join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
    }

    /// Whether node `i`'s keeper (`pg_autoctl`; the read replica's server) runs.
    pub fn keeper_runs(&self, i: usize) -> bool {
        self.nodes[i]
            .keeper
            .lock()
            .unwrap()
            .as_mut()
            .is_some_and(|k| matches!(k.try_wait(), Ok(None)))
    }

    /// The folder of every server's Unix socket (a port each).
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// The node of the pair the monitor has as primary now (primary, or primary
    /// without its standby: `wait_primary`), if either is.
    pub async fn primary(&self) -> Option<usize> {
        self.states()
            .await
            .into_iter()
            .find(|(i, s)| *i < PAIR && (s == "primary" || s == "wait_primary"))
            .map(|(i, _)| i)
    }

    /// Every line the keepers and their servers logged so far, each file whole.
    pub fn all_logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            for e in entries.flatten() {
                if e.path().extension().is_some_and(|x| x == "log") {
                    out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        out
    }

    /// What node `i`'s PostgreSQL logged (pg_autoctl has it log into `PGDATA/log`).
    pub fn server_log(&self, i: usize) -> String {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.nodes[i].pgdata.join("log"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect()
    }

    /// Everything the keepers and servers logged, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    out.push_str(&format!("--- {} (last lines)\n", p.display()));
                    for l in tail.iter().rev() {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    fn create_node(&self, fleet: &Fleet, i: usize, monitor_addr: &str) {
        let monitor =
            format!("postgres://autoctl_node@{monitor_addr}:{MONITOR_PORT}/pg_auto_failover");
        let addr = self.addrs[i].clone();
        let args = [
            "create",
            "postgres",
            "--hostname",
            &addr,
            "--dbname",
            DATABASE,
            "--monitor",
            &monitor,
            "--auth",
            "trust",
            "--no-ssl",
            // Lets the fleet's hosts (198.18.0.0/24) reach --dbname.
            "--pg-hba-lan",
            "--run",
        ];
        let keeper = self.autoctl_spawn(fleet, Some(i), &args, &format!("node{}", i + 1));
        *self.nodes[i].keeper.lock().unwrap() = Some(keeper);
    }

    /// `pg_autoctl ARGS… --pgdata … [--pgport … --pgctl …]` in the background on the
    /// node's (or the monitor's) host, as `postgres`, logging to `<dir>/<log>.log`.
    fn autoctl_spawn(&self, fleet: &Fleet, node: Option<usize>, args: &[&str], log: &str) -> Child {
        let n = match node {
            Some(i) => &self.nodes[i],
            None => &self.monitor,
        };
        let mut cmd = self.autoctl(fleet, &n.host);
        cmd.args(args).arg("--pgdata").arg(&n.pgdata);
        if args[0] == "create" {
            cmd.arg("--pgport")
                .arg(n.port.to_string())
                .arg("--pgctl")
                .arg(self.bin.join("pg_ctl"));
        }
        let out = self.log_file(log);
        let err = out.try_clone().unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawning pg_autoctl");
        child
    }

    /// Writes the keeper's `timeout.network_partition_timeout` (see
    /// [`NETWORK_PARTITION_TIMEOUT_S`]) and has the running keeper read it again
    /// (`pg_autoctl reload`).
    fn set_partition_timeout(&self, fleet: &Fleet, host: &str, pgdata: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = self
                .autoctl(fleet, host)
                .args(["config", "set", "--pgdata"])
                .arg(pgdata)
                .args([
                    "timeout.network_partition_timeout",
                    &NETWORK_PARTITION_TIMEOUT_S.to_string(),
                ])
                .output()
                .expect("pg_autoctl config set");
            if out.status.success() {
                let _ = self
                    .autoctl(fleet, host)
                    .args(["reload", "--pgdata"])
                    .arg(pgdata)
                    .output();
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pg_autoctl config set: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `<dir>/<log>.log`, appended to: a process started again keeps the earlier runs'
    /// lines.
    fn log_file(&self, log: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{log}.log")))
            .expect("opening a log file in the formation's folder")
    }

    /// `program` on `host` as `postgres`.
    fn as_postgres(&self, fleet: &Fleet, host: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", fleet.netns(host)])
            .args(["runuser", "-u", "postgres", "--"])
            .arg(program)
            .current_dir("/");
        cmd
    }

    /// `pg_autoctl` on `host` as `postgres`, its files (configuration, state, sockets)
    /// in the formation's folder.
    fn autoctl(&self, fleet: &Fleet, host: &str) -> Command {
        let d = self.dir.path();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", fleet.netns(host)])
            .args(["runuser", "-u", "postgres", "--", "env"])
            .arg(format!(
                "XDG_CONFIG_HOME={}",
                d.join("xdg/config").display()
            ))
            .arg(format!("XDG_DATA_HOME={}", d.join("xdg/data").display()))
            .arg(format!("XDG_RUNTIME_DIR={}", d.join("xdg/run").display()))
            .arg(format!("PG_REGRESS_SOCK_DIR={}", d.join("sock").display()))
            .arg(format!("PGHOST={}", d.join("sock").display()))
            .arg("/usr/bin/pg_autoctl")
            .current_dir("/");
        cmd
    }

    async fn wait_connect(&self, port: u16, db: &str) -> Client {
        let url = self.socket_url(port, db);
        wait_for(
            &format!("PostgreSQL on port {port} ({db})"),
            Duration::from_secs(60),
            || {
                let url = url.clone();
                async move {
                    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .ok()?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    Some(c)
                }
            },
        )
        .await
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // Everything on the formation's hosts first (keepers, servers): a server still
        // writing into its folder would keep the folder from being removed.
        for ns in &self.namespaces {
            let pids = Command::new("ip")
                .args(["netns", "pids", ns])
                .stderr(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for pid in pids.split_whitespace().filter_map(|p| p.parse().ok()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for n in self.nodes.iter().chain(std::iter::once(&self.monitor)) {
            if let Some(mut k) = n.keeper.lock().unwrap().take() {
                let _ = k.kill();
                let _ = k.wait();
            }
        }
    }
}

fn mkdir_for_postgres(path: &Path) {
    let out = Command::new("install")
        .args(["-d", "-o", "postgres", "-m", "0755"])
        .arg(path)
        .output()
        .expect("install -d");
    assert!(out.status.success(), "install -d {}", path.display());
}

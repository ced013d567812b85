//! Where the soak's blackboard lives, and the faults that hit it there.
//!
//! - `single` (the default): one durable PostgreSQL server on host `db`; it is crashed
//!   (SIGQUIT) and stopped for 20 s.
//! - `fleet` (issue 36 §3), the production topology: a pg_auto_failover formation (its
//!   monitor on `mon`, the primary and its synchronous standby on `n1` and `n2`), a
//!   hot standby on `n3` outside it, streaming from whichever node is the standby (see
//!   `Formation::start_with_replica` for why outside), a pgbouncer in transaction mode
//!   beside each of `n1` and `n2` (every artex process is given both, with
//!   `target_session_attrs=read-write`, and LISTENs through their session alias), and
//!   `artex serve` reading from the replica. Its faults: the primary's host killed or its
//!   link cut (a failover each), the primary's postmaster crashed (its keeper starts it
//!   again), the primary's pgbouncer restarted, the replica's host lost. A 20 s stop has
//!   no place here: the monitor fails over first, which the failovers stand for.
//!
//! A pgbouncer is started and stopped in place (it is up within a tenth of a second):
//! the soak's other tasks wait that long.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::fleet::{Fleet, FleetDb};
use crate::common::formation::{Formation, DATABASE};
use crate::common::pooler::{FleetPooler, PoolerSpec, POOLER_PORT};

/// Which topology a run soaks (`ARTEX_SOAK_TOPOLOGY`, `scripts/soak.sh --topology`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Topology {
    /// One PostgreSQL server.
    Single,
    /// A formation behind pgbouncers, with a read replica.
    Fleet,
}

impl Topology {
    /// Parses `single` or `fleet`.
    pub fn parse(s: &str) -> Result<Topology, String> {
        match s {
            "single" => Ok(Topology::Single),
            "fleet" => Ok(Topology::Fleet),
            other => Err(format!("{other}: expected single or fleet")),
        }
    }

    /// Its name, as given.
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Fleet => "fleet",
        }
    }

    /// The hosts PostgreSQL needs (the fleet's other hosts come after).
    pub fn database_hosts(&self) -> &'static [&'static str] {
        match self {
            Topology::Single => &["db"],
            Topology::Fleet => &["mon", "n1", "n2", "n3"],
        }
    }
}

/// Server connections of each pgbouncer: the transaction pool, and the session alias
/// (a LISTEN session per artex process: 2 planners, 3 workers, one more during a hot
/// upgrade, `serve`, and spares).
const POOL_SIZE: u32 = 20;
const SESSION_POOL_SIZE: u32 = 12;
/// The formation's replica node.
const REPLICA: usize = 2;

/// The blackboard's servers.
pub enum Database {
    /// See [`Topology::Single`].
    Single(FleetDb),
    /// See [`Topology::Fleet`]; a pooler beside each of the nodes 0 and 1.
    Fleet {
        formation: Formation,
        poolers: Vec<FleetPooler>,
        /// The node whose host is cut off now (a failover by a cut), if one is.
        cut: std::sync::Mutex<Option<usize>>,
        _dir: tempfile::TempDir,
    },
}

impl Database {
    /// Starts the servers of `topology` on `fleet`, the blackboard migrated.
    pub async fn start(fleet: &Fleet, topology: Topology) -> Database {
        match topology {
            // Durable: PostgreSQL is crashed on purpose, and what it acknowledged must
            // survive (with the tests' unsafe settings a crash loses recent commits, and
            // their transaction ids are given out again).
            Topology::Single => Database::Single(fleet.start_durable_postgres("db").await),
            Topology::Fleet => {
                let formation =
                    Formation::start_with_replica(fleet, "mon", ["n1", "n2"], Some("n3")).await;
                let dir = tempfile::Builder::new()
                    .prefix("artex-soak-poolers.")
                    .tempdir()
                    .expect("the poolers' folder");
                std::fs::set_permissions(
                    dir.path(),
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )
                .expect("chmod the poolers' folder");
                let poolers = (0..2)
                    .map(|i| {
                        let host = formation.nodes[i].host.clone();
                        let spec = PoolerSpec {
                            netns: fleet.netns(&host),
                            addr: fleet.addr(&host),
                            socket: formation.socket_dir(),
                            port: formation.nodes[i].port,
                            database: DATABASE,
                            pool_size: POOL_SIZE,
                            session_pool_size: SESSION_POOL_SIZE,
                            unix_socket: true,
                        };
                        FleetPooler::start(&spec, &dir.path().join(&host))
                    })
                    .collect();
                let db = Database::Fleet {
                    formation,
                    poolers,
                    cut: std::sync::Mutex::new(None),
                    _dir: dir,
                };
                let bb = artex_actors::Blackboard::connect(&db.local_url(), 2).expect("a pool");
                bb.maintenance()
                    .migrate()
                    .await
                    .expect("migrating the primary");
                db
            }
        }
    }

    /// What artex processes on the fleet's hosts are given: `ARTEX_DATABASE_URL`, and
    /// the flags that go with it.
    pub fn fleet_url(&self) -> (String, Vec<String>) {
        match self {
            Database::Single(db) => (db.url_from_fleet(), Vec::new()),
            Database::Fleet { poolers, .. } => {
                let hosts: Vec<String> = poolers.iter().map(FleetPooler::host_port).collect();
                let url = |db: &str| {
                    format!(
                        "postgresql://postgres@{}/{db}?target_session_attrs=read-write",
                        hosts.join(",")
                    )
                };
                (
                    url(DATABASE),
                    vec![
                        "--listen-database-url".into(),
                        url(&format!("{DATABASE}_session")),
                    ],
                )
            }
        }
    }

    /// What `artex serve` (in the root namespace, which reaches the servers and the
    /// poolers through their Unix sockets) is given: its URL and flags.
    pub fn serve_url(&self) -> (String, Vec<String>) {
        match self {
            Database::Single(db) => (db.local_url(), Vec::new()),
            Database::Fleet {
                formation, poolers, ..
            } => {
                let dirs: Vec<String> = poolers
                    .iter()
                    .filter_map(|p| p.socket_dir().map(|d| d.display().to_string()))
                    .collect();
                let ports = vec![POOLER_PORT.to_string(); dirs.len()].join(",");
                let url = |db: &str| {
                    format!(
                        "host={} port={ports} user=postgres dbname={db} \
                         target_session_attrs=read-write connect_timeout=2",
                        dirs.join(",")
                    )
                };
                let replica = format!(
                    "host={} port={} user=postgres dbname={DATABASE} connect_timeout=2",
                    formation.socket_dir().display(),
                    formation.nodes[REPLICA].port
                );
                (
                    url(DATABASE),
                    vec![
                        "--listen-database-url".into(),
                        url(&format!("{DATABASE}_session")),
                        "--read-database-url".into(),
                        replica,
                    ],
                )
            }
        }
    }

    /// The primary, for the soak's own queries (Unix sockets, straight to the servers).
    pub fn local_url(&self) -> String {
        match self {
            Database::Single(db) => db.local_url(),
            Database::Fleet { formation, .. } => format!(
                "host={sock},{sock} port={},{} user=postgres dbname={DATABASE} \
                 target_session_attrs=read-write connect_timeout=2",
                formation.nodes[0].port,
                formation.nodes[1].port,
                sock = formation.socket_dir().display(),
            ),
        }
    }

    /// The primary for the soak's reads: the server itself, or the node the monitor has
    /// as primary now (none during a failover). Not any node that takes writes through
    /// its Unix socket: an old primary cut off from the fleet still does, for the seconds
    /// until its keeper demotes it, and what artex wrote on the new one is not there.
    pub async fn primary_url(&self) -> Option<String> {
        match self {
            Database::Single(db) => Some(db.local_url()),
            Database::Fleet { formation, .. } => {
                formation.primary().await.map(|i| formation.local_url(i))
            }
        }
    }

    /// The URLs of the nodes that may be primary, each alone (through its Unix socket,
    /// refusing a session that takes no writes): the soak's own writes go to the one
    /// that is not cut off while a cut lasts ([`Database::cut_node`]). None in the single
    /// topology.
    pub fn node_urls(&self) -> Vec<String> {
        match self {
            Database::Single(_) => Vec::new(),
            Database::Fleet { formation, .. } => (0..2)
                .map(|i| format!("{} target_session_attrs=read-write", formation.local_url(i)))
                .collect(),
        }
    }

    /// The node cut off from the fleet now, if one is. The root namespace, where the
    /// soak and `serve` run, reaches the servers and the poolers through Unix sockets,
    /// which no cut stops; so while it lasts the soak writes to the other node only and
    /// the cut host's pgbouncer is stopped, and nothing reaches the cut node that the
    /// fleet could not.
    pub fn cut_node(&self) -> Option<usize> {
        match self {
            Database::Single(_) => None,
            Database::Fleet { cut, .. } => *cut.lock().unwrap(),
        }
    }

    /// Everything the blackboard's servers logged (not the monitor's, whose own
    /// database is none of artex's).
    pub fn server_log(&self) -> String {
        match self {
            Database::Single(db) => db.server_log(),
            Database::Fleet { formation, .. } => (0..formation.nodes.len())
                .map(|i| formation.server_log(i))
                .collect(),
        }
    }

    /// Copies the servers' and poolers' logs into `dir`.
    pub fn keep_logs(&self, dir: &std::path::Path) {
        match self {
            Database::Single(db) => {
                let _ = std::fs::write(dir.join("postgres.log"), db.server_log());
            }
            Database::Fleet {
                formation, poolers, ..
            } => {
                let _ = std::fs::write(dir.join("pg_autoctl.log"), formation.all_logs());
                for i in 0..formation.nodes.len() {
                    let name = format!("postgres-n{}.log", i + 1);
                    let _ = std::fs::write(dir.join(name), formation.server_log(i));
                }
                for (i, p) in poolers.iter().enumerate() {
                    let _ = std::fs::write(dir.join(format!("pgbouncer-n{}.log", i + 1)), p.log());
                }
            }
        }
    }

    /// The single server, for the faults only it meets.
    pub fn single(&self) -> Option<&FleetDb> {
        match self {
            Database::Single(db) => Some(db),
            Database::Fleet { .. } => None,
        }
    }

    /// The formation's failover faults: the primary's host killed (`cut` false) or its
    /// link cut until the standby is promoted (at least `hold`); then the old primary
    /// comes back and rejoins as a standby on its own. Says what happened; `Err` when
    /// the standby was not promoted within 90 s (the wait for a healthy pair, this and
    /// the hold stay within the 3 minutes a fault may take).
    pub async fn failover(
        &self,
        fleet: &Fleet,
        cut: bool,
        hold: Duration,
    ) -> Result<String, String> {
        let Database::Fleet {
            formation,
            poolers,
            cut: cut_node,
            ..
        } = self
        else {
            return Ok("no formation".into());
        };
        let p = match healthy_primary(formation, Duration::from_secs(60)).await {
            Ok(p) => p,
            Err(states) => return Ok(format!("skipped: the pair is not healthy: {states}")),
        };
        let host = formation.nodes[p].host.clone();
        let t0 = Instant::now();
        if cut {
            *cut_node.lock().unwrap() = Some(p);
            poolers[p].stop();
            fleet.partition(&host);
        } else {
            formation.crash(fleet, p);
        }
        let promoted = wait_primary(formation, 1 - p, Duration::from_secs(90)).await;
        let took = t0.elapsed().as_secs_f64();
        if let Some(left) = hold.checked_sub(t0.elapsed()) {
            tokio::time::sleep(left).await;
        }
        if cut {
            fleet.heal(&host);
            poolers[p].start_again();
            *cut_node.lock().unwrap() = None;
        } else {
            let pooler = &poolers[p];
            formation.restart(fleet, p);
            pooler.start_again();
        }
        let how = if cut { "link cut" } else { "host killed" };
        let (old, new) = (p + 1, 2 - p);
        if promoted {
            Ok(format!(
                "node {old} ({how}): node {new} primary after {took:.1} s; node {old} back"
            ))
        } else {
            let states = formation.states().await;
            Err(format!(
                "node {old} ({how}): node {new} not primary after {took:.1} s: {states:?}"
            ))
        }
    }

    /// The primary's postmaster crashes (SIGQUIT); the keeper starts it again, or the
    /// monitor fails over. Says which.
    pub async fn crash_primary_postgres(&self) -> String {
        let Database::Fleet { formation, .. } = self else {
            return "no formation".into();
        };
        let p = match healthy_primary(formation, Duration::from_secs(60)).await {
            Ok(p) => p,
            Err(states) => return format!("skipped: the pair is not healthy: {states}"),
        };
        let Some(pid) = formation.postmaster_pid(p) else {
            return format!("node {}: no postmaster.pid", p + 1);
        };
        let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(90) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if formation.writable(0).await || formation.writable(1).await {
                return format!(
                    "node {}'s postmaster (pid {pid}) crashed; writable again after {:.1} s",
                    p + 1,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        format!(
            "node {}'s postmaster (pid {pid}) crashed; not writable after 90 s",
            p + 1
        )
    }

    /// The primary's pgbouncer stops (every client connection closed) for `hold`, then
    /// starts again.
    pub async fn restart_pooler(&self, hold: Duration) -> String {
        let Database::Fleet {
            formation, poolers, ..
        } = self
        else {
            return "no pooler".into();
        };
        let p = formation.primary().await.unwrap_or(0);
        poolers[p].stop();
        tokio::time::sleep(hold).await;
        poolers[p].start_again();
        format!(
            "node {}'s pgbouncer down for {:.1} s",
            p + 1,
            hold.as_secs_f64()
        )
    }

    /// The replica's host crashes, and comes back after `hold`.
    pub async fn lose_replica(&self, fleet: &Fleet, hold: Duration) -> String {
        let Database::Fleet { formation, .. } = self else {
            return "no replica".into();
        };
        formation.crash(fleet, REPLICA);
        tokio::time::sleep(hold).await;
        formation.restart(fleet, REPLICA);
        format!("replica's host down for {:.1} s", hold.as_secs_f64())
    }

    /// At the end: whatever a fault left down is up again (links, keepers, poolers), and
    /// a primary serves.
    pub async fn heal(&self, fleet: &Fleet) {
        match self {
            Database::Single(db) => {
                if !matches!(
                    db.cluster.status(),
                    Ok(artex::dev_db::ClusterState::Running(_))
                ) {
                    db.start_in_host();
                }
            }
            Database::Fleet {
                formation,
                poolers,
                cut,
                ..
            } => {
                *cut.lock().unwrap() = None;
                for i in 0..formation.nodes.len() {
                    fleet.heal(&formation.nodes[i].host);
                    if !formation.keeper_runs(i) {
                        formation.restart(fleet, i);
                    }
                }
                for p in poolers {
                    if !p.runs() {
                        p.start_again();
                    }
                }
                if healthy_primary(formation, Duration::from_secs(180))
                    .await
                    .is_err()
                {
                    eprintln!(
                        "SOAK the formation is not healthy after the faults: {}",
                        formation.logs()
                    );
                }
            }
        }
    }
}

/// Which of the nodes 0 and 1 is primary while the pair is healthy (one primary, the
/// other its secondary), waiting up to `wait`; `Err` gives the states seen.
async fn healthy_primary(formation: &Formation, wait: Duration) -> Result<usize, String> {
    let end = Instant::now() + wait;
    let mut nudged: Option<Instant> = None;
    loop {
        let states = formation.states().await;
        // A node rebuilt by a base backup waits for the primary's next checkpoint,
        // spread over minutes by default: ask for one now, as an operator would.
        let rebuilding = states.iter().any(|(_, s)| s.ends_with("catchingup"));
        if rebuilding && nudged.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
            nudged = Some(Instant::now());
            if let Some(p) = formation.primary().await {
                if let Some(c) = formation.try_client(p).await {
                    let _ = c.batch_execute("checkpoint").await;
                }
            }
        }
        let of = |i: usize| {
            states
                .iter()
                .find(|(j, _)| *j == i)
                .map(|(_, s)| s.as_str())
        };
        match (of(0), of(1)) {
            (Some("primary"), Some("secondary")) => return Ok(0),
            (Some("secondary"), Some("primary")) => return Ok(1),
            _ if Instant::now() >= end => return Err(format!("{states:?}")),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Waits until node `i` is primary (or primary without a standby), up to `wait`.
async fn wait_primary(formation: &Formation, i: usize, wait: Duration) -> bool {
    let end = Instant::now() + wait;
    while Instant::now() < end {
        if formation.primary().await == Some(i) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

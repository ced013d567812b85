//! A fleet on one machine: each host a Linux network namespace with an `eth0` on a bridge
//! that lives in a namespace of its own (the switch), PostgreSQL on one host, artex
//! processes on others, and the faults a fleet meets: a host cut off (its switch port
//! down) and healed, a process killed or frozen. Needs root, as CI has.
//!
//! Nothing touches the root namespace's network: the bridge and the switch-side veths
//! live in the switch namespace, the host sides in their hosts. The test, in the root
//! namespace, reaches PostgreSQL through its Unix socket and the hosts through
//! [`Fleet::exec`]. Addresses are `198.18.0.<n>/24` (the benchmarking range), the same in
//! every fleet: each fleet has a switch of its own, so two fleets never see each other.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use artex::dev_db::{find_server_binaries, Cluster, ClusterOptions};
use artex_actors::Blackboard;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio_postgres::Client;

use super::pooler::{FleetPooler, PoolerSpec};
use super::procs::{alive, with_defaults, Proc, FAST_PLANNER, FAST_WORKER};

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The prefix of every namespace a test fleet makes: `artex-t<pid>-<n>-<host>`, so that
/// a fleet left behind by a killed test process is recognised and removed.
const PREFIX: &str = "artex-t";
/// The port PostgreSQL listens on, inside its host.
pub const PG_PORT: u16 = 5432;
/// The port [`Fleet::worker`] gives a worker's HTTP server, inside its host.
pub const HTTP_PORT: u16 = 8080;

/// A set of hosts on one switch; removes them (and kills what runs on them) when dropped,
/// also when the test panics.
pub struct Fleet {
    /// `artex-t<pid>-<n>-`: the start of every name this fleet gives.
    prefix: String,
    switch: String,
    bridge: String,
    hosts: Vec<Host>,
}

struct Host {
    name: String,
    netns: String,
    /// Its veth end on the switch (in the switch namespace): the port a partition downs.
    port: String,
    addr: Ipv4Addr,
}

impl Fleet {
    /// Creates the switch and one host per name (`eth0` at `198.18.0.<i + 1>` in the
    /// order given, `lo` up). Panics, saying why, when that is impossible (not root).
    pub fn new(hosts: &[&str]) -> Fleet {
        assert!(
            nix::unistd::geteuid().is_root(),
            "fleet tests need root: they create network namespaces (CI runs them as root); \
             run scripts/test.sh as root"
        );
        assert!(
            !hosts.is_empty() && hosts.len() <= 250,
            "a fleet has 1 to 250 hosts"
        );
        remove_stale_fleets();
        static FLEETS: AtomicU32 = AtomicU32::new(0);
        let n = FLEETS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Interface names live only in the switch namespace, so they cannot collide with
        // another fleet's; the pid (hex, to stay within 15 bytes) and counter in them make
        // `ip -n … link` readable.
        let tag = format!("{pid:x}x{n}");
        let prefix = format!("{PREFIX}{pid}-{n}-");
        let mut fleet = Fleet {
            switch: format!("{prefix}switch"),
            bridge: format!("b{tag}"),
            hosts: Vec::new(),
            prefix,
        };
        // Each step is recorded before the next, so a failure midway still cleans up.
        let (sw, br) = (fleet.switch.clone(), fleet.bridge.clone());
        ip(&format!("netns add {sw}"));
        ip(&format!("-n {sw} link add {br} type bridge"));
        ip(&format!("-n {sw} link set {br} up"));
        for (i, name) in hosts.iter().enumerate() {
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                "host name {name:?}: letters, digits, '-' and '_' only"
            );
            assert!(
                fleet.hosts.iter().all(|h| h.name != *name),
                "host {name} named twice"
            );
            let (netns, port) = (format!("{}{name}", fleet.prefix), format!("v{tag}-{i}"));
            let addr = Ipv4Addr::new(198, 18, 0, i as u8 + 1);
            ip(&format!("netns add {netns}"));
            fleet.hosts.push(Host {
                name: name.to_string(),
                netns: netns.clone(),
                port: port.clone(),
                addr,
            });
            // Both ends are made from the switch namespace: the host's end goes straight
            // into its namespace, never through the root namespace.
            ip(&format!(
                "-n {sw} link add {port} type veth peer name eth0 netns {netns}"
            ));
            ip(&format!("-n {sw} link set {port} master {br} up"));
            ip(&format!("-n {netns} addr add {addr}/24 dev eth0"));
            ip(&format!("-n {netns} link set eth0 up"));
            ip(&format!("-n {netns} link set lo up"));
        }
        fleet
    }

    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in this fleet"))
    }

    /// The address of `host` on the fleet's network.
    pub fn addr(&self, host: &str) -> Ipv4Addr {
        self.host(host).addr
    }

    /// The name of `host`'s network namespace (for `ip netns exec` by hand).
    pub fn netns(&self, host: &str) -> &str {
        &self.host(host).netns
    }

    /// Runs `program ARGS…` on `host` to completion.
    pub fn exec(&self, host: &str, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", self.netns(host), program])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running ip netns exec {program} on {host}: {e}"))
    }

    /// Starts `artex ARGS…` on `host` with `ARTEX_DATABASE_URL=url`, as [`Proc::start`]
    /// does. `ip netns exec` execs artex, so the handle's pid is artex's own.
    pub fn spawn(
        &self,
        host: &str,
        name: &str,
        url: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        Proc::start_via(
            &["ip", "netns", "exec", self.netns(host)],
            name,
            url,
            args,
            env,
        )
    }

    /// `artex worker` on `host` with [`FAST_WORKER`] settings, its HTTP server on
    /// `<host's address>:8080` with reads open (`--public-read`), plus `extra`.
    pub fn worker(&self, host: &str, name: &str, url: &str, extra: &[&str]) -> Proc {
        let http = self.http_addr(host);
        let mut defaults = vec!["--http", http.as_str()];
        // FAST_WORKER starts with its own `--http 127.0.0.1:0`.
        assert_eq!(FAST_WORKER[0], "--http");
        defaults.extend_from_slice(&FAST_WORKER[2..]);
        let mut args = with_defaults("worker", &defaults, extra);
        args.push("--public-read");
        self.spawn(host, name, url, &args, &[])
    }

    /// `artex planner` on `host` with [`FAST_PLANNER`] settings, those `extra` names
    /// replaced.
    pub fn planner(&self, host: &str, name: &str, url: &str, extra: &[&str]) -> Proc {
        let args = with_defaults("planner", FAST_PLANNER, extra);
        self.spawn(host, name, url, &args, &[])
    }

    /// `<host's address>:8080`, where [`Fleet::worker`] serves HTTP.
    pub fn http_addr(&self, host: &str) -> String {
        format!("{}:{HTTP_PORT}", self.addr(host))
    }

    /// An HTTP GET of `http://{to}{path}` made from `from`'s namespace (by curl, giving
    /// up after 2 s without a connection). `Err` says why there was no answer.
    pub fn http_get(&self, from: &str, to: &str, path: &str) -> Result<(u16, String), String> {
        let url = format!("http://{to}{path}");
        let out = self.exec(
            from,
            "curl",
            &[
                "-sS",
                "--connect-timeout",
                "2",
                "--max-time",
                "5",
                "-w",
                "\n%{http_code}",
                &url,
            ],
        );
        if !out.status.success() {
            return Err(format!(
                "GET {url} from {from}: curl {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code
            .trim()
            .parse()
            .map_err(|_| format!("GET {url} from {from}: no status in {text:?}"))?;
        Ok((code, body.to_string()))
    }

    /// Cuts `host` off: its switch port goes down, so its `eth0` loses the carrier and
    /// every packet to or from it is lost (a silent partition: peers time out, nothing
    /// is refused). Processes on it keep running.
    pub fn partition(&self, host: &str) {
        ip(&format!(
            "-n {} link set {} down",
            self.switch,
            self.host(host).port
        ));
    }

    /// Undoes [`Fleet::partition`].
    pub fn heal(&self, host: &str) {
        ip(&format!(
            "-n {} link set {} up",
            self.switch,
            self.host(host).port
        ));
    }

    /// The pids of every process on `host` (PostgreSQL's too, children included).
    pub fn pids(&self, host: &str) -> Vec<i32> {
        netns_pids(self.netns(host))
    }

    /// Sends `sig` to every process on `host`: `SIGSTOP` freezes the whole host,
    /// `SIGCONT` thaws it, `SIGKILL` crashes it.
    pub fn signal_host(&self, host: &str, sig: Signal) {
        for pid in self.pids(host) {
            // A process may exit between the listing and the signal.
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    /// Starts a fresh, migrated PostgreSQL cluster whose server runs on `host`, listening
    /// on the host's address (port 5432, `trust` for 198.18.0.0/15) and on a Unix socket
    /// that the test reaches from the root namespace. Stopped when the value is dropped.
    pub async fn start_postgres(&self, host: &str) -> FleetDb {
        self.postgres(host, true).await
    }

    /// As [`Fleet::start_postgres`], with PostgreSQL's durable settings (fsync,
    /// synchronous commits): for crash tests where a commit acknowledged before the
    /// crash must survive it, as it does in production.
    pub async fn start_durable_postgres(&self, host: &str) -> FleetDb {
        self.postgres(host, false).await
    }

    async fn postgres(&self, host: &str, unsafe_fast: bool) -> FleetDb {
        let addr = self.addr(host);
        let netns = self.netns(host).to_string();
        // Named like the fleet, so that one left by a killed test is found and removed.
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}{host}-pg.", self.prefix))
            .tempdir()
            .expect("temp dir for a fleet cluster");
        // As root the server runs as `postgres`, which must traverse the 0700 temp dir.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("opening the fleet cluster's folder");
        let cluster = Cluster::new(ClusterOptions {
            unsafe_fast,
            ..ClusterOptions::new(dir.path().join("c"))
        })
        .expect("PostgreSQL binaries");
        // dev_db creates a cluster only as part of starting it, on its Unix socket in
        // this (root) namespace: let it, stop it, and start it again inside the host.
        cluster
            .start()
            .expect("creating the fleet cluster (first start, socket only)");
        cluster.stop().expect("stopping the fleet cluster");
        let data = cluster.data_dir();
        allow_fleet_in_hba(&data);
        let log = dir.path().join("c").join("postgres.log");
        let db = FleetDb {
            cluster,
            addr,
            netns,
            log,
            _dir: dir,
        };
        db.start_in_host();
        let bb = Blackboard::connect(&db.local_url(), 2).expect("fleet cluster pool");
        bb.maintenance()
            .migrate()
            .await
            .expect("migrating the fleet cluster");
        db
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for host in &self.hosts {
            remove_netns(&host.netns);
        }
        // Deleting a host's namespace deleted its veth pair; the bridge goes with the
        // switch's.
        remove_netns(&self.switch);
    }
}

/// A PostgreSQL cluster whose server runs inside a fleet host; stopped when dropped.
pub struct FleetDb {
    /// The cluster (its data folder, `stop`, `status`).
    pub cluster: Cluster,
    /// The address it listens on, inside the fleet.
    pub addr: Ipv4Addr,
    netns: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl FleetDb {
    /// Starts the (stopped) server inside its host, listening on the host's address.
    pub fn start_in_host(&self) {
        let bin = find_server_binaries().expect("PostgreSQL binaries");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            // PostgreSQL refuses root; `runuser` keeps the namespace `ip netns exec` set.
            .args(["runuser", "-u", "postgres", "--"])
            .arg(bin.join("pg_ctl"))
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(self.cluster.data_dir())
            .arg("-l")
            .arg(&self.log)
            .arg("-o")
            .arg(format!(
                "-c listen_addresses={} -c port={PG_PORT}",
                self.addr
            ))
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .expect("running pg_ctl start in the host's namespace");
        assert!(
            out.status.success(),
            "PostgreSQL did not start on {}: {}\n{}",
            self.netns,
            String::from_utf8_lossy(&out.stderr).trim(),
            self.server_log()
        );
    }

    /// Stops the server (fast shutdown): an outage, until [`FleetDb::start_in_host`].
    pub fn stop(&self) {
        self.cluster.stop().expect("stopping the fleet cluster");
    }

    /// Everything the server logged so far.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The URL of its `postgres` database for processes on fleet hosts (TCP).
    pub fn url_from_fleet(&self) -> String {
        format!("postgresql://postgres@{}:{PG_PORT}/postgres", self.addr)
    }

    /// The URL of its `postgres` database through the Unix socket, for the test itself
    /// (the root namespace cannot reach the fleet's addresses).
    pub fn local_url(&self) -> String {
        self.cluster.url("postgres")
    }

    /// A client through the Unix socket, for the test's own queries.
    pub async fn client(&self) -> Client {
        super::connect(&self.local_url()).await
    }
}

impl Drop for FleetDb {
    fn drop(&mut self) {
        // A test may have frozen the host; a frozen server never stops.
        for pid in netns_pids(&self.netns) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
        if let Err(e) = self.cluster.stop() {
            eprintln!("warning: stopping the fleet cluster: {e}");
        }
    }
}

impl FleetDb {
    /// Starts a pgbouncer on this database's host, in transaction mode with a pool of
    /// `pool_size` server connections, and in session mode under `postgres_session`
    /// (2 connections) for LISTEN; stopped when dropped.
    pub fn start_pgbouncer(&self, pool_size: u32) -> FleetPooler {
        let spec = PoolerSpec {
            netns: &self.netns,
            addr: self.addr,
            socket: self.cluster.socket_dir(),
            port: PG_PORT,
            database: "postgres",
            pool_size,
            session_pool_size: 2,
            unix_socket: false,
        };
        FleetPooler::start(&spec, &self._dir.path().join("pgbouncer"))
    }
}

/// Freezes process `pid` (SIGSTOP), as a stalled VM or a long GC pause would.
pub fn freeze(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
}

/// Thaws a process frozen by [`freeze`] (SIGCONT).
pub fn thaw(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGCONT).expect("SIGCONT");
}

/// Puts `host all all 198.18.0.0/15 trust` first in the cluster's pg_hba.conf (the first
/// matching line wins; initdb's own lines ask TCP clients for a password).
fn allow_fleet_in_hba(data: &Path) {
    let hba = data.join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
    let new =
        format!("# fleet hosts (tests/common/fleet.rs)\nhost all all 198.18.0.0/15 trust\n{old}");
    // Written in place: the file keeps its owner (postgres).
    std::fs::write(&hba, new).expect("writing pg_hba.conf");
}

/// Runs `ip` with the words of `args` (names here never hold spaces); panics with its
/// error output if it fails.
fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running ip (iproute2) failed: {e}"));
    assert!(
        out.status.success(),
        "ip {args} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The pids of every process in namespace `netns` (none if it is gone).
fn netns_pids(netns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", netns])
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills every process in `netns` and deletes it; warns rather than panics (drop).
fn remove_netns(netns: &str) {
    for pid in netns_pids(netns) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let out = Command::new("ip").args(["netns", "delete", netns]).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "warning: ip netns delete {netns}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("warning: ip netns delete {netns}: {e}"),
    }
}

/// Removes what fleets whose test process died without dropping them (a SIGKILL, a
/// timeout) left: namespaces and cluster folders `artex-t<pid>-…` with no process `<pid>`.
fn remove_stale_fleets() {
    for name in stale_names(Path::new(NETNS_DIR)) {
        remove_netns(&name);
    }
    let tmp = std::env::temp_dir();
    for name in stale_names(&tmp) {
        let _ = std::fs::remove_dir_all(tmp.join(name));
    }
}

/// The entries of `dir` named by a fleet whose process is gone.
fn stale_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.strip_prefix(PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<i32>().ok())
                .is_some_and(|pid| !alive(pid))
        })
        .collect()
}

/// Waits until the `n` tasks whose payload says `"batch": batch` succeeded.
pub async fn wait_batch_done(c: &Client, batch: i32, n: i64, timeout: std::time::Duration) {
    super::procs::wait_for(
        &format!("the {n} tasks of batch {batch} to succeed"),
        timeout,
        || async move {
            let done: i64 = c
                .query_one(
                    "select count(*) from artex.tasks \
                     where status = 'succeeded' and (payload->>'batch')::int = $1",
                    &[&batch],
                )
                .await
                .ok()?
                .get(0);
            (done == n).then_some(())
        },
    )
    .await;
}

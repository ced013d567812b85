//! A pgbouncer (Debian's, 1.18) on a fleet host, in front of one PostgreSQL server it
//! reaches through that server's Unix socket: transaction mode for every statement, and
//! session mode under `<database>_session` for LISTEN. It may also listen on a Unix
//! socket of its own, for processes of the root namespace. Stopped when dropped; it can
//! be stopped and started again (a pooler restart), and is started again after its host
//! crashed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The port pgbouncer listens on, inside its host (and the name of its Unix socket).
pub const POOLER_PORT: u16 = 6432;

/// What a pooler serves and where it runs.
pub struct PoolerSpec<'a> {
    /// The network namespace of its host.
    pub netns: &'a str,
    /// The host's address, where it listens.
    pub addr: Ipv4Addr,
    /// The server's Unix socket folder and port.
    pub socket: PathBuf,
    /// See `socket`.
    pub port: u16,
    /// The database it pools (and `<database>_session`).
    pub database: &'a str,
    /// Server connections for the transaction-mode pool.
    pub pool_size: u32,
    /// Server connections for the session alias (one per LISTEN session at once).
    pub session_pool_size: u32,
    /// Whether it also listens on a Unix socket in its folder.
    pub unix_socket: bool,
}

/// A running pgbouncer.
pub struct FleetPooler {
    addr: Ipv4Addr,
    database: String,
    netns: String,
    dir: PathBuf,
    unix_socket: bool,
    child: Mutex<Option<Child>>,
}

impl FleetPooler {
    /// Writes its configuration into `dir` (made, and given to the postgres user), starts
    /// it, and waits until it accepts.
    pub fn start(spec: &PoolerSpec<'_>, dir: &Path) -> FleetPooler {
        std::fs::create_dir_all(dir).expect("pgbouncer folder");
        if let Some(pg) = nix::unistd::User::from_name("postgres").ok().flatten() {
            nix::unistd::chown(dir, Some(pg.uid), Some(pg.gid)).expect("chown pgbouncer folder");
        }
        let ini = format!(
            "[databases]\n\
             {db} = host={socket} port={port} user=postgres dbname={db} pool_size={pool}\n\
             {db}_session = host={socket} port={port} user=postgres dbname={db} \
             pool_mode=session pool_size={session}\n\
             [pgbouncer]\n\
             listen_addr = {addr}\n\
             listen_port = {POOLER_PORT}\n\
             unix_socket_dir = {unix}\n\
             auth_type = any\n\
             pool_mode = transaction\n\
             max_client_conn = 1000\n\
             server_login_retry = 1\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            db = spec.database,
            socket = spec.socket.display(),
            port = spec.port,
            pool = spec.pool_size,
            session = spec.session_pool_size,
            addr = spec.addr,
            unix = if spec.unix_socket {
                dir.display().to_string()
            } else {
                String::new()
            },
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("writing pgbouncer.ini");
        let pooler = FleetPooler {
            addr: spec.addr,
            database: spec.database.to_string(),
            netns: spec.netns.to_string(),
            dir: dir.to_path_buf(),
            unix_socket: spec.unix_socket,
            child: Mutex::new(None),
        };
        pooler.start_again();
        pooler
    }

    /// Starts it (after [`FleetPooler::stop`], or after its host crashed) and waits until
    /// its log says it accepts.
    pub fn start_again(&self) {
        self.stop();
        let _ = std::fs::remove_file(self.dir.join("pgbouncer.pid"));
        let logged = self.log().len();
        // pgbouncer refuses root, as PostgreSQL does.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(["runuser", "-u", "postgres", "--", "/usr/sbin/pgbouncer"])
            .arg(self.dir.join("pgbouncer.ini"))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting pgbouncer in its host");
        *self.child.lock().unwrap() = Some(child);
        // It accepts once its log says so (the root namespace cannot reach the fleet).
        let started = Instant::now();
        let up = || {
            self.log()
                .get(logged..)
                .is_some_and(|l| l.contains("process up"))
        };
        while !up() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "pgbouncer did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it (SIGTERM: pgbouncer closes every client and server connection at once),
    /// if it runs.
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            // runuser passes SIGTERM on to pgbouncer and waits for it.
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// Whether its process runs (not stopped, not killed with its host).
    pub fn runs(&self) -> bool {
        self.child
            .lock()
            .unwrap()
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The URL of every statement (transaction mode), for processes on fleet hosts.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@{}:{POOLER_PORT}/{}",
            self.addr, self.database
        )
    }

    /// The URL of LISTEN sessions (`--listen-database-url`: session mode).
    pub fn listen_url(&self) -> String {
        format!(
            "postgresql://postgres@{}:{POOLER_PORT}/{}_session",
            self.addr, self.database
        )
    }

    /// `host:port` on the fleet.
    pub fn host_port(&self) -> String {
        format!("{}:{POOLER_PORT}", self.addr)
    }

    /// The folder of its Unix socket (port [`POOLER_PORT`]), if it has one.
    pub fn socket_dir(&self) -> Option<&Path> {
        self.unix_socket.then_some(self.dir.as_path())
    }

    /// What pgbouncer logged, for a failing assertion.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for FleetPooler {
    fn drop(&mut self) {
        self.stop();
    }
}

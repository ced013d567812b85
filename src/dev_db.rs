//! The embedded default: a private PostgreSQL cluster that artex runs from the machine's
//! own PostgreSQL binaries when no database URL is given, so a newcomer needs no set-up.
//! The same code starts the throwaway cluster of the test suite and of the benchmark.
//!
//! PostgreSQL refuses to run as root; when artex runs as root, the server runs as the
//! unprivileged `postgres` system user (the one Debian's package creates), which owns the
//! cluster's folder. That user must reach the folder: when the data dir lies below a
//! folder it cannot enter (root's home, mode 0700, is the usual place to clone), the
//! cluster lives in a folder of its own under [`RELOCATED_ROOT`], keyed by the data dir,
//! and the data dir holds a note saying where.

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::Digest;

use crate::error::{Error, Result};

/// The database artex creates inside its cluster.
pub const DATABASE: &str = "artex";
/// The superuser of a cluster artex created.
pub const SUPERUSER: &str = "postgres";
const SOCKET_PORT: u16 = 5432;

/// Where clusters live whose data dir the server's user cannot reach (see the module doc).
pub const RELOCATED_ROOT: &str = "/var/lib/artex";

/// The note left in a data dir whose cluster lives elsewhere.
const LOCATION_NOTE: &str = "CLUSTER-LOCATION";

/// How to lay out and tune an embedded cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The cluster's folder: `PGDATA` is `<dir>/pg`, the Unix socket lives inside it.
    pub dir: PathBuf,
    /// Also listen on this loopback TCP port (the socket alone otherwise).
    pub tcp_port: Option<u16>,
    /// Trade durability for speed (`fsync=off` …): for throwaway test clusters only.
    pub unsafe_fast: bool,
    /// Start with `wal_level=logical`, for the logical decoding feed.
    pub logical: bool,
    /// Extra `name = value` settings appended to postgresql.conf at creation.
    pub settings: Vec<(String, String)>,
}

impl ClusterOptions {
    /// Defaults for a cluster in `dir`: socket only, durable.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ClusterOptions {
            dir: dir.into(),
            tcp_port: None,
            unsafe_fast: false,
            logical: false,
            settings: Vec::new(),
        }
    }

    /// The folder holding `PGDATA`, the server's log and socket: `dir`, or, as root with
    /// `dir` below a folder the server's user cannot enter, a folder of its own under
    /// [`RELOCATED_ROOT`] named after `dir`'s absolute path.
    pub fn base(&self) -> PathBuf {
        let dir = std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone());
        // Once relocated, always: the note says so even if the folders' modes change.
        let relocated = dir.join(LOCATION_NOTE).exists();
        if !relocated && (!nix::unistd::geteuid().is_root() || reachable_by_others(&dir)) {
            return dir;
        }
        let key = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
        Path::new(RELOCATED_ROOT).join(&hex::encode(key)[..16])
    }

    /// `PGDATA`.
    fn pgdata(&self) -> PathBuf {
        self.base().join("pg")
    }

    /// Whether a cluster was ever created in `dir` (else [`Cluster::status`] says
    /// `Absent`). Needs no PostgreSQL binaries, so a command that only wants to know can
    /// say so before looking for them.
    pub fn cluster_exists(&self) -> bool {
        self.pgdata().join("PG_VERSION").exists()
    }
}

/// What `status` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterState {
    /// No cluster was ever created in this folder.
    Absent,
    /// Created, not running.
    Stopped,
    /// Running; the server's pid.
    Running(u32),
}

/// A PostgreSQL cluster in a folder of artex's own.
#[derive(Debug, Clone)]
pub struct Cluster {
    opts: ClusterOptions,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
}

impl Cluster {
    /// Finds the PostgreSQL server binaries and decides who runs them; creates nothing.
    pub fn new(mut opts: ClusterOptions) -> Result<Self> {
        // The server runs from `/` (its user may not read our working directory).
        opts.dir =
            std::path::absolute(&opts.dir).map_err(|e| io_error("resolving", &opts.dir, e))?;
        let bin = find_server_binaries()?;
        let run_as = unprivileged_identity()?;
        Ok(Cluster { opts, bin, run_as })
    }

    /// `PGDATA`.
    pub fn data_dir(&self) -> PathBuf {
        self.opts.pgdata()
    }

    /// The folder holding the Unix socket (`PGDATA` itself: private to the server's user).
    pub fn socket_dir(&self) -> PathBuf {
        self.data_dir()
    }

    /// A connection URL to `database`, usable by psql and by `ARTEX_DATABASE_URL`.
    pub fn url(&self, database: &str) -> String {
        let socket = self.socket_dir();
        format!(
            "postgresql:///{database}?host={}&port={SOCKET_PORT}&user={SUPERUSER}",
            percent_encode_path(&socket)
        )
    }

    /// Whether the cluster exists and runs.
    pub fn status(&self) -> Result<ClusterState> {
        if !self.opts.cluster_exists() {
            return Ok(ClusterState::Absent);
        }
        let out = self
            .pg_command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(self.data_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Error::Cluster(format!("running pg_ctl status: {e}")))?;
        // pg_ctl status: 0 running, 3 not running, 4 no accessible data folder.
        match out.status.code() {
            Some(0) => {
                let text = String::from_utf8_lossy(&out.stdout);
                let pid = text
                    .split("PID: ")
                    .nth(1)
                    .and_then(|s| s.split(')').next())
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                Ok(ClusterState::Running(pid))
            }
            Some(3) => Ok(ClusterState::Stopped),
            _ => Err(Error::Cluster(format!(
                "pg_ctl status on {} failed: {}",
                self.data_dir().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }

    /// Creates the cluster if it does not exist and starts it if it is not running;
    /// reuses what it finds otherwise. Returns true when it had to start the server.
    pub fn start(&self) -> Result<bool> {
        match self.status()? {
            ClusterState::Running(_) => return Ok(false),
            ClusterState::Absent => self.init()?,
            ClusterState::Stopped => {}
        }
        let log = self.opts.base().join("postgres.log");
        if !log.exists() {
            fs::write(&log, b"").map_err(|e| io_error("creating", &log, e))?;
            self.give_to_server(&log)?;
        }
        let out = self
            .pg_command("pg_ctl")
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(self.data_dir())
            .arg("-l")
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Error::Cluster(format!("running pg_ctl start: {e}")))?;
        if !out.status.success() {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(8).collect();
            return Err(Error::Cluster(format!(
                "PostgreSQL in {} did not start: {}\nlast lines of {}:\n{}",
                self.data_dir().display(),
                String::from_utf8_lossy(&out.stderr).trim(),
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
        Ok(true)
    }

    /// Stops the server (fast mode: running transactions are rolled back). Returns false
    /// when it was not running.
    pub fn stop(&self) -> Result<bool> {
        if !matches!(self.status()?, ClusterState::Running(_)) {
            return Ok(false);
        }
        self.pg_ctl(&["stop", "-w", "-m", "fast"])?;
        Ok(true)
    }

    /// Restarts the server in place (used by tests that prove clients reconnect).
    pub fn restart(&self) -> Result {
        // Without -l the new server would inherit our stdout/stderr pipes, and waiting
        // for pg_ctl's output would wait for the server to exit.
        let log = self.opts.base().join("postgres.log");
        let log = log.to_string_lossy();
        self.pg_ctl(&["restart", "-w", "-m", "fast", "-l", &log])
    }

    fn pg_ctl(&self, args: &[&str]) -> Result {
        let out = self
            .pg_command("pg_ctl")
            .args(args)
            .arg("-D")
            .arg(self.data_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Error::Cluster(format!("running pg_ctl {}: {e}", args[0])))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Cluster(format!(
                "pg_ctl {} on {} failed: {}",
                args[0],
                self.data_dir().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    fn init(&self) -> Result {
        let base = self.opts.base();
        let dir = &base;
        if base != self.opts.dir {
            // The data dir keeps a note of where its cluster lives.
            let note = self.opts.dir.join(LOCATION_NOTE);
            fs::create_dir_all(&self.opts.dir)
                .map_err(|e| io_error("creating", &self.opts.dir, e))?;
            fs::write(
                &note,
                format!(
                    "The PostgreSQL cluster of this data dir lives in {}: the server runs as \
                     the postgres user, which cannot enter a folder above this one.\n",
                    base.display()
                ),
            )
            .map_err(|e| io_error("writing", &note, e))?;
            for d in [Path::new(RELOCATED_ROOT), dir.as_path()] {
                fs::create_dir_all(d).map_err(|e| io_error("creating", d, e))?;
                fs::set_permissions(d, fs::Permissions::from_mode(0o711))
                    .map_err(|e| io_error("opening", d, e))?;
            }
        }
        fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
        let data = self.data_dir();
        fs::create_dir_all(&data).map_err(|e| io_error("creating", &data, e))?;
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700))
            .map_err(|e| io_error("securing", &data, e))?;
        if self.run_as.is_some() {
            // The server's user must reach its folder through ours.
            let mode = fs::metadata(dir).map_err(|e| io_error("reading", dir, e))?;
            let mode = mode.permissions().mode() | 0o711;
            fs::set_permissions(dir, fs::Permissions::from_mode(mode))
                .map_err(|e| io_error("opening", dir, e))?;
            self.give_to_server(&data)?;
        }
        let out = self
            .pg_command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                SUPERUSER,
                "-E",
                "UTF8",
                "--no-locale",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Error::Cluster(format!("running initdb: {e}")))?;
        if !out.status.success() {
            return Err(Error::Cluster(format!(
                "initdb into {} failed: {}",
                data.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let conf = data.join("postgresql.conf");
        let mut extra = fs::read_to_string(&conf).map_err(|e| io_error("reading", &conf, e))?;
        extra.push_str("\n# --- set by artex ---\n");
        for (name, value) in self.settings() {
            extra.push_str(&format!("{name} = {value}\n"));
        }
        fs::write(&conf, extra).map_err(|e| io_error("writing", &conf, e))?;
        Ok(())
    }

    fn settings(&self) -> Vec<(String, String)> {
        let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
        let mut s: Vec<(String, String)> = vec![
            (
                "unix_socket_directories".into(),
                quoted(&self.socket_dir().to_string_lossy()),
            ),
            ("port".into(), SOCKET_PORT.to_string()),
            ("max_connections".into(), "300".into()),
            ("shared_buffers".into(), "'256MB'".into()),
            // The task table turns over its rows at thousands per second: with the default
            // 60 s between autovacuum checks, dead versions pile up for a minute and every
            // index walk over held and runnable tasks slows down (scripts/bench.sh W4: a
            // 30% decline over 400,000 tasks; flat at 2 s).
            ("autovacuum_naptime".into(), "'2s'".into()),
        ];
        match self.opts.tcp_port {
            Some(port) => {
                s.push(("listen_addresses".into(), "'127.0.0.1'".into()));
                // The socket file is named after the port, so both share it.
                s[1].1 = port.to_string();
            }
            None => s.push(("listen_addresses".into(), "''".into())),
        }
        if self.opts.unsafe_fast {
            for (k, v) in [
                ("fsync", "off"),
                ("full_page_writes", "off"),
                ("synchronous_commit", "off"),
            ] {
                s.push((k.into(), v.into()));
            }
        }
        if self.opts.logical {
            s.push(("wal_level".into(), "logical".into()));
            s.push(("max_replication_slots".into(), "16".into()));
            s.push(("max_wal_senders".into(), "16".into()));
        }
        s.extend(self.opts.settings.iter().cloned());
        s
    }

    fn give_to_server(&self, path: &Path) -> Result {
        if let Some((uid, gid)) = self.run_as {
            chown(path, Some(uid), Some(gid))
                .map_err(|e| io_error("giving to the server's user", path, e))?;
        }
        Ok(())
    }

    fn pg_command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
            // The server's user cannot read root's working directory or home.
            cmd.current_dir("/").env("HOME", "/");
        }
        cmd
    }
}

/// Creates (first time) and starts the embedded cluster unless it runs, and creates its
/// database. Returns the cluster and whether it had to start the server.
pub async fn start_embedded(opts: ClusterOptions) -> Result<(Cluster, bool)> {
    let cluster = Cluster::new(opts)?;
    let c = cluster.clone();
    let started = tokio::task::spawn_blocking(move || c.start())
        .await
        .map_err(|e| Error::Cluster(format!("starting the cluster: {e}")))??;
    if started {
        tracing::info!(data_dir = %cluster.data_dir().display(), "started the embedded PostgreSQL cluster");
    }
    artex_actors::blackboard::admin::create_database(&cluster.url("postgres"), DATABASE, None)
        .await?;
    Ok((cluster, started))
}

/// Finds `initdb`, `pg_ctl` and `postgres`: `$ARTEX_PG_BIN`, then `PATH`, then the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps the server binaries off `PATH`).
pub fn find_server_binaries() -> Result<PathBuf> {
    let has_all = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(dir) = std::env::var_os("ARTEX_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if has_all(&dir) {
            Ok(dir)
        } else {
            Err(Error::PostgresMissing(format!(
                "ARTEX_PG_BIN={} does not hold initdb, pg_ctl and postgres; install them with: \
                 sudo apt-get install -y postgresql (Debian puts them in \
                 /usr/lib/postgresql/<version>/bin)",
                dir.display()
            )))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_all(&dir) {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_all(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        Error::PostgresMissing(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) are not on PATH nor in \
             /usr/lib/postgresql/*/bin; install them with: sudo apt-get install -y postgresql \
             (or set ARTEX_PG_BIN, or give --database-url)"
                .into(),
        )
    })
}

/// PostgreSQL will not run as root: as root, run it as the `postgres` system user.
fn unprivileged_identity() -> Result<Option<(u32, u32)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(SUPERUSER) {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        Ok(None) => Err(Error::Cluster(
            "running as root, but there is no 'postgres' system user to run PostgreSQL as \
             (PostgreSQL refuses root); install the postgresql package, which creates it, or \
             run artex as an ordinary user"
                .into(),
        )),
        Err(e) => Err(Error::Cluster(format!("looking up the postgres user: {e}"))),
    }
}

/// Whether every folder from `/` down to `dir` (those that exist) lets others through
/// (`o+x`): what the server's user needs to reach a cluster there.
fn reachable_by_others(dir: &Path) -> bool {
    dir.ancestors().all(|d| match fs::metadata(d) {
        Ok(m) => m.permissions().mode() & 0o001 != 0,
        Err(_) => true,
    })
}

fn percent_encode_path(path: &Path) -> String {
    let mut out = String::new();
    for b in path.to_string_lossy().bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Cluster(format!("{what} {}: {e}", path.display()))
}

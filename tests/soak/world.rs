//! The soak's fleet: PostgreSQL on host `db` (or the formation of the fleet topology on
//! `mon`, `n1`, `n2` and `n3`: see `topology`), planners on `p1` and `p2`, workers on `w1`,
//! `w2` and `w3` (the last upgradable, keeping uploads on a small tmpfs), a client host
//! `cl` for curl and `artex upload`, and `artex serve` in the root namespace (reading
//! through the Unix socket). Every process started here is restarted by [`World::restart`]
//! as a supervisor would after a kill; logs of every generation are kept for the report.
//!
//! Who takes which fault (so that some processes live the whole run, for the memory and
//! descriptor checks): `w2`, `p2` and `w3` are killed; `w1` and `w2` are cut off and
//! frozen; `w3` is upgraded and has its upload disk filled; `p1` and `serve` only ride
//! out PostgreSQL's restarts and stops.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use artex_actors::Blackboard;
use artex_testkit::disk::SmallDisk;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::fleet::Fleet;
use crate::common::procs::{alive, serve_address, Proc};
use crate::topology::Database;
use crate::Soak;

/// The write token of `w3` (uploads) and of `artex serve`.
pub const WRITE_TOKEN: &str = "soak-write-token";
/// The roles a fault may hit, besides PostgreSQL.
pub const ROLES: [&str; 6] = ["p1", "p2", "w1", "w2", "w3", "serve"];
/// Bytes of w3's upload folder (a tmpfs): a few uploads in flight fit, a filler does not.
const UPLOAD_DISK: &str = "48m";

/// One role's process: the handle of the one this run started last (its log holds the
/// log of the processes a hot upgrade spawned from it too) and the pid serving now.
struct Role {
    proc: Proc,
    pid: i32,
    generation: u32,
    /// A fault took it down on purpose (kill -9, a hot upgrade under way): the
    /// supervisor leaves it to the fault.
    held: bool,
}

/// The fleet and its processes.
pub struct World {
    /// The network namespaces.
    pub fleet: Fleet,
    /// PostgreSQL, on host `db` (or the formation and its poolers).
    pub db: Database,
    /// Its URL from the fleet's hosts (TCP).
    pub url: String,
    /// The flags that go with [`World::url`] (LISTEN through a pooler's session alias).
    url_flags: Vec<String>,
    /// A blackboard for the soak itself, through the Unix socket.
    bb: Blackboard,
    /// In the fleet topology, one per node that may be primary (see
    /// [`World::operator`]).
    node_bbs: Vec<Blackboard>,
    /// Upgrade keys, bundles and the upgrade token.
    pub keys: Keys,
    /// Two good bundles (copies of this build told apart by a variant byte), used in turn.
    pub good: Vec<PathBuf>,
    /// A bundle whose binary exits at once: its upgrade must roll back.
    pub bad: PathBuf,
    /// `artex serve`'s address (127.0.0.1:port).
    pub serve_addr: String,
    /// The file every `journal` / `journal-checkpoint` execution appends to.
    pub journal: PathBuf,
    /// w3's upload folder (a tmpfs of [`UPLOAD_DISK`]).
    pub uploads: PathBuf,
    /// Where the files to upload are made.
    pub files: PathBuf,
    /// The file holding [`WRITE_TOKEN`].
    pub token_file: PathBuf,
    /// The history's retention, as given to the planners (e.g. "3m").
    pub retention: String,
    roles: Mutex<HashMap<&'static str, Role>>,
    /// Which of [`World::good`] w3 runs (none: the build the run started with).
    running_good: Mutex<Option<usize>>,
    retired: Mutex<Vec<(String, Proc)>>,
    /// w3's upload disk, unmounted after every process is gone (fields drop in order).
    _disk: SmallDisk,
    _dir: tempfile::TempDir,
}

impl World {
    /// Builds the fleet, starts PostgreSQL and every process, and waits until the
    /// workers are online.
    pub async fn start(soak: &Soak) -> World {
        let topology = soak.settings.topology;
        let hosts: Vec<&str> = topology
            .database_hosts()
            .iter()
            .copied()
            .chain(["p1", "p2", "w1", "w2", "w3", "cl"])
            .collect();
        let fleet = Fleet::new(&hosts);
        let db = Database::start(&fleet, topology).await;
        let (url, url_flags) = db.fleet_url();
        let bb = Blackboard::connect(&db.local_url(), 6).expect("the soak's pool");
        let node_bbs = db
            .node_urls()
            .iter()
            .map(|url| Blackboard::connect(url, 3).expect("the soak's pool of a node"))
            .collect();
        let dir = tempfile::Builder::new()
            .prefix("artex-soak.")
            .tempdir()
            .expect("the soak's folder");
        let keys = Keys::new();
        let good = keys
            .variant_bundles(2)
            .into_iter()
            .map(|(zip, _)| zip)
            .collect();
        let bad = keys.script_bundle(
            "soak-bad",
            "#!/bin/sh\necho 'this build exits' >&2\nexit 3\n",
        );
        let token_file = dir.path().join("write-token");
        std::fs::write(&token_file, WRITE_TOKEN).expect("the write token");
        let uploads = dir.path().join("uploads");
        let disk = SmallDisk::mount(&uploads, UPLOAD_DISK);
        let files = dir.path().join("files");
        std::fs::create_dir_all(&files).expect("the files folder");
        let journal = soak.settings.out.join("journal.log");
        let _ = std::fs::remove_file(&journal);
        let retention = format!("{}m", soak.settings.retention_minutes());

        // `artex serve` reads through the Unix socket: the root namespace is not on the
        // fleet's network.
        let (serve_url, serve_flags) = db.serve_url();
        let mut serve_args: Vec<&str> = vec![
            "serve",
            "--http",
            "127.0.0.1:0",
            "--write-token-file",
            token_file.to_str().unwrap(),
        ];
        serve_args.extend(serve_flags.iter().map(String::as_str));
        let serve = Proc::start("serve", &serve_url, &serve_args, &[]);
        let serve_addr = serve_address(&serve).await;
        let world = World {
            fleet,
            db,
            url,
            url_flags,
            bb,
            node_bbs,
            keys,
            good,
            bad,
            serve_addr,
            journal,
            uploads,
            files,
            token_file,
            retention,
            roles: Mutex::default(),
            running_good: Mutex::default(),
            retired: Mutex::default(),
            _disk: disk,
            _dir: dir,
        };
        let pid = serve.pid();
        world.roles.lock().unwrap().insert(
            "serve",
            Role {
                proc: serve,
                pid,
                generation: 0,
                held: false,
            },
        );
        for role in ["p1", "p2", "w1", "w2", "w3"] {
            world.launch(role);
        }
        let c = crate::common::connect(&world.db.local_url()).await;
        crate::common::procs::wait_online(&c, 3, Duration::from_secs(60)).await;
        world
    }

    /// Starts `role`'s process (again).
    fn launch(&self, role: &'static str) {
        let mut roles = self.roles.lock().unwrap();
        let generation = roles.get(role).map(|r| r.generation + 1).unwrap_or(0);
        let name = format!("{role}.{generation}");
        let flags: Vec<&str> = self.url_flags.iter().map(String::as_str).collect();
        let proc = match role {
            "p1" | "p2" => {
                let mut extra = vec!["--history-retention", &self.retention];
                extra.extend(&flags);
                self.fleet.planner(role, &name, &self.url, &extra)
            }
            "w1" | "w2" => self.fleet.worker(role, &name, &self.url, &flags),
            "w3" => {
                let mut extra: Vec<String> = self.keys.flags("upgrades");
                extra.extend(self.url_flags.iter().cloned());
                extra.extend(
                    [
                        "--write-token-file",
                        self.token_file.to_str().unwrap(),
                        "--upload-dir",
                        self.uploads.to_str().unwrap(),
                        "--upload-sweep-ms",
                        "1000",
                    ]
                    .map(String::from),
                );
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                self.fleet.worker(role, &name, &self.url, &extra)
            }
            "serve" => panic!("serve is never restarted: no fault hits it"),
            other => panic!("no role {other}"),
        };
        let pid = proc.pid();
        if role == "w3" {
            *self.running_good.lock().unwrap() = None;
        }
        if let Some(old) = roles.insert(
            role,
            Role {
                proc,
                pid,
                generation,
                held: false,
            },
        ) {
            self.retired
                .lock()
                .unwrap()
                .push((format!("{role}.{}", old.generation), old.proc));
        }
    }

    /// The soak's operator (its submissions, cancels and pauses): to whichever server
    /// takes writes, but never, in the fleet topology, to a node cut off from the fleet,
    /// which no process on it could reach either.
    pub fn operator(&self) -> artex_actors::blackboard::OperatorBoard {
        match self.db.cut_node() {
            Some(i) => self.node_bbs[1 - i].operator(),
            None => self.bb.operator(),
        }
    }

    /// A client of the primary through its Unix socket, or `None` while it is away (or,
    /// in the fleet topology, while the monitor names no primary).
    pub async fn client(&self) -> Option<tokio_postgres::Client> {
        let url = self.db.primary_url().await?;
        let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
        let (client, connection) = tokio::time::timeout(Duration::from_secs(3), connect)
            .await
            .ok()?
            .ok()?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Some(client)
    }

    /// The good bundle to upgrade w3 to: one it does not run.
    pub fn next_good(&self) -> usize {
        match *self.running_good.lock().unwrap() {
            Some(i) => (i + 1) % self.good.len(),
            None => 0,
        }
    }

    /// w3 runs good bundle `i` now.
    pub fn runs_good(&self, i: usize) {
        *self.running_good.lock().unwrap() = Some(i);
    }

    /// The pid serving as `role` now.
    pub fn pid(&self, role: &str) -> i32 {
        self.roles.lock().unwrap()[role].pid
    }

    /// A hot upgrade handed `role` to `pid`.
    pub fn upgraded(&self, role: &str, pid: i32) {
        if let Some(r) = self.roles.lock().unwrap().get_mut(role) {
            r.pid = pid;
        }
    }

    /// Marks `role` as taken down on purpose (or given back) for the supervisor.
    pub fn hold(&self, role: &str, held: bool) {
        if let Some(r) = self.roles.lock().unwrap().get_mut(role) {
            r.held = held;
        }
    }

    /// What systemd's `Restart=on-failure` does: starts again every role whose process
    /// ended by itself with a failure (e.g. PostgreSQL went away while it started), or,
    /// for w3 after an upgrade, whose serving process is gone. Counted per role.
    pub fn supervise(&self, soak: &Soak) {
        let mut down = Vec::new();
        for (role, r) in self.roles.lock().unwrap().iter_mut() {
            if r.held || *role == "serve" {
                continue;
            }
            let failed = if r.pid == r.proc.pid() {
                r.proc
                    .exited_now()
                    .filter(|s| !s.success())
                    .map(|s| s.to_string())
            } else {
                (!alive(r.pid)).then(|| "the upgraded process is gone".to_string())
            };
            if let Some(why) = failed {
                down.push((*role, why));
            }
        }
        for (role, why) in down {
            soak.count(&format!("supervisor restarted {role} ({why})"));
            self.launch(role);
        }
    }

    /// kill -9 of `role`'s serving process, recorded; returns its pid.
    pub fn kill9(&self, soak: &Soak, role: &str) -> i32 {
        self.hold(role, true);
        let pid = self.pid(role);
        soak.deaths.lock().unwrap().insert(pid, soak.now());
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        pid
    }

    /// Starts `role` again (after a kill), as a supervisor would.
    pub fn restart(&self, role: &'static str) {
        self.launch(role);
    }

    /// `w3`'s HTTP address on the fleet.
    pub fn w3_http(&self) -> String {
        self.fleet.http_addr("w3")
    }

    /// Undoes whatever a fault left: heals every link, thaws every host, starts
    /// PostgreSQL if it is down and every role whose process is gone.
    pub async fn heal_everything(&self) {
        for host in ["w1", "w2", "w3", "p1", "p2"] {
            self.fleet.heal(host);
            self.fleet.signal_host(host, Signal::SIGCONT);
        }
        self.db.heal(&self.fleet).await;
        for role in ["p1", "p2", "w1", "w2", "w3"] {
            if !alive(self.pid(role)) {
                self.launch(role);
            }
        }
    }

    /// Writes every process's log (every generation) and PostgreSQL's into `dir`.
    pub fn keep_logs(&self, dir: &Path) {
        std::fs::create_dir_all(dir).expect("the logs folder");
        for (name, p) in self.retired.lock().unwrap().iter() {
            let _ = std::fs::write(dir.join(format!("{name}.log")), p.log_text());
        }
        for (role, r) in self.roles.lock().unwrap().iter() {
            let _ = std::fs::write(
                dir.join(format!("{role}.{}.log", r.generation)),
                r.proc.log_text(),
            );
        }
        self.db.keep_logs(dir);
    }

    /// The upgrade token (the keys' token file).
    pub fn upgrade_token(&self) -> &'static str {
        TOKEN
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // What a hot upgrade spawned is no handle's child: killed here; the handles
        // kill theirs as the fields drop, and the disk goes last.
        for (_, r) in self.roles.lock().unwrap().drain() {
            if r.pid != r.proc.pid() {
                let _ = kill(Pid::from_raw(r.pid), Signal::SIGKILL);
            }
        }
    }
}

//! The engine behind `/upgrade`: checks the caller, verifies and unpacks the bundle,
//! spawns the new binary, runs the old side of the handover with it (socket, then
//! tasks), and on any failure before `TakenOver` rolls everything back: the child and
//! whatever it started (its own process group) are killed, its tasks come back, the
//! suspended ones resume here.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use artex_actors::blackboard::WorkerState;
use artex_actors::worker::{
    GetId, ResumeReport, ResumeTasks, ResumeWork, SuspendForTransfer, Worker,
};
use artex_actors::Blackboard;
use artex_upgrade::bundle::VerifiedBundle;
use artex_upgrade::channel::ChannelListener;
use artex_upgrade::private_dir::ensure_private_dir;
use artex_upgrade::{bundle, spawn, Limits, VerifyingKey};
use serde::Serialize;
use uuid::Uuid;

use super::old_side::OldSide;
use super::protocol::HandoverError;
use super::schema;
use crate::config::WorkerArgs;
use crate::error::{Error, Result};
use crate::process::{BinaryDigest, GENERATION_MARKER};
use crate::tokens;

/// How the upgrade folder is named in errors.
pub const UPGRADE_FOLDER: &str = "upgrade folder (--upgrade-dir)";

/// What a worker's upgrade flags say: the key bundles must be signed with, the token
/// callers must present, and where bundles are received and unpacked.
pub struct UpgradeSettings {
    /// `--upgrade-public-key`, loaded.
    pub public_key: Option<VerifyingKey>,
    /// `--upgrade-token-file` (or `ARTEX_UPGRADE_TOKEN`), trimmed.
    pub token: Option<String>,
    /// `--upgrade-dir`, or a folder of this user's under the temp folder.
    pub dir: PathBuf,
}

impl UpgradeSettings {
    /// Reads and checks the worker's upgrade flags (the key file, the token file).
    pub fn from_args(args: &WorkerArgs) -> Result<UpgradeSettings> {
        let public_key = args
            .upgrade_public_key
            .as_deref()
            .map(bundle::load_public_key)
            .transpose()?;
        let token = match &args.upgrade_token {
            _ if args.upgrade_token_file.is_some() => {
                tokens::from_file(args.upgrade_token_file.as_deref(), "--upgrade-token-file")?
            }
            Some(t) => Some(t.trim().to_string()),
            None => None,
        };
        if token.as_deref() == Some("") {
            return Err(Error::Invalid("the upgrade token is empty".into()));
        }
        let dir = args.upgrade_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("artex-upgrade-{}", nix::unistd::geteuid()))
        });
        // Refused rather than replaced by a private folder of our own: the folder is
        // where this and the next generations meet, a mistake in it (or somebody else's
        // folder at its path) should show at start-up, not at the first upgrade, and a
        // fallback would hide it. Checked only when upgrades are on, so a worker that never
        // upgrades never cares.
        if public_key.is_some() && token.is_some() {
            ensure_private_dir(&dir, UPGRADE_FOLDER)?;
        }
        Ok(UpgradeSettings {
            public_key,
            token,
            dir,
        })
    }
}

/// Settings and state of the `/upgrade` endpoint of one worker.
pub struct Upgrader {
    /// The worker actor.
    pub worker: Addr<Worker>,
    /// The blackboard.
    pub bb: Blackboard,
    /// Public key bundles must be signed with; upgrades are refused without one.
    pub public_key: Option<VerifyingKey>,
    /// Bearer token the caller must present; upgrades are refused without one.
    pub token: Option<String>,
    /// A duplicate of the HTTP listening socket, to hand to the successor.
    pub listener: std::net::TcpListener,
    /// Where bundles are received and generations unpacked.
    pub dir: PathBuf,
    /// How long the new process has to get ready and take over.
    pub ready_deadline: Duration,
    /// How long an upload may send nothing (`--upgrade-body-timeout-ms`).
    pub body_timeout: Duration,
    /// How long resumable tasks have to reach a checkpoint.
    pub suspend_deadline: Duration,
    /// Lease given to moved tasks, seconds.
    pub lease_secs: f64,
    /// Bundle limits.
    pub limits: Limits,
    /// sha256 of this process's binary.
    pub binary_sha256: BinaryDigest,
    /// Set while an upgrade runs (a second one gets 409).
    pub in_progress: AtomicBool,
    /// Set once a successor took over: this process only finishes what it runs.
    pub handed_over: Arc<AtomicBool>,
}

/// Why an upgrade did not happen, with the HTTP status that says so.
#[derive(Debug)]
pub enum UpgradeError {
    /// 403: no key or token configured.
    NotConfigured(String),
    /// 401: missing or wrong token.
    Unauthorized,
    /// 409: another upgrade is running.
    InProgress,
    /// 409: the new build cannot run against the database's schema (the message names
    /// the migration and what to run); nothing was spawned.
    Schema(String),
    /// 413: bundle larger than allowed.
    TooLarge(u64),
    /// 408: the upload stalled or took too long (what and how far is said).
    Timeout(String),
    /// 400: the bundle was refused (what was wrong is said).
    BadBundle(String),
    /// 500: the new process failed; everything was rolled back.
    RolledBack {
        /// What went wrong.
        why: String,
        /// The child's pid, if it was spawned.
        child_pid: Option<u32>,
        /// Milliseconds from upload received to rollback complete.
        elapsed_ms: u64,
    },
    /// 500: something on this side failed before anything changed.
    Internal(String),
}

/// A completed (or unnecessary) upgrade.
#[derive(Debug, Serialize)]
pub struct UpgradeReport {
    /// `upgraded` or `unchanged`.
    pub status: &'static str,
    /// This process.
    pub old_pid: u32,
    /// The new process (absent when unchanged).
    pub new_pid: Option<u32>,
    /// Old build version.
    pub old_version: String,
    /// New build version (from the signed manifest).
    pub new_version: String,
    /// sha256 of the new binary.
    pub new_binary_sha256: String,
    /// The new worker's id.
    pub new_worker: Option<String>,
    /// Running tasks resumed by the new process.
    pub tasks_resumed: usize,
    /// Running tasks the blackboard no longer had (conflicts, handled).
    pub tasks_conflicting: usize,
    /// Unstarted tasks moved to the new process.
    pub tasks_moved_unstarted: i64,
    /// Milliseconds from upload received to each step.
    pub timings_ms: Timings,
}

/// Milliseconds since the upload was received.
#[derive(Debug, Default, Serialize)]
pub struct Timings {
    /// Bundle verified and unpacked.
    pub verified: u64,
    /// New process registered.
    pub ready: u64,
    /// New process accepting on the socket.
    pub serving: u64,
    /// Tasks handed over; this process drains next.
    pub taken_over: u64,
}

/// How far a handover got: what a rollback has to put back.
#[derive(Default)]
struct Progress {
    /// The new worker's id, once it registered.
    child_worker: Option<String>,
    /// Resumable tasks stopped at a checkpoint here, to resume there.
    suspended: Vec<(Uuid, i64)>,
    /// Unstarted tasks moved to the new worker.
    moved: i64,
}

impl Upgrader {
    /// Checks configuration and the bearer token, in that order.
    pub fn authorize(&self, header: Option<&str>) -> Result<(), UpgradeError> {
        let (Some(_), Some(token)) = (&self.public_key, &self.token) else {
            return Err(UpgradeError::NotConfigured(
                "upgrades not configured: start the worker with --upgrade-public-key and \
                 --upgrade-token-file (or ARTEX_UPGRADE_TOKEN)"
                    .into(),
            ));
        };
        if !tokens::matches(tokens::bearer(header).unwrap_or(""), token) {
            return Err(UpgradeError::Unauthorized);
        }
        Ok(())
    }

    /// A fresh private folder (0700) under the upgrade folder, which is checked again
    /// first: a temp cleaner may have removed it since start-up, and anyone may have
    /// created the path since.
    pub fn fresh_dir(&self, prefix: &str) -> Result<PathBuf, String> {
        use std::os::unix::fs::DirBuilderExt;
        ensure_private_dir(&self.dir, UPGRADE_FOLDER).map_err(|e| e.to_string())?;
        let dir = self
            .dir
            .join(format!("{prefix}-{}", Uuid::new_v4().simple()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// Runs an upgrade from the bundle at `zip` (received at `received`). The caller holds
    /// `in_progress`.
    pub async fn upgrade(
        &self,
        zip: &Path,
        received: Instant,
    ) -> Result<UpgradeReport, UpgradeError> {
        let ms = |t: Instant| t.duration_since(received).as_millis() as u64;
        let (verified, gen_dir) = self.unpack(zip).await?;
        let mut timings = Timings {
            verified: ms(Instant::now()),
            ..Default::default()
        };
        let mut report = UpgradeReport {
            status: "unchanged",
            old_pid: std::process::id(),
            new_pid: None,
            old_version: crate::VERSION.to_string(),
            new_version: verified.manifest.version.clone(),
            new_binary_sha256: verified.manifest.binary_sha256.clone(),
            new_worker: None,
            tasks_resumed: 0,
            tasks_conflicting: 0,
            tasks_moved_unstarted: 0,
            timings_ms: Timings::default(),
        };
        if verified.manifest.binary_sha256 == self.binary_sha256.get().await {
            let _ = std::fs::remove_dir_all(&gen_dir);
            report.timings_ms = timings;
            return Ok(report);
        }
        // Before anything is spawned: a new build that needs a migration the database does
        // not have would only fail its own start (a rollback at best); one that predates
        // a contraction would break on the first statement that touches it.
        if let Err(e) = schema::check_new_build(&self.bb, verified.manifest.schema.as_ref()).await {
            let _ = std::fs::remove_dir_all(&gen_dir);
            if let UpgradeError::Schema(why) = &e {
                tracing::warn!(version = %verified.manifest.version, %why, "upgrade refused");
            }
            return Err(e);
        }
        let old_worker = self
            .worker
            .send(GetId)
            .await
            .map_err(|e| UpgradeError::Internal(format!("worker actor: {e}")))?;
        let hs = ChannelListener::bind(&gen_dir.join("handover"))
            .map_err(|e| UpgradeError::Internal(format!("handover socket: {e}")))?;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        // Process groups, and why the child gets one of its own only for a while: a
        // rollback must end the child *and everything it started* (a script's background
        // job, a handler's subprocess), which a kill by pid misses: its orphans would live
        // on under init. So the child leads a new group, and a rollback signals the whole
        // group (`kill_group_and_reap`). It cannot stay there once it took over, though:
        // the process group we live in is what supervisors track (`artex master` sees the
        // generation of a lineage gone when its group is empty; a terminal signals its
        // foreground group), and nothing must ever kill our own group on a rollback. So
        // `Transfer` tells the child to move into our group before it says `TakenOver`;
        // from then on it lives exactly where a successor always lived, and a rollback
        // (which can only come before `TakenOver`) still reaches what it started meanwhile,
        // left behind in the group it led. Why not track descendants by /proc instead: an
        // orphan's parent link is lost the moment its parent exits, and under a subreaper
        // it is adopted by someone else; a group survives both.
        let our_group = nix::unistd::getpgrp().as_raw() as u32;
        let options = spawn::SpawnOptions {
            process_group: Some(0),
            ..spawn::SpawnOptions::default()
        };
        let mut child = spawn::spawn_with(&verified.binary, hs.path(), &args, &options)
            .map_err(|e| UpgradeError::Internal(format!("spawning the new binary: {e}")))?;
        let child_pid = child.id().unwrap_or(0);
        tracing::info!(child_pid, version = %verified.manifest.version, "upgrade: new process spawned");

        // Until `TakenOver`, any failure rolls back; `progress` says how far it got.
        let mut progress = Progress::default();
        let deadline = tokio::time::Instant::now() + self.ready_deadline;
        let handed = async {
            let mut old = OldSide::accept(&hs, &mut child, child_pid, deadline).await?;
            self.hand_over(
                &mut old,
                &old_worker,
                our_group,
                &mut progress,
                &mut timings,
                &ms,
            )
            .await
        }
        .await;
        match handed {
            Ok(taken) => {
                timings.taken_over = ms(Instant::now());
                self.handed_over.store(true, Ordering::Release);
                warn_if_not_in_group(child_pid, our_group);
                tracing::info!(
                    child_pid,
                    resumed = taken.resumed.len(),
                    moved = progress.moved,
                    "upgrade: the new process took over; this one drains"
                );
                report.status = "upgraded";
                report.new_pid = Some(child_pid);
                report.new_worker = progress.child_worker;
                report.tasks_resumed = taken.resumed.len();
                report.tasks_conflicting = taken.conflicts.len();
                report.tasks_moved_unstarted = progress.moved;
                report.timings_ms = timings;
                Ok(report)
            }
            Err(why) => {
                tracing::error!(child_pid, %why, "upgrade failed; rolling back");
                self.handed_over.store(false, Ordering::Release);
                // The group is the child's own (see above), never ours.
                let grace = Duration::from_secs(2);
                let stopped = if child_pid > 1 {
                    spawn::kill_group_and_reap(&mut child, child_pid, grace).await
                } else {
                    spawn::kill_and_reap(&mut child, grace).await
                };
                if let Err(e) = stopped {
                    tracing::warn!(child_pid, error = %e, "rollback: cannot stop the new process");
                }
                self.roll_back(&old_worker, progress).await;
                let _ = std::fs::remove_dir_all(&gen_dir);
                Err(UpgradeError::RolledBack {
                    why: why.to_string(),
                    child_pid: Some(child_pid),
                    elapsed_ms: ms(Instant::now()),
                })
            }
        }
    }

    /// Verifies and unpacks the bundle into a fresh generation folder, off the async
    /// threads (it reads and hashes the whole binary).
    async fn unpack(&self, zip: &Path) -> Result<(VerifiedBundle, PathBuf), UpgradeError> {
        let gen_dir = self
            .fresh_dir("gen")
            .map_err(|e| UpgradeError::Internal(format!("creating a generation folder: {e}")))?;
        let key = self
            .public_key
            .ok_or_else(|| UpgradeError::NotConfigured("no key".into()))?;
        let (zip_path, dest, limits) = (zip.to_path_buf(), gen_dir.clone(), self.limits);
        let verified =
            tokio::task::spawn_blocking(move || bundle::unpack(&zip_path, &key, &limits, &dest))
                .await
                .map_err(|e| UpgradeError::Internal(format!("verifying the bundle: {e}")))?;
        match verified {
            Ok(v) => {
                // Marks the folder as a generation: that generation removes it when it exits.
                let _ = std::fs::write(gen_dir.join(GENERATION_MARKER), b"");
                Ok((v, gen_dir))
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&gen_dir);
                Err(UpgradeError::BadBundle(e.to_string()))
            }
        }
    }

    /// The handover proper, once the child said `Hello`: it gets ready, receives the
    /// socket, this process suspends its resumable tasks and moves its unstarted ones,
    /// and the child takes the suspended ones over.
    async fn hand_over(
        &self,
        old: &mut OldSide<'_>,
        old_worker: &str,
        our_group: u32,
        progress: &mut Progress,
        timings: &mut Timings,
        ms: &impl Fn(Instant) -> u64,
    ) -> Result<ResumeReport, HandoverError> {
        let http_addr = self
            .listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let child_worker = old.ready(&http_addr, old_worker).await?;
        progress.child_worker = Some(child_worker.clone());
        timings.ready = ms(Instant::now());
        old.pass_listener(self.listener.as_fd()).await?;
        timings.serving = ms(Instant::now());
        // From here the successor serves this socket too: this process reports ready
        // while it hands over (a draining 503 would fail callers for no reason).
        self.handed_over.store(true, Ordering::Release);
        let handover = self
            .worker
            .send(SuspendForTransfer {
                deadline: self.suspend_deadline,
            })
            .await
            .map_err(|source| HandoverError::Actor {
                step: "suspending tasks",
                source,
            })?;
        progress.suspended = handover.suspended;
        // Everything else assigned here moves; what runs on here and what is handed
        // over below stays put.
        let mut keep = handover.staying;
        keep.extend(progress.suspended.iter().map(|(id, _)| *id));
        progress.moved = self
            .bb
            .move_assigned(old_worker, &child_worker, self.lease_secs, &keep)
            .await
            .map_err(|source| HandoverError::Blackboard {
                step: "moving unstarted tasks",
                source,
            })?;
        old.transfer(old_worker, progress.suspended.clone(), Some(our_group))
            .await
    }

    /// Puts back what a failed handover had changed (the child is dead by now): the
    /// tasks that reached it come back here, it is marked gone, suspended tasks resume
    /// here and the worker takes new work again. What cannot be put back is left to
    /// the reaper, and said.
    async fn roll_back(&self, old_worker: &str, progress: Progress) {
        if let Some(cw) = &progress.child_worker {
            if let Err(e) = self
                .bb
                .move_assigned(cw, old_worker, self.lease_secs, &[])
                .await
            {
                tracing::warn!(error = %e, "rollback: cannot take back unstarted tasks; the reaper will");
            }
            if let Err(e) = self.bb.set_worker_state(cw, WorkerState::Gone).await {
                tracing::warn!(error = %e, "rollback: cannot mark the failed worker gone");
            }
        }
        if !progress.suspended.is_empty() {
            let resumed = self
                .worker
                .send(ResumeTasks {
                    from: old_worker.to_string(),
                    tasks: progress.suspended,
                })
                .await;
            match resumed {
                Ok(Ok(r)) => tracing::info!(
                    resumed = r.resumed.len(),
                    "rollback: resumed suspended tasks here"
                ),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "rollback: cannot resume suspended tasks; the reaper will")
                }
                Err(e) => tracing::warn!(error = %e, "rollback: worker actor unavailable"),
            }
        }
        self.worker.do_send(ResumeWork);
    }
}

/// A successor built before process groups were handed back ignores `join_group` and
/// stays in the group it was spawned in: it works, but a supervisor tracking our group
/// (`artex master`) no longer sees it. The handover is complete by now, so say so.
fn warn_if_not_in_group(child_pid: u32, group: u32) {
    let Ok(pid) = i32::try_from(child_pid) else {
        return;
    };
    match nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))) {
        Ok(g) if g.as_raw() as u32 == group => {}
        Ok(g) => tracing::warn!(
            child_pid,
            child_group = g.as_raw(),
            group,
            "the new process did not move into this process group (a build older than \
             the group hand-back?); a supervisor tracking the group will not see it"
        ),
        Err(e) => tracing::warn!(child_pid, error = %e, "cannot read the new process's group"),
    }
}

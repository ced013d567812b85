//! The old process's side of an upgrade, the engine behind `/upgrade`: [`Upgrader::run`]
//! checks the caller, receives, verifies and unpacks the bundle, spawns the new binary,
//! runs the old side of the upgrade channel with it (the listener pass, then the task
//! transfer), and on any failure before `TakenOver` rolls everything back: the child and
//! whatever it started (its own process group) are killed, its tasks come back, the
//! suspended ones resume here. On success it starts this process's drain.

use artex_actors::trace::{OpSpan, TraceParent};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use artex_actors::blackboard::WorkerState;
use artex_actors::error::retry_unreachable;
use artex_actors::worker::{
    GetId, ResumeReport, ResumeTasks, ResumeWork, SuspendForTransfer, TransferDone, Worker,
};
use artex_actors::Blackboard;
use artex_upgrade::bundle::VerifiedBundle;
use artex_upgrade::channel::ChannelListener;
use artex_upgrade::private_dir::ensure_private_dir;
use artex_upgrade::{bundle, spawn, Limits, VerifyingKey};
use futures_util::Stream;
use serde::Serialize;
use uuid::Uuid;

use super::channel::ChannelError;
use super::error::UpgradeError;
use super::generation::GENERATION_MARKER;
use super::old_side::OldSide;
use super::programs;
use super::receive::{self, Form, MAX_UPLOAD};
use super::schema;
use crate::config::WorkerArgs;
use crate::error::{Error, Result};
use crate::process::BinaryDigest;
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
    /// A duplicate of the HTTP listening socket, for the listener pass.
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
    /// `--tasks-dir`: beside it, the programs a bundle carries are installed.
    pub tasks_dir: Option<PathBuf>,
    /// sha256 of this process's binary.
    pub binary_sha256: BinaryDigest,
    /// Set while an upgrade runs (a second one gets 409).
    pub in_progress: AtomicBool,
    /// Set once the listener pass is done (and cleared by a rollback): the successor
    /// serves the socket too, and this process only finishes what it runs.
    pub listener_passed: Arc<AtomicBool>,
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
    /// Task transfer done; this process drains next.
    pub taken_over: u64,
}

/// How far an upgrade got: what a rollback has to put back.
#[derive(Default)]
struct Progress {
    /// The new worker's id, once it registered.
    child_worker: Option<String>,
    /// Resumable tasks stopped at a checkpoint here, to resume there.
    suspended: Vec<(Uuid, i64)>,
    /// Unstarted tasks moved to the new worker.
    moved: i64,
}

/// What an upgrade needs of its `/upgrade` request's headers (the route reads them).
pub struct UpgradeRequest<'a> {
    /// `Authorization`: the bearer token.
    pub authorization: Option<&'a str>,
    /// `Content-Length`, if the caller said.
    pub content_length: Option<&'a str>,
    /// `Content-Type`: a raw ZIP, or a multipart form.
    pub content_type: Option<&'a str>,
    /// `traceparent`: the W3C context the upgrade's spans join (docs/tracing.md).
    pub traceparent: Option<&'a str>,
}

/// Holds the one upgrade slot ([`Upgrader::in_progress`]); frees it however the upgrade
/// ends: answered, failed, or dropped with the connection.
struct Slot<'a>(&'a AtomicBool);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Removes a folder when dropped (the received upload, whatever became of it).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Upgrader {
    /// A whole upgrade, old side, for one `/upgrade` request: authenticates the caller,
    /// refuses a second upgrade while one runs, receives the bundle ([`receive`]), runs
    /// the upgrade itself ([`Upgrader::upgrade`]), and once the new process took over
    /// starts this process's drain.
    pub async fn run<S, E>(
        &self,
        req: UpgradeRequest<'_>,
        body: S,
    ) -> Result<UpgradeReport, UpgradeError>
    where
        S: Stream<Item = Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        // With tracing on, the upgrade's span (a child of the caller's context, if it
        // sent one) and its upload's.
        let given = req.traceparent.and_then(|t| TraceParent::parse(t).ok());
        let span = OpSpan::start("artex.upgrade", given.as_ref());
        let context = span.as_ref().and_then(OpSpan::context);
        let result = self.run_untraced(req, body, context).await;
        if let Some(mut span) = span {
            match &result {
                Ok(r) => {
                    span.set_text("artex.upgrade.status", r.status);
                    span.set_text("artex.upgrade.new_version", r.new_version.clone());
                    span.set_int("artex.upgrade.tasks_resumed", r.tasks_resumed as i64);
                    if let Some(pid) = r.new_pid {
                        span.set_int("artex.upgrade.new_pid", i64::from(pid));
                    }
                    span.end(None);
                }
                Err(e) => span.end(Some(&format!("{e:?}"))),
            }
        }
        result
    }

    /// [`Upgrader::run`] without its span; the upload's span is a child of `context`.
    async fn run_untraced<S, E>(
        &self,
        req: UpgradeRequest<'_>,
        body: S,
        context: Option<TraceParent>,
    ) -> Result<UpgradeReport, UpgradeError>
    where
        S: Stream<Item = Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let received = Instant::now();
        self.authorize(req.authorization)?;
        let declared = req
            .content_length
            .and_then(|l| l.trim().parse::<u64>().ok());
        if declared.is_some_and(|l| l > MAX_UPLOAD) {
            return Err(UpgradeError::TooLarge(MAX_UPLOAD));
        }
        let form = Form::of(req.content_type.unwrap_or("")).map_err(UpgradeError::BadBundle)?;
        let _slot = self.begin()?;
        let incoming = self
            .fresh_dir("incoming")
            .map_err(|e| UpgradeError::Internal(format!("upload folder: {e}")))?;
        let _incoming = RemoveOnDrop(incoming.clone());
        let upload = context.and_then(|c| OpSpan::start("artex.upgrade.upload", Some(&c)));
        let zip = receive::receive(body, &incoming, form, self.body_timeout).await;
        if let Some(mut upload) = upload {
            match &zip {
                Ok(zip) => {
                    let bytes = std::fs::metadata(zip).map_or(0, |m| m.len());
                    upload.set_int("artex.upgrade.bundle_bytes", bytes as i64);
                    upload.end(None);
                }
                Err(e) => upload.end(Some(&format!("{e:?}"))),
            }
        }
        let zip = zip?;
        let report = self.upgrade(&zip, received).await?;
        if report.status == "upgraded" {
            // The drain of this process, exactly as an operator's SIGUSR2 would start it;
            // the HTTP server finishes this response before it stops.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGUSR2);
        }
        Ok(report)
    }

    /// Takes the one upgrade slot, or says another upgrade runs (409).
    fn begin(&self) -> Result<Slot<'_>, UpgradeError> {
        self.in_progress
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Slot(&self.in_progress))
            .map_err(|_| UpgradeError::InProgress)
    }

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

    /// Runs an upgrade from the bundle at `zip` (received at `received`): unpacks and
    /// verifies it, spawns its binary, passes the listener, transfers the tasks, or rolls
    /// back. The caller holds `in_progress`.
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
        // The same binary with programs is an upgrade all the same: of the programs.
        if verified.manifest.binary_sha256 == self.binary_sha256.get().await
            && verified.tasks.is_none()
        {
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
        let programs = match self.install_programs(&verified) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&gen_dir);
                return Err(e);
            }
        };
        let old_worker = self
            .worker
            .send(GetId)
            .await
            .map_err(|e| UpgradeError::Internal(format!("worker actor: {e}")))?;
        let channel = ChannelListener::bind(&gen_dir.join("channel"))
            .map_err(|e| UpgradeError::Internal(format!("upgrade channel socket: {e}")))?;
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
            env: programs
                .iter()
                .map(|p| (programs::UPGRADE_TASKS_ENV.into(), p.clone().into()))
                .collect(),
            ..spawn::SpawnOptions::default()
        };
        let mut child = spawn::spawn_with(&verified.binary, channel.path(), &args, &options)
            .map_err(|e| UpgradeError::Internal(format!("spawning the new binary: {e}")))?;
        let child_pid = child.id().unwrap_or(0);
        tracing::info!(child_pid, version = %verified.manifest.version, "upgrade: new process spawned");

        // Until `TakenOver`, any failure rolls back; `progress` says how far it got.
        let mut progress = Progress::default();
        let deadline = tokio::time::Instant::now() + self.ready_deadline;
        let outcome = async {
            let mut old = OldSide::accept(&channel, &mut child, child_pid, deadline).await?;
            let child_worker = self
                .pass_listener(&mut old, &old_worker, &mut progress, &mut timings, &ms)
                .await?;
            self.transfer_tasks(
                &mut old,
                &old_worker,
                &child_worker,
                our_group,
                &mut progress,
            )
            .await
        }
        .await;
        match outcome {
            Ok(taken) => {
                timings.taken_over = ms(Instant::now());
                self.worker.do_send(TransferDone);
                if let (Some(new), Some(dir)) = (&programs, &self.tasks_dir) {
                    // This generation's own, until it has drained; older ones now go.
                    let ours = programs::effective_dir(Some(dir));
                    let keep: Vec<&Path> = [Some(new.as_path()), ours.as_deref()]
                        .into_iter()
                        .flatten()
                        .collect();
                    programs::prune(dir, &keep);
                }
                self.listener_passed.store(true, Ordering::Release);
                warn_if_not_in_group(child_pid, our_group);
                tracing::info!(
                    child_pid,
                    resumed = taken.resumed.len(),
                    moved = progress.moved,
                    "upgrade: task transfer done, the new process took over; this one drains"
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
                self.listener_passed.store(false, Ordering::Release);
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
                if let Some(p) = &programs {
                    let _ = std::fs::remove_dir_all(p);
                }
                Err(UpgradeError::RolledBack {
                    why: why.to_string(),
                    child_pid: Some(child_pid),
                    elapsed_ms: ms(Instant::now()),
                })
            }
        }
    }

    /// Installs the programs the bundle carries beside `--tasks-dir` for the new
    /// generation (see [`programs`]); where, or `None` for a bundle without any.
    fn install_programs(&self, verified: &VerifiedBundle) -> Result<Option<PathBuf>, UpgradeError> {
        let Some(from) = &verified.tasks else {
            return Ok(None);
        };
        let Some(dir) = &self.tasks_dir else {
            return Err(UpgradeError::BadBundle(format!(
                "the bundle carries programs ({} files under tasks/), but this worker runs no \
                 --tasks-dir to install them beside; start it with --tasks-dir",
                verified.manifest.tasks.len()
            )));
        };
        let installed = programs::install(from, dir).map_err(UpgradeError::Internal)?;
        tracing::info!(dir = %installed.display(), files = verified.manifest.tasks.len(),
            "upgrade: the bundle's programs installed for the new generation");
        Ok(Some(installed))
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

    /// The listener pass, once the child said `Hello`: it gets ready (registered in the
    /// blackboard, its id returned), then receives the listening socket. From then on
    /// both processes accept on it.
    async fn pass_listener(
        &self,
        old: &mut OldSide<'_>,
        old_worker: &str,
        progress: &mut Progress,
        timings: &mut Timings,
        ms: &impl Fn(Instant) -> u64,
    ) -> Result<String, ChannelError> {
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
        // while the upgrade finishes (a draining 503 would fail callers for no reason).
        self.listener_passed.store(true, Ordering::Release);
        Ok(child_worker)
    }

    /// The task transfer: this process suspends its resumable tasks at a checkpoint and
    /// moves its unstarted ones to `child_worker` in the blackboard (fenced), and the
    /// child takes the suspended ones over; it moves into `our_group` before it answers.
    async fn transfer_tasks(
        &self,
        old: &mut OldSide<'_>,
        old_worker: &str,
        child_worker: &str,
        our_group: u32,
        progress: &mut Progress,
    ) -> Result<ResumeReport, ChannelError> {
        // Out of the planners' rounds before it stops taking work: a task assigned here
        // after the unstarted ones moved would wait for this process's drain to give it
        // back (or for the reaper, were the database away then).
        let patience = Some(self.lease());
        let board = self.bb.worker();
        if let Err(e) = retry_unreachable(patience, "marking this worker upgrading", || {
            board.set_worker_state(old_worker, WorkerState::Upgrading)
        })
        .await
        {
            tracing::warn!(error = %e, "cannot mark this worker upgrading; planners may still assign to it (its drain gives that back)");
        }
        let suspended = self
            .worker
            .send(SuspendForTransfer {
                deadline: self.suspend_deadline,
            })
            .await
            .map_err(|source| ChannelError::Actor {
                step: "suspending tasks",
                source,
            })?;
        progress.suspended = suspended.suspended;
        // Everything else assigned here moves; what runs on here and what is transferred
        // below stays put.
        let mut keep = suspended.staying;
        keep.extend(progress.suspended.iter().map(|(id, _)| *id));
        progress.moved = retry_unreachable(patience, "moving unstarted tasks", || {
            board.move_assigned(old_worker, child_worker, self.lease_secs, &keep)
        })
        .await
        .map_err(|source| ChannelError::Blackboard {
            step: "moving unstarted tasks",
            source,
        })?;
        old.transfer(old_worker, progress.suspended.clone(), Some(our_group))
            .await
    }

    /// The worker's lease: how long a step of the transfer or of a rollback waits for a
    /// database that is away (its tasks' leases would not outlast more).
    fn lease(&self) -> Duration {
        Duration::try_from_secs_f64(self.lease_secs).unwrap_or(Duration::from_secs(30))
    }

    /// Puts back what a failed upgrade had changed (the child is dead by now): the
    /// tasks that reached it come back here, it is marked gone, suspended tasks resume
    /// here and the worker takes new work again. What cannot be put back is left to
    /// the reaper, and said.
    async fn roll_back(&self, old_worker: &str, progress: Progress) {
        // Each step waits a lease for a database that is away (a failover).
        let (patience, board) = (Some(self.lease()), self.bb.worker());
        if let Some(cw) = &progress.child_worker {
            if let Err(e) =
                retry_unreachable(patience, "rollback: taking back unstarted tasks", || {
                    board.move_assigned(cw, old_worker, self.lease_secs, &[])
                })
                .await
            {
                tracing::warn!(error = %e, "rollback: cannot take back unstarted tasks; the reaper will");
            }
            if let Err(e) =
                retry_unreachable(patience, "rollback: marking the new process gone", || {
                    board.set_worker_state(cw, WorkerState::Gone)
                })
                .await
            {
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

/// A successor built before process groups were given back ignores `join_group` and
/// stays in the group it was spawned in: it works, but a supervisor tracking our group
/// (`artex master`) no longer sees it. The task transfer is complete by now, so say so.
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
             the move into this group?); a supervisor tracking the group will not see it"
        ),
        Err(e) => tracing::warn!(child_pid, error = %e, "cannot read the new process's group"),
    }
}

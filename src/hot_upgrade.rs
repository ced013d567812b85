//! Hot upgrade, both sides of the handover. The old process verifies the bundle, spawns
//! the new binary, and over the handover socket: hears `Hello`, names its HTTP address,
//! waits for `Ready` (database reached, registered), passes the listening socket
//! (SCM_RIGHTS) only then — so a child that never gets ready never accepts a connection —
//! waits for `Serving`, suspends its resumable tasks at their next checkpoint, moves its
//! unstarted tasks, sends `Transfer` and waits for `TakenOver`. Any failure before that
//! kills the child and puts everything back (rollback). The new process runs the mirror
//! image in [`successor`].

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use artex_actors::worker::{
    GetId, ResumeReport, ResumeTasks, ResumeWork, SuspendForHandover, Worker,
};
use artex_actors::Blackboard;
use artex_upgrade::handover::{self, Channel, HandoverListener};
use artex_upgrade::{bundle, spawn, Limits, VerifyingKey};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One message of the handover protocol (both directions).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    /// Child → parent, first: who it is.
    Hello {
        /// Child pid.
        pid: u32,
        /// Child build version.
        version: String,
        /// Handover protocol it speaks.
        protocol: u32,
    },
    /// Parent → child: where it will serve, and whose tasks it will take.
    Welcome {
        /// The HTTP address of the listening socket it will receive.
        http_addr: String,
        /// The old worker's id.
        old_worker: String,
    },
    /// Child → parent: connected to the blackboard and registered.
    Ready {
        /// The new worker's id.
        worker_id: String,
    },
    /// Parent → child: the listening socket (attached as a file descriptor).
    Listener,
    /// Child → parent: accepting on the socket.
    Serving,
    /// Parent → child: take over these running tasks (held by `from` at these epochs).
    Transfer {
        /// Old worker id.
        from: String,
        /// (task, epoch).
        tasks: Vec<(Uuid, i64)>,
    },
    /// Child → parent: what it took over.
    TakenOver {
        /// The takeover's report.
        report: ResumeReport,
    },
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
    /// How long resumable tasks have to reach a checkpoint.
    pub suspend_deadline: Duration,
    /// Lease given to moved tasks, seconds.
    pub lease_secs: f64,
    /// Bundle limits.
    pub limits: Limits,
    /// sha256 of this process's binary.
    pub binary_sha256: crate::BinaryDigest,
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
    /// 413: bundle larger than allowed.
    TooLarge(u64),
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
        let given = header
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("")
            .trim();
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            return Err(UpgradeError::Unauthorized);
        }
        Ok(())
    }

    /// A fresh private folder (0700) under the upgrade folder.
    pub fn fresh_dir(&self, prefix: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let dir = self
            .dir
            .join(format!("{prefix}-{}", Uuid::new_v4().simple()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
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
        let verified = match verified {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&gen_dir);
                return Err(UpgradeError::BadBundle(e.to_string()));
            }
        };
        // Marks the folder as a generation, so that generation removes it when it exits.
        let _ = std::fs::write(gen_dir.join(".artex-generation"), b"");
        let mut timings = Timings {
            verified: ms(Instant::now()),
            ..Default::default()
        };
        let old_version = crate::VERSION.to_string();
        if verified.manifest.binary_sha256 == self.binary_sha256.get().await {
            let _ = std::fs::remove_dir_all(&gen_dir);
            return Ok(UpgradeReport {
                status: "unchanged",
                old_pid: std::process::id(),
                new_pid: None,
                old_version,
                new_version: verified.manifest.version,
                new_binary_sha256: verified.manifest.binary_sha256,
                new_worker: None,
                tasks_resumed: 0,
                tasks_conflicting: 0,
                tasks_moved_unstarted: 0,
                timings_ms: timings,
            });
        }
        let old_worker = self
            .worker
            .send(GetId)
            .await
            .map_err(|e| UpgradeError::Internal(format!("worker actor: {e}")))?;
        let socket_dir = gen_dir.join("handover");
        let hs = HandoverListener::bind(&socket_dir)
            .map_err(|e| UpgradeError::Internal(format!("handover socket: {e}")))?;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let mut child = spawn::spawn(&verified.binary, hs.path(), &args, &[])
            .map_err(|e| UpgradeError::Internal(format!("spawning the new binary: {e}")))?;
        let child_pid = child.id().unwrap_or(0);
        tracing::info!(child_pid, version = %verified.manifest.version, "upgrade: new process spawned");

        // Until `TakenOver`, any failure rolls back; the step says how far it got.
        let mut child_worker: Option<String> = None;
        let mut suspended: Vec<(Uuid, i64)> = Vec::new();
        let mut moved: i64 = 0;
        let deadline = tokio::time::Instant::now() + self.ready_deadline;
        let outcome: Result<ResumeReport, String> = async {
            let mut old = OldSide::accept(&hs, &mut child, child_pid, deadline).await?;
            let http_addr = self
                .listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            child_worker = Some(old.ready(&http_addr, &old_worker).await?);
            timings.ready = ms(Instant::now());
            old.pass_listener(self.listener.as_fd()).await?;
            timings.serving = ms(Instant::now());
            // From here the successor serves this socket too: this process reports ready
            // while it hands over (a draining 503 would fail callers for no reason).
            self.handed_over.store(true, Ordering::Release);
            let handover = self
                .worker
                .send(SuspendForHandover {
                    deadline: self.suspend_deadline,
                })
                .await
                .map_err(|e| format!("suspending tasks: {e}"))?;
            suspended = handover.suspended;
            // Everything else assigned here moves; what runs on here and what is handed
            // over below stays put.
            let mut keep = handover.staying;
            keep.extend(suspended.iter().map(|(id, _)| *id));
            let to = child_worker.clone().unwrap_or_default();
            moved = self
                .bb
                .move_assigned(&old_worker, &to, self.lease_secs, &keep)
                .await
                .map_err(|e| format!("moving unstarted tasks: {e}"))?;
            old.transfer(&old_worker, suspended.clone()).await
        }
        .await;

        match outcome {
            Ok(report) => {
                timings.taken_over = ms(Instant::now());
                self.handed_over.store(true, Ordering::Release);
                tracing::info!(
                    child_pid,
                    resumed = report.resumed.len(),
                    moved,
                    "upgrade: the new process took over; this one drains"
                );
                Ok(UpgradeReport {
                    status: "upgraded",
                    old_pid: std::process::id(),
                    new_pid: Some(child_pid),
                    old_version,
                    new_version: verified.manifest.version,
                    new_binary_sha256: verified.manifest.binary_sha256,
                    new_worker: child_worker,
                    tasks_resumed: report.resumed.len(),
                    tasks_conflicting: report.conflicts.len(),
                    tasks_moved_unstarted: moved,
                    timings_ms: timings,
                })
            }
            Err(why) => {
                tracing::error!(child_pid, %why, "upgrade failed; rolling back");
                self.handed_over.store(false, Ordering::Release);
                let _ = spawn::kill_and_reap(&mut child, Duration::from_secs(2)).await;
                if let Some(cw) = &child_worker {
                    // Whatever reached the dead child comes back here.
                    if let Err(e) = self
                        .bb
                        .move_assigned(cw, &old_worker, self.lease_secs, &[])
                        .await
                    {
                        tracing::warn!(error = %e, "rollback: cannot take back unstarted tasks; the reaper will");
                    }
                    if let Err(e) = self
                        .bb
                        .set_worker_state(cw, artex_actors::blackboard::WorkerState::Gone)
                        .await
                    {
                        tracing::warn!(error = %e, "rollback: cannot mark the failed worker gone");
                    }
                }
                if !suspended.is_empty() {
                    let tasks = std::mem::take(&mut suspended);
                    match self
                        .worker
                        .send(ResumeTasks {
                            from: old_worker.clone(),
                            tasks,
                        })
                        .await
                    {
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
                let _ = std::fs::remove_dir_all(&gen_dir);
                Err(UpgradeError::RolledBack {
                    why,
                    child_pid: Some(child_pid),
                    elapsed_ms: ms(Instant::now()),
                })
            }
        }
    }
}

/// The old side of the handover protocol with a spawned child, step by step, each step
/// bounded by the child's exit and one deadline. Used by hot upgrades and by
/// `artex master` (which hands over a listener and no tasks).
pub struct OldSide<'a> {
    ch: Channel,
    child: &'a mut tokio::process::Child,
    deadline: tokio::time::Instant,
}

impl<'a> OldSide<'a> {
    /// Accepts the child's connection (its pid checked) and its `Hello`.
    pub async fn accept(
        hs: &HandoverListener,
        child: &'a mut tokio::process::Child,
        pid: u32,
        deadline: tokio::time::Instant,
    ) -> Result<OldSide<'a>, String> {
        let ch = tokio::select! {
            r = hs.accept(pid) => r.map_err(|e| format!("handover connection: {e}"))?,
            st = child.wait() => return Err(format!("the new process exited before connecting ({})", describe_exit(st))),
            _ = tokio::time::sleep_until(deadline) => return Err("the new process did not connect in time".into()),
        };
        let mut old = OldSide {
            ch,
            child,
            deadline,
        };
        match old.recv().await? {
            Msg::Hello { protocol, .. } if protocol == handover::PROTOCOL_VERSION => Ok(old),
            m => Err(format!(
                "expected hello with protocol {}, got {m:?}",
                handover::PROTOCOL_VERSION
            )),
        }
    }

    /// `Welcome` → `Ready`: returns the new worker's id (it is registered).
    pub async fn ready(&mut self, http_addr: &str, old_worker: &str) -> Result<String, String> {
        self.send(
            &Msg::Welcome {
                http_addr: http_addr.into(),
                old_worker: old_worker.into(),
            },
            &[],
        )
        .await?;
        match self.recv().await? {
            Msg::Ready { worker_id } => Ok(worker_id),
            m => Err(format!("expected ready, got {m:?}")),
        }
    }

    /// `Listener` (the socket passed with SCM_RIGHTS) → `Serving`.
    pub async fn pass_listener(&mut self, listener: BorrowedFd<'_>) -> Result<(), String> {
        self.send(&Msg::Listener, &[listener]).await?;
        match self.recv().await? {
            Msg::Serving => Ok(()),
            m => Err(format!("expected serving, got {m:?}")),
        }
    }

    /// `Transfer` → `TakenOver`: what the child took over.
    pub async fn transfer(
        &mut self,
        from: &str,
        tasks: Vec<(Uuid, i64)>,
    ) -> Result<ResumeReport, String> {
        self.send(
            &Msg::Transfer {
                from: from.into(),
                tasks,
            },
            &[],
        )
        .await?;
        match self.recv().await? {
            Msg::TakenOver { report } => Ok(report),
            m => Err(format!("expected taken_over, got {m:?}")),
        }
    }

    async fn send(&mut self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> Result<(), String> {
        self.ch
            .send(msg, fds)
            .await
            .map_err(|e| format!("sending {msg:?}: {e}"))
    }

    async fn recv(&mut self) -> Result<Msg, String> {
        tokio::select! {
            r = self.ch.recv::<Msg>() => match r {
                Ok((m, _)) => Ok(m),
                // A broken channel usually means the child died: say how, if it did.
                Err(e) => match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
                    Ok(st) => Err(format!("the new process exited during the handover ({})", describe_exit(st))),
                    Err(_) => Err(format!("the new process broke the handover: {e}")),
                },
            },
            st = self.child.wait() => Err(format!("the new process exited during the handover ({})", describe_exit(st))),
            _ = tokio::time::sleep_until(self.deadline) => Err("the new process did not get ready in time".into()),
        }
    }
}

pub(crate) fn describe_exit(st: std::io::Result<std::process::ExitStatus>) -> String {
    match st {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The new process's side of the handover.
pub mod successor {
    use super::*;

    /// The handover channel, from `ARTEX_HANDOVER_SOCKET`, when this process was spawned by
    /// an upgrade (or by the stable parent of the supervisor mode).
    pub async fn connect_if_spawned() -> crate::Result<Option<Channel>> {
        let Some(path) = std::env::var_os(spawn::HANDOVER_ENV) else {
            return Ok(None);
        };
        let mut ch = handover::connect(Path::new(&path)).await?;
        ch.send(
            &Msg::Hello {
                pid: std::process::id(),
                version: crate::VERSION.to_string(),
                protocol: handover::PROTOCOL_VERSION,
            },
            &[],
        )
        .await?;
        Ok(Some(ch))
    }

    /// Receives `Welcome`: (HTTP address, old worker id).
    pub async fn welcome(ch: &mut Channel) -> crate::Result<(String, String)> {
        match ch.recv::<Msg>().await? {
            (
                Msg::Welcome {
                    http_addr,
                    old_worker,
                },
                _,
            ) => Ok((http_addr, old_worker)),
            (m, _) => Err(crate::Error::Invalid(format!(
                "handover: expected welcome, got {m:?}"
            ))),
        }
    }

    /// Says `Ready` and receives the listening socket.
    pub async fn ready(ch: &mut Channel, worker_id: &str) -> crate::Result<std::net::TcpListener> {
        ch.send(
            &Msg::Ready {
                worker_id: worker_id.into(),
            },
            &[],
        )
        .await?;
        match ch.recv::<Msg>().await? {
            (Msg::Listener, mut fds) if fds.len() == 1 => {
                let fd = fds.remove(0);
                Ok(std::net::TcpListener::from(fd))
            }
            (m, fds) => Err(crate::Error::Invalid(format!(
                "handover: expected the listener with one fd, got {m:?} with {} fds",
                fds.len()
            ))),
        }
    }

    /// Says `Serving`, receives the transfer, takes the tasks over, says `TakenOver`.
    pub async fn take_over(ch: &mut Channel, worker: &Addr<Worker>) -> crate::Result<ResumeReport> {
        ch.send(&Msg::Serving, &[]).await?;
        artex_actors::supervisor::failpoint("handover_after_ready");
        let (from, tasks) = match ch.recv::<Msg>().await? {
            (Msg::Transfer { from, tasks }, _) => (from, tasks),
            (m, _) => {
                return Err(crate::Error::Invalid(format!(
                    "handover: expected transfer, got {m:?}"
                )))
            }
        };
        let report = if tasks.is_empty() {
            ResumeReport::default()
        } else {
            worker
                .send(ResumeTasks { from, tasks })
                .await
                .map_err(artex_actors::Error::from)??
        };
        ch.send(
            &Msg::TakenOver {
                report: report.clone(),
            },
            &[],
        )
        .await?;
        Ok(report)
    }
}

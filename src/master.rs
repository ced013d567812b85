//! `artex master`: a stable parent for supervisors that cannot follow a PID change
//! (supervisord, runit), after HAProxy's master-worker mode. It holds the HTTP listener,
//! starts a worker generation through the ordinary upgrade channel (as an "old side":
//! a listener pass, no task transfer), adopts the later generations that hot upgrades start (child subreaper),
//! respawns one when the generation dies, and forwards SIGTERM / SIGUSR2 to all of them.
//!
//! Every generation of one lineage shares the process group of the first (an upgrade
//! spawns its successor without changing group), so "the generation is gone" is "the
//! group is empty", and one `killpg` reaches an old process still draining as well as
//! its successor.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use artex_upgrade::channel::ChannelListener;
use artex_upgrade::private_dir::ensure_private_dir;
use artex_upgrade::spawn::{self, SpawnOptions};
use artex_upgrade::{notify, subreaper, StopSignal, StopSignals};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

use crate::error::{Error, Result};
use crate::hot_upgrade::{ChannelError, OldSide, UPGRADE_FOLDER};
use crate::process::notify_service;

/// The worker id a generation started by the master is told it takes over from (it has
/// no tasks to transfer).
pub const MASTER_WORKER: &str = "master";

/// A generation that lived this long was healthy: its death does not grow the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Backoff before the second respawn in a row; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// On stop, generations get `--drain-ms` plus this (the HTTP server's own 10 s shutdown
/// and some slack) before SIGKILL.
const STOP_MARGIN: Duration = Duration::from_secs(15);
/// After SIGKILL, how long to wait for the kernel to let the processes go.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Safety net for a missed SIGCHLD (they coalesce).
const REAP_TICK: Duration = Duration::from_millis(500);

/// What the master runs, and how long it waits.
pub struct MasterConfig {
    /// The binary generations start from (our own path on disk: a package upgrade of it
    /// is what the next respawn runs).
    pub exe: PathBuf,
    /// The generations' arguments: `worker` and the flags it runs with.
    pub generation_args: Vec<OsString>,
    /// The HTTP listener the generations serve.
    pub listener: std::net::TcpListener,
    /// Private folder for the upgrade channel sockets (the upgrade folder).
    pub dir: PathBuf,
    /// How long a generation has to get ready (`--upgrade-ready-ms`).
    pub ready_deadline: Duration,
    /// How long a generation has to drain (`--drain-ms`).
    pub drain_deadline: Duration,
}

/// Runs the master until SIGTERM or SIGINT: serves the listener through worker
/// generations started with `config.generation_args`. Fails only if the first generation
/// cannot be brought up; later deaths are respawned.
pub async fn run(config: MasterConfig) -> Result {
    let master = Master::new(config)?;
    subreaper::become_subreaper()?;
    let mut signals = StopSignals::install()?;
    let mut children = signal(SignalKind::child())
        .map_err(|e| Error::io("listening for SIGCHLD (artex master)", e))?;
    tracing::info!(
        pid = std::process::id(),
        http = %master.http_addr,
        binary = %master.exe.display(),
        args = %masked(&master.gen_args),
        "master starting: generations run `artex worker` with these arguments"
    );

    let mut number = 1;
    let mut generation = match master.start_generation(number, &mut signals).await {
        Ok(g) => g,
        Err(Start::Stopped(sig)) => {
            tracing::info!(signal = ?sig, "master stopped before the first generation served");
            return Ok(());
        }
        Err(Start::Failed(why)) => {
            return Err(Error::Master(format!(
                "the first worker generation did not come up: {why}"
            )))
        }
    };
    // Under systemd the master is the service (generations have no NOTIFY_SOCKET).
    notify_service(notify::ready());
    notify_service(notify::status(&generation.describe(&master.http_addr)));

    let mut failures: u32 = 0;
    let mut drain_requested = false;
    let mut tick = tokio::time::interval(REAP_TICK);
    loop {
        tokio::select! {
            sig = signals.next() => match sig {
                StopSignal::Drain => {
                    tracing::info!(pgid = generation.pgid, "SIGUSR2: forwarding to the generation; a fresh one starts once it has drained");
                    drain_requested = true;
                    forward(generation.pgid, Signal::SIGUSR2);
                }
                stop => {
                    tracing::info!(signal = ?stop, "master stopping");
                    return master.stop(&mut generation, &mut children).await;
                }
            },
            Some(()) = children.recv() => {}
            _ = tick.tick() => {}
        }
        generation.reap();
        if subreaper::group_alive(generation.pgid)? {
            continue;
        }
        if drain_requested {
            tracing::info!(
                pgid = generation.pgid,
                "the generation drained; starting a fresh one"
            );
            failures = 0;
        } else {
            let lived = generation.started.elapsed();
            failures = if lived >= STABLE_AFTER {
                0
            } else {
                failures + 1
            };
            tracing::error!(
                generation = generation.number,
                pgid = generation.pgid,
                lived_ms = lived.as_millis() as u64,
                "the worker generation died (no process left in its group); respawning"
            );
        }
        notify_service(notify::status("worker generation gone; respawning"));
        let Some(next) = master
            .respawn(&mut number, &mut failures, &mut signals)
            .await
        else {
            generation.reap();
            return Ok(());
        };
        generation = next;
        drain_requested = false;
        notify_service(notify::status(&generation.describe(&master.http_addr)));
    }
}

/// What does not change while the master runs.
struct Master {
    /// The binary generations start from (our own path on disk: a package upgrade of it
    /// is what the next respawn runs).
    exe: PathBuf,
    /// `worker` and our own flags.
    gen_args: Vec<OsString>,
    listener: std::net::TcpListener,
    http_addr: String,
    /// Private folder for the upgrade channel sockets (the upgrade folder).
    dir: PathBuf,
    ready_deadline: Duration,
    stop_deadline: Duration,
}

/// The running lineage of generations.
struct Generation {
    /// Its process group: the pid of the first process the master started for it.
    pgid: u32,
    number: u64,
    started: Instant,
    worker_id: String,
    /// The process the master started, while not reaped. Reaped through its handle
    /// (not left to tokio's own orphan reaping), so its end is logged like the others'.
    leader: Option<Child>,
}

impl Generation {
    /// Reaps whatever descendant has exited, logging how each ended.
    fn reap(&mut self) {
        if let Some(leader) = &mut self.leader {
            let pid = self.pgid;
            match leader.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    self.leader = None;
                    if status.success() {
                        tracing::info!(pid, "reaped: generation leader {status}");
                    } else {
                        tracing::warn!(pid, "reaped: generation leader {status}");
                    }
                }
                // Reaped below in an earlier round.
                Err(_) => self.leader = None,
            }
        }
        log_reaped(subreaper::reap_exited());
    }

    fn describe(&self, http: &str) -> String {
        format!(
            "generation {} (group {}, worker {}) serving on {http}",
            self.number, self.pgid, self.worker_id
        )
    }
}

/// Why a generation did not start.
enum Start {
    /// SIGTERM or SIGINT arrived meanwhile: the master is to stop.
    Stopped(StopSignal),
    /// It failed (what happened is said); it was killed and its group with it.
    Failed(String),
}

impl Master {
    fn new(config: MasterConfig) -> Result<Self> {
        // The master always passes the listener through this folder: check it before
        // anything.
        ensure_private_dir(&config.dir, UPGRADE_FOLDER)?;
        let http_addr = config
            .listener
            .local_addr()
            .map_err(|e| Error::io("reading the HTTP listener's address", e))?
            .to_string();
        Ok(Master {
            exe: config.exe,
            gen_args: config.generation_args,
            listener: config.listener,
            http_addr,
            dir: config.dir,
            ready_deadline: config.ready_deadline,
            stop_deadline: config.drain_deadline + STOP_MARGIN,
        })
    }

    /// Starts generations, after the backoff `failures` calls for and growing it at each
    /// failed start, until one serves; `None` if SIGTERM or SIGINT came first.
    async fn respawn(
        &self,
        number: &mut u64,
        failures: &mut u32,
        signals: &mut StopSignals,
    ) -> Option<Generation> {
        loop {
            let delay = backoff(*failures);
            if !delay.is_zero() {
                tracing::warn!(
                    delay_ms = delay.as_millis() as u64,
                    failures = *failures,
                    "waiting before the respawn"
                );
                if let Some(sig) = pause(delay, signals).await {
                    tracing::info!(signal = ?sig, "master stopping (no generation running)");
                    return None;
                }
            }
            *number += 1;
            match self.start_generation(*number, signals).await {
                Ok(g) => {
                    tracing::info!(
                        generation = g.number,
                        pid = g.pgid,
                        "respawned the worker generation"
                    );
                    return Some(g);
                }
                Err(Start::Stopped(sig)) => {
                    tracing::info!(signal = ?sig, "master stopping (the respawn was cut short)");
                    return None;
                }
                Err(Start::Failed(why)) => {
                    *failures += 1;
                    tracing::error!(generation = *number, %why, "respawn failed");
                }
            }
        }
    }

    /// Starts generation `number` in a new process group and passes it the listener.
    async fn start_generation(
        &self,
        number: u64,
        signals: &mut StopSignals,
    ) -> std::result::Result<Generation, Start> {
        let socket_dir = self
            .dir
            .join(format!("master-{}-{number}", std::process::id()));
        let channel = ensure_private_dir(&self.dir, UPGRADE_FOLDER)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                ChannelListener::bind(&socket_dir)
                    .map_err(|e| format!("upgrade channel socket: {e}"))
            })
            .map_err(Start::Failed)?;
        // A package upgrade may have replaced (or removed) our binary on disk.
        let exe = if self.exe.exists() {
            self.exe.clone()
        } else {
            PathBuf::from("/proc/self/exe")
        };
        let options = SpawnOptions {
            env_remove: vec![notify::NOTIFY_SOCKET_ENV.into()],
            process_group: Some(0),
            ..SpawnOptions::default()
        };
        let mut child = match spawn::spawn_with(&exe, channel.path(), &self.gen_args, &options) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&socket_dir);
                return Err(Start::Failed(e.to_string()));
            }
        };
        let pid = child.id().unwrap_or(0);
        tracing::info!(
            generation = number,
            pid,
            binary = %exe.display(),
            "starting a worker generation"
        );
        let outcome = {
            let passed = self.pass_listener(&channel, &mut child, pid);
            tokio::pin!(passed);
            loop {
                tokio::select! {
                    r = &mut passed => break r.map_err(|e| Start::Failed(e.to_string())),
                    sig = signals.next() => match sig {
                        StopSignal::Drain => tracing::info!("SIGUSR2 ignored: a generation is starting"),
                        stop => break Err(Start::Stopped(stop)),
                    },
                }
            }
        };
        drop(channel);
        let _ = std::fs::remove_dir_all(&socket_dir);
        match outcome {
            Ok(worker_id) => {
                tracing::info!(generation = number, pid, worker = %worker_id, "generation serving");
                Ok(Generation {
                    pgid: pid,
                    number,
                    started: Instant::now(),
                    worker_id,
                    leader: Some(child),
                })
            }
            Err(e) => {
                if let Start::Failed(why) = &e {
                    tracing::error!(generation = number, pid, %why, "the generation failed to start; stopping it");
                }
                if let Err(err) = spawn::kill_and_reap(&mut child, Duration::from_secs(2)).await {
                    tracing::warn!(pid, error = %err, "cannot stop the failed generation");
                }
                // Whatever it started goes with it; the main loop reaps them.
                if pid > 1 {
                    let _ = subreaper::signal_group(pid, Signal::SIGKILL);
                }
                Err(e)
            }
        }
    }

    /// The old side of the upgrade channel, with nothing to pass but the listener:
    /// returns the new worker's id once it has taken over.
    async fn pass_listener(
        &self,
        channel: &ChannelListener,
        child: &mut Child,
        pid: u32,
    ) -> std::result::Result<String, ChannelError> {
        let deadline = tokio::time::Instant::now() + self.ready_deadline;
        let mut old = OldSide::accept(channel, child, pid, deadline).await?;
        let worker_id = old.ready(&self.http_addr, MASTER_WORKER).await?;
        old.pass_listener(self.listener.as_fd()).await?;
        // The generation stays the leader of its own group: that group is the lineage.
        old.transfer(MASTER_WORKER, Vec::new(), None).await?;
        Ok(worker_id)
    }

    /// SIGTERM to the generation; waits (up to the stop deadline, then SIGKILL) until no
    /// process of its group is left.
    async fn stop(
        &self,
        generation: &mut Generation,
        children: &mut tokio::signal::unix::Signal,
    ) -> Result {
        let pgid = generation.pgid;
        notify_service(notify::stopping());
        forward(pgid, Signal::SIGTERM);
        if self
            .wait_gone(generation, Instant::now() + self.stop_deadline, children)
            .await?
        {
            return Ok(());
        }
        tracing::warn!(pgid, timeout = ?self.stop_deadline, "the generation did not stop in time; SIGKILL");
        forward(pgid, Signal::SIGKILL);
        if !self
            .wait_gone(generation, Instant::now() + KILL_WAIT, children)
            .await?
        {
            tracing::error!(
                pgid,
                "processes of the generation survive SIGKILL; leaving them"
            );
        }
        Ok(())
    }

    /// Reaps until the generation's group is empty (true) or `deadline` passes (false).
    async fn wait_gone(
        &self,
        generation: &mut Generation,
        deadline: Instant,
        children: &mut tokio::signal::unix::Signal,
    ) -> Result<bool> {
        loop {
            generation.reap();
            if !subreaper::group_alive(generation.pgid)? {
                tracing::info!("master stopped; no worker process left");
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::select! {
                Some(()) = children.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(100).min(deadline - now)) => {}
            }
        }
    }
}

/// Sends `sig` to the generation's group, logging (not failing) if that is impossible.
fn forward(pgid: u32, sig: Signal) {
    match subreaper::signal_group(pgid, sig) {
        Ok(true) => tracing::info!(pgid, signal = %sig, "signal forwarded to the generation"),
        Ok(false) => tracing::info!(pgid, signal = %sig, "no generation process to signal"),
        Err(e) => tracing::error!(pgid, error = %e, "cannot signal the generation"),
    }
}

fn log_reaped(reaped: artex_upgrade::Result<Vec<subreaper::Reaped>>) {
    match reaped {
        Ok(list) => {
            for r in list {
                if r.code == Some(0) {
                    tracing::info!(pid = r.pid, "reaped: {r}");
                } else {
                    tracing::warn!(pid = r.pid, "reaped: {r}");
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot reap children"),
    }
}

/// Sleeps `delay` unless SIGTERM or SIGINT comes first (returned). SIGUSR2 is ignored:
/// there is no generation to drain.
async fn pause(delay: Duration, signals: &mut StopSignals) -> Option<StopSignal> {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return None,
            sig = signals.next() => if sig != StopSignal::Drain {
                return Some(sig);
            },
        }
    }
}

/// No wait after a healthy generation died; then 250 ms, doubling, at most 30 s.
fn backoff(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => FIRST_BACKOFF
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(MAX_BACKOFF),
    }
}

/// `args` for a log line, with the values of secret-bearing options hidden.
fn masked(args: &[OsString]) -> String {
    const SECRET: [&str; 2] = ["--upgrade-token", "--database-url"];
    let mut out = Vec::with_capacity(args.len());
    let mut hide_next = false;
    for a in args {
        let a = a.to_string_lossy();
        if hide_next {
            out.push("***".to_string());
            hide_next = false;
        } else if let Some((flag, _)) = a.split_once('=').filter(|(f, _)| SECRET.contains(f)) {
            out.push(format!("{flag}=***"));
        } else {
            hide_next = SECRET.contains(&a.as_ref());
            out.push(a.into_owned());
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn secrets_are_masked_in_the_start_up_line() {
        let shown = masked(&argv(&[
            "worker",
            "--upgrade-token",
            "s3cret",
            "--database-url=postgres://u:pw@h/db",
            "--http",
            "1.2.3.4:5",
        ]));
        assert_eq!(
            shown,
            "worker --upgrade-token *** --database-url=*** --http 1.2.3.4:5"
        );
    }

    #[test]
    fn backoff_starts_at_zero_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_millis(250));
        assert_eq!(backoff(3), Duration::from_secs(1));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}

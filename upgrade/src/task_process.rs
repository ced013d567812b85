//! A task's program (docs/programs.md): started in a session and process group of its
//! own, with the protocol's descriptor 3 (a pipe the program writes its JSON lines to),
//! and nothing else of ours but the environment it is given.
//!
//! Its exit is awaited without reaping it (`WNOWAIT`; through a pidfd on the caller's
//! runtime, or a thread of its own on kernels without one): while the
//! leader is an unreaped zombie its process group id cannot be reused, so the group can be
//! signalled safely until everything in it is killed and reaped. When the leader exits,
//! whatever it left in its group is killed (SIGKILL) and reaped (the worker is a child
//! subreaper: orphans of the group are reparented to it), and only then is the exit
//! reported: a task whose program ended leaves no process behind. [`Group::terminate`]
//! ends a program that still runs (a cancel, a timeout, a lost lease): SIGTERM to the
//! whole group, SIGKILL after a grace. A process that leaves the group on purpose
//! (`setsid`, `setpgid`) is not followed.

use std::ffi::OsString;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
pub use nix::sys::resource::Resource;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::clone_spawn;
use crate::error::{Error, Result};
use crate::subreaper::signal_group;

/// How long ending a group may take before giving up on a process that does not die
/// (uninterruptible sleep): it is logged and left.
const END_GROUP_PATIENCE: Duration = Duration::from_secs(10);

/// How a program's main process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(Signal),
    /// It could not be waited for (the message says why).
    Lost(String),
}

type ExitFuture = Pin<Box<dyn Future<Output = Exit> + Send>>;

/// How a program ended, once it did and its group is gone. Dropped before then (the
/// attempt was given up: a timeout, a lost lease), the wait goes on by itself on the
/// runtime, so that the program and what it started are still reaped.
pub struct Exited {
    wait: Option<ExitFuture>,
}

impl Future for Exited {
    type Output = Exit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Exit> {
        let Some(wait) = self.wait.as_mut() else {
            return std::task::Poll::Ready(Exit::Lost("its exit was already taken".into()));
        };
        let exit = std::task::ready!(wait.as_mut().poll(cx));
        self.wait = None;
        std::task::Poll::Ready(exit)
    }
}

impl Drop for Exited {
    fn drop(&mut self) {
        let Some(wait) = self.wait.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    wait.await;
                });
            }
            // Only a thread-watched program can be here (a pidfd needs the runtime): its
            // thread reaps it whether or not anyone hears of it.
            Err(_) => drop(wait),
        }
    }
}

/// A started program: its pipes and its end.
pub struct TaskProcess {
    /// Its pid, which is also its process group and session id.
    pub pid: u32,
    /// Its standard input (the write end).
    pub stdin: OwnedFd,
    /// Its standard output (the read end).
    pub stdout: OwnedFd,
    /// Its standard error (the read end).
    pub stderr: OwnedFd,
    /// The read end of its descriptor 3.
    pub protocol: OwnedFd,
    /// Resolves once it exited and everything it left in its group was killed and
    /// reaped.
    pub exited: Exited,
    /// Its process group, to end it early.
    pub group: Group,
}

/// A program's process group, for as long as it may still be signalled.
#[derive(Debug, Clone)]
pub struct Group {
    pgid: u32,
    state: Arc<Mutex<GroupState>>,
}

#[derive(Debug, Default)]
struct GroupState {
    /// Every process of the group was killed and reaped: the id may belong to another
    /// group by now, and must not be signalled.
    reaped: bool,
    /// [`Group::terminate`] was asked already.
    terminating: bool,
}

impl Group {
    /// Ends the program: SIGTERM to its whole group now, SIGKILL after `grace` if any of
    /// it still runs then. Asked again, it sends no second SIGTERM, and a shorter grace
    /// brings the SIGKILL forward (a cancel's grace, then the lease running out); after
    /// the program ended it does nothing.
    pub fn terminate(&self, grace: Duration) {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.reaped {
                return;
            }
            // Once: a later call (with a shorter grace) only brings the SIGKILL forward.
            if !state.terminating {
                state.terminating = true;
                // Under the lock, with the group not reaped: its id is still its own.
                warn_failed(self.pgid, signal_group(self.pgid, Signal::SIGTERM));
            }
        }
        let group = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kill-group-{}", self.pgid))
            .spawn(move || {
                std::thread::sleep(grace);
                let state = group.state.lock().unwrap_or_else(|e| e.into_inner());
                if !state.reaped {
                    warn_failed(group.pgid, signal_group(group.pgid, Signal::SIGKILL));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(pgid = self.pgid, error = %e, "cannot start the thread that kills a program's group after its grace; killing it now");
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !state.reaped {
                warn_failed(self.pgid, signal_group(self.pgid, Signal::SIGKILL));
            }
        }
    }
}

fn warn_failed(pgid: u32, r: Result<bool>) {
    if let Err(e) = r {
        tracing::warn!(pgid, error = %e, "cannot signal a program's process group");
    }
}

/// Who a program runs as and what it may use.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Run as this user and group (ours when `None`); supplementary groups are dropped.
    pub user: Option<(u32, u32)>,
    /// Resource limits (soft, hard) set before exec.
    pub limits: Vec<(Resource, u64, u64)>,
}

/// Starts `program` with exactly `env` as its environment, as `launch` says, in a new
/// session (so in a process group of its own), its descriptor 3 the write end of a pipe
/// whose read end is returned; stdin, stdout and stderr are pipes. No other descriptor of
/// ours reaches it. The program is executed directly: no shell. Started by
/// [`clone_spawn`](crate::clone_spawn): our address space is not copied.
pub fn start(program: &Path, env: &[(OsString, OsString)], launch: &Launch) -> Result<TaskProcess> {
    let spawn_err = |source: std::io::Error| Error::Spawn {
        binary: program.to_owned(),
        source,
    };
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err(e.into()));
    let (stdin_r, stdin) = pipe()?;
    let (stdout, stdout_w) = pipe()?;
    let (stderr, stderr_w) = pipe()?;
    let (protocol, protocol_w) = pipe()?;
    let limits: Vec<_> = launch
        .limits
        .iter()
        .map(|&(r, soft, hard)| (r as libc::__rlimit_resource_t, soft, hard))
        .collect();
    let fds = [
        stdin_r.as_raw_fd(),
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
        protocol_w.as_raw_fd(),
    ];
    let mut plan =
        clone_spawn::Plan::new(program, env, fds, &limits, launch.user).map_err(spawn_err)?;
    let pid = clone_spawn::spawn(&mut plan).map_err(spawn_err)?;
    // Only the program holds its ends now: its end (and its group's) is each pipe's end
    // of file.
    drop((stdin_r, stdout_w, stderr_w, protocol_w));
    let group = Group {
        pgid: pid,
        state: Arc::default(),
    };
    let wait = match watch_by_pidfd(pid, &group) {
        Some(wait) => wait,
        None => watch_by_thread(pid, &group).map_err(spawn_err)?,
    };
    let exited = Exited { wait: Some(wait) };
    Ok(TaskProcess {
        pid,
        stdin,
        stdout,
        stderr,
        protocol,
        exited,
        group,
    })
}

/// Blocks until process `pid` (our child) exits, leaving it a zombie.
fn wait_without_reaping(pid: u32) -> Exit {
    let pid_ = Pid::from_raw(pid as i32);
    loop {
        match waitid(Id::Pid(pid_), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(WaitStatus::Exited(_, code)) => return Exit::Code(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => return Exit::Signal(signal),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Exit::Lost(format!("waiting for pid {pid}: {e}")),
        }
    }
}

/// Waits for the program through a pidfd on the caller's runtime: no thread of its own
/// (a thread per program was a tenth of the worker's CPU per program). `None` where the
/// kernel has no pidfd (before 5.3) or no runtime is there.
fn watch_by_pidfd(pid: u32, group: &Group) -> Option<ExitFuture> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a descriptor pidfd_open just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    tokio::runtime::Handle::try_current().ok()?;
    // SAFETY: an OwnedFd's descriptor stays open, and the same, until it is dropped,
    // which is when the AsyncFd is.
    let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()?;
    let group = group.clone();
    Some(Box::pin(async move {
        // Readable once the process has exited.
        let exit = loop {
            match fd.readable().await {
                Ok(mut ready) => match peek_exit(pid) {
                    Some(exit) => break exit,
                    None => ready.clear_ready(),
                },
                Err(e) => break Exit::Lost(format!("waiting for pid {pid}: {e}")),
            }
        };
        if !end_group_now(&group) {
            // Something of the group outlived a SIGKILL for now: wait for it off the
            // runtime's threads.
            let g = group.clone();
            if tokio::task::spawn_blocking(move || end_group(&g))
                .await
                .is_err()
            {
                end_group(&group);
            }
        }
        exit
    }))
}

/// Waits for the program on a thread of its own (kernels without pidfd).
fn watch_by_thread(pid: u32, group: &Group) -> std::io::Result<ExitFuture> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let watched = group.clone();
    let watcher = std::thread::Builder::new()
        .name(format!("program-{pid}"))
        .spawn(move || {
            let exit = wait_without_reaping(pid);
            end_group(&watched);
            let _ = tx.send(exit);
        });
    if let Err(e) = watcher {
        // Without its watcher nobody would reap it: stop it here, and say why.
        group.terminate(Duration::ZERO);
        end_group(group);
        return Err(e);
    }
    Ok(Box::pin(async move {
        rx.await
            .unwrap_or_else(|_| Exit::Lost("its watcher stopped".into()))
    }))
}

/// How process `pid` (our child, exited) ended, leaving it a zombie; `None` while it
/// runs.
fn peek_exit(pid: u32) -> Option<Exit> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(Exit::Code(code)),
        Ok(WaitStatus::Signaled(_, signal, _)) => Some(Exit::Signal(signal)),
        Ok(_) | Err(Errno::EINTR) => None,
        Err(e) => Some(Exit::Lost(format!("waiting for pid {pid}: {e}"))),
    }
}

/// [`end_group`] if one pass does it, without waiting; false if the group is still
/// there (nothing is marked then).
fn end_group_now(group: &Group) -> bool {
    let mut state = group.state.lock().unwrap_or_else(|e| e.into_inner());
    let done = end_group_pass(group);
    if done {
        state.reaped = true;
    }
    done
}

/// Kills what is left of the group (its leader, unreaped, keeps the group's id ours
/// until then) and reaps every process of it that is, or becomes as its parent dies, our
/// child; returns once the group is empty, or after [`END_GROUP_PATIENCE`]. The group's
/// lock is held throughout: [`Group::terminate`] never signals an id that was let go.
fn end_group(group: &Group) {
    let mut state = group.state.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    while !end_group_pass(group) {
        if started.elapsed() > END_GROUP_PATIENCE {
            tracing::warn!(
                pgid = group.pgid,
                "a program's process group is still there after SIGKILL; left as it is"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    state.reaped = true;
}

/// SIGKILL to the group and every exited child of it reaped, again while that reaped
/// something; true once the group is gone (or cannot be signalled: nothing more to do).
/// The caller holds the group's lock.
fn end_group_pass(group: &Group) -> bool {
    let pgid = Pid::from_raw(group.pgid as i32);
    loop {
        match signal_group(group.pgid, Signal::SIGKILL) {
            Ok(false) => return true,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(pgid = group.pgid, error = %e, "cannot end a program's process group");
                return true;
            }
        }
        let mut reaped = false;
        loop {
            match waitid(Id::PGid(pgid), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) => reaped = true,
                Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(pgid = group.pgid, error = %e, "cannot reap a program's process group");
                    return true;
                }
            }
        }
        if !reaped {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn program(dir: &Path, text: &str) -> std::path::PathBuf {
        let path = dir.join("p.sh");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Outside a runtime the exit is awaited on a thread of its own (the path of kernels
    /// without pidfd): descriptor 3, the environment given and the exit status all come
    /// through, and the child it left in its group is gone by the time the exit is heard.
    #[test]
    fn a_program_watched_by_a_thread_reports_its_exit_after_its_group_is_gone() {
        // As the worker is: what the program leaves is reparented here, and reaped.
        crate::subreaper::become_subreaper().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = program(
            dir.path(),
            "#!/bin/sh\nsleep 300 &\necho \"$!\" >&3\necho \"$ONLY\" >&3\nexit 3\n",
        );
        let env = [(OsString::from("ONLY"), OsString::from("this"))];
        let p = start(&path, &env, &Launch::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(p.exited), Exit::Code(3));
        let mut said = String::new();
        std::fs::File::from(p.protocol)
            .read_to_string(&mut said)
            .unwrap();
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines[1], "this", "{said:?}");
        let child: i32 = lines[0].parse().unwrap();
        assert_eq!(
            nix::sys::signal::kill(Pid::from_raw(child), None),
            Err(Errno::ESRCH),
            "the child it left is killed and reaped"
        );
    }

    /// A program that ignores SIGTERM, told to stop with a long grace and then a short
    /// one (a cancel, then its lease running out): the shorter one wins.
    #[test]
    fn a_second_terminate_with_a_shorter_grace_brings_the_kill_forward() {
        let dir = tempfile::tempdir().unwrap();
        let path = program(
            dir.path(),
            "#!/bin/sh
trap '' TERM
echo up >&3
while :; do sleep 0.05; done
",
        );
        let p = start(&path, &[], &Launch::default()).unwrap();
        let mut up = [0u8; 3];
        std::fs::File::from(p.protocol).read_exact(&mut up).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        p.group.terminate(Duration::from_secs(60));
        p.group.terminate(Duration::from_millis(100));
        assert_eq!(rt.block_on(p.exited), Exit::Signal(Signal::SIGKILL));
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }

    /// A step that fails in the child is the error, named: here execve.
    #[test]
    fn a_program_that_cannot_be_executed_is_an_error_naming_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = start(&missing, &[], &Launch::default())
            .err()
            .expect("no such program");
        let text = err.to_string();
        assert!(text.contains("execve: No such file or directory"), "{text}");
    }
}

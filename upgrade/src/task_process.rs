//! A task's program (docs/programs.md): started in a session and process group of its
//! own, with the protocol's descriptor 3 (a pipe the program writes its JSON lines to),
//! and nothing else of ours but the environment it is given.
//!
//! A thread of its own waits for the program without reaping it (`WNOWAIT`): while the
//! leader is an unreaped zombie its process group id cannot be reused, so the group can be
//! signalled safely until everything in it is killed and reaped. When the leader exits,
//! whatever it left in its group is killed (SIGKILL) and reaped (the worker is a child
//! subreaper: orphans of the group are reparented to it), and only then is the exit
//! reported: a task whose program ended leaves no process behind. [`Group::terminate`]
//! ends a program that still runs (a cancel, a timeout, a lost lease): SIGTERM to the
//! whole group, SIGKILL after a grace. A process that leaves the group on purpose
//! (`setsid`, `setpgid`) is not followed.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::resource::setrlimit;
pub use nix::sys::resource::Resource;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::subreaper::signal_group;

/// The descriptor a program writes its protocol lines to.
pub const PROTOCOL_FD: i32 = 3;
/// How long ending a group may take before the watcher gives up on a process that does
/// not die (uninterruptible sleep): it is logged and left.
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

/// A started program: its pipes and its end.
#[derive(Debug)]
pub struct TaskProcess {
    /// Its pid, which is also its process group and session id.
    pub pid: u32,
    /// Its standard input.
    pub stdin: ChildStdin,
    /// Its standard output.
    pub stdout: ChildStdout,
    /// Its standard error.
    pub stderr: ChildStderr,
    /// The read end of its descriptor 3.
    pub protocol: OwnedFd,
    /// Resolves once it exited and everything it left in its group was killed and
    /// reaped.
    pub exited: tokio::sync::oneshot::Receiver<Exit>,
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
    /// it still runs then. Asked again, or after the program ended, it does nothing.
    pub fn terminate(&self, grace: Duration) {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.reaped || state.terminating {
                return;
            }
            state.terminating = true;
            // Under the lock, with the group not reaped: its id is still its own.
            warn_failed(self.pgid, signal_group(self.pgid, Signal::SIGTERM));
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

    /// Its process group id.
    pub fn pgid(&self) -> u32 {
        self.pgid
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
/// ours reaches it (std's and ours are close-on-exec). The program is executed directly:
/// no shell.
pub fn start(program: &Path, env: &[(OsString, OsString)], launch: &Launch) -> Result<TaskProcess> {
    let spawn_err = |source: std::io::Error| Error::Spawn {
        binary: program.to_owned(),
        source,
    };
    let (read_end, write_end) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err(e.into()))?;
    let write_fd = write_end.as_raw_fd();
    let mut command = Command::new(program);
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((uid, gid)) = launch.user {
        command.uid(uid).gid(gid);
    }
    let limits = launch.limits.clone();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed; it makes raw system calls (setrlimit, setsid,
    // dup2, fcntl) on values copied in before the fork (`limits` is only read), and
    // touches no lock, allocation or shared state.
    unsafe {
        command.pre_exec(move || {
            for (resource, soft, hard) in &limits {
                setrlimit(*resource, *soft, *hard).map_err(std::io::Error::from)?;
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if write_fd == PROTOCOL_FD {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                if libc::fcntl(PROTOCOL_FD, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(write_fd, PROTOCOL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(spawn_err)?;
    // Only the program holds the write end now: its end (and its group's) is the
    // protocol's end of file.
    drop(write_end);
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        unreachable!("stdin, stdout and stderr were asked as pipes");
    };
    // The std handle is dropped without waiting: the watcher reaps it, after its group.
    drop(child);
    let group = Group {
        pgid: pid,
        state: Arc::default(),
    };
    let (tx, exited) = tokio::sync::oneshot::channel();
    let watched = group.clone();
    let watcher = std::thread::Builder::new()
        .name(format!("program-{pid}"))
        .spawn(move || {
            let exit = wait_without_reaping(pid);
            end_group(&watched);
            let _ = tx.send(exit);
        });
    if let Err(source) = watcher {
        // Without its watcher nobody would reap it: stop it here, and say why.
        group.terminate(Duration::ZERO);
        end_group(&group);
        return Err(spawn_err(source));
    }
    Ok(TaskProcess {
        pid,
        stdin,
        stdout,
        stderr,
        protocol: read_end,
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

/// Kills what is left of the group (its leader, unreaped, keeps the group's id ours
/// until then) and reaps every process of it that is, or becomes as its parent dies, our
/// child; returns once the group is empty, or after [`END_GROUP_PATIENCE`].
fn end_group(group: &Group) {
    let mut state = group.state.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let pgid = Pid::from_raw(group.pgid as i32);
    loop {
        match signal_group(group.pgid, Signal::SIGKILL) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(pgid = group.pgid, error = %e, "cannot end a program's process group");
                break;
            }
        }
        loop {
            match waitid(Id::PGid(pgid), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(pgid = group.pgid, error = %e, "cannot reap a program's process group");
                    break;
                }
            }
        }
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

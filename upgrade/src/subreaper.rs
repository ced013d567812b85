//! Supervising descendants that are not our children: become a child subreaper (orphans
//! below us are reparented to us, not to init), reap whatever of them exits, and signal
//! or probe a whole process group. What a stable parent needs to outlive the generations
//! that replace one another beneath it.

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Error, Result};

/// Marks this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant whose
/// parent exits is reparented to us, so we can reap it and see that it is gone.
pub fn become_subreaper() -> Result {
    nix::sys::prctl::set_child_subreaper(true).map_err(|source| Error::ProcessControl {
        action: "become a child subreaper (prctl PR_SET_CHILD_SUBREAPER)".into(),
        source,
    })
}

/// One descendant that was reaped, and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Its pid (no longer valid: it may be reused from now on).
    pub pid: u32,
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<Signal>,
}

impl std::fmt::Display for Reaped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "pid {} exited with code {code}", self.pid),
            (None, Some(sig)) => write!(f, "pid {} killed by {sig}", self.pid),
            (None, None) => write!(f, "pid {} ended", self.pid),
        }
    }
}

/// Reaps every child that has exited so far (`waitpid(-1, WNOHANG)` until none is left)
/// and returns them. Never blocks. Children still running are left alone; having no
/// children at all is not an error.
pub fn reap_exited() -> Result<Vec<Reaped>> {
    let mut reaped = Vec::new();
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => reaped.push(Reaped {
                pid: pid.as_raw() as u32,
                code: Some(code),
                signal: None,
            }),
            Ok(WaitStatus::Signaled(pid, signal, _)) => reaped.push(Reaped {
                pid: pid.as_raw() as u32,
                code: None,
                signal: Some(signal),
            }),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(reaped),
            // Only exits are asked for (no WUNTRACED / WCONTINUED); nothing else to do.
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(source) => {
                return Err(Error::ProcessControl {
                    action: "reap exited children (waitpid)".into(),
                    source,
                })
            }
        }
    }
}

/// Whether process group `pgid` still has a member (a zombie not yet reaped counts).
pub fn group_alive(pgid: u32) -> Result<bool> {
    signal_group(pgid, None)
}

/// Sends `signal` to every process of group `pgid` (`None` only probes). Returns false
/// when the group has no process left.
pub fn signal_group(pgid: u32, signal: impl Into<Option<Signal>>) -> Result<bool> {
    let signal = signal.into();
    let group =
        i32::try_from(pgid)
            .ok()
            .filter(|g| *g > 1)
            .ok_or_else(|| Error::ProcessControl {
                action: format!("signal process group {pgid}"),
                source: Errno::EINVAL,
            })?;
    match killpg(Pid::from_raw(group), signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(source) => Err(Error::ProcessControl {
            action: match signal {
                Some(s) => format!("send {s} to process group {pgid}"),
                None => format!("probe process group {pgid}"),
            },
            source,
        }),
    }
}

//! Starting the next generation and, on rollback, stopping it and everything it started
//! for good; once it took over, moving it into its predecessor's process group.
//!
//! The child learns where to connect from [`CHANNEL_ENV`], shares our stdout and stderr
//! (so the supervisor's log capture keeps working), and inherits no other descriptor:
//! everything it should own, it receives over the upgrade channel.

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::error::{Error, Result};

/// Environment variable carrying the upgrade channel socket's path to the new process.
/// Its name is older than the word "upgrade channel" and stays: builds on either side of
/// an upgrade (forward or back) must agree on it, or the new process would not know it
/// was spawned by one.
pub const CHANNEL_ENV: &str = "ARTEX_HANDOVER_SOCKET";

/// Linux's `CLOSE_RANGE_CLOEXEC` (include/uapi/linux/close_range.h); libc does not
/// export it for Linux.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
/// Upper bound for the descriptor-by-descriptor fallback on kernels without
/// `close_range` (before 5.11), where RLIMIT_NOFILE can be in the millions.
const FALLBACK_MAX_FD: libc::c_int = 65_536;

/// Starts `binary` with `args`, `CHANNEL_ENV=channel_socket` and `env` on top of our
/// own environment.
///
/// stdin is /dev/null; stdout and stderr are inherited. Descriptors std and tokio create
/// are close-on-exec already, but ones inherited from our own parent (a supervisor, a
/// jobserver, a C library) may not be, so the child marks every descriptor above 2
/// close-on-exec just before exec. The child is not killed when the handle is dropped:
/// after a successful upgrade it is the service.
pub fn spawn(
    binary: &Path,
    channel_socket: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<Child> {
    let options = SpawnOptions {
        env: env.to_vec(),
        ..SpawnOptions::default()
    };
    spawn_with(binary, channel_socket, args, &options)
}

/// What [`spawn_with`] can do beyond [`spawn`]'s defaults.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    /// Variables set on top of our own environment.
    pub env: Vec<(OsString, OsString)>,
    /// Variables of our own environment the child must not see (e.g. `NOTIFY_SOCKET`, so
    /// that only a stable parent talks to systemd).
    pub env_remove: Vec<OsString>,
    /// Put the child in this process group; `Some(0)` makes it the leader of a new one
    /// (its pid becomes the group id), so that it and every process it starts can be
    /// signalled at once. `None` keeps our group.
    pub process_group: Option<i32>,
}

/// [`spawn`], with the environment and process group chosen by `options`.
pub fn spawn_with(
    binary: &Path,
    channel_socket: &Path,
    args: &[OsString],
    options: &SpawnOptions,
) -> Result<Child> {
    let mut command = Command::new(binary);
    command.args(args);
    for key in &options.env_remove {
        command.env_remove(key);
    }
    command
        .env(CHANNEL_ENV, channel_socket)
        .envs(options.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(false);
    if let Some(group) = options.process_group {
        command.process_group(group);
    }
    // Computed before fork: sysconf is not async-signal-safe.
    // SAFETY: sysconf only reads a process limit; it has no memory-safety preconditions.
    let open_max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    let fallback_max = libc::c_int::try_from(open_max)
        .unwrap_or(FALLBACK_MAX_FD)
        .clamp(3, FALLBACK_MAX_FD);
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed; it makes raw syscalls (close_range, fcntl)
    // and touches no locks, allocations or shared state.
    unsafe {
        command.pre_exec(move || {
            cloexec_from_3(fallback_max);
            Ok(())
        });
    }
    command.spawn().map_err(|source| Error::Spawn {
        binary: binary.to_owned(),
        source,
    })
}

/// Marks every descriptor from 3 up close-on-exec. Runs between fork and exec.
fn cloexec_from_3(fallback_max: libc::c_int) {
    // SAFETY: close_range only changes descriptor flags in this (child) process; an error
    // just means an old kernel, handled below.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    if !done {
        for fd in 3..fallback_max {
            // SAFETY: F_SETFD on a descriptor number is harmless whether or not it is
            // open (EBADF is ignored); FD_CLOEXEC is the only descriptor flag.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

/// Stops `child` for good: SIGTERM, then SIGKILL if it is still running after `grace`,
/// and always waits for it, so no zombie is left behind. Returns how it ended; a child
/// that had already exited is just reaped.
pub async fn kill_and_reap(child: &mut Child, grace: Duration) -> Result<ExitStatus> {
    let pid = child.id();
    let wait_err = |source: io::Error| Error::Reap { pid, source };
    if let Some(status) = child.try_wait().map_err(wait_err)? {
        return Ok(status);
    }
    // Not yet reaped, so the pid still names our child: it cannot have been reused.
    if let Some(raw) = pid.and_then(|p| i32::try_from(p).ok()) {
        match kill(Pid::from_raw(raw), Signal::SIGTERM) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pid = raw, error = %e, "cannot SIGTERM child"),
        }
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.map_err(wait_err),
        Err(_) => {
            tracing::warn!(?pid, ?grace, "child ignored SIGTERM; sending SIGKILL");
            // Child::kill sends SIGKILL and waits for the exit, reaping it.
            child.kill().await.map_err(wait_err)?;
            child.wait().await.map_err(wait_err)
        }
    }
}

/// Stops `child` and everything it started: SIGTERM to its process group `pgid`, up to
/// `grace` for the child to exit, then SIGKILL to the group, and the child is reaped.
/// `pgid` must be a group made for the child (spawned with `process_group: Some(0)`, so
/// `pgid` is its pid): never a group this process or a supervisor's lineage lives in.
///
/// The group is signalled while the child is not yet reaped, when it can be: until then
/// its pid, hence the group id, cannot be reused. If the child was already reaped (it
/// exited by itself), the group is signalled anyway, to end what it left behind: a group
/// id stays reserved while any member lives, so it can only name someone else's group if
/// it emptied and the pid space wrapped around in between. What left the group (setsid,
/// setpgid: a daemon that detaches on purpose) is beyond a process group's reach.
pub async fn kill_group_and_reap(
    child: &mut Child,
    pgid: u32,
    grace: Duration,
) -> Result<ExitStatus> {
    let signal = |sig: Signal| match crate::subreaper::signal_group(pgid, sig) {
        Ok(_) => {}
        Err(e) => tracing::warn!(pgid, error = %e, "cannot signal the new process's group"),
    };
    signal(Signal::SIGTERM);
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let end = tokio::time::Instant::now() + grace;
        while !exited_unreaped(pid) && tokio::time::Instant::now() < end {
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
    signal(Signal::SIGKILL);
    kill_and_reap(child, grace).await
}

/// How often [`kill_group_and_reap`] looks whether the child has exited.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// Whether our child `pid` has exited, leaving it a zombie (WNOWAIT: it stays
/// waitable, so its pid and group id stay reserved). A child no longer ours counts as
/// exited.
fn exited_unreaped(pid: i32) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    !matches!(
        waitid(Id::Pid(Pid::from_raw(pid)), flags),
        Ok(WaitStatus::StillAlive) | Err(Errno::EINTR)
    )
}

/// Moves this process into process group `pgid` of its session. A successor spawned in a
/// group of its own (so that a rollback can end everything it started) calls this once it
/// has taken over, to live on in its predecessor's group, where supervisors look for it
/// (`artex master` tracks a lineage of generations by group). Processes it started before
/// stay in the old group.
pub fn join_group(pgid: u32) -> Result {
    let action = || format!("join process group {pgid} (setpgid)");
    let group =
        i32::try_from(pgid)
            .ok()
            .filter(|g| *g > 1)
            .ok_or_else(|| Error::ProcessControl {
                action: action(),
                source: Errno::EINVAL,
            })?;
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(group)).map_err(|source| {
        Error::ProcessControl {
            action: action(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::ExitStatusExt;
    use tokio::io::{AsyncBufReadExt, BufReader};

    const SH: &str = "/bin/sh";

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    #[tokio::test]
    async fn the_child_gets_the_socket_path_and_extra_env() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let socket = dir.path().join("channel.sock");
        let script = format!(
            "printf '%s|%s|%s' \"$ARTEX_HANDOVER_SOCKET\" \"$EXTRA\" \"$1\" > '{}'",
            out.display()
        );
        let mut args = sh(&script);
        args.extend(["argv0".into(), "first-arg".into()]);
        let env = [(OsString::from("EXTRA"), OsString::from("extra value"))];
        let mut child = spawn(Path::new(SH), &socket, &args, &env).unwrap();
        assert!(child.wait().await.unwrap().success());
        let got = std::fs::read_to_string(&out).unwrap();
        assert_eq!(got, format!("{}|extra value|first-arg", socket.display()));
    }

    #[tokio::test]
    async fn the_child_inherits_only_stdio() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("fds");
        // dup() makes a descriptor without close-on-exec, like one inherited from a
        // supervisor: exactly what must not reach the next generation.
        let file = std::fs::File::open("/dev/null").unwrap();
        let leaky = nix::unistd::dup(&file).unwrap();
        let flags = nix::fcntl::fcntl(&leaky, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_eq!(
            flags & libc::FD_CLOEXEC,
            0,
            "test setup: dup must not set CLOEXEC"
        );

        // `find` runs as a child of the shell and lists the shell's table, so its own
        // handles do not show; `; true` keeps the shell from exec'ing it, and -fprint
        // avoids a shell redirection (dash parks the old stdout on fd 10 for those).
        let script = format!(
            "find /proc/$$/fd -mindepth 1 -maxdepth 1 -fprint '{}'; true",
            out.display()
        );
        let mut child = spawn(Path::new(SH), &dir.path().join("s"), &sh(&script), &[]).unwrap();
        assert!(child.wait().await.unwrap().success());
        let listed = std::fs::read_to_string(&out).unwrap();
        let mut fds: Vec<&str> = listed
            .lines()
            .filter_map(|path| path.rsplit('/').next())
            .collect();
        fds.sort_unstable();
        assert_eq!(
            fds,
            ["0", "1", "2"],
            "child inherited more than stdio (leaky fd was {})",
            leaky.as_raw_fd()
        );
    }

    /// Starts a shell that runs `setup`, reports "ready" on stdout, then execs a sleep.
    async fn started(setup: &str) -> Child {
        let mut child = Command::new(SH)
            .args(["-c", &format!("{setup}; echo ready; exec sleep 60")])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await.unwrap();
        assert_eq!(line, "ready\n");
        child
    }

    fn assert_reaped(pid: u32) {
        let res = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        assert_eq!(res, Err(Errno::ECHILD), "child {pid} not reaped");
    }

    #[tokio::test]
    async fn a_cooperative_child_stops_on_sigterm() {
        let mut child = started(":").await;
        let pid = child.id().unwrap();
        let status = kill_and_reap(&mut child, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        assert_reaped(pid);
    }

    #[tokio::test]
    async fn a_child_ignoring_sigterm_is_killed_after_the_grace() {
        // An ignored signal stays ignored across exec, so the sleep ignores it too.
        let mut child = started("trap '' TERM").await;
        let pid = child.id().unwrap();
        let status = kill_and_reap(&mut child, Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert_reaped(pid);
    }

    #[tokio::test]
    async fn an_exited_child_is_reaped_with_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn(Path::new(SH), &dir.path().join("s"), &sh("exit 7"), &[]).unwrap();
        let pid = child.id().unwrap();
        // Wait for the exit without reaping, so kill_and_reap finds a zombie to collect.
        let exited = tokio::task::spawn_blocking(move || {
            nix::sys::wait::waitid(
                nix::sys::wait::Id::Pid(Pid::from_raw(pid as i32)),
                nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
            )
        })
        .await
        .unwrap();
        assert!(exited.is_ok(), "{exited:?}");
        let status = kill_and_reap(&mut child, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(status.code(), Some(7));
        assert_reaped(pid);
    }

    #[tokio::test]
    async fn spawn_with_starts_a_new_group_without_the_removed_variables() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // Field 5 of /proc/PID/stat is the process group; $$ is the shell's own pid. The
        // removed variable is one this test process is sure to have.
        let script = format!(
            "printf '%s|%s|%s' \"$$\" \"$(cut -d' ' -f5 /proc/$$/stat)\" \"${{HOME-unset}}\" > '{}'",
            out.display()
        );
        assert!(
            std::env::var_os("HOME").is_some(),
            "test setup: HOME must be set"
        );
        let options = SpawnOptions {
            env_remove: vec!["HOME".into()],
            process_group: Some(0),
            ..SpawnOptions::default()
        };
        let mut child =
            spawn_with(Path::new(SH), &dir.path().join("s"), &sh(&script), &options).unwrap();
        assert!(child.wait().await.unwrap().success());
        let got = std::fs::read_to_string(&out).unwrap();
        let fields: Vec<&str> = got.split('|').collect();
        assert_eq!(
            fields[0], fields[1],
            "the child leads a group of its own: {got}"
        );
        assert_ne!(
            fields[1],
            nix::unistd::getpgid(None).unwrap().to_string(),
            "the child left our group"
        );
        assert_eq!(fields[2], "unset", "HOME was removed: {got}");
    }

    /// Whether `pid` runs (a zombie counts as gone).
    fn running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                let state = s.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z') && !state.starts_with('X')
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_group_kill_ends_what_the_child_started() {
        let dir = tempfile::tempdir().unwrap();
        let bg = dir.path().join("bg.pid");
        // A background process that ignores SIGTERM, then the shell becomes a sleep.
        let script = format!(
            "(trap '' TERM; exec sleep 600) & echo $! > '{}'; exec sleep 60",
            bg.display()
        );
        let options = SpawnOptions {
            process_group: Some(0),
            ..SpawnOptions::default()
        };
        let mut child =
            spawn_with(Path::new(SH), &dir.path().join("s"), &sh(&script), &options).unwrap();
        let pid = child.id().unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let bg_pid: i32 = loop {
            if let Some(p) = std::fs::read_to_string(&bg)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break p;
            }
            assert!(std::time::Instant::now() < end, "no background pid");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(running(bg_pid));
        kill_group_and_reap(&mut child, pid, Duration::from_millis(200))
            .await
            .unwrap();
        assert_reaped(pid);
        // The orphan is someone else's to reap; SIGKILL is final, so it only has to die.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while running(bg_pid) {
            assert!(
                std::time::Instant::now() < end,
                "background {bg_pid} survived"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_missing_binary_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-artex");
        let err = spawn(&missing, &dir.path().join("s"), &[], &[]).unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("no-such-artex"), "{err}");
    }
}

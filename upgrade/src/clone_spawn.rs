//! Starting a program without copying our address space: `clone(CLONE_VM | CLONE_VFORK)`,
//! as `posix_spawn` does, with the few steps `posix_spawn` cannot take (resource limits,
//! another user) done in the child before `execve`.
//!
//! `fork` copies the page tables of the whole worker, and the child tears them down
//! again at `execve`: with a worker of tens of MiB that was ~1.5 ms of the actor thread per
//! program, the bound on how many programs a second a worker could start (issue 35 asks
//! for 0.8× of `xargs -P 10`). The child here shares our memory until it execs, while
//! this thread waits (CLONE_VFORK), so it only makes raw system calls on values prepared
//! before the clone: no allocation, no lock, no glibc wrapper that assumes it is a
//! thread of ours (the `set*id` wrappers signal every thread of the process: raw
//! syscalls are used instead).

use std::ffi::{c_char, c_int, c_void, CString, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What the child does, prepared before the clone.
pub struct Plan {
    path: CString,
    argv: [*const c_char; 2],
    envp: Vec<*const c_char>,
    _env: Vec<CString>,
    /// The descriptors that become the child's 0, 1, 2 and 3.
    fds: [RawFd; 4],
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    user: Option<(libc::uid_t, libc::gid_t)>,
    /// Set by the child when a step fails: the step and its errno.
    failed: Option<(&'static str, c_int)>,
}

/// Linux's `CLOSE_RANGE_CLOEXEC` (include/uapi/linux/close_range.h).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
/// The child's stack: it runs a handful of system calls.
const STACK_BYTES: usize = 64 * 1024;

impl Plan {
    /// `program` with exactly `env`, its 0–3 the descriptors `fds`, `limits` (resource,
    /// soft, hard) and, if given, the user and group it runs as.
    pub fn new(
        program: &Path,
        env: &[(OsString, OsString)],
        fds: [RawFd; 4],
        limits: &[(libc::__rlimit_resource_t, u64, u64)],
        user: Option<(u32, u32)>,
    ) -> io::Result<Plan> {
        let nul = |_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a name or value");
        let path = CString::new(program.as_os_str().as_bytes()).map_err(nul)?;
        let env = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).map_err(nul)
            })
            .collect::<io::Result<Vec<CString>>>()?;
        let mut envp: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());
        let argv = [path.as_ptr(), std::ptr::null()];
        let limits = limits
            .iter()
            .map(|&(r, soft, hard)| {
                (
                    r,
                    libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    },
                )
            })
            .collect();
        Ok(Plan {
            path,
            argv,
            envp,
            _env: env,
            fds,
            limits,
            user,
            failed: None,
        })
    }
}

/// Starts the plan's program in a new session; returns its pid once it has exec'd. A
/// failed step before that is the error (the child is reaped).
pub fn spawn(plan: &mut Plan) -> io::Result<u32> {
    // Capacity only: a stack needs no zeroing (64 KiB of memset per program otherwise).
    let mut stack: Vec<u8> = Vec::with_capacity(STACK_BYTES);
    // The stack grows down on every architecture Linux runs this on; 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + STACK_BYTES) & !15;
    // SAFETY: sigfillset and pthread_sigmask only write the sets given; blocking every
    // signal in this thread while the child shares our memory keeps a handler of ours
    // from running on the child's stack before it reset them (posix_spawn does the same).
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    // SAFETY: `child` gets a pointer to `plan`, which outlives the child's use of it:
    // with CLONE_VFORK this thread is suspended until the child execs or exits, and
    // `stack` stays allocated until then. The child only makes raw system calls (see
    // `child`).
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *mut Plan as *mut c_void,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores this thread's own mask, saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(clone_error);
    }
    // SAFETY: the child wrote `failed` through the pointer before it exited (or never);
    // it has exec'd or exited by now, so nothing writes it any more.
    if let Some((step, errno)) = unsafe { std::ptr::read_volatile(&plan.failed) } {
        // It exited (status 127): reap it.
        let mut status = 0;
        // SAFETY: waits for our own child by pid.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let e = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(e.kind(), format!("{step}: {e}")));
    }
    Ok(pid as u32)
}

/// The child, between clone and exec, in our memory: raw system calls only.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Plan` `spawn` passed, alive while its thread is suspended.
    let plan = unsafe { &mut *(arg as *mut Plan) };
    // SAFETY: every call below is a system call on values prepared before the clone;
    // `fail` ends the child with _exit.
    unsafe {
        // Signal dispositions are our copy (no CLONE_SIGHAND): back to the defaults,
        // then nothing blocked, as a new program expects.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // 0–3 from the plan's descriptors, through copies above 10 so that no target
        // is overwritten before it is read.
        let mut high = [0; 4];
        for (i, fd) in plan.fds.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
            if high[i] < 0 {
                fail(plan, "duplicating a descriptor");
            }
        }
        for (target, fd) in high.iter().enumerate() {
            if libc::dup2(*fd, target as c_int) < 0 {
                fail(plan, "dup2");
            }
        }
        // Nothing else of ours reaches the program (an error means an old kernel: ours
        // are close-on-exec already; inherited ones may stay).
        libc::syscall(
            libc::SYS_close_range,
            4 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
        if libc::setsid() < 0 {
            fail(plan, "setsid");
        }
        for (resource, limit) in &plan.limits {
            if libc::setrlimit(*resource, limit) < 0 {
                fail(plan, "setrlimit");
            }
        }
        if let Some((uid, gid)) = plan.user {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0 {
                fail(plan, "setgroups");
            }
            if libc::syscall(libc::SYS_setgid, gid) < 0 {
                fail(plan, "setgid");
            }
            if libc::syscall(libc::SYS_setuid, uid) < 0 {
                fail(plan, "setuid");
            }
        }
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(plan, "execve")
    }
}

/// Records the failed step and its errno for the parent, and ends the child.
unsafe fn fail(plan: &mut Plan, step: &'static str) -> ! {
    // SAFETY: __errno_location is this thread's errno; the write goes to the plan the
    // parent reads once the child is gone.
    unsafe {
        let errno = *libc::__errno_location();
        std::ptr::write_volatile(&mut plan.failed, Some((step, errno.max(1))));
        libc::_exit(127)
    }
}

//! The subreaper helpers with real processes. One test function: `reap_exited` reaps any
//! child of the process, so tests sharing it as threads would steal each other's.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use artex_upgrade::subreaper::{self, Reaped};
use nix::sys::signal::Signal;

/// Starts `sh -c script` leading a new process group; returns (shell pid, the first line
/// it prints).
// The handle is dropped without waiting on purpose: reaping is subreaper::reap_exited's job.
#[allow(clippy::zombie_processes)]
fn group(script: &str) -> (u32, String) {
    let mut child = Command::new("/bin/sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child.id(), line.trim().to_string())
}

/// Reaps until group `pgid` is empty; returns everything reaped on the way.
fn reap_until_empty(pgid: u32) -> Vec<Reaped> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut reaped = Vec::new();
    loop {
        reaped.extend(subreaper::reap_exited().unwrap());
        if !subreaper::group_alive(pgid).unwrap() {
            return reaped;
        }
        assert!(
            Instant::now() < end,
            "group {pgid} still alive; reaped {reaped:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn orphans_come_back_to_the_subreaper_and_groups_are_signalled_whole() {
    subreaper::become_subreaper().unwrap();
    assert!(nix::sys::prctl::get_child_subreaper().unwrap());
    assert!(subreaper::reap_exited().unwrap().is_empty(), "no child yet");

    // The shell exits at once; its background sleep is orphaned and must be reparented
    // to us (not to init), so we reap it too, and only then is the group empty.
    let (shell, grandchild) = group("sleep 0.3 & echo $!; exit 3");
    let grandchild: u32 = grandchild.parse().unwrap();
    let reaped = reap_until_empty(shell);
    let shell_end = reaped.iter().find(|r| r.pid == shell);
    assert_eq!(shell_end.and_then(|r| r.code), Some(3), "{reaped:?}");
    let orphan_end = reaped.iter().find(|r| r.pid == grandchild);
    assert_eq!(orphan_end.and_then(|r| r.code), Some(0), "{reaped:?}");

    // A signal to the group reaches every member, whoever their parent is.
    let (shell, grandchild) = group("sleep 30 & echo $!; exec sleep 30");
    let grandchild: u32 = grandchild.parse().unwrap();
    assert!(subreaper::group_alive(shell).unwrap());
    assert!(subreaper::signal_group(shell, Signal::SIGTERM).unwrap());
    let reaped = reap_until_empty(shell);
    for pid in [shell, grandchild] {
        let end = reaped.iter().find(|r| r.pid == pid);
        assert_eq!(
            end.and_then(|r| r.signal),
            Some(Signal::SIGTERM),
            "{reaped:?}"
        );
    }
    assert!(
        !subreaper::signal_group(shell, Signal::SIGTERM).unwrap(),
        "empty group"
    );
    let err = subreaper::signal_group(1, Signal::SIGTERM).unwrap_err();
    assert!(err.to_string().contains("process group 1"), "{err}");
}

//! Hot upgrade with real binaries, real curl and real load: five upgrades in a row under
//! continuous HTTP and task traffic, rollbacks of broken bundles, hostile bundles,
//! authentication and the systemd notifications.
//!
//! # Layout
//! - `under_load`: five upgrades in a row under continuous traffic.
//! - `cancel`: a task handed over in an upgrade canceled through its new process.
//! - `transfer`: tasks handed over under load run on once in the new process.
//! - `traced`: a transferred task's spans stay in its trace (with `receiver`, the OTLP
//!   receiver of tests/traces).
//! - `rollback`: failed upgrades rolled back, leaving no process behind.
//! - `hostile`: hostile bundles, bad callers and stalled uploads refused.
//! - `programs`: programs shipped in the bundle; a resumable one moved, a plain one not.
//! - `configuration`: upgrades off unless configured; an upgrade folder ours alone.
//! - `schema`: a bundle that needs a newer schema refused until it is there.
//! - `systemd`: READY and the new MAINPID told to systemd.
//! - `windows`: the task transfer's windows opened on purpose (a delay point): a long
//!   wait, a locked worker row, a PostgreSQL restart.

#[path = "../common/mod.rs"]
mod common;

mod cancel;
mod configuration;
mod hostile;
mod programs;
// Shared with tests/traces, which reads every field it keeps.
#[allow(dead_code)]
#[path = "../traces/receiver.rs"]
mod receiver;
mod rollback;
mod schema;
mod systemd;
mod traced;
mod transfer;
mod under_load;
mod windows;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::bundles::Keys;
use common::procs::{alive, wait_for, with_defaults, Proc, FAST_WORKER};
use serde_json::Value;

/// `curl -T BUNDLE` (or a multipart form) to /upgrade; (HTTP code, JSON body).
fn curl_upgrade(addr: &str, bundle: &Path, token: Option<&str>, multipart: bool) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    if multipart {
        cmd.arg("-F").arg(format!("bundle=@{}", bundle.display()));
    } else {
        cmd.arg("-T").arg(bundle);
    }
    let out = cmd
        .arg(format!("http://{addr}/upgrade"))
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code: u16 = code.trim().parse().unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    (code, body)
}

/// A worker with upgrades enabled.
fn upgradable_worker(
    name: &str,
    url: &str,
    keys: &Keys,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let flags = keys.flags("upgrades");
    let mut args = with_defaults("worker", FAST_WORKER, extra);
    args.extend(flags.iter().map(String::as_str));
    Proc::start(name, url, &args, env)
}

/// Generations after the first are not the test's children: end them even if the test
/// fails midway.
struct KillAll(Vec<i32>);

impl Drop for KillAll {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

async fn wait_gone(pid: i32, timeout: Duration) {
    wait_for(&format!("pid {pid} to exit"), timeout, || async move {
        (!alive(pid)).then_some(())
    })
    .await;
}

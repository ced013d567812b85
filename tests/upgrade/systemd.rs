//! The systemd notifications: READY, and the new MAINPID after an upgrade.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{worker_http, Proc};
use crate::common::TestDb;
use crate::{curl_upgrade, upgradable_worker, wait_gone, KillAll};

#[tokio::test]
async fn systemd_hears_ready_and_the_new_main_pid() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock_path = sock_dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &[],
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let http = worker_http(&c, &w).await;
    let mut seen = Vec::new();
    let mut read_until = |want: &str| {
        let mut buf = [0u8; 4096];
        loop {
            let n = sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("waiting for {want}: {e}; seen {seen:?}"));
            let msg = String::from_utf8_lossy(&buf[..n]).to_string();
            seen.push(msg.clone());
            if msg.lines().any(|l| l == want) {
                return;
            }
        }
    };
    read_until("READY=1");
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap();
    let _spawned = KillAll(vec![new as i32]);
    read_until(&format!("MAINPID={new}"));
    read_until("READY=1");
    wait_gone(w.pid(), Duration::from_secs(30)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(new as i32, Duration::from_secs(30)).await;
}

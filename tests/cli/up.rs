//! `artex up`: the dashboard's URL said first, on a port that stays the same from one run
//! to the next, and a second `artex up` told that the port is taken.

use std::net::TcpListener;
use std::time::Duration;

use crate::common::procs::{http_get, wait_for, Proc};
use crate::common::TestDb;
use crate::{artex, stderr};

/// `artex up`'s default HTTP address (README's tour; docs/getting-started.md).
const DEFAULT: &str = "127.0.0.1:27839";

/// The one test that runs `up` on its default port (every other gives `--http
/// 127.0.0.1:0`). A lock file beside the system's temp files keeps it from running at the
/// same time as itself in another checkout's test run on this host.
#[tokio::test]
async fn up_says_the_dashboard_url_first_and_a_second_up_is_told_the_port_is_taken() {
    let lock = std::fs::File::create(std::env::temp_dir().join("artex-test-up-port.lock"))
        .expect("the port's lock file");
    lock.lock().expect("lock the default port");
    drop(TcpListener::bind(DEFAULT).unwrap_or_else(|e| {
        panic!("{DEFAULT} is taken on this host ({e}): an `artex up` running? stop it")
    }));
    let db = TestDb::new().await;
    let up = Proc::start("up", &db.url, &["up"], &[]);
    let log = wait_for("up's banner", Duration::from_secs(30), || async {
        let log = up.log_text();
        log.contains("Stop with Ctrl-C").then_some(log)
    })
    .await;
    let first = log.lines().find(|l| l.contains("http://"));
    assert_eq!(
        first.map(str::trim),
        Some(format!("dashboard:  http://{DEFAULT}/").as_str()),
        "{log}"
    );
    let (code, body) = http_get(DEFAULT, "/health").expect("up answers on its port");
    assert_eq!(code, 200, "{body}");

    let second = artex(Some(&db.url), None, &["up"]);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    let err = stderr(&second);
    assert!(
        err.contains(&format!("{DEFAULT} is in use")) && err.contains("--http 127.0.0.1:0"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

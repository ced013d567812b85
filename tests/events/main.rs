//! The change feed end to end (issues 6 and 13): out-of-order commits delivered in a final
//! order, a consumer killed with kill -9 mid-stream resuming without gap or duplicate, one
//! history row per real transition (the feed reads them), Server-Sent Events resumed with
//! Last-Event-ID, retention by whole time partitions that holds back for a live consumer
//! and then answers 410, finished tasks pruned past the retention, and the logical
//! decoding consumer resuming from its slot's LSN.
//!
//! # Layout
//! - `delivery`: the feed's order and a killed consumer's resumption (and the ignored
//!   benchmark of its delay).
//! - `history`: the history rows a task's life writes, and those the feed shows.
//! - `sse`: Server-Sent Events resumed after Last-Event-ID.
//! - `retention`: history partitions and their retention, finished tasks pruned.
//! - `logical_decoding`: the consumer that reads a replication slot.

#[path = "../common/mod.rs"]
mod common;

mod delivery;
mod history;
mod logical_decoding;
mod retention;
mod sse;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::procs::wait_for;
use serde_json::{json, Value};
use tokio_postgres::Client;

/// The history rows the feed shows (see `actors/src/blackboard/feed/events.rs`).
const FEED_ROWS: &str = "xid > '1' and to_status <> 'assigned'
    and from_status is distinct from to_status";

/// Every event's position, in feed order.
async fn all_positions(c: &Client) -> Vec<String> {
    c.query(
        &format!(
            "select xid::text || '-' || id from artex.task_transitions where {FEED_ROWS}
             order by xid, id"
        ),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A long-running `artex` whose standard output goes to a file of its own.
struct Tail {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tail {
    /// Starts `artex ARGS…`; its database sessions are named `app` (see
    /// [`sessions_gone`]).
    fn start(url: &str, app: &str, args: &[&str]) -> Tail {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={app}");
        let url = url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let err = dir.path().join("err.log");
        let child = Command::new(common::artex_bin())
            .args(args)
            .env("ARTEX_DATABASE_URL", url)
            .env("ARTEX_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("spawn artex");
        Tail {
            child,
            out,
            err,
            _dir: dir,
        }
    }

    fn lines(&self) -> Vec<Value> {
        read_lines(&self.out)
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- stderr of a tail ----\n{}",
                std::fs::read_to_string(&self.err).unwrap_or_default()
            );
        }
    }
}

/// The complete JSON lines of a file (a line cut by a kill is not complete).
fn read_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}")))
        .collect()
}

/// Waits until the sessions of a killed process are gone: a statement it sent just
/// before dying (an acknowledgment) still runs to its end on the server, so its durable
/// position is only final then.
async fn sessions_gone(c: &Client, app: &str) {
    wait_for(
        &format!("the sessions of {app} to end"),
        Duration::from_secs(20),
        || async move {
            let n: i64 = c
                .query_one(
                    "select count(*) from pg_stat_activity where application_name = $1",
                    &[&app],
                )
                .await
                .ok()?
                .get(0);
            (n == 0).then_some(())
        },
    )
    .await
}

/// Inserts one task per transaction from `sessions` sessions at once, each transaction
/// held open for a random few milliseconds after its insert, so that transactions commit
/// in another order than the one they drew their event ids in.
async fn concurrent_writers(url: &str, sessions: usize, per_session: usize) {
    let mut handles = Vec::new();
    for s in 0..sessions {
        let url = url.to_string();
        handles.push(tokio::spawn(async move {
            let mut c = common::connect(&url).await;
            for i in 0..per_session {
                let tx = c.transaction().await.unwrap();
                tx.execute(
                    "insert into artex.tasks (kind, payload) values ('echo', $1)",
                    &[&json!({ "s": s, "i": i })],
                )
                .await
                .unwrap();
                let ms = ((s * 7 + i * 13) % 6) as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tx.commit().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

//! The logical decoding consumer: it reads a replication slot and resumes from the LSN
//! it acknowledged.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::common;
use crate::common::procs::wait_for;
use crate::common::{run_cli as artex, TestDb};
use crate::{concurrent_writers, sessions_gone, Tail, FEED_ROWS};

/// A replication slot for one test, dropped at the end (a database with a slot cannot be
/// dropped, and a forgotten slot holds WAL on the shared cluster).
struct SlotGuard {
    url: String,
    slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (url, slot) = (self.url.clone(), self.slot.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let c = common::connect(&url).await;
                let _ = c
                    .execute(
                        "select pg_drop_replication_slot(slot_name) from pg_replication_slots
                         where slot_name = $1",
                        &[&slot],
                    )
                    .await;
            })
        })
        .join();
    }
}

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

#[tokio::test]
async fn the_logical_decoding_consumer_resumes_from_its_lsn() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let suffix = Uuid::new_v4().simple().to_string();
    let slot = format!("artex_t_{}", &suffix[..16]);
    let raw_slot = format!("artex_r_{}", &suffix[..16]);
    let _g1 = SlotGuard {
        url: db.url.clone(),
        slot: slot.clone(),
    };
    let _g2 = SlotGuard {
        url: db.url.clone(),
        slot: raw_slot.clone(),
    };
    assert!(db.bb.feed().ensure_logical_slot(&slot).await.unwrap());
    assert!(!db.bb.feed().ensure_logical_slot(&slot).await.unwrap());
    assert!(db.bb.feed().ensure_logical_slot(&raw_slot).await.unwrap());
    let url = db.url.clone();
    let writers = tokio::spawn(async move { concurrent_writers(&url, 4, 100).await });
    let args = [
        "events",
        "tail",
        "--logical",
        "--slot",
        &slot,
        "--follow",
        "--batch",
        "5",
        "--poll-ms",
        "20",
    ];
    let mut first = Tail::start(&db.url, "tail_first", &args);
    wait_for(
        "the logical consumer to print 100 events",
        Duration::from_secs(60),
        || {
            let n = first.lines().len();
            async move { (n >= 100).then_some(()) }
        },
    )
    .await;
    first.kill9();
    sessions_gone(&c, "tail_first").await;
    let confirmed = slot_position(&c, &slot).await;
    writers.await.unwrap();
    // Logical decoding reads flushed WAL only, and the test cluster commits
    // asynchronously: a synchronous commit that writes WAL (a transaction that wrote
    // nothing is never flushed) flushes everything before it.
    c.batch_execute(
        "begin; set local synchronous_commit = on;
         select pg_logical_emit_message(true, 'artex-test', 'flush'); commit",
    )
    .await
    .unwrap();
    let (code, out, err) = artex(&db.url, &["events", "tail", "--logical", "--slot", &slot]);
    assert_eq!(code, 0, "{err}");
    let second: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let one = first.lines();
    let id_of = |l: &Value| l["id"].as_i64().unwrap();
    // The first run's confirmed transactions, then the second run: every insert exactly
    // once; the second run starts after the confirmed LSN.
    let kept: Vec<&Value> = one
        .iter()
        .filter(|l| lsn(l["lsn"].as_str().unwrap()) <= lsn(&confirmed))
        .collect();
    let unconfirmed = one.len() - kept.len();
    assert!(
        unconfirmed <= 5 * 2,
        "{unconfirmed} lines past the confirmed LSN"
    );
    assert!(second
        .iter()
        .all(|l| lsn(l["lsn"].as_str().unwrap()) > lsn(&confirmed)));
    let mut ids: Vec<i64> = kept.iter().map(|l| id_of(l)).collect();
    ids.extend(second.iter().map(id_of));
    let expected: Vec<i64> = c
        .query(
            &format!("select id from artex.task_transitions where {FEED_ROWS}"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(sorted, expected_sorted, "every event exactly once");
    assert_eq!(ids.len(), 400);
    assert!(second
        .iter()
        .all(|l| l["to"] == "pending" && l["task_id"].is_string()));
    // The slot now stands after the last transaction printed.
    let end = slot_position(&c, &slot).await;
    assert_eq!(end, second.last().unwrap()["lsn"].as_str().unwrap());

    // --raw: every row change of artex.tasks, decoded.
    let (code, out, err) = artex(
        &db.url,
        &["events", "tail", "--logical", "--slot", &raw_slot, "--raw"],
    );
    assert_eq!(code, 0, "{err}");
    let raw: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(raw.len(), 400);
    assert!(raw.iter().all(|l| l["table"] == "artex.tasks"
        && l["op"] == "INSERT"
        && l["row"]["kind"] == "echo"
        && l["row"]["payload"]["i"].is_number()));
    // A wrong wal_level or a foreign slot is refused clearly; dropping works.
    let (code, _, err) = artex(&db.url, &["events", "tail", "--logical"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, _) = artex(&db.url, &["events", "drop-slot", "--slot", &raw_slot]);
    assert_eq!(code, 0);
    assert!(out.contains("dropped"));
}

/// Where `slot`'s consumer confirmed it has read up to.
async fn slot_position(c: &tokio_postgres::Client, slot: &str) -> String {
    c.query_one(
        "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = $1",
        &[&slot],
    )
    .await
    .expect("reading the slot's position")
    .get(0)
}

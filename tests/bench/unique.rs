//! unique: what a unique key costs a submission. 20,000 tasks in batches of 100, one
//! transaction a batch: without keys (one insert a batch), with distinct keys (each
//! through `artex.submit`, the SQL path), and the same keys again (all duplicates: a
//! lookup, nothing written); then keyed batches as the API and the library send them
//! (the keys' locks, then one set-based statement: the operator handle's own
//! `LOCK_KEYS` and `SUBMIT_KEYED`), new and again. Tasks/s and WAL bytes per task.

use std::time::Instant;

use artex_actors::blackboard::operator::{LOCK_KEYS, SUBMIT_KEYED};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Client;

use crate::report::{fixed, result};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_unique";

pub async fn run(bench: &mut Bench) {
    let n = bench.sizes.w1;
    let batches = n / 100;
    let mut c = bench.rig.new_db(DB).await;
    exec(&c, sql::CHECKPOINT).await;
    let no_key = sql::unique_no_key(batches);
    timed(bench, "no_key", n, || exec(&c, &no_key)).await;
    exec(&c, sql::CHECKPOINT).await;
    let keyed = sql::unique_keyed(batches);
    timed(bench, "distinct_keys", n, || exec(&c, &keyed)).await;
    timed(bench, "duplicates", n, || exec(&c, &keyed)).await;
    let tasks: i64 = c.query_one(sql::TASKS, &[]).await.expect("tasks").get(0);
    assert_eq!(tasks, 2 * i64::from(n), "unique: duplicates were written");
    exec(&c, sql::CHECKPOINT).await;
    for label in ["batch_distinct_keys", "batch_duplicates"] {
        let wal0 = bench.rig.counters(DB).await.wal;
        let t0 = Instant::now();
        keyed_batches(&mut c, batches).await;
        report(bench, label, n, t0, wal0).await;
    }
    let tasks: i64 = c.query_one(sql::TASKS, &[]).await.expect("tasks").get(0);
    assert_eq!(
        tasks,
        3 * i64::from(n),
        "unique: a keyed batch wrote duplicates"
    );
    bench.rig.drop_db(DB, c).await;
}

/// Runs `round`, then reports its tasks/s and WAL bytes per task.
async fn timed<F: std::future::Future<Output = ()>>(
    bench: &Bench,
    label: &str,
    n: u32,
    round: impl FnOnce() -> F,
) {
    let wal0 = bench.rig.counters(DB).await.wal;
    let t0 = Instant::now();
    round().await;
    report(bench, label, n, t0, wal0).await;
}

async fn report(bench: &Bench, label: &str, n: u32, t0: Instant, wal0: i64) {
    let secs = t0.elapsed().as_secs_f64();
    let wal1 = bench.rig.counters(DB).await.wal;
    let n = f64::from(n);
    result(
        &format!("unique_{label}_tasks_per_s"),
        fixed(n / secs, 0),
        "tasks/s",
    );
    result(
        &format!("unique_{label}_wal_bytes_per_task"),
        fixed((wal1 - wal0) as f64 / n, 0),
        "bytes",
    );
}

/// `batches` keyed batches of 100 (keys `batch-B-G`), a transaction each: the keys'
/// locks, then the set-based statement, as the operator handle sends them.
pub async fn keyed_batches(c: &mut Client, batches: u32) {
    let lock = c.prepare(LOCK_KEYS).await.expect("LOCK_KEYS");
    let submit = c.prepare(SUBMIT_KEYED).await.expect("SUBMIT_KEYED");
    let kinds = vec!["noop"; 100];
    let payloads = vec![Value::Object(Default::default()); 100];
    let priorities = vec![0i32; 100];
    // The columns a keyed batch leaves out: empty arrays, which unnest pads with NULLs.
    let run_at: Vec<DateTime<Utc>> = Vec::new();
    let ints: Vec<i32> = Vec::new();
    let texts: Vec<String> = Vec::new();
    let secs: Vec<f64> = Vec::new();
    let jsons: Vec<Value> = Vec::new();
    for b in 1..=batches {
        let keys: Vec<String> = (1..=100).map(|g| format!("batch-{b}-{g}")).collect();
        let tx = c.transaction().await.expect("a batch's transaction");
        tx.query(&lock, &[&keys]).await.expect("the keys' locks");
        tx.query(
            &submit,
            &[
                &"bench",
                &"submitted",
                &kinds,
                &payloads,
                &priorities,
                &run_at,
                &ints,
                &ints,
                &texts,
                &keys,
                &secs,
                &jsons,
                &texts,
                &texts,
            ],
        )
        .await
        .expect("a keyed batch");
        tx.commit().await.expect("a batch's commit");
    }
}

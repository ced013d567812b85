//! limits, tags and unique keys: what they cost when used. W1 from idle (2 workers at
//! default flags) four times on one database: no-op tasks with a limit key each (1,000
//! keys) and no limits set; the same with the kind limited (per key 5, kind 10,000: room
//! enough that the limits check every round without binding); tasks with two tags and no
//! limit key; tasks with a unique key each (the unique index is written at each write
//! that is not HOT, and checked at the claim).
//! Tasks/s of the run, WAL bytes per task of the insert and of the run (the tags' GIN
//! index costs at the insert, the limits' counting index at the assignment).

use tokio_postgres::Client;

use crate::report::{fixed, profile_print, profile_reset, result, Progress};
use crate::rig::{exec, run_rate};
use crate::{sql, Bench};

const DB: &str = "bench_limits";

pub async fn run(bench: &mut Bench) {
    let c = bench.rig.new_db(DB).await;
    let args = bench.defaults_worker_args.clone();
    bench.rig.start_runtime_online(&c, DB, 2, &args).await;
    round(bench, &c, "keys_unlimited", sql::LIMITS_INSERT_KEYED).await;
    exec(&c, sql::LIMITS_SET).await;
    round(bench, &c, "keys_limited", sql::LIMITS_INSERT_KEYED).await;
    exec(&c, sql::LIMITS_CLEAR).await;
    round(bench, &c, "tagged", sql::LIMITS_INSERT_TAGGED).await;
    round(bench, &c, "unique_keys", sql::LIMITS_INSERT_UNIQUE).await;
    bench.rig.stop_runtime().await;
    bench.rig.drop_db(DB, c).await;
}

async fn round(bench: &Bench, c: &Client, label: &str, insert: &str) {
    let n = bench.sizes.w1;
    exec(c, sql::CHECKPOINT).await;
    let wal0 = bench.rig.counters(DB).await.wal;
    c.execute(insert, &[&(n as i32), &bench.sizes.w1idle_lead])
        .await
        .expect("the tasks");
    let wal1 = bench.rig.counters(DB).await.wal;
    profile_reset(c).await;
    let mut progress = Progress::new(&format!("limits {label}"), n.into());
    bench.rig.drained(c, &mut progress).await;
    profile_print(c, &format!("limits {label} (the run)"), n).await;
    let wal2 = bench.rig.counters(DB).await.wal;
    let ok: i64 = c
        .query_one(sql::SUCCEEDED, &[])
        .await
        .expect("succeeded")
        .get(0);
    assert_eq!(ok, i64::from(n), "limits {label}: not every task succeeded");
    let rate = run_rate(c, n).await;
    bench
        .ceilings
        .throughput(&format!("limits_{label}_tasks_per_s"), rate);
    let per_task = |x: i64| fixed(x as f64 / f64::from(n), 0);
    result(
        &format!("limits_{label}_wal_bytes_per_task_insert"),
        per_task(wal1 - wal0),
        "bytes",
    );
    result(
        &format!("limits_{label}_wal_bytes_per_task_run"),
        per_task(wal2 - wal1),
        "bytes",
    );
    exec(c, sql::DELETE_TASKS).await;
}

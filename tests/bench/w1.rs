//! W1: throughput. 20,000 no-op tasks inserted in bulk, then 1 planner + 1 worker
//! (concurrency 10, local queue 2,000: ARTEX_BENCH_WORKER_ARGS) drain them; again with 2
//! workers. Time from the processes' start to the last finish; what one task costs
//! PostgreSQL (transactions, WAL written and flushed, CPU) and the artex processes (CPU).

use std::time::{SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;

use crate::report::{fixed, profile_print, profile_reset, result, Progress};
use crate::rig::{exec, Counters};
use crate::{sql, Bench};

pub async fn run(bench: &mut Bench) {
    for workers in [1, 2] {
        one(bench, workers).await;
    }
}

async fn one(bench: &mut Bench, workers: usize) {
    let n = bench.sizes.w1;
    let db = format!("bench_w1_{workers}");
    let c = bench.rig.new_db(&db).await;
    insert_noops(&c, n).await;
    if workers == 2 {
        profile_reset(&c).await;
    }
    // The insert's session gone (its backend's CPU reaped into the postmaster's).
    drop(c);
    bench.rig.wait_idle(&db).await;
    let before = bench.rig.counters(&db).await;
    let pg0 = bench.rig.pg_cpu_s();
    let t0 = unix_now();
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(&db, workers, "artex", &args);
    let c = bench.rig.client(&db).await;
    let mut progress = Progress::new(&format!("W1 with {workers} worker(s)"), n.into());
    bench.rig.drained(&c, &mut progress).await;
    let artex_cpu = bench.rig.procs_cpu_s();
    bench.rig.stop_runtime().await;
    drop(c);
    bench.rig.wait_idle(&db).await;
    let pg = bench.rig.pg_cpu_s() - pg0;
    let after = bench.rig.counters(&db).await;
    let c = bench.rig.client(&db).await;
    bench.rig.check_all_succeeded(&c, &db, n.into()).await;
    let r = c
        .query_one(sql::FINISHES_SINCE_S, &[&t0])
        .await
        .expect("finishes");
    let (first, last): (f64, f64) = (r.get(0), r.get(1));
    let tasks = f64::from(n);
    bench
        .ceilings
        .throughput(&format!("w1_tasks_per_s_{workers}worker"), tasks / last);
    // Of that time, start-up: from the processes' start to the first task finished.
    result(
        &format!("w1_{workers}worker_first_finish_ms"),
        fixed(first * 1000.0, 0),
        "ms",
    );
    costs(workers, n, (before, after), pg, artex_cpu);
    if workers == 2 {
        profile_print(&c, "W1 with 2 workers", n).await;
    }
    bench.rig.drop_db(&db, c).await;
}

/// What one task costs: transactions PostgreSQL ran (including those in which each
/// LISTENing session reads the NOTIFY queue), WAL written and flushed, CPU spent by
/// PostgreSQL and by the artex processes (both include start-up; PostgreSQL's includes
/// autovacuum, the checkpointer and the bench's polling).
fn costs(workers: usize, n: u32, (before, after): (Counters, Counters), pg: f64, artex_cpu: f64) {
    let tasks = f64::from(n);
    let per = |x: i64| x as f64 / tasks;
    let name = |what: &str| format!("w1_{workers}worker_{what}");
    result(
        &name("pg_transactions_per_task"),
        fixed(per(after.commits - before.commits), 2),
        "transactions",
    );
    result(
        &name("wal_bytes_per_task"),
        fixed(per(after.wal - before.wal), 0),
        "bytes",
    );
    result(
        &name("wal_flushes_per_task"),
        fixed(per(after.syncs - before.syncs), 2),
        "fsyncs",
    );
    result(
        &name("cpu_us_per_task_postgres"),
        fixed(pg * 1e6 / tasks, 0),
        "us",
    );
    result(
        &name("cpu_us_per_task_artex"),
        fixed(artex_cpu * 1e6 / tasks, 0),
        "us",
    );
}

/// `count` no-op tasks with time-ordered ids, 100,000 a statement, then vacuum analyze
/// and a checkpoint (W1, W3, W4, W6's backlog).
pub async fn insert_noops(c: &Client, count: u32) {
    let mut left = count;
    while left > 0 {
        let n = left.min(100_000);
        c.execute(sql::INSERT_NOOPS, &[&(n as i32)])
            .await
            .expect("the tasks");
        left -= n;
    }
    exec(c, sql::VACUUM_ANALYZE).await;
    exec(c, sql::CHECKPOINT).await;
}

/// Now, as Unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

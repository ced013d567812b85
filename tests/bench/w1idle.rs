//! W1 from idle: 20,000 no-op tasks made runnable at one instant while the runtime
//! idles, as users submit them: inserted with plain SQL (the column default id) with
//! `run_at` 8 s ahead while 1 planner + 2 workers at default flags (no --prefetch: the
//! queue sizes itself) sit idle. Tasks/s from the first start to the last finish (the
//! insert announces when its tasks fall due, migrations/V57, and the Scanner starts at
//! that time); WAL bytes and PostgreSQL CPU per task, of the insert, of the run (from the
//! insert's end, so with the lead's idling) and of the burst alone (from `run_at`); and
//! how many tasks the workers claimed in their own reads rather than a planner placed
//! (their `artex_worker_tasks_claimed_total`: the workers serve `/metrics` without a
//! token here, `ARTEX_PUBLIC_READ`, on loopback).
//!
//! A burst lasts about a second, so what the host's two cores do in that second moves
//! one burst's figures by a quarter either way: the part runs `ARTEX_BENCH_W1IDLE_RUNS`
//! bursts (3; 1 with --quick), each on a fresh database and runtime, prints each, and
//! reports their medians.
//!
//! `ARTEX_BENCH_STATS_FLUSH=1` hands the insert's table counts to the server's
//! statistics at once, so that autovacuum's pass for the insert runs in the lead, not in
//! the burst (an experiment; see [`burst`]).

use tokio_postgres::Client;

use crate::report::{
    cpu_split_print, fixed, median, profile_print, profile_reset, profiling, repeats, result,
    Activity, Progress,
};
use crate::rig::{exec, run_rate};
use crate::{sql, Bench};

const DB: &str = "bench_w1idle";

/// One burst's figures.
#[derive(Debug, Clone, Copy)]
struct Burst {
    /// Tasks/s from the first start to the last finish.
    rate: f64,
    /// The first start, ms after run_at.
    first_ms: f64,
    /// WAL bytes and PostgreSQL CPU µs per task, of the insert and of the run (from the
    /// insert's end: the lead's idling counted too).
    wal_insert: f64,
    wal_run: f64,
    cpu_insert: f64,
    cpu_run: f64,
    /// The same of the burst alone: from just before `run_at` to the drain seen.
    wal_burst: f64,
    cpu_burst: f64,
}

/// One figure of a burst.
type Figure = fn(&Burst) -> f64;

pub async fn run(bench: &mut Bench) {
    let runs = repeats("ARTEX_BENCH_W1IDLE_RUNS", bench.quick);
    let mut bursts = Vec::with_capacity(runs);
    for i in 1..=runs {
        let b = burst(bench).await;
        println!(
            "# W1 from idle, burst {i} of {runs}: {} tasks/s; first start +{} ms; per task WAL {} / {} B, PostgreSQL CPU {} / {} us (insert / run); the burst alone {} B, {} us",
            fixed(b.rate, 0),
            b.first_ms,
            fixed(b.wal_insert, 0),
            fixed(b.wal_run, 0),
            fixed(b.cpu_insert, 0),
            fixed(b.cpu_run, 0),
            fixed(b.wal_burst, 0),
            fixed(b.cpu_burst, 1),
        );
        bursts.push(b);
    }
    let of = |f: Figure| median(bursts.iter().map(f).collect());
    bench
        .ceilings
        .throughput("w1idle_tasks_per_s_2workers", of(|b| b.rate));
    result(
        "w1idle_first_start_after_run_at_ms",
        of(|b| b.first_ms),
        "ms",
    );
    // The run's CPU includes the seconds of idling around it (the lead's 8 s: the
    // fleet's polls and heartbeats, the drain's polls, the insert's autovacuum); the
    // burst's does not.
    let per_task: [(&str, Figure, &str); 6] = [
        (
            "w1idle_wal_bytes_per_task_insert",
            |b| b.wal_insert,
            "bytes",
        ),
        ("w1idle_wal_bytes_per_task_run", |b| b.wal_run, "bytes"),
        (
            "w1idle_cpu_us_per_task_postgres_insert",
            |b| b.cpu_insert,
            "us",
        ),
        ("w1idle_cpu_us_per_task_postgres_run", |b| b.cpu_run, "us"),
        ("w1idle_wal_bytes_per_task_burst", |b| b.wal_burst, "bytes"),
        (
            "w1idle_cpu_us_per_task_postgres_burst",
            |b| b.cpu_burst,
            "us",
        ),
    ];
    for (name, figure, unit) in per_task {
        result(name, fixed(of(figure), 0), unit);
    }
}

/// One burst on a fresh database and runtime.
async fn burst(bench: &mut Bench) -> Burst {
    let n = bench.sizes.w1;
    let c = bench.rig.new_db(DB).await;
    let args = bench.defaults_worker_args.clone();
    // Their /metrics readable without a token (loopback): the tasks they claimed.
    let env = [("ARTEX_PUBLIC_READ", "true")];
    bench
        .rig
        .start_runtime_online_env(&c, DB, 2, &args, &env)
        .await;
    // Both parts start from a checkpoint, as W1's run does: full-page images count alike.
    exec(&c, sql::CHECKPOINT).await;
    let wal0 = bench.rig.counters(DB).await.wal;
    let pg0 = bench.rig.pg_cpu_s();
    let lead = bench.sizes.w1idle_lead;
    c.execute(sql::INSERT_NOOPS_AT, &[&(n as i32), &lead])
        .await
        .expect("the insert");
    // This session idles after the insert, so its table counts reach the autovacuum
    // launcher late and the insert's vacuum and analyze run in the burst (two bursts of
    // three; docs/bench/2026-12-08.md). The flush moves them into the lead; off by
    // default, so that runs stay comparable with those before it.
    if std::env::var("ARTEX_BENCH_STATS_FLUSH").as_deref() == Ok("1") {
        exec(&c, sql::STATS_FLUSH).await;
    }
    let wal1 = bench.rig.counters(DB).await.wal;
    let pg1 = bench.rig.pg_cpu_s();
    let lead_row = c
        .query_one(sql::W1IDLE_WITHIN_LEAD, &[])
        .await
        .expect("lead");
    assert!(
        lead_row.get::<_, bool>(0),
        "w1idle: the insert took longer than the {lead} s lead"
    );
    // The instant the burst is due, as of this answer: the steps below take time of
    // their own, and the sampling must start at `run_at`, not that long after it.
    let run_at = tokio::time::Instant::now() + std::time::Duration::from_secs_f64(lead_row.get(1));
    profile_reset(&c).await;
    let split0 = bench.rig.pg_cpu_by_process().await;
    let runtime0 = bench.rig.procs_cpu_each_s();
    let activity = Activity::start(&bench.rig, DB, run_at).await;
    // The burst's own readings: just before `run_at` (its first start comes 7–20 ms
    // after it) and as soon as the drain is seen.
    tokio::time::sleep_until(run_at - std::time::Duration::from_millis(5)).await;
    let (wal_at, pg_at) = (bench.rig.counters(DB).await.wal, bench.rig.pg_cpu_s());
    let split_at = bench.rig.pg_cpu_by_process().await;
    let mut progress = Progress::new("W1 from idle", n.into());
    bench.rig.drained(&c, &mut progress).await;
    let (pg_drained, wal_drained) = (bench.rig.pg_cpu_s(), bench.rig.counters(DB).await.wal);
    // By process, unprofiled too: the burst's client backends against the `cycle` part's
    // one connection (what the workers' statements cost beyond it).
    cpu_split_print(
        "W1 from idle (the burst)",
        &split_at,
        &bench.rig.pg_cpu_by_process().await,
        n,
    );
    activity.print("W1 from idle (the run)").await;
    let split1 = bench.rig.pg_cpu_by_process().await;
    let runtime1 = bench.rig.procs_cpu_each_s();
    profile_print(&c, "W1 from idle (the run)", n).await;
    if profiling() {
        cpu_split_print("W1 from idle (the run)", &split0, &split1, n);
    }
    // The two cores are the budget of every process, not PostgreSQL's alone.
    let runtime: Vec<String> = runtime0
        .iter()
        .zip(&runtime1)
        .map(|(a, b)| fixed((b - a) * 1e6 / f64::from(n), 1))
        .collect();
    println!(
        "# W1 from idle: CPU us per task of the planner and each worker (the run): {}",
        runtime.join(" / ")
    );
    let wal2 = bench.rig.counters(DB).await.wal;
    let pg2 = bench.rig.pg_cpu_s();
    let capacity: String = c
        .query_one(sql::CAPACITIES, &[])
        .await
        .expect("capacity")
        .get(0);
    let claimed = claimed_by_workers(&c).await;
    bench.rig.stop_runtime().await;
    bench.rig.check_all_succeeded(&c, DB, n.into()).await;
    time_ordered_ids(&c).await;
    let rate = run_rate(&c, n).await;
    let first_ms: f64 = c
        .query_one(sql::FIRST_START_AFTER_RUN_AT_MS, &[])
        .await
        .expect("first")
        .get(0);
    println!("# W1 from idle: workers' capacity (concurrency + queue depth) at the last finish: {capacity}");
    println!("# W1 from idle: tasks the workers claimed themselves (V46), the rest placed by the planner: {claimed} of {n}");
    timeline(&c).await;
    bench.rig.drop_db(DB, c).await;
    let per_task = |x: f64| x / f64::from(n);
    Burst {
        rate,
        first_ms,
        wal_insert: per_task((wal1 - wal0) as f64),
        wal_run: per_task((wal2 - wal1) as f64),
        cpu_insert: per_task((pg1 - pg0) * 1e6),
        cpu_run: per_task((pg2 - pg1) * 1e6),
        wal_burst: per_task((wal_drained - wal_at) as f64),
        cpu_burst: per_task((pg_drained - pg_at) * 1e6),
    }
}

/// The tasks the online workers claimed in their own reads, not placed by a planner's
/// round: the sum of their `artex_worker_tasks_claimed_total`.
async fn claimed_by_workers(c: &Client) -> f64 {
    let mut sum = 0.0;
    for row in c.query(sql::ONLINE_HTTP, &[]).await.expect("workers") {
        let addr: String = row.get(0);
        let (code, text) = crate::common::procs::http_get_as(&addr, "/metrics", None)
            .unwrap_or_else(|e| panic!("w1idle: GET {addr}/metrics: {e}"));
        assert_eq!(code, 200, "w1idle: GET {addr}/metrics: {text}");
        sum += crate::common::procs::metric_value(&text, "artex_worker_tasks_claimed_total")
            .unwrap_or_else(|| panic!("w1idle: no claimed counter in {addr}/metrics"));
    }
    sum
}

/// Every id the column default made is a UUIDv7 (time-ordered).
async fn time_ordered_ids(c: &Client) {
    let not7: i64 = c.query_one(sql::NOT_UUID7, &[]).await.expect("ids").get(0);
    assert_eq!(
        not7, 0,
        "w1idle: ids by the column default are not time-ordered (UUIDv7)"
    );
}

/// Where the time went: assignment rounds and their sizes, the first rounds, and the
/// finishes from run_at (`#` lines).
async fn timeline(c: &Client) {
    let r = c.query_one(sql::ROUNDS, &[]).await.expect("rounds");
    let (rounds, avg, lo, hi, span): (i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
    println!("# W1 from idle: {rounds} assignment rounds over {span} ms, {avg} tasks each on average (min {lo}, max {hi})");
    let firsts: String = c
        .query_one(sql::FIRST_ROUNDS, &[])
        .await
        .expect("first rounds")
        .get(0);
    println!("# W1 from idle: first rounds (tasks@ms after run_at, worker): {firsts}");
    let r = c
        .query_one(sql::FINISHED_AFTER_RUN_AT_MS, &[])
        .await
        .expect("finishes");
    let (f10, f50, f100): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    println!("# W1 from idle: 10% finished +{f10} ms, 50% +{f50} ms, all +{f100} ms after run_at");
    let r = c
        .query_one(sql::PER_50_MS_AFTER_RUN_AT, &[])
        .await
        .expect("per 50 ms");
    let (assigned, finished): (String, String) = (r.get(0), r.get(1));
    println!("# W1 from idle: assigned per 50 ms after run_at: {assigned}");
    println!("# W1 from idle: finished per 50 ms after run_at: {finished}");
}

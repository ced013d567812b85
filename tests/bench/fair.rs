//! fair: fair dispatch between tenants (issue 37, `artex kind limit K --fair`). A planner
//! and 2 workers at default flags, `sleep` tasks of 20 ms: a key `small` submits one task
//! every 100 ms for 10 s, first on an idle fleet, then behind a backlog of 20,000 tasks
//! of a key `big` inserted at once (the fleet busy throughout) with the kind fair, then
//! the same with the kind not fair. Figures: the small key's median wait (creation to
//! start) each time and its ratio to the idle one (target ≤ 2 when fair), and the tasks
//! started per second over the 10 s, fair against not fair (target ≥ 0.9). The idle wait
//! is measured twice: with the kind not fair (its tasks born assigned to idle workers
//! since V62) and with it fair (through a planner's round, as behind the backlog); the
//! `…_vs_idle_fair` figures compare like with like.
//!
//! The backlog's tasks all last 20 ms, so a worker's slots end in step and a late task
//! waits for the next of them to end, about half a task length whatever the dispatch.
//! So the fair case runs twice: with that backlog, and with one whose tasks last
//! 20 ± S ms (uniformly, the same mean; S is `ARTEX_BENCH_FAIR_SPREAD_MS`, 0 to 19, 10
//! unset), their ends spread out as real tasks' are (`…_spread` figures).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;

use crate::report::{fixed, result, Progress};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_fair";
const TASK_MS: i32 = 20;
const EVERY: Duration = Duration::from_millis(100);

pub async fn run(bench: &mut Bench) {
    let (backlog, secs) = if bench.quick { (300, 1) } else { (20_000, 10) };
    let spread = spread_ms();
    let c = bench.rig.new_db(DB).await;
    let args = bench.defaults_worker_args.clone();
    bench.rig.start_runtime_online(&c, DB, 2, &args).await;

    trickle(&c, secs).await;
    let idle = small_median(bench, &c).await;
    exec(&c, sql::DELETE_TASKS).await;
    exec(&c, sql::FAIR_SET).await;
    // The same key's wait with no backlog and the kind fair: the like-for-like baseline
    // since V62 (a fair kind's tasks go through a planner's round; on an idle fleet a
    // kind that is not fair has its tasks born assigned to an idle worker).
    println!("# fair (idle, the kind fair)");
    trickle(&c, secs).await;
    let idle_fair = small_median(bench, &c).await;
    exec(&c, sql::DELETE_TASKS).await;
    let (fair_wait, fair_rate) = behind_backlog(bench, &c, (backlog, 0), secs, "fair").await;
    let (spread_wait, spread_rate) =
        behind_backlog(bench, &c, (backlog, spread), secs, "fair, ends spread").await;
    exec(&c, sql::LIMITS_CLEAR).await;
    let (unfair_wait, unfair_rate) = behind_backlog(bench, &c, (backlog, 0), secs, "unfair").await;
    bench.rig.stop_runtime().await;
    bench.rig.drop_db(DB, c).await;

    result("fair_small_wait_p50_idle_ms", fixed(idle, 1), "ms");
    result(
        "fair_small_wait_p50_idle_fair_ms",
        fixed(idle_fair, 1),
        "ms",
    );
    result("fair_small_wait_p50_fair_ms", fixed(fair_wait, 1), "ms");
    result("fair_small_wait_p50_unfair_ms", fixed(unfair_wait, 1), "ms");
    result("fair_small_wait_vs_idle", fixed(fair_wait / idle, 2), "x");
    result(
        "fair_small_wait_p50_fair_spread_ms",
        fixed(spread_wait, 1),
        "ms",
    );
    result(
        "fair_small_wait_vs_idle_spread",
        fixed(spread_wait / idle, 2),
        "x",
    );
    result(
        "fair_small_wait_vs_idle_fair",
        fixed(fair_wait / idle_fair, 2),
        "x",
    );
    result(
        "fair_small_wait_vs_idle_fair_spread",
        fixed(spread_wait / idle_fair, 2),
        "x",
    );
    result(
        "fair_tasks_per_s_fair_spread",
        fixed(spread_rate, 0),
        "tasks/s",
    );
    result("fair_tasks_per_s_fair", fixed(fair_rate, 0), "tasks/s");
    result("fair_tasks_per_s_unfair", fixed(unfair_rate, 0), "tasks/s");
    result(
        "fair_throughput_vs_unfair",
        fixed(fair_rate / unfair_rate, 2),
        "x",
    );
}

/// `ARTEX_BENCH_FAIR_SPREAD_MS`: how far a task's length may be from [`TASK_MS`] in the
/// spread backlog, ms (10 when unset).
fn spread_ms() -> i32 {
    let Ok(v) = std::env::var("ARTEX_BENCH_FAIR_SPREAD_MS") else {
        return 10;
    };
    match v.parse::<i32>() {
        Ok(s) if (0..TASK_MS).contains(&s) => s,
        _ => panic!(
            "ARTEX_BENCH_FAIR_SPREAD_MS={v}: a whole number of ms from 0 to {}",
            TASK_MS - 1
        ),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One `small` task every [`EVERY`] for `secs` seconds.
async fn trickle(c: &Client, secs: u32) {
    let start = Instant::now();
    for i in 0..secs * 10 {
        let due = start + EVERY * i;
        tokio::time::sleep_until(due.into()).await;
        c.execute(sql::FAIR_ONE, &[&TASK_MS])
            .await
            .expect("a small task");
    }
}

/// The `small` key's median wait once all its tasks ran, ms.
async fn small_median(bench: &Bench, c: &Client) -> f64 {
    let mut progress = Progress::new("fair: the small key", 0);
    bench.rig.drained(c, &mut progress).await;
    let row = c
        .query_one(sql::FAIR_SMALL_WAIT, &[])
        .await
        .expect("the waits");
    let parts = c
        .query_one(sql::FAIR_SMALL_WAIT_PARTS, &[])
        .await
        .expect("the waits' parts");
    if let (Some(to_assigned), Some(to_start)) = (
        parts.get::<_, Option<f64>>(0),
        parts.get::<_, Option<f64>>(1),
    ) {
        println!(
            "# fair: the small key's median wait: {to_assigned:.1} ms to its assignment, \
             {to_start:.1} ms from there to its start"
        );
    }
    row.get::<_, Option<f64>>(1).expect("small tasks ran")
}

/// `backlog` tasks of `big` (how many, and how far their lengths spread), then the small
/// key's trickle: its median wait, and the tasks started per second meanwhile.
async fn behind_backlog(
    bench: &Bench,
    c: &Client,
    (backlog, spread): (i32, i32),
    secs: u32,
    label: &str,
) -> (f64, f64) {
    println!("# fair ({label}): the backlog's tasks last {TASK_MS} ± {spread} ms");
    c.execute(sql::FAIR_BACKLOG, &[&backlog, &TASK_MS, &"big", &spread])
        .await
        .expect("the backlog");
    let t0 = unix_now();
    trickle(c, secs).await;
    let t1 = unix_now();
    let started: i64 = c
        .query_one(sql::FAIR_STARTED_BETWEEN, &[&t0, &t1])
        .await
        .expect("started")
        .get(0);
    println!(
        "# fair ({label}): {started} tasks started in {:.1} s",
        t1 - t0
    );
    let wait = small_median(bench, c).await;
    exec(c, sql::DELETE_TASKS).await;
    (wait, started as f64 / (t1 - t0))
}

//! W4: the soak. ARTEX_BENCH_W4_TASKS no-op tasks (default 1,000,000, ~5 min on an idle
//! 2-core box; `--quick` 5,000) inserted in bulk, then 1 planner + 2 workers
//! (ARTEX_BENCH_WORKER_ARGS) drain them: tasks/s overall and per tenth of the run (by
//! completion order), the task table's size and dead tuples at the end, the history's
//! size, the planner's and the workers' peak RSS.
//!
//! ARTEX_BENCH_W4_RETENTION=2m keeps history and finished tasks that long (the planner's
//! Maintenance drops history partitions and deletes finished tasks during the run): the
//! rows left are reported instead of every task's audit trail being checked.

use std::time::Duration;

use tokio_postgres::Client;

use crate::report::{fixed, result, Progress};
use crate::rig::{exec, proc_kb};
use crate::w1::{insert_noops, unix_now};
use crate::{sql, Bench};

const DB: &str = "bench_w4";

pub async fn run(bench: &mut Bench) {
    let quick_default = if bench.quick { 5_000 } else { 1_000_000 };
    let n: u32 = std::env::var("ARTEX_BENCH_W4_TASKS")
        .ok()
        .map(|v| v.parse().expect("ARTEX_BENCH_W4_TASKS: a number of tasks"))
        .unwrap_or(quick_default);
    let keep = std::env::var("ARTEX_BENCH_W4_RETENTION").ok();
    let c = bench.rig.new_db(DB).await;
    if let Some(keep) = &keep {
        c.execute(sql::W4_RETENTION, &[keep])
            .await
            .expect("the retention");
        exec(&c, sql::W4_PARTITIONS_REMADE).await;
    }
    insert_noops(&c, n).await;
    let t0 = unix_now();
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(DB, 2, "artex", &args);
    let mut progress = Progress::new("W4", n.into());
    let timeout = Duration::from_secs(u64::from(n) / 100 + 300);
    bench.rig.drained_within(&c, &mut progress, timeout).await;
    let pids = bench.rig.pids();
    let planner_kb = proc_kb(pids[0], "status", "VmHWM");
    let worker_kb = pids[1..]
        .iter()
        .map(|&p| proc_kb(p, "status", "VmHWM"))
        .max()
        .unwrap_or(0);
    bench.rig.stop_runtime().await;
    // Every session gone: the backends' last statistics have landed.
    drop(c);
    bench.rig.wait_idle(DB).await;
    let c = bench.rig.client(DB).await;
    match &keep {
        None => bench.rig.check_all_succeeded(&c, DB, n.into()).await,
        Some(keep) => retained(&c, keep).await,
    }
    println!("# W4: {n} tasks, 1 planner + 2 workers");
    let r = c
        .query_one(sql::FINISHES_SINCE_S, &[&t0])
        .await
        .expect("the last finish");
    let last: f64 = r.get(1);
    bench
        .ceilings
        .throughput("w4_tasks_per_s", f64::from(n) / last);
    tenths(&c).await;
    sizes(&c).await;
    let mb = |kb: u64| fixed(kb as f64 / 1024.0, 1);
    result("w4_planner_peak_rss_mb", mb(planner_kb), "MB");
    result("w4_worker_peak_rss_mb", mb(worker_kb), "MB");
    bench.rig.drop_db(DB, c).await;
}

/// With a retention: every task left succeeded; what is left of the tasks and history.
async fn retained(c: &Client, keep: &str) {
    let count =
        |q: &'static str| async move { c.query_one(q, &[]).await.expect(q).get::<_, i64>(0) };
    assert_eq!(
        count(sql::NOT_SUCCEEDED).await,
        0,
        "{DB}: tasks did not succeed"
    );
    let (tasks, history) = (count(sql::TASKS).await, count(sql::HISTORY_ROWS).await);
    let r = c.query_one(sql::W4_RETAINED, &[]).await.expect("retained");
    let (parts, pruned): (String, String) = (r.get(0), r.get(1));
    println!("# W4 with a retention of {keep}: {tasks} tasks left, history partitions: {parts}, feed pruned through {pruned}");
    result("w4_tasks_left", tasks, "rows");
    result("w4_history_rows_left", history, "rows");
}

/// Tasks/s in each tenth of the run, then the slowest tenth over the fastest.
async fn tenths(c: &Client) {
    let rows = c.query(sql::W4_TENTHS, &[]).await.expect("tenths");
    let rates: Vec<f64> = rows.iter().map(|r| r.get(1)).collect();
    for r in &rows {
        let (tenth, rate): (i32, f64) = (r.get(0), r.get(1));
        result(
            &format!("w4_tasks_per_s_tenth_{tenth:02}"),
            fixed(rate, 0),
            "tasks/s",
        );
    }
    let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rates.iter().copied().fold(0.0, f64::max);
    result("w4_slowest_tenth_vs_fastest", fixed(lo / hi, 2), "ratio");
}

/// The task table's and the history's size at the end.
async fn sizes(c: &Client) {
    let r = c.query_one(sql::W4_SIZES, &[]).await.expect("sizes");
    let (heap, total, live, dead, trans, parts): (i64, i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
    let mb = |b: i64| fixed(b as f64 / 1_048_576.0, 1);
    result("w4_tasks_heap_mb", mb(heap), "MB");
    result("w4_tasks_with_indexes_mb", mb(total), "MB");
    result("w4_tasks_live_tuples", live, "rows");
    result("w4_tasks_dead_tuples", dead, "rows");
    result("w4_task_transitions_mb", mb(trans), "MB");
    result("w4_task_transitions_partitions", parts, "partitions");
}

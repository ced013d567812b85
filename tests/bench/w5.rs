//! W5: bursts after idle gaps. 10 bursts of 20,000 no-op tasks inserted by plain SQL into
//! 1 planner + 2 workers at default flags, each 5 s after the previous one finished (an
//! idle gap however fast the box is): each burst's tasks/s (first start to last finish)
//! and its first task's start after the idle gap (from the end of its insert).

use std::time::Duration;

use crate::report::{fixed, result, Progress};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_w5";

pub async fn run(bench: &mut Bench) {
    let (bursts, n, gap) = if bench.quick {
        (3, 300, 2)
    } else {
        (10, 20_000, 5)
    };
    let mut c = bench.rig.new_db(DB).await;
    exec(&c, sql::W5_BURSTS_TABLE).await;
    let args = bench.defaults_worker_args.clone();
    bench.rig.start_runtime_online(&c, DB, 2, &args).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut progress = Progress::new("W5", u64::from(bursts as u32 * n));
    for b in 1..=bursts {
        if b > 1 {
            bench.rig.drained(&c, &mut progress).await;
            tokio::time::sleep(Duration::from_secs(gap)).await;
        }
        let tx = c.transaction().await.expect("a burst's transaction");
        tx.execute(sql::W5_INSERT, &[&b, &(n as i32)])
            .await
            .expect("a burst");
        tx.execute(sql::W5_MARK, &[&b]).await.expect("its time");
        tx.commit().await.expect("a burst's commit");
    }
    bench.rig.drained(&c, &mut progress).await;
    bench.rig.stop_runtime().await;
    bench
        .rig
        .check_all_succeeded(&c, DB, i64::from(bursts) * i64::from(n))
        .await;
    report(bench, &c, n).await;
    bench.rig.drop_db(DB, c).await;
}

/// Each burst's tasks/s and first start, its timeline, and the medians.
async fn report(bench: &Bench, c: &tokio_postgres::Client, n: u32) {
    let mut rows: Vec<(i32, f64, f64)> = c
        .query(sql::W5_RATES, &[&(n as i32)])
        .await
        .expect("the bursts")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    for &(b, rate, first) in &rows {
        bench
            .ceilings
            .throughput(&format!("w5_burst_{b:02}_tasks_per_s"), rate);
        result(
            &format!("w5_burst_{b:02}_first_start_ms"),
            fixed(first, 1),
            "ms",
        );
    }
    for r in c.query(sql::W5_TIMELINE, &[]).await.expect("the timeline") {
        let (b, first, half, p99, last): (i32, i64, i64, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        println!("# W5 burst {b}: first start +{first} ms, half finished +{half} ms, 99% +{p99} ms, last +{last} ms");
    }
    // The (upper) median, as the bash bench took it.
    let mid = rows.len().div_ceil(2) - 1;
    rows.sort_by(|x, y| x.1.total_cmp(&y.1));
    bench
        .ceilings
        .throughput("w5_tasks_per_s_median", rows[mid].1);
    rows.sort_by(|x, y| x.2.total_cmp(&y.2));
    result("w5_first_start_ms_median", fixed(rows[mid].2, 1), "ms");
    result(
        "w5_first_start_ms_max",
        fixed(rows[rows.len() - 1].2, 1),
        "ms",
    );
}

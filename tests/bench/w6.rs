//! W6: the planner against a fleet. 20,000 pending no-op tasks assigned by one planner to
//! 10 simulated workers of 2,000 slots, then to 2,000 of 10 slots (rows without a process
//! or LISTEN session, which the roster accepts): assignment throughput, rounds, and the
//! cost of the round's read (roster + claim). Target: 2,000 workers at least half the
//! rate of 10.

use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::report::{fixed, result};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::{sql, Bench};

pub async fn run(bench: &mut Bench) {
    let mut rates = Vec::new();
    for fleet in [10u32, 2000] {
        rates.push(one(bench, fleet).await);
    }
    result(
        "w6_2000_vs_10_workers",
        fixed(rates[1] / rates[0], 2),
        "ratio",
    );
}

async fn one(bench: &mut Bench, fleet: u32) -> f64 {
    let n = bench.sizes.w1;
    let db = format!("bench_w6_{fleet}");
    let c = bench.rig.new_db(&db).await;
    let slots = (n / fleet).max(1); // --quick: fewer tasks than workers
    c.execute(sql::SIM_WORKERS, &[&(fleet as i32), &(slots as i32)])
        .await
        .expect("the fleet");
    exec(&c, sql::ANALYZE_WORKERS).await;
    insert_noops(&c, n).await;
    let dispatch_ms = dispatch_ms(&c, 2000, None).await;
    let args = [
        "planner",
        "--worker-suspect-ms",
        "600000",
        "--worker-timeout-ms",
        "600000",
    ];
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    bench.rig.spawn(&db, "planner", "artex", &args);
    bench
        .rig
        .wait_until(&c, sql::PENDING_NONE, &[], Duration::from_secs(600), None)
        .await;
    bench.rig.stop_runtime().await;
    let r = c.query_one(sql::W6_RATE, &[]).await.expect("the rate");
    let (rate, rounds): (f64, i64) = (r.get(0), r.get(1));
    let over: i64 = c
        .query_one(sql::OVER_CAPACITY, &[])
        .await
        .expect("capacity")
        .get(0);
    assert_eq!(
        over, 0,
        "{db}: {over} workers hold more than their capacity"
    );
    println!("# W6: {n} tasks to {fleet} simulated workers of {slots} slots, 1 planner");
    bench
        .ceilings
        .throughput(&format!("w6_assign_per_s_{fleet}_workers"), rate);
    result(&format!("w6_rounds_{fleet}_workers"), rounds, "rounds");
    result(
        &format!("w6_dispatch_2000_ms_{fleet}_workers"),
        dispatch_ms,
        "ms",
    );
    bench.rig.drop_db(&db, c).await;
    rate
}

/// The round's read as the runtime sends it (prepared; 7 runs let PostgreSQL settle on
/// the plan it keeps) for `limit` tasks, in a transaction rolled back afterwards: the
/// median execution time, as EXPLAIN ANALYZE prints it (ms).
/// `before` runs first in that transaction (W3: a simulated worker on the roster).
pub async fn dispatch_ms(c: &Client, limit: u32, before: Option<&str>) -> String {
    let body: String = c
        .query_one(sql::DISPATCH_BODY, &[])
        .await
        .expect("dispatch_round")
        .get(0);
    exec(c, sql::BEGIN).await;
    if let Some(before) = before {
        exec(c, before).await;
    }
    exec(c, &sql::prepare_dispatch(&body)).await;
    let mut times = Vec::new();
    for _ in 0..7 {
        let rows = c
            .simple_query(&sql::explain_dispatch(limit))
            .await
            .expect("explain");
        for m in rows {
            if let SimpleQueryMessage::Row(r) = m {
                if let Some(t) = r
                    .get(0)
                    .and_then(|l| l.trim().strip_prefix("Execution Time: "))
                {
                    times.push(t.trim_end_matches(" ms").to_string());
                }
            }
        }
    }
    exec(c, sql::ROLLBACK).await;
    exec(c, sql::DEALLOCATE_DISPATCH).await;
    times.sort_by(|a, b| {
        a.parse::<f64>()
            .unwrap_or(0.0)
            .total_cmp(&b.parse().unwrap_or(0.0))
    });
    times
        .get(3)
        .cloned()
        .unwrap_or_else(|| panic!("no execution times: {times:?}"))
}

//! W6: the planner against a fleet. 20,000 pending no-op tasks assigned by one planner to
//! 10 simulated workers of 2,000 slots, then to 2,000 of 10 slots (rows without a process
//! or LISTEN session, which the roster accepts): assignment throughput, rounds, and the
//! cost of the round's read (roster + claim). Target (issue 39): 2,000 workers at least
//! 0.9× the rate of 10. Since V55 most of a drain's rounds claim by the roster a round
//! kept (`artex.claim_head`) and read the roster every 250 ms: the read timed here is
//! the whole one (`artex.dispatch_round`), which the first round makes.
//!
//! Each case lasts about a second, and one pair's ratio moved from 0.95 to 0.76 between
//! two runs of the same code (2026-12-05): the part runs `ARTEX_BENCH_W6_RUNS` pairs (3;
//! 1 with --quick), prints each, and reports the median of the pairs' ratios and, for
//! each fleet, the figures of its case of median rate.

use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::report::{fixed, median, repeats, result};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::{sql, Bench};

/// One case's figures: assignments per second, rounds, and the round's read of 2,000 (ms).
struct Case {
    rate: f64,
    rounds: i64,
    dispatch_ms: String,
}

pub async fn run(bench: &mut Bench) {
    let runs = repeats("ARTEX_BENCH_W6_RUNS", bench.quick);
    let [few, many] = [10u32, 2000];
    let mut cases: [Vec<Case>; 2] = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for i in 1..=runs {
        let a = one(bench, few).await;
        let b = one(bench, many).await;
        let ratio = b.rate / a.rate;
        println!(
            "# W6, pair {i} of {runs}: {} tasks/s to {few} workers, {} to {many} ({})",
            fixed(a.rate, 0),
            fixed(b.rate, 0),
            fixed(ratio, 2),
        );
        ratios.push(ratio);
        cases[0].push(a);
        cases[1].push(b);
    }
    // Each fleet's figures are those of its case of median rate.
    for (fleet, cases) in [few, many].iter().zip(&mut cases) {
        cases.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        let median = &cases[cases.len() / 2];
        bench
            .ceilings
            .throughput(&format!("w6_assign_per_s_{fleet}_workers"), median.rate);
        result(
            &format!("w6_rounds_{fleet}_workers"),
            median.rounds,
            "rounds",
        );
        result(
            &format!("w6_dispatch_2000_ms_{fleet}_workers"),
            &median.dispatch_ms,
            "ms",
        );
    }
    result(
        &format!("w6_{many}_vs_{few}_workers"),
        fixed(median(ratios), 2),
        "ratio",
    );
}

async fn one(bench: &mut Bench, fleet: u32) -> Case {
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
    bench.rig.drop_db(&db, c).await;
    Case {
        rate,
        rounds,
        dispatch_ms,
    }
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

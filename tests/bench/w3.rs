//! W3: claim cost against the backlog. The planner round's read (its roster and claim in
//! one statement, `artex.dispatch_round`'s body) as the runtime sends it, for 500 tasks
//! with one simulated worker of ample capacity on the roster, and the drain rate of 1
//! planner + 2 workers, with 10,000 pending, 1,000,000 pending, and 10,000 pending over
//! 1,000,000 finished; the read again right after the drain, before vacuum has caught up.

use std::time::Duration;

use tokio_postgres::Client;

use crate::report::{fixed, result};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::w6::dispatch_ms;
use crate::{sql, Bench};

pub async fn run(bench: &mut Bench) {
    let (small, big) = if bench.quick {
        (300, 3000)
    } else {
        (10_000, 1_000_000)
    };
    // The first half of the small backlog's completions (so a backlog is left in every
    // case), from the first batch of finishes to the last (start-up excluded).
    let drain = small / 2;
    let mut first: Option<(f64, f64)> = None;
    for backlog in ["small", "big", "finished"] {
        let db = format!("bench_w3_{backlog}");
        let c = bench.rig.new_db(&db).await;
        let label = fill(&c, backlog, small, big).await;
        let claim = claim_ms(&c).await;
        result(&format!("w3_claim_ms_{label}_pending"), &claim, "ms");
        if let Some((small_claim, _)) = first {
            let ratio = fixed(claim.parse::<f64>().unwrap_or(0.0) / small_claim, 2);
            result(
                &format!("w3_claim_ms_{label}_pending_vs_{small}"),
                ratio,
                "ratio",
            );
        }
        let rate = drain_rate(bench, &c, &db, drain).await;
        bench.ceilings.throughput(
            &format!("w3_drain_{drain}_tasks_per_s_{label}_pending"),
            rate,
        );
        let after = claim_ms(&c).await;
        result(
            &format!("w3_claim_ms_{label}_pending_after_drain"),
            &after,
            "ms",
        );
        match first {
            None => first = Some((claim.parse().unwrap_or(0.0), after.parse().unwrap_or(0.0))),
            Some((_, small_after)) => {
                let ratio = fixed(after.parse::<f64>().unwrap_or(0.0) / small_after, 2);
                result(
                    &format!("w3_claim_ms_{label}_pending_after_drain_vs_{small}"),
                    ratio,
                    "ratio",
                );
            }
        }
        bench.rig.drop_db(&db, c).await;
    }
}

/// The backlog `backlog` names in `c`'s database: `small` pending, `big` pending, or
/// `small` pending over `big` finished; its label in the figures' names.
async fn fill(c: &Client, backlog: &str, small: u32, big: u32) -> String {
    match backlog {
        "small" => {
            insert_noops(c, small).await;
            small.to_string()
        }
        "big" => {
            insert_noops(c, big).await;
            big.to_string()
        }
        _ => {
            exec(c, sql::REPLICA_ROLE).await;
            c.execute(sql::W3_FINISHED, &[&(big as i32)])
                .await
                .expect("finished tasks");
            exec(c, sql::REPLICA_ROLE_RESET).await;
            insert_noops(c, small).await;
            format!("{small}_over_{big}_finished")
        }
    }
}

/// The round's read for 500 tasks, a simulated worker on the roster: median of 7 (ms).
async fn claim_ms(c: &Client) -> String {
    dispatch_ms(c, 500, Some(sql::W3_SIM_WORKER)).await
}

/// 1 planner + 2 workers until `drain` tasks succeeded: tasks/s after the first batch.
async fn drain_rate(bench: &mut Bench, c: &Client, db: &str, drain: u32) -> f64 {
    let base: i64 = c
        .query_one(sql::LAST_TRANSITION, &[])
        .await
        .expect("base")
        .get(0);
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(db, 2, "artex", &args);
    let offset = i64::from(drain) - 1;
    bench
        .rig
        .wait_until(
            c,
            sql::W3_DRAINED,
            &[&base, &offset],
            Duration::from_secs(600),
            None,
        )
        .await;
    bench.rig.stop_runtime().await;
    let bad: i64 = c
        .query_one(sql::ENDED_BADLY, &[])
        .await
        .expect("failures")
        .get(0);
    assert_eq!(bad, 0, "{db}: tasks failed");
    c.query_one(sql::W3_DRAIN_RATE, &[&base, &i64::from(drain)])
        .await
        .expect("the drain rate")
        .get(0)
}

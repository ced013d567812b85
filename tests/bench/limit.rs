//! Limit: the minimal queue cycle, claim + done in one transaction (pgbench on a minimal
//! jobs table), 1 job and 100 jobs a transaction: the ceilings every other throughput
//! figure is divided by. 8 clients on 2 threads (the best of 1, 4, 8 and 16 here); the
//! 1-client run gives the latency floor, one durable claim + done.

use tokio::process::Command;

use crate::report::{fixed, result};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_limit";

pub async fn run(bench: &mut Bench) {
    let c = bench.rig.new_db(DB).await;
    let tx = bench.sizes.limit_tx;
    let (tps, _) = pgbench(bench, &c, 1, 8, tx * 10).await;
    let one = fixed(tps, 0);
    result("limit_jobs_per_s_1_per_tx", &one, "jobs/s");
    let (tps, _) = pgbench(bench, &c, 100, 8, tx).await;
    let hundred = fixed(tps * 100.0, 0);
    result("limit_jobs_per_s_100_per_tx", &hundred, "jobs/s");
    let (_, latency_ms) = pgbench(bench, &c, 1, 1, tx * 4).await;
    result("limit_latency_ms_1_client", &latency_ms, "ms");
    // Later ratios divide by the figures as printed, as the bash bench did.
    bench.ceilings.one = one.parse().ok();
    bench.ceilings.hundred = hundred.parse().ok();
    bench.ceilings.floor_ms = latency_ms.parse().ok();
    bench.rig.drop_db(DB, c).await;
}

/// A fresh jobs table, then pgbench's claim script: (tps, average latency in ms as
/// pgbench prints it).
async fn pgbench(
    bench: &Bench,
    c: &tokio_postgres::Client,
    jobs_per_tx: u32,
    clients: u32,
    transactions: u32,
) -> (f64, String) {
    // 10% spare: skip locked may claim short.
    let jobs = (jobs_per_tx * clients * transactions * 11 / 10) as i32;
    for s in sql::LIMIT_TABLE {
        exec(c, s).await;
    }
    c.execute(sql::LIMIT_FILL, &[&jobs])
        .await
        .expect("the jobs");
    exec(c, sql::LIMIT_VACUUM).await;
    exec(c, sql::CHECKPOINT).await;
    let text = pgbench_run(
        bench,
        DB,
        &sql::limit_claim_script(jobs_per_tx),
        clients,
        transactions,
    )
    .await;
    let field = |prefix: &str, at: usize| {
        text.lines()
            .rfind(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(at))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("pgbench printed no '{prefix}': {text}"))
    };
    let tps = field("tps", 2).parse().expect("pgbench's tps");
    (tps, field("latency average", 3))
}

/// pgbench (prepared, `clients` clients on 2 threads, `transactions` each) of `script` on
/// `db`: what it printed.
pub async fn pgbench_run(
    bench: &Bench,
    db: &str,
    script: &str,
    clients: u32,
    transactions: u32,
) -> String {
    let file = bench.rig.tmp.path().join("pgbench.sql");
    std::fs::write(&file, script).expect("pgbench's script");
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-f"])
        .arg(&file)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-t",
            &transactions.to_string(),
        ])
        .arg(bench.rig.url(db))
        .output()
        .await
        .expect("pgbench (postgresql-contrib)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pgbench: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

//! api: submission through `artex serve` against plain SQL. The same no-op tasks
//! submitted through `POST /api/v1/tasks` (examples/api-load.rs: 4 concurrent clients on
//! keep-alive connections) and inserted with plain SQL (pgbench, 4 clients, `insert into
//! artex.tasks (kind, payload)`), one task per request/transaction and 100 per
//! request/transaction, in the same run against the same cluster: tasks/s of each and the
//! API's ratio to SQL (20,000 one a request and 200,000 in batches; `--quick` 400 and
//! 4,000). No planner or worker runs: submission only (a simulated worker row declares
//! the kind, as the API checks).

use tokio::process::Command;

use crate::limit::pgbench_run;
use crate::report::{fixed, result};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_api";
const CLIENTS: u32 = 4;

pub async fn run(bench: &mut Bench) {
    let (single, batched) = if bench.quick {
        (400, 4_000)
    } else {
        (20_000, 200_000)
    };
    let c = bench.rig.new_db(DB).await;
    exec(&c, sql::API_SIM_WORKER).await;
    let token = bench.rig.tmp.path().join("api-token");
    std::fs::write(&token, "bench-write-token").expect("the token");
    let token = token.to_string_lossy().into_owned();
    let (serve, addr) = bench
        .rig
        .serve(DB, &["--write-token-file", token.as_str()])
        .await;
    println!("# API: {CLIENTS} clients; {single} tasks one a request, {batched} in batches of 100; plain SQL the same");
    let api1 = api_load(bench, &addr, &token, single, 1).await;
    let sql1 = sql_insert(bench, 1, single / CLIENTS).await;
    let api100 = api_load(bench, &addr, &token, batched, 100).await;
    let sql100 = sql_insert(bench, 100, batched / 100 / CLIENTS).await;
    drop(serve);
    let n: i64 = c.query_one(sql::TASKS, &[]).await.expect("tasks").get(0);
    let expected = 2 * i64::from(single + batched);
    assert_eq!(n, expected, "{DB}: {n} tasks, expected {expected}");
    result("api_submit_per_s_single", api1, "tasks/s");
    result("api_sql_insert_per_s_single", sql1, "tasks/s");
    result("api_vs_sql_single", fixed(api1 / sql1, 2), "ratio");
    result("api_submit_per_s_batch_100", api100, "tasks/s");
    result("api_sql_insert_per_s_batch_100", sql100, "tasks/s");
    result("api_vs_sql_batch_100", fixed(api100 / sql100, 2), "ratio");
    bench.rig.drop_db(DB, c).await;
}

/// examples/api-load.rs: `tasks` tasks in requests of `batch`: tasks/s, as it prints it.
async fn api_load(bench: &Bench, addr: &str, token: &str, tasks: u32, batch: u32) -> f64 {
    let out = Command::new(bench.rig.bin("api-load"))
        .args([addr, token, "noop"])
        .args([tasks, CLIENTS, batch].map(|n| n.to_string()))
        .output()
        .await
        .expect("api-load");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "api-load: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.split("tasks_per_s=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("api-load printed no tasks_per_s: {text}"))
}

/// pgbench, `CLIENTS` clients inserting `per_tx` tasks a transaction: tasks/s (whole).
async fn sql_insert(bench: &Bench, per_tx: u32, transactions: u32) -> f64 {
    let script = sql::api_insert_script(per_tx);
    let text = pgbench_run(bench, DB, &script, CLIENTS, transactions).await;
    let tps: f64 = text
        .lines()
        .find(|l| l.starts_with("tps"))
        .and_then(|l| l.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or_else(|| panic!("pgbench printed no tps: {text}"));
    (tps * f64::from(per_tx)).round()
}

//! dash: the dashboard's first data with 1,000,000 tasks in the table. The API calls each
//! page makes before it shows anything, against `artex serve` on a database of
//! ARTEX_BENCH_DASH_TASKS tasks (default 1,000,000; `--quick` 20,000) as a busy hour
//! leaves them: 90% succeeded, finished over the last hour, 5% failed, 5% pending
//! (written with the triggers off: the bench needs the rows, not their lives), and a
//! history row for each end, which the overview's recent figures read. Each
//! figure is the median of 7 requests (time to the last byte); a page shows its data when
//! its slowest call has answered (they run in parallel).

use std::time::{Duration, Instant};

use artex_testkit::http::Request;
use tokio_postgres::Client;

use crate::report::{fixed, result};
use crate::rig::exec;
use crate::{sql, Bench};

const DB: &str = "bench_dash";

/// Every request of the dashboard's pages: the figure's name and the path.
pub const PATHS: [(&str, &str); 9] = [
    ("dash_page_ms", "/"),
    // The overview asks for a sample of 20,000 recent tasks; the API's default reads 100,000.
    ("dash_overview_stats_ms", "/api/v1/stats?sample=20000"),
    ("dash_stats_default_sample_ms", "/api/v1/stats"),
    ("dash_events_head_ms", "/api/v1/events/head"),
    ("dash_tasks_ms", "/api/v1/tasks?limit=50"),
    (
        "dash_tasks_failed_ms",
        "/api/v1/tasks?status=failed&limit=50",
    ),
    ("dash_tasks_kind_ms", "/api/v1/tasks?kind=etl&limit=50"),
    ("dash_flows_ms", "/api/v1/flows?limit=100"),
    ("dash_workers_ms", "/api/v1/workers"),
];

pub async fn run(bench: &mut Bench) {
    let n = if bench.quick {
        20_000
    } else {
        std::env::var("ARTEX_BENCH_DASH_TASKS")
            .ok()
            .map(|v| {
                v.parse()
                    .expect("ARTEX_BENCH_DASH_TASKS: a number of tasks")
            })
            .unwrap_or(1_000_000)
    };
    let c = bench.rig.new_db(DB).await;
    fill_busy_hour(&c, n).await;
    let (serve, addr) = bench.rig.serve(DB, &["--public-read"]).await;
    let statuses: String = c
        .query_one(sql::STATUSES, &[])
        .await
        .expect("statuses")
        .get(0);
    println!("# dash: {n} tasks ({statuses}), artex serve");
    // Warm-up: the first connection, the prepared statements.
    median_ms(&addr, "/").await;
    median_ms(&addr, "/api/v1/stats").await;
    for (name, path) in PATHS {
        result(name, median_ms(&addr, path).await, "ms");
    }
    drop(serve);
    bench.rig.drop_db(DB, c).await;
}

/// `n` tasks as a busy hour leaves them (see the module's doc), vacuumed, analyzed and
/// checkpointed.
pub async fn fill_busy_hour(c: &Client, n: u32) {
    exec(c, sql::REPLICA_ROLE).await;
    c.execute(sql::BUSY_HOUR, &[&(n as i32)])
        .await
        .expect("the busy hour");
    exec(c, sql::BUSY_HOUR_HISTORY).await;
    exec(c, sql::REPLICA_ROLE_RESET).await;
    exec(c, sql::VACUUM_ANALYZE_TASKS).await;
    exec(c, sql::CHECKPOINT).await;
}

/// The median of 7 GETs of `path`, ms to the last byte (1 decimal); each must answer 200.
async fn median_ms(addr: &str, path: &str) -> String {
    let (addr, path) = (addr.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || {
        let mut ms: Vec<f64> = (0..7)
            .map(|_| {
                let t0 = Instant::now();
                let r = get(&addr, &path);
                assert_eq!(r.0, 200, "GET {path}: {}", r.1);
                t0.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        fixed(ms[3], 1)
    })
    .await
    .expect("the requests")
}

/// A GET on a connection of its own, read to its end: status (0 when it failed) and
/// body, or what went wrong.
pub fn get(addr: &str, path: &str) -> (u16, String) {
    let sent = Request::get(path)
        .timeout(Duration::from_secs(60))
        .send(addr)
        .and_then(|r| r.complete());
    match sent {
        Ok(r) => (r.status, r.text()),
        Err(e) => (0, e.to_string()),
    }
}

//! W2: latency on an idle system. An idle planner + worker, 20 warm-up tasks, then 300
//! inserted 20 ms apart, each committed on its own: enqueue → handler start, p50/p95/p99.
//! `created_at` is the inserting transaction's start (the server's clock), so a figure
//! includes the insert's own commit, the planner's wake-up and assignment round, the
//! worker's wake-up and its start transaction; the `stamp` kind (examples/artex-bench.rs)
//! returns the time its handler began (same clock). Then its floor, in the same run: a
//! minimal LISTEN/NOTIFY + `for update skip locked` loop (examples/latency-floor.rs) fed
//! the same way; W2 as a multiple of it.

use std::time::Duration;

use tokio::process::Command;
use tokio_postgres::Client;

use crate::report::{fixed, profile_print, profile_reset, result};
use crate::{sql, Bench};

const DB: &str = "bench_w2";

pub async fn run(bench: &mut Bench) {
    let (warm, n) = (bench.sizes.w2_warm, bench.sizes.w2);
    let c = bench.rig.new_db(DB).await;
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(DB, 1, "artex-bench", &args);
    bench
        .rig
        .wait_until(&c, sql::ANY_ONLINE, &[], Duration::from_secs(60), None)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    profile_reset(&c).await;
    feed(&c, sql::INSERT_STAMP, warm, n).await;
    bench
        .rig
        .wait_until(&c, sql::UNFINISHED_NONE, &[], Duration::from_secs(60), None)
        .await;
    bench.rig.stop_runtime().await;
    profile_print(&c, "W2", warm + n).await;
    bench
        .rig
        .check_all_succeeded(&c, DB, (warm + n).into())
        .await;
    let r = c
        .query_one(sql::W2_PERCENTILES, &[])
        .await
        .expect("percentiles");
    let p: [(&str, f64); 3] = [("p50", r.get(0)), ("p95", r.get(1)), ("p99", r.get(2))];
    let (d50, d99): (f64, f64) = (r.get(3), r.get(4));
    for (name, ms) in p {
        result(
            &format!("w2_enqueue_to_handler_ms_{name}"),
            fixed(ms, 2),
            "ms",
        );
        if let Some(floor) = bench.ceilings.floor_ms {
            let ratio = fixed(ms / floor, 1);
            result(
                &format!("w2_enqueue_to_handler_ms_{name}_vs_limit_latency"),
                ratio,
                "ratio",
            );
        }
    }
    let floor = floor(bench, &c, warm, n).await;
    for ((name, ms), floor) in p.iter().zip(floor) {
        let ratio = fixed(ms / floor, 2);
        result(
            &format!("w2_enqueue_to_handler_ms_{name}_vs_floor"),
            ratio,
            "ratio",
        );
    }
    steps(&c, d50, d99).await;
    bench.rig.drop_db(DB, c).await;
}

/// Enqueue → `running` (p50, p99: `d50`, `d99`), and where the median goes.
async fn steps(c: &Client, d50: f64, d99: f64) {
    // The same, up to the start of the worker's `running` transaction only (database clock).
    result("w2_enqueue_to_running_ms_p50", fixed(d50, 2), "ms");
    result("w2_enqueue_to_running_ms_p99", fixed(d99, 2), "ms");
    // Where the median goes.
    let r = c.query_one(sql::W2_STEPS, &[]).await.expect("steps");
    let (a, s, h): (f64, f64, f64) = (r.get(0), r.get(1), r.get(2));
    result("w2_p50_insert_to_assignment_ms", fixed(a, 2), "ms");
    result("w2_p50_assignment_to_start_ms", fixed(s, 2), "ms");
    result("w2_p50_start_to_handler_ms", fixed(h, 2), "ms");
}

/// `warm` warm-up rows, then `n` more, each inserted by `insert` (its one parameter: is
/// it a warm-up) in a transaction of its own, 20 ms apart, from one session.
pub async fn feed(c: &Client, insert: &str, warm: u32, n: u32) {
    let insert = c.prepare(insert).await.expect("the insert");
    for i in 1..=warm + n {
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.execute(&insert, &[&(i <= warm)])
            .await
            .expect("an insert");
    }
}

/// W2's floor: the latency ceiling of any PostgreSQL queue on this box, this run, on
/// W2's database (its tables, not its artex schema). Reports and returns p50, p95, p99.
async fn floor(bench: &mut Bench, c: &Client, warm: u32, n: u32) -> [f64; 3] {
    let bin = bench.rig.bin("latency-floor");
    let url = bench.rig.url(DB);
    let setup = Command::new(&bin)
        .args(["setup", &url])
        .output()
        .await
        .expect("latency-floor");
    assert!(
        setup.status.success(),
        "latency-floor setup: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let log_path = bench.rig.log(&format!("{DB}.floor"));
    let log = std::fs::File::create(&log_path).expect("the floor's log");
    let mut floor = Command::new(&bin)
        .args(["run", &url, &(warm + n).to_string()])
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("latency-floor run");
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    for _ in 0..600 {
        if read_log().lines().any(|l| l == "listening") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        read_log().lines().any(|l| l == "listening"),
        "latency-floor is not listening: {}",
        read_log()
    );
    feed(c, sql::FLOOR_INSERT, warm, n).await;
    let status = floor.wait().await.expect("latency-floor");
    assert!(status.success(), "latency-floor failed: {}", read_log());
    let r = c
        .query_one(sql::FLOOR_PERCENTILES, &[])
        .await
        .expect("the floor's percentiles");
    let p = [r.get(0), r.get(1), r.get(2)];
    for (name, ms) in ["p50", "p95", "p99"].iter().zip(p) {
        result(
            &format!("w2_floor_enqueue_to_start_ms_{name}"),
            fixed(ms, 2),
            "ms",
        );
    }
    p
}

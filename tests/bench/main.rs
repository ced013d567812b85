//! The artex benchmark's workloads (issue 5, moved from bash by issue 34 §5): each part
//! starts from a fresh database cloned from a migrated blackboard on a private durable
//! PostgreSQL cluster, runs release planners and workers as real processes, and prints
//! one `RESULT name=value unit` line per figure (`# …` lines are context) under the names
//! and units the bash bench used, so earlier figures stay comparable.
//!
//! Run by `scripts/bench.sh` (it builds the release binaries, then runs the ignored test
//! `bench` here with `ARTEX_BENCH_*` set). The plain suite runs `statements_prepare`
//! only: every statement of `sql` prepared against the current schema.
//!
//! After each part, `host_steal_pct_<part>` (the share of the machine's CPU time the
//! hypervisor gave other guests meanwhile) and `host_pace_ns_<part>` (the slower of the
//! host's pace before and after it: one core's time for a fixed piece of arithmetic).
//! On this shared host a part ran at half its speed at the same code when the
//! neighbours were busy, with little steal: parts are comparable at equal paces.
//!
//! # Layout
//! - `rig`: the cluster, the copied binaries, the processes, the counters.
//! - `sql`: every statement the bench sends.
//! - `report`: RESULT lines, ratios to the ceilings, the progress line.
//! - `limit`, `w1`, `w1idle`, `w5`, `w2`, `timers`, `w3`, `w4`, `w6`, `history`, `cycle`, `unique`,
//!   `limits`, `fair`, `trace`, `programs`, `api`, `dash`, `replica`, `upload`, `fleet`, `upgrade`: one module per workload,
//!   named as ARTEX_BENCH_ONLY names them; each one's doc says what it measures and the
//!   knobs (`ARTEX_BENCH_W4_TASKS`, `ARTEX_BENCH_FLEET_WORKERS`, …) it reads.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod cycle;
mod dash;
mod fair;
mod fleet;
mod history;
mod limit;
mod limits;
mod programs;
mod replica;
mod report;
mod rig;
mod sql;
mod timers;
mod trace;
mod unique;
mod upgrade;
mod upload;
mod w1;
mod w1idle;
mod w2;
mod w3;
mod w4;
mod w5;
mod w6;

use std::path::PathBuf;

use report::Ceilings;
use rig::Rig;

/// The parts this program runs, in the order it runs them (the bash bench's order, the
/// hot upgrades last).
pub const PARTS: [&str; 22] = [
    "limit", "w1", "w1idle", "w5", "w2", "timers", "w3", "w4", "w6", "history", "cycle", "unique",
    "limits", "fair", "trace", "programs", "api", "dash", "replica", "upload", "fleet", "upgrade",
];

/// Workload sizes: the full run, or `--quick`'s tiny one (CI: every task must succeed,
/// the figures mean nothing).
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub w1: u32,
    pub w2_warm: u32,
    pub w2: u32,
    pub limit_tx: u32,
    /// W1 from idle: how far ahead `run_at` is set, seconds.
    pub w1idle_lead: f64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                w1: 300,
                w2_warm: 5,
                w2: 40,
                limit_tx: 20,
                w1idle_lead: 3.0,
            }
        } else {
            Sizes {
                w1: 20_000,
                w2_warm: 20,
                w2: 300,
                limit_tx: 500,
                w1idle_lead: 8.0,
            }
        }
    }
}

/// One run: the rig, the sizes and flags, and the ceilings once `limit` measured them.
pub struct Bench {
    pub rig: Rig,
    /// `--quick`: tiny sizes.
    pub quick: bool,
    pub sizes: Sizes,
    pub ceilings: Ceilings,
    /// The workers' flags for W1–W4, history and replica (ARTEX_BENCH_WORKER_ARGS).
    pub worker_args: Vec<String>,
    /// The flags of W1 from idle's and W5's workers, at defaults otherwise
    /// (ARTEX_BENCH_DEFAULTS_WORKER_ARGS).
    pub defaults_worker_args: Vec<String>,
}

fn words(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
#[ignore = "the benchmark: run it with scripts/bench.sh"]
async fn bench() {
    let quick = std::env::var("ARTEX_BENCH_QUICK").as_deref() == Ok("1");
    let only = std::env::var("ARTEX_BENCH_ONLY").unwrap_or_else(|_| PARTS.join(","));
    let only: Vec<&str> = only.split(',').map(str::trim).collect();
    if let Some(other) = only.iter().find(|p| !PARTS.contains(p)) {
        panic!("ARTEX_BENCH_ONLY: '{other}' is not a part of this program ({PARTS:?})");
    }
    let bin_dir = std::env::var_os("ARTEX_BENCH_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release"));
    let rig = Rig::start(&bin_dir).await;
    let mut bench = Bench {
        rig,
        quick,
        sizes: Sizes::new(quick),
        ceilings: Ceilings::default(),
        worker_args: words(
            "ARTEX_BENCH_WORKER_ARGS",
            "--concurrency 10 --prefetch 2000",
        ),
        defaults_worker_args: words("ARTEX_BENCH_DEFAULTS_WORKER_ARGS", ""),
    };
    let admin = &bench.rig.admin;
    let version: String = admin
        .query_one(sql::VERSION, &[])
        .await
        .expect("version")
        .get(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "# {} cores, load average at start: {}; {version}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.join(" ")
    );
    let defaults = if bench.defaults_worker_args.is_empty() {
        "no flags".to_string()
    } else {
        bench.defaults_worker_args.join(" ")
    };
    println!(
        "# workers: {}; at defaults (W1 from idle, W5): {defaults}",
        bench.worker_args.join(" ")
    );
    if quick {
        println!("# --quick: tiny sizes; the figures mean nothing");
    }
    for part in PARTS.iter().filter(|p| only.contains(p)) {
        let host = report::Host::now();
        run_part(&mut bench, part).await;
        host.print_since(part);
    }
}

/// Runs one part.
async fn run_part(bench: &mut Bench, part: &str) {
    match part {
        "limit" => limit::run(bench).await,
        "w1" => w1::run(bench).await,
        "w1idle" => w1idle::run(bench).await,
        "w2" => w2::run(bench).await,
        "timers" => timers::run(bench).await,
        "w5" => w5::run(bench).await,
        "w3" => w3::run(bench).await,
        "w6" => w6::run(bench).await,
        "unique" => unique::run(bench).await,
        "limits" => limits::run(bench).await,
        "fair" => fair::run(bench).await,
        "trace" => trace::run(bench).await,
        "w4" => w4::run(bench).await,
        "history" => history::run(bench).await,
        "cycle" => cycle::run(bench).await,
        "programs" => programs::run(bench).await,
        "api" => api::run(bench).await,
        "dash" => dash::run(bench).await,
        "replica" => replica::run(bench).await,
        "upload" => upload::run(bench).await,
        "fleet" => fleet::run(bench).await,
        "upgrade" => upgrade::run(bench).await,
        _ => unreachable!("PARTS names every part"),
    }
}

/// Every statement of the bench prepares against the schema the migrations make, and a
/// keyed batch runs: a migration that breaks the bench fails here, not in the next
/// person's benchmark run (as the keyed batches of the bash bench did, 13 parameters
/// where it sent 11).
#[tokio::test]
async fn statements_prepare() {
    let db = common::TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(sql::BENCH_SCHEMA)
        .await
        .expect("the bench schema");
    for s in sql::LIMIT_TABLE {
        c.batch_execute(s).await.expect(s);
    }
    for s in sql::PREPARED.iter().chain([&sql::LIMIT_FILL]) {
        if let Err(e) = c.prepare(s).await {
            panic!("the bench's statement no longer prepares: {e}\n{s}");
        }
    }
    // The round's read that W3 and W6 take from the function's source.
    let dispatch: String = c
        .query_one(sql::DISPATCH_BODY, &[])
        .await
        .expect("dispatch_round's statement")
        .get(0);
    c.batch_execute(&sql::prepare_dispatch(&dispatch))
        .await
        .unwrap_or_else(|e| panic!("dispatch_round's statement no longer prepares: {e}"));
    // The keyed batch is the operator handle's statement, its parameters the bench's:
    // one batch for real, new and again.
    let mut c = c;
    unique::keyed_batches(&mut c, 1).await;
    unique::keyed_batches(&mut c, 1).await;
    let tasks: i64 = c.query_one(sql::TASKS, &[]).await.expect("tasks").get(0);
    assert_eq!(
        tasks, 100,
        "a keyed batch, sent twice, writes its 100 tasks once"
    );
}

//! programs: the cost of a task whose kind is a program (issue 35, docs/programs.md).
//! 10,000 tasks of a trivial program (`exit 0` in sh) through 1 planner and 1 worker
//! (`--concurrency 10`, the programs' folder as `--tasks-dir`), inserted by plain SQL
//! while the worker idles; side by side, the same program 10,000 times through
//! `xargs -P 10`, before and after (their mean): the bare process-spawn rate of this
//! host, the physical limit. Also the
//! worker's, the planner's and PostgreSQL's CPU per task (what artex spends besides the
//! program; PostgreSQL's counts the insert) and the memory each running
//! program costs the worker (its RSS with 10 programs running, over that idle, per
//! program; the program's own memory not counted).

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::report::{fixed, profile_print, profile_reset, result, Progress};
use crate::rig::{cpu_s, proc_kb, run_rate};
use crate::{sql, Bench};

const DB: &str = "bench_programs";
/// Tasks in the full run (the quick run: 200).
const TASKS: u32 = 10_000;
/// Programs running at once, here and for xargs.
const CONCURRENCY: u32 = 10;

pub async fn run(bench: &mut Bench) {
    let n = if bench.quick { 200 } else { TASKS };
    let dir = bench.rig.dir("programs");
    std::fs::create_dir_all(&dir).expect("the programs' folder");
    for (name, text) in [
        ("true.sh", "#!/bin/sh\nexit 0\n"),
        ("hold.sh", "#!/bin/sh\nexec sleep 3\n"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("a program");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let before = xargs_rate(&dir, n);
    let c = bench.rig.new_db(DB).await;
    let args: Vec<String> = [
        "--concurrency",
        &CONCURRENCY.to_string(),
        "--tasks-dir",
        dir.to_str().expect("a UTF-8 path"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    bench.rig.start_runtime_online(&c, DB, 1, &args).await;
    // The planner, then the worker.
    let (planner, worker) = (bench.rig.pids()[0], bench.rig.pids()[1]);

    // The run.
    profile_reset(&c).await;
    let (cpu0, pg0, pl0) = (cpu_s(worker), bench.rig.pg_cpu_s(), cpu_s(planner));
    c.execute(sql::INSERT_PROGRAM_TASKS, &[&"true", &(n as i32)])
        .await
        .expect("the tasks");
    let mut progress = Progress::new("programs", n.into());
    bench.rig.drained(&c, &mut progress).await;
    let (cpu1, pg1, pl1) = (cpu_s(worker), bench.rig.pg_cpu_s(), cpu_s(planner));
    profile_print(&c, "programs", n).await;
    bench.rig.check_all_succeeded(&c, DB, n.into()).await;
    let rate = run_rate(&c, n).await;

    // The memory each running program costs the worker.
    let idle_kb = proc_kb(worker, "status", "VmRSS");
    c.execute(sql::INSERT_PROGRAM_TASKS, &[&"hold", &(CONCURRENCY as i32)])
        .await
        .expect("the holding tasks");
    let minute = Duration::from_secs(60);
    let running = [&(i64::from(CONCURRENCY)) as &(dyn tokio_postgres::types::ToSql + Sync)];
    bench
        .rig
        .wait_until(&c, sql::RUNNING_AT_LEAST, &running, minute, None)
        .await;
    let busy_kb = proc_kb(worker, "status", "VmRSS");
    let mut progress = Progress::new("programs (holding)", (n + CONCURRENCY).into());
    bench.rig.drained(&c, &mut progress).await;
    bench.rig.stop_runtime().await;

    // The same program through xargs, side by side: before and after the run (the
    // host's speed drifts), their mean the bare rate.
    let after = xargs_rate(&dir, n);
    let bare = (before + after) / 2.0;

    println!("# programs: {n} tasks of `exit 0` in sh, 1 worker, --concurrency {CONCURRENCY}");
    result("programs_tasks_per_s", fixed(rate, 0), "tasks/s");
    result("programs_xargs_per_s", fixed(bare, 0), "runs/s");
    println!("# programs: xargs {before:.0} runs/s before the run, {after:.0} after");
    result("programs_vs_xargs", fixed(rate / bare, 2), "ratio");
    result(
        "programs_spawn_ms_per_task_xargs",
        fixed(1000.0 * f64::from(CONCURRENCY) / bare, 2),
        "ms",
    );
    result(
        "programs_worker_cpu_us_per_task",
        fixed((cpu1 - cpu0) * 1e6 / f64::from(n), 0),
        "us",
    );
    result(
        "programs_postgres_cpu_us_per_task",
        fixed((pg1 - pg0) * 1e6 / f64::from(n), 0),
        "us",
    );
    result(
        "programs_planner_cpu_us_per_task",
        fixed((pl1 - pl0) * 1e6 / f64::from(n), 0),
        "us",
    );
    result(
        "programs_worker_kb_per_running_program",
        busy_kb.saturating_sub(idle_kb) / u64::from(CONCURRENCY),
        "kB",
    );
    bench.rig.drop_db(DB, c).await;
}

/// Runs of `DIR/true.sh` per second through `xargs -P CONCURRENCY`, `n` of them.
fn xargs_rate(dir: &std::path::Path, n: u32) -> f64 {
    let t0 = Instant::now();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "seq {n} | xargs -P {CONCURRENCY} -n 1 {}",
            dir.join("true.sh").display()
        ))
        .status()
        .expect("xargs");
    assert!(status.success(), "programs: xargs failed: {status}");
    f64::from(n) / t0.elapsed().as_secs_f64()
}

//! timers: how late what is due at a time starts, on an idle planner and worker
//! (`artex-bench`). Three sets, each `n` (30; 5 with `--quick`):
//! - a flow of `for` timers of 1,500 ms + 173 ms × i, reached at its submission: each
//!   wait's end after its `due_at` (ended by the planner's Scheduler);
//! - a flow of `noop` tasks, each followed by a `for` timer of 300 ms, reached when its
//!   task succeeds (sooner than the Scheduler's next pass of every second): the same;
//! - `stamp` tasks inserted due in an hour, each then moved by plain SQL to 1 s + 37 ms × i
//!   ahead, 300 ms apart (an `update … set run_at`, as the Reaper's rescue after its
//!   backoff): each start (`running`) after its `run_at`.
//!
//! p50 and max of each, in ms, on the database's clock.

use std::time::Duration;

use artex_actors::blackboard::FlowSpec;
use artex_actors::Blackboard;
use serde_json::json;

use crate::report::{fixed, result};
use crate::{sql, Bench};

const DB: &str = "bench_timers";

pub async fn run(bench: &mut Bench) {
    let n: u32 = if bench.quick { 5 } else { 30 };
    let c = bench.rig.new_db(DB).await;
    let args = bench.defaults_worker_args.clone();
    bench.rig.start_runtime(DB, 1, "artex-bench", &args);
    let minute = Duration::from_secs(60);
    bench
        .rig
        .wait_until(&c, sql::ANY_ONLINE, &[], minute, None)
        .await;
    let bb = Blackboard::connect(&bench.rig.url(DB), 1).expect("a pool on the bench database");
    let timers = (0..n).map(
        |i| json!({"name": format!("t{i}"), "wait": {"for": format!("{}ms", 1500 + 173 * i)}}),
    );
    let flow = submit_flow(&bb, "timers", timers.collect()).await;
    let short = (0..n).flat_map(|i| {
        [
            json!({"name": format!("n{i}"), "kind": "noop"}),
            json!({"name": format!("w{i}"), "wait": {"for": "300ms"},
                   "depends_on": [format!("n{i}")]}),
        ]
    });
    let short = submit_flow(&bb, "short", short.collect()).await;
    // Its pool's connection would hold the database open at its drop.
    drop(bb);
    for i in 0..n {
        let id: uuid::Uuid = c
            .query_one(sql::INSERT_STAMP_IN_AN_HOUR, &[])
            .await
            .expect("a task due in an hour")
            .get(0);
        let ahead_ms = 1000.0 + 37.0 * f64::from(i);
        c.execute(sql::MOVE_RUN_AT, &[&id, &ahead_ms])
            .await
            .expect("moving its run_at");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for done in [sql::WAITS_ENDED, sql::UNFINISHED_NONE] {
        bench.rig.wait_until(&c, done, &[], minute, None).await;
    }
    bench.rig.stop_runtime().await;
    println!(
        "# timers: {n} flow timers, {n} of 300 ms after a task, {n} tasks moved by SQL; \
         1 planner + 1 worker"
    );
    for (name, r) in [
        (
            "timers_wait_end_after_due_ms",
            c.query_one(sql::TIMERS_LATE, &[&flow]).await,
        ),
        (
            "timers_short_wait_end_after_due_ms",
            c.query_one(sql::TIMERS_LATE, &[&short]).await,
        ),
        (
            "timers_moved_start_after_run_at_ms",
            c.query_one(sql::MOVED_LATE, &[]).await,
        ),
    ] {
        let r = r.expect(name);
        let (count, p50, max): (i64, f64, f64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(count, i64::from(n), "{name}: {count} of {n} measured");
        result(&format!("{name}_p50"), fixed(p50, 1), "ms");
        result(&format!("{name}_max"), fixed(max, 1), "ms");
    }
    bench.rig.drop_db(DB, c).await;
}

/// Submits a flow of `tasks` named `name`; its id.
async fn submit_flow(bb: &Blackboard, name: &str, tasks: Vec<serde_json::Value>) -> uuid::Uuid {
    let spec: FlowSpec = serde_json::from_value(json!({"name": name, "tasks": tasks}))
        .unwrap_or_else(|e| panic!("the {name} flow: {e}"));
    bb.operator()
        .submit_flow(&spec, "bench")
        .await
        .unwrap_or_else(|e| panic!("submitting the {name} flow: {e}"))
}

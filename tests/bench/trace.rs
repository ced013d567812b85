//! trace: what OpenTelemetry tracing costs (issue 37, item 1; docs/tracing.md). W1 from
//! idle twice in one run: 20,000 no-op tasks, each with a trace context of its own
//! (inserted with plain SQL, `run_at` 8 s ahead), through 1 planner + 2 workers at
//! default flags, first with tracing off, then with tracing on and every task sampled
//! (`OTEL_TRACES_SAMPLER=always_on`) exporting to a sink: an OTLP/HTTP receiver in this
//! process that reads each export and answers 200. Tracing on, each task's life is three
//! spans (queue, assignment, attempt) and the planner's and the worker's reads of the
//! contexts. Three pairs of runs, off then on; figures: the median tasks/s off and on,
//! their ratio (target ≥ 0.9: at most 10% less), each pair's, and the spans the sink
//! received. `ARTEX_BENCH_TRACE_TASKS=N` runs N tasks each time
//! instead of W1's 20,000: a burst of a second moves with whatever else the two cores do
//! in it, a longer one less.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::report::{fixed, median, result, Progress};
use crate::rig::{exec, run_rate};
use crate::{sql, Bench};

pub async fn run(bench: &mut Bench) {
    let (sink, received) = sink();
    let on_env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.as_str()),
        ("OTEL_TRACES_SAMPLER", "always_on"),
    ];
    // Off and on alternate, ROUNDS pairs: a pair's ratio moves by ±15% with what else the
    // two cores do during its bursts; the medians of several move less.
    let rounds = if bench.quick { 1 } else { ROUNDS };
    let (mut offs, mut ons) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        offs.push(w1idle(bench, "bench_trace_off", &[]).await);
        ons.push(w1idle(bench, "bench_trace_on", &on_env).await);
    }
    let pairs: Vec<String> = offs
        .iter()
        .zip(&ons)
        .map(|(off, on)| format!("{:.0}/{:.0} ({:.3})", off, on, on / off))
        .collect();
    println!("# trace: off/on by round: {}", pairs.join(", "));
    let (off, on) = (median(offs), median(ons));
    result("trace_w1idle_tasks_per_s_off", fixed(off, 0), "tasks/s");
    result("trace_w1idle_tasks_per_s_on", fixed(on, 0), "tasks/s");
    result("trace_w1idle_on_vs_off", fixed(on / off, 3), "x");
    println!(
        "# trace: the sink received {} exports ({} bytes)",
        received.0.load(Ordering::Relaxed),
        received.1.load(Ordering::Relaxed)
    );
}

/// Pairs of runs, off then on.
const ROUNDS: usize = 3;

/// W1 from idle with traced tasks and `env` for the planner and workers: tasks/s from
/// the first start to the last finish.
async fn w1idle(bench: &mut Bench, db: &str, env: &[(&str, &str)]) -> f64 {
    let n = match std::env::var("ARTEX_BENCH_TRACE_TASKS") {
        Ok(v) => v
            .parse::<u32>()
            .unwrap_or_else(|e| panic!("ARTEX_BENCH_TRACE_TASKS={v}: {e}")),
        Err(_) => bench.sizes.w1,
    };
    let c = bench.rig.new_db(db).await;
    let args = bench.defaults_worker_args.clone();
    bench.rig.start_runtime_env(db, 2, "artex", &args, env);
    let online = 2i64;
    bench
        .rig
        .wait_until(
            &c,
            sql::ONLINE,
            &[&online],
            std::time::Duration::from_secs(60),
            None,
        )
        .await;
    exec(&c, sql::CHECKPOINT).await;
    let lead = bench.sizes.w1idle_lead;
    c.execute(sql::INSERT_TRACED_NOOPS_AT, &[&(n as i32), &lead])
        .await
        .expect("the insert");
    let in_time: bool = c
        .query_one(sql::W1IDLE_WITHIN_LEAD, &[])
        .await
        .expect("lead")
        .get(0);
    assert!(
        in_time,
        "trace: the insert took longer than the {lead} s lead"
    );
    let label = if env.is_empty() { "off" } else { "on" };
    let mut progress = Progress::new(&format!("trace: W1 from idle, tracing {label}"), n.into());
    bench.rig.drained(&c, &mut progress).await;
    bench.rig.stop_runtime().await;
    bench.rig.check_all_succeeded(&c, db, n.into()).await;
    let rate = run_rate(&c, n).await;
    bench.rig.drop_db(db, c).await;
    rate
}

/// An OTLP/HTTP sink on 127.0.0.1: reads each request and answers 200, keeping only
/// the count of exports and bytes. Its URL, and the counts.
fn sink() -> (String, Arc<(AtomicU64, AtomicU64)>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the sink");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let counts: Arc<(AtomicU64, AtomicU64)> = Arc::default();
    let kept = counts.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let Ok(mut out) = stream.try_clone() else {
                    return;
                };
                let mut r = BufReader::new(stream);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    kept.0.fetch_add(1, Ordering::Relaxed);
                    kept.1.fetch_add(length as u64, Ordering::Relaxed);
                    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if out.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, counts)
}

#!/usr/bin/env bash
# The artex benchmark (issue 5). Builds release, starts a private durable PostgreSQL
# cluster (fsync and synchronous_commit on: the defaults), runs the workloads and prints
# one `RESULT name=value unit` line per figure; `# …` lines are context. While a long
# workload runs, a progress line on stderr says how many tasks are done and at what rate.
#
#   limit    pgbench's minimal claim + done: the ceilings the throughputs are divided by
#   w1       20,000 no-op tasks in bulk through 1 planner + 1 worker, then 2 workers
#   w1idle   the same 20,000 made runnable at one instant while 1 planner + 2 workers
#            idle; medians of 3 such bursts (ARTEX_BENCH_W1IDLE_RUNS)
#   w5       10 bursts of 20,000 after idle gaps
#   w2       enqueue → handler start on an idle runtime, and its floor in the same run
#   w3       the planner round's read and the drain rate against backlogs up to 1,000,000
#   w4       the soak: 1,000,000 tasks through 1 planner + 2 workers (~5 min)
#   w6       one planner assigning 20,000 tasks to 10, then 2,000 simulated workers;
#            medians of 3 such pairs (ARTEX_BENCH_W6_RUNS)
#   history  history rows and WAL per finished task, by table (pg_waldump)
#   cycle    the two hot functions alone by plain SQL: WAL and PostgreSQL CPU per task
#   unique   what a unique key costs a submission
#   limits   W1 from idle with limit keys, with kind limits, with tags
#   fair     a key's wait behind another key's backlog of 20,000, fair (tasks of one length and spread) and not (~2 min)
#   trace    W1 from idle without and with OpenTelemetry tracing (every task sampled)
#   programs 10,000 tasks of a trivial program (--tasks-dir) against xargs -P 10
#   api      submission through `artex serve` against plain SQL inserts
#   dash     the dashboard's first data with 1,000,000 tasks in the table
#   replica  W1 while a dashboard reads a streaming standby, or the primary
#   upload   a 1 GiB file: artex upload against curl -T, peak RSS, over a 1 Gbit/s link
#   fleet    500 real workers through pgbouncer against 10 connected directly
#   upgrade  5 hot upgrades of a worker under HTTP and task load
# Each part's full description, and the knobs of single parts (ARTEX_BENCH_W4_TASKS,
# ARTEX_BENCH_FLEET_WORKERS, …), are in its module's doc: tests/bench/<part>.rs.
#
# Usage: scripts/bench.sh [--quick]   (--quick: a tiny run of everything, for CI; checks
# that every task succeeded with its audit trail, asserts no speed.)
# ARTEX_BENCH_ONLY=w1,w2 runs only those parts (ratios to the ceilings need `limit`);
# ARTEX_BENCH_WORKER_ARGS replaces the workers' `--concurrency 10 --prefetch 2000` of
# W1–W4, history and replica; ARTEX_BENCH_DEFAULTS_WORKER_ARGS gives flags to W1 from
# idle's and W5's workers (at defaults otherwise);
# ARTEX_BENCH_PG_SETTINGS="shared_buffers=1GB max_wal_size=8GB"
# tries server settings; ARTEX_BENCH_DROP_INDEXES="tasks_listed tasks_kind_id" runs
# without those indexes, ARTEX_BENCH_DROP_TRIGGERS="tasks_held_after_update" without
# those triggers on artex.tasks (experiments: what they keep is then not kept);
# ARTEX_BENCH_PROFILE=1 also prints the statements that cost the time
# (pg_stat_statements) in W1 with 2 workers, W1 from idle, W2 and the idle fleet, and
# W1 from idle's PostgreSQL CPU by process and its statements running at once;
# ARTEX_BENCH_STATS_FLUSH=1 has autovacuum's pass for W1 from idle's insert run in its
# lead rather than in its burst (an experiment).
#
# The workloads are Rust: tests/bench, the ignored test `bench`, run here on one cluster
# of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
    '') ;;
    --quick) quick=1 ;;
    # The header: the comment lines after the shebang.
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "scripts/bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
all=limit,w1,w1idle,w5,w2,w3,w4,w6,history,cycle,unique,limits,fair,trace,programs,api,dash,replica,upload,fleet,upgrade
parts=()
IFS=, read -r -a asked <<<"${ARTEX_BENCH_ONLY:-$all}"
for part in "${asked[@]}"; do
    part=${part// /}
    [ -n "$part" ] || continue
    if [[ ",$all," != *",$part,"* ]]; then
        echo "scripts/bench.sh: ARTEX_BENCH_ONLY names '$part', not one of $all" >&2
        exit 2
    fi
    parts+=("$part")
done
[ ${#parts[@]} -gt 0 ] || { echo "scripts/bench.sh: ARTEX_BENCH_ONLY names no part" >&2; exit 2; }

cargo build --release --bin artex --example artex-bench --example latency-floor \
    --example api-load --example upload-sink
# The test binary, run directly: its output streams as it comes.
exe=$(cargo test --test bench --no-run 2>&1 | sed -nE 's/.*Executable tests\/bench\/main.rs \((.*)\)$/\1/p')
[ -x "$exe" ] || { echo "scripts/bench.sh: could not build tests/bench" >&2; exit 1; }
ARTEX_BENCH_ONLY=$(IFS=,; echo "${parts[*]}") ARTEX_BENCH_QUICK=$quick \
    ARTEX_BENCH_BIN_DIR="${CARGO_TARGET_DIR:-target}/release" \
    "$exe" --ignored --exact bench --nocapture --test-threads 1 \
    | sed -u -E 's/^test bench \.\.\. //; /^(running [0-9]+ tests?|ok|test result: .*|)$/d'
echo "# done"

#!/usr/bin/env bash
# The parts of the artex benchmark not yet moved to Rust (tests/bench, issue 34 §5):
# scripts/bench.sh runs this script for them, with ARTEX_BENCH_ONLY naming only those
# and the ceilings of a `limit` run it made in Rust passed on in ARTEX_BENCH_CEILING_1,
# ARTEX_BENCH_CEILING_100 and ARTEX_BENCH_FLOOR_MS. A part moved to Rust leaves this file.
#
# The artex benchmark (issue 5). Builds release, starts a private durable PostgreSQL
# cluster (fsync and synchronous_commit on: the defaults), runs the workloads below and
# prints one `RESULT name=value unit` line per figure; `# …` lines are context.
#
#   Limit  pgbench, a minimal jobs table, claim + done in one transaction: 1 job and 100
#          jobs per transaction. The ceiling every other figure is divided by.
#   W1     20,000 no-op tasks inserted in bulk, then 1 planner + 1 worker (concurrency 10,
#          local queue 2,000) drain them; again with 2 workers. Time from process start to
#          the last finish.
#   W1 from idle  the same 20,000 no-op tasks, made runnable at one instant while the
#          runtime idles, as users submit them: inserted with plain SQL (the column default
#          id) with `run_at` 8 s ahead while 1 planner + 2 workers at default flags (no
#          --prefetch: the queue sizes itself) sit idle. Tasks/s from the first start to
#          the last finish; WAL bytes and PostgreSQL CPU per task, of the insert and of
#          the run.
#   W5     bursts: 10 bursts of 20,000 no-op tasks inserted (plain SQL) into 1 planner +
#          2 workers at default flags, each 5 s after the previous one finished (an idle
#          gap however fast the box is): each burst's tasks/s (first start to last finish)
#          and its first task's start after the idle gap (from the end of its insert).
#   W2     idle planner + worker, 20 warm-up tasks, then 300 inserted 20 ms apart:
#          enqueue → handler start, p50/p95/p99.
#          Then its floor, in the same run: a minimal LISTEN/NOTIFY + `for update skip
#          locked` loop (examples/latency-floor.rs) fed the same way; W2 as a ratio to it.
#   W3     claim cost (EXPLAIN ANALYZE of the planner round's read: roster + claim) and
#          drain rate with 10,000 pending, 1,000,000 pending, and 10,000 pending over 1,000,000 finished.
#   W4     ARTEX_BENCH_W4_TASKS tasks (default 1,000,000; ~5 min on an idle 2-core box)
#          through 1 planner + 2 workers: tasks/s per tenth of the run, table size and
#          dead tuples at the end, peak RSS of planner and workers.
#   W6     the planner against a fleet: 20,000 pending no-op tasks assigned by one planner
#          to 10 simulated workers of 2,000 slots, then to 2,000 of 10 slots (rows without
#          a process or LISTEN session, which the roster accepts): assignment throughput,
#          rounds, and the cost of the round's read (roster + claim). Target: 2,000
#          workers at least half the rate of 10.
#   fleet  ARTEX_BENCH_FLEET_WORKERS (default 500) real workers and 2 planners through a
#          real pgbouncer in transaction mode (pool of 40): RSS per idle worker, what the idle
#          fleet costs PostgreSQL per worker, W1 from idle with the backends sampled
#          throughout, W2; against 10 workers connected directly (issue 22).
#   unique what a unique key costs a submission: 20,000 tasks in batches of 100 without
#          keys (one insert a batch), with distinct keys (each through `artex.submit`, the
#          SQL path), and the same keys again (all duplicates); then keyed batches as the
#          API and the library send them (the keys' locks, one set-based statement), new and
#          again: tasks/s and WAL bytes per task.
#   limits W1 from idle with a limit key on each task (1,000 keys) and no limits, then
#          with the kind limited per key and overall (room enough not to bind), then with
#          two tags per task: tasks/s and WAL bytes per task (insert, run) of each.
#   api    submission through the HTTP API (`artex serve`, `POST /api/v1/tasks`, 4
#          clients) one task a request and 100 a request, against plain SQL inserts of the
#          same tasks in the same run: tasks/s and the API's ratio to SQL.
#   replica  W1 (20,000 tasks, 1 planner + 2 workers) on a database of 1,000,000 finished
#          tasks while a dashboard's requests (the `dash` part's, in a loop) go to
#          `artex serve --read-database-url` on a streaming standby of this cluster, then
#          to one on the primary; each as a ratio to W1 with no dashboard load.
#
# Usage: scripts/bench.sh [--quick]   (--quick: a tiny run of everything, for CI; checks
# that every task succeeded with its audit trail, asserts no speed.)
# ARTEX_BENCH_ONLY=w1,w2 runs only those parts (of limit, w1, w1idle, w2, w3, w4, w5, w6, history, unique, limits, api, dash, replica, upload, fleet;
# ratios to the ceiling need `limit`); ARTEX_BENCH_WORKER_ARGS replaces the workers'
# `--concurrency 10 --prefetch 2000` of W1–W4 (e.g. to compare prefetch depths), and
# ARTEX_BENCH_DEFAULTS_WORKER_ARGS gives flags to W1 from idle's and W5's workers,
# which run at defaults otherwise.
# ARTEX_BENCH_PG_SETTINGS="shared_buffers=1GB max_wal_size=8GB" tries server settings.
# ARTEX_BENCH_DROP_INDEXES="tasks_listed tasks_kind_id" runs without those indexes.
# ARTEX_BENCH_PROFILE=1 also loads pg_stat_statements and prints, for W1 with 2 workers,
# W1 from idle and W2, the statements that cost the time (it slows PostgreSQL down a
# little).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false
[ "${1:-}" = --quick ] && quick=true
if $quick; then
    w1=300 w2_warm=5 w2=40 w3_small=300 w3_big=3000 w4=${ARTEX_BENCH_W4_TASKS:-5000}
    limit_tx=20 w1idle_lead=3 w5_bursts=3 w5=300 w5_gap=2
else
    w1=20000 w2_warm=20 w2=300 w3_small=10000 w3_big=1000000 w4=${ARTEX_BENCH_W4_TASKS:-1000000}
    limit_tx=500 w1idle_lead=8 w5_bursts=10 w5=20000 w5_gap=5
fi
profile=${ARTEX_BENCH_PROFILE:-0}
only=",${ARTEX_BENCH_ONLY:-limit,w1,w1idle,w2,w3,w4,w5,w6,history,unique,limits,api,dash,replica,upload,fleet},"
want() { [[ $only == *",$1,"* ]]; }
read -r -a worker_args <<<"${ARTEX_BENCH_WORKER_ARGS:---concurrency 10 --prefetch 2000}"
read -r -a defaults_worker_args <<<"${ARTEX_BENCH_DEFAULTS_WORKER_ARGS:-}"

db_url() { echo "${url/\/artex\?//$1?}"; }
sql() { PGOPTIONS='-c client_min_messages=warning' psql "$(db_url "$1")" -XAtq -v ON_ERROR_STOP=1 "${@:2}"; }
die() { echo "FAIL: $*" >&2; exit 1; }
result() { echo "RESULT $1=$2 $3"; }
calc() { awk "BEGIN { printf \"%.${2:-0}f\", $1 }"; }

new_db() { sql postgres -c "drop database if exists $1" -c "create database $1 template artex"; }
drop_db() { sql postgres -c "drop database $1"; }
insert_tasks() { # db count kind: in one statement per 100,000
    local left=$2
    while [ "$left" -gt 0 ]; do
        local n=$((left < 100000 ? left : 100000))
        sql "$1" -c "insert into artex.tasks (id, kind) select bench.uuid7(), '$3' from generate_series(1, $n)"
        left=$((left - n))
    done
    sql "$1" -c "vacuum analyze" -c checkpoint
}

# 1 planner + N workers (concurrency 10, a local queue of 2,000, other settings default,
# unless ARTEX_BENCH_WORKER_ARGS says otherwise) on database $1.
start_runtime() { # db workers [worker binary]
    local u; u=$(db_url "$1")
    ARTEX_DATABASE_URL=$u "$artex" planner >>"$tmp/log/$1.planner" 2>&1 &
    procs+=($!)
    for i in $(seq "$2"); do
        ARTEX_DATABASE_URL=$u "${3:-$artex}" worker "${worker_args[@]}" >>"$tmp/log/$1.worker$i" 2>&1 &
        procs+=($!)
    done
}
# The same with the workers at default flags (W1 from idle, W5).
start_runtime_at_defaults() { # db workers
    local worker_args=("${defaults_worker_args[@]}")
    start_runtime "$@"
}
stop_runtime() {
    [ ${#procs[@]} -eq 0 ] && return 0
    kill -TERM "${procs[@]}" 2>/dev/null || true
    wait "${procs[@]}" 2>/dev/null || true
    procs=()
}
# `artex serve` on database $1 (further flags after it), on a free loopback port: its
# address in $serve_addr, once its log says where it listens.
serve_api() {
    ARTEX_DATABASE_URL=$(db_url "$1") "$artex" serve --http 127.0.0.1:0 "${@:2}" \
        >>"$tmp/log/$1.serve" 2>&1 &
    procs+=($!)
    serve_addr=''
    for _ in $(seq 200); do
        serve_addr=$(sed -nE 's|.*the HTTP API on http://([0-9.:]+)/api/v1.*|\1|p' "$tmp/log/$1.serve" | head -n 1)
        [ -n "$serve_addr" ] && return 0
        sleep 0.05
    done
    die "artex serve did not say where it listens"
}
# Waits until no session is connected to database $1 (its backends have exited and been
# reaped, so their CPU time is in the postmaster's and their statistics are flushed).
wait_idle() {
    for _ in $(seq 200); do
        [ "$(sql postgres -c "select count(*) from pg_stat_activity where datname = '$1'")" = 0 ] && return 0
        sleep 0.05
    done
    die "sessions still connected to $1"
}
# Peak RSS (kB) and CPU seconds of one process, read before it is stopped.
hwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
# CPU seconds of the whole PostgreSQL cluster so far: the postmaster, its exited children
# (reaped into its cutime/cstime) and its live ones.
pg_cpu_s() {
    local pm; pm=$(head -n 1 "$tmp/db/pg/postmaster.pid")
    { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat"
      for c in $(pgrep -P "$pm"); do awk '{ print $14 + $15 }' "/proc/$c/stat" 2>/dev/null || true; done
    } | awk -v hz="$(getconf CLK_TCK)" '{ s += $1 } END { print s / hz }'
}
# Transactions committed in database $1, WAL bytes written and WAL flushes so far (read
# from another database, so that reading them adds nothing to $1).
counters() {
    sql postgres -F' ' -c "select xact_commit, pg_current_wal_lsn() - '0/0', (select wal_sync from pg_stat_wal)
        from pg_stat_database where datname = '$1'"
}
# Blocks until the SQL condition holds, polling every 50 ms in one session that commits
# between polls: a session holding one snapshot keeps every dead index entry of the task
# table alive, and the runtime's claims slow down a hundredfold within a minute.
wait_until() { # db condition timeout_s
    local deadline; deadline=$(calc "$(date +%s) + $3")
    sql "$1" -c "do \$\$ begin loop
        exit when $2;
        if clock_timestamp() > to_timestamp($deadline) then
            raise exception 'timed out after $3 s waiting for: %', \$c\$$2\$c\$;
        end if;
        perform pg_sleep(0.05); commit;
    end loop; end \$\$" &
    wait $! # in the background, so that a signal stops the script at once
}
# Through the indexes (the runnable and the held set): the wait's polls cost the run nothing.
unfinished="not exists (select 1 from artex.tasks where listed = 'pending')
    and not exists (select 1 from artex.tasks where assigned_to is not null)"
# Every task succeeded, with exactly its three history rows: new → pending, assigned →
# running (the assignment has no row of its own when a start follows), running →
# succeeded.
check_all_succeeded() { # db count
    local ok; ok=$(sql "$1" -c "select
        (select count(*) from artex.tasks) = $2
        and (select count(*) from artex.tasks where status = 'succeeded') = $2
        and (select count(*) from (select task_id from artex.task_transitions group by 1
             having string_agg(coalesce(from_status::text, 'new') || '>' || to_status, ','
                               order by id)
                    = 'new>pending,assigned>running,running>succeeded') t) = $2")
    [ "$ok" = t ] || die "$1: not all $2 tasks succeeded with their audit trail: $(sql "$1" \
        -c "select string_agg(status || ' ' || n, ', ') from (select status, count(*) n from artex.tasks group by 1) s")"
}

cargo build --release --bin artex --example artex-bench --example latency-floor
tmp=$(mktemp -d "${TMPDIR:-/tmp}/artex-bench.XXXXXX")
chmod 0755 "$tmp" # as root, the server runs as postgres and must reach its folder
mkdir "$tmp/log"
# Copies, so that a rebuild by someone else during the run changes nothing.
rel=${CARGO_TARGET_DIR:-target}/release
cp "$rel/artex" "$rel/examples/artex-bench" "$rel/examples/latency-floor" "$tmp/"
artex="$tmp/artex"
procs=()
keep_procs=() # started once for a whole part (the replica part's `artex serve`s)
standby=''    # the replica part's standby's PGDATA, while it runs
cleanup() {
    local rc=$?
    procs+=("${keep_procs[@]}")
    stop_runtime
    if declare -F stop_bouncer >/dev/null; then stop_bouncer; fi
    if [ -n "$standby" ]; then as_pg "$pgbin/pg_ctl" stop -m immediate -D "$standby" >/dev/null 2>&1 || true; fi
    if [ -n "${link_ns:-}" ]; then ip netns del "$link_ns" 2>/dev/null || true; fi
    "$artex" db stop --data-dir "$tmp/db" >/dev/null 2>&1 || true
    if [ "$rc" -ne 0 ]; then
        echo "bench failed; last lines of the logs:" >&2
        tail -n 5 "$tmp"/log/* >&2 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

url=$("$artex" db start --data-dir "$tmp/db" 2>/dev/null)

# ARTEX_BENCH_PG_SETTINGS="name=value …": server settings to try (alter system + restart).
if [ -n "${ARTEX_BENCH_PG_SETTINGS:-}" ]; then
    for kv in $ARTEX_BENCH_PG_SETTINGS; do sql postgres -c "alter system set ${kv%%=*} = '${kv#*=}'"; done
    "$artex" db stop --data-dir "$tmp/db" >/dev/null
    "$artex" db start --data-dir "$tmp/db" >/dev/null 2>&1
    echo "# server settings: $ARTEX_BENCH_PG_SETTINGS"
fi
if [ "$profile" = 1 ]; then
    sql postgres -c "alter system set shared_preload_libraries = 'pg_stat_statements'"
    "$artex" db stop --data-dir "$tmp/db" >/dev/null
    "$artex" db start --data-dir "$tmp/db" >/dev/null 2>&1
    sql postgres -c "alter system set pg_stat_statements.track = 'all'" -c "select pg_reload_conf()" >/dev/null
    sql artex -c "create extension pg_stat_statements"
fi
# Every workload runs in its own database cloned from the migrated `artex` one. Task ids
# are time-ordered (UUIDv7, as artex makes them), so bulk inserts stay on the right edge.
sql artex <<'SQL'
create schema bench;
create function bench.uuid7() returns uuid language sql volatile as $$
    select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing
        substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
        from 1 for 6), 52, 1), 53, 1), 'hex')::uuid
$$;
SQL
# ARTEX_BENCH_DROP_INDEXES="tasks_listed tasks_kind_id": indexes of artex.tasks to try
# the run without (what they cost the hot path).
for ix in ${ARTEX_BENCH_DROP_INDEXES:-}; do
    sql artex -c "drop index artex.$ix"
    echo "# without index artex.$ix"
done
echo "# $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(sql postgres -c 'select version()' | cut -d, -f1)"
echo "# workers: ${worker_args[*]}; at defaults (W1 from idle, W5): ${defaults_worker_args[*]:-no flags}"
$quick && echo "# --quick: tiny sizes; the figures mean nothing"

# ---- Limit: the minimal queue cycle, claim + done in one transaction (pgbench) ----------
# 8 clients on 2 threads (the best of 1, 4, 8 and 16 here); the 1-client run gives the
# latency floor: one durable claim + done.
ceiling1=${ARTEX_BENCH_CEILING_1:-} ceiling100=${ARTEX_BENCH_CEILING_100:-} floor_ms=${ARTEX_BENCH_FLOOR_MS:-}
limit_run() { # jobs_per_tx clients transactions_per_client → "tps latency_ms"
    local jobs=$(($1 * $2 * $3 * 11 / 10)) # 10% spare: skip locked may claim short
    sql bench_limit -c "drop table if exists jobs" \
        -c "create table jobs (id bigint generated always as identity primary key,
                status smallint not null default 0, payload jsonb not null default '{}',
                done_at timestamptz)" \
        -c "create index jobs_pending on jobs (id) where status = 0" \
        -c "insert into jobs (payload) select '{}' from generate_series(1, $jobs)" \
        -c "vacuum analyze jobs" -c checkpoint
    cat >"$tmp/claim.sql" <<SQL
begin;
with c as (select id from jobs where status = 0 order by id limit $1 for update skip locked)
update jobs j set status = 1, done_at = now() from c where j.id = c.id;
commit;
SQL
    pgbench -n -M prepared -f "$tmp/claim.sql" -c "$2" -j 2 -t "$3" "$(db_url bench_limit)" \
        >"$tmp/log/pgbench" 2>&1 || die "pgbench: $(cat "$tmp/log/pgbench")"
    awk '/^tps/ { tps = $3 } /^latency average/ { lat = $4 } END { print tps, lat }' "$tmp/log/pgbench"
}
if want limit; then
new_db bench_limit
fields=$(limit_run 1 8 $((limit_tx * 10)))
read -r tps _ <<<"$fields"
ceiling1=$(calc "$tps")
result limit_jobs_per_s_1_per_tx "$ceiling1" jobs/s
fields=$(limit_run 100 8 "$limit_tx")
read -r tps _ <<<"$fields"
ceiling100=$(calc "$tps * 100")
result limit_jobs_per_s_100_per_tx "$ceiling100" jobs/s
fields=$(limit_run 1 1 $((limit_tx * 4)))
read -r _ floor_ms <<<"$fields"
result limit_latency_ms_1_client "$floor_ms" ms
drop_db bench_limit
fi
# A throughput figure, and the same as a fraction of both ceilings.
throughput() { # name tasks/s
    result "$1" "$2" tasks/s
    [ -n "$ceiling1" ] || return 0
    result "${1}_vs_limit_1_per_tx" "$(calc "$2 / $ceiling1" 3)" ratio
    result "${1}_vs_limit_100_per_tx" "$(calc "$2 / $ceiling100" 3)" ratio
}

# ARTEX_BENCH_PROFILE=1: the statements that cost the time in database $1 since its last
# pg_stat_statements_reset() (nested = run by a trigger).
statements() { # db label tasks
    echo "# pg_stat_statements, $2 (nested = run by a trigger):"
    echo "#   calls | per task | total ms | mean ms | WAL bytes per task | statement"
    sql "$1" -F' | ' -c "select calls, round(calls::numeric / $3, 3) per_task,
            round(total_exec_time::numeric) total_ms, round(mean_exec_time::numeric, 3) mean_ms,
            round(wal_bytes::numeric / $3) wal_b_per_task, case when toplevel then '' else 'nested ' end
            || left(regexp_replace(query, '\s+', ' ', 'g'), 70)
        from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())
          and query not like '%pg_sleep%' and query not like 'do %'
        order by total_exec_time desc limit 15" | sed 's/^/#   /'
}

# ---- W1: throughput, 1 and 2 workers --------------------------------------------------
for workers in 1 2; do
    want w1 || break
    db=bench_w1_$workers
    new_db $db
    insert_tasks $db $w1 noop
    if [ "$profile" = 1 ] && [ $workers = 2 ]; then sql $db -c "select pg_stat_statements_reset()" >/dev/null; fi
    wait_idle $db
    read -r commits0 wal0 syncs0 <<<"$(counters $db)"
    pg0=$(pg_cpu_s)
    t0=$EPOCHREALTIME
    start_runtime $db $workers
    wait_until $db "$unfinished" 600
    artex_cpu=0
    for p in "${procs[@]}"; do artex_cpu=$(calc "$artex_cpu + $(cpu_s "$p")" 2); done
    stop_runtime
    wait_idle $db
    pg=$(calc "$(pg_cpu_s) - $pg0" 2)
    read -r commits wal syncs <<<"$(counters $db)"
    check_all_succeeded $db $w1
    rate=$(sql $db -c "select $w1 / (extract(epoch from max(finished_at)) - $t0) from artex.tasks")
    throughput w1_tasks_per_s_${workers}worker "$(calc "$rate")"
    # Of that time, start-up: from the processes' start to the first task finished.
    result w1_${workers}worker_first_finish_ms "$(sql $db -c "select round(((extract(epoch from min(finished_at)) - $t0) * 1000)::numeric) from artex.tasks")" ms
    # What one task costs: transactions PostgreSQL ran (including those in which each
    # LISTENing session reads the NOTIFY queue), WAL written and flushed, CPU spent by
    # PostgreSQL and by the artex processes (both include start-up; PostgreSQL's includes
    # autovacuum, the checkpointer and this script's polling).
    commits=$((commits - commits0)) wal=$((wal - wal0)) syncs=$((syncs - syncs0))
    result w1_${workers}worker_pg_transactions_per_task "$(calc "$commits / $w1" 2)" transactions
    result w1_${workers}worker_wal_bytes_per_task "$(calc "$wal / $w1")" bytes
    result w1_${workers}worker_wal_flushes_per_task "$(calc "$syncs / $w1" 2)" fsyncs
    result w1_${workers}worker_cpu_us_per_task_postgres "$(calc "$pg * 1e6 / $w1")" us
    result w1_${workers}worker_cpu_us_per_task_artex "$(calc "$artex_cpu * 1e6 / $w1")" us
    if [ "$profile" = 1 ] && [ $workers = 2 ]; then
        statements $db "W1 with 2 workers" $w1
    fi
    drop_db $db
done

# ---- W1 from idle: runnable at one instant, plain-SQL ids, default flags ---------------
# The runtime idles (its queues shrunk to their minimum) until the whole batch becomes
# runnable at once; the scanner finds it at its next poll (≤ 200 ms after run_at: no
# NOTIFY announces a time), which is why the rate counts from the first start.
online() { echo "(select count(*) from artex.workers where state = 'online') = $1"; }
if want w1idle; then
db=bench_w1idle
new_db $db
start_runtime_at_defaults $db 2
wait_until $db "$(online 2)" 60
# Both parts start from a checkpoint, as W1's run does: full-page images count alike.
sql $db -c checkpoint
read -r _ wal0 _ <<<"$(counters $db)"
pg0=$(pg_cpu_s)
sql $db -c "insert into artex.tasks (kind, run_at)
    select 'noop', now() + interval '$w1idle_lead s' from generate_series(1, $w1)"
read -r _ wal1 _ <<<"$(counters $db)"
pg1=$(pg_cpu_s)
[ "$(sql $db -c "select max(run_at) > now() and min(started_at) is null from artex.tasks")" = t ] \
    || die "w1idle: the insert took longer than the ${w1idle_lead} s lead"
if [ "$profile" = 1 ]; then sql $db -c "select pg_stat_statements_reset()" >/dev/null; fi
wait_until $db "$unfinished" 600
if [ "$profile" = 1 ]; then statements $db "W1 from idle (the run)" $w1; fi
read -r _ wal2 _ <<<"$(counters $db)"
pg2=$(pg_cpu_s)
capacity=$(sql $db -c "select string_agg(capacity::text, ' ') from artex.workers where state = 'online'")
stop_runtime
check_all_succeeded $db $w1
[ "$(sql $db -c "select count(*) from artex.tasks where substr(id::text, 15, 1) <> '7'")" = 0 ] \
    || die "w1idle: ids by the column default are not time-ordered (UUIDv7)"
rate=$(sql $db -c "select $w1 / extract(epoch from max(finished_at) - min(started_at)) from artex.tasks")
throughput w1idle_tasks_per_s_2workers "$(calc "$rate")"
result w1idle_first_start_after_run_at_ms "$(sql $db -c "select round((extract(epoch from min(started_at) - min(run_at)) * 1000)::numeric) from artex.tasks")" ms
echo "# W1 from idle: workers' capacity (concurrency + queue depth) at the last finish: $capacity"
# Where the time goes: assignment rounds (when a task was assigned: its start row's
# `assigned_at`, or its own row when it ended unstarted — both its transaction's start),
# their sizes, and the timeline from run_at.
rounds_sql="with r as (select coalesce(assigned_at, at) at, count(*) n from artex.task_transitions
    where assigned_at is not null or to_status = 'assigned' group by 1)"
sql $db -F' ' -c "$rounds_sql select count(*), round(avg(n)), min(n), max(n),
        round((extract(epoch from max(at) - min(at)) * 1000)::numeric)
    from r" | {
    read -r rounds avg lo hi span
    echo "# W1 from idle: $rounds assignment rounds over $span ms, $avg tasks each on average (min $lo, max $hi)"
}
sql $db -F' ' -c "$rounds_sql
    select string_agg(n::text || '@' || round((extract(epoch from at - (select min(run_at) from artex.tasks)) * 1000)::numeric), ' ' order by at)
    from (select * from r order by at limit 12) f" | sed 's/^/# W1 from idle: first rounds (tasks@ms after run_at): /'
sql $db -F' ' -c "select round((extract(epoch from percentile_disc(0.1) within group (order by finished_at) - min(run_at)) * 1000)::numeric),
        round((extract(epoch from percentile_disc(0.5) within group (order by finished_at) - min(run_at)) * 1000)::numeric),
        round((extract(epoch from max(finished_at) - min(run_at)) * 1000)::numeric)
    from artex.tasks" | { read -r f10 f50 f100; echo "# W1 from idle: 10% finished +$f10 ms, 50% +$f50 ms, all +$f100 ms after run_at"; }
result w1idle_wal_bytes_per_task_insert "$(calc "($wal1 - $wal0) / $w1")" bytes
result w1idle_wal_bytes_per_task_run "$(calc "($wal2 - $wal1) / $w1")" bytes
result w1idle_cpu_us_per_task_postgres_insert "$(calc "($pg1 - $pg0) * 1e6 / $w1")" us
# The run's CPU includes the ~${w1idle_lead} s of idling around it (polls, heartbeats).
result w1idle_cpu_us_per_task_postgres_run "$(calc "($pg2 - $pg1) * 1e6 / $w1")" us
drop_db $db
fi

# ---- W5: bursts after idle gaps, default flags -------------------------------------------
if want w5; then
db=bench_w5
new_db $db
sql $db -c "create table bench.bursts (burst int primary key, committed_at timestamptz not null)"
start_runtime_at_defaults $db 2
wait_until $db "$(online 2)" 60
sleep 1
for b in $(seq "$w5_bursts"); do
    [ "$b" = 1 ] || { wait_until $db "$unfinished" 600; sleep "$w5_gap"; }
    # The time is taken at the end of the insert, in its transaction: the tasks become
    # runnable at its commit, a moment (one WAL flush) later.
    sql $db -c "insert into artex.tasks (kind, payload)
            select 'noop', jsonb_build_object('burst', $b) from generate_series(1, $w5);
        insert into bench.bursts values ($b, clock_timestamp())"
done
wait_until $db "$unfinished" 600
stop_runtime
check_all_succeeded $db $((w5_bursts * w5))
sql $db -F' ' -c "select b.burst, round($w5 / extract(epoch from max(t.finished_at) - min(t.started_at))),
        round((extract(epoch from min(t.started_at) - b.committed_at) * 1000)::numeric, 1)
    from artex.tasks t join bench.bursts b on b.burst = (t.payload->>'burst')::int
    group by b.burst, b.committed_at order by 1" >"$tmp/bursts"
while read -r b rate first; do
    throughput "w5_burst_$(printf %02d "$b")_tasks_per_s" "$rate"
    result "w5_burst_$(printf %02d "$b")_first_start_ms" "$first" ms
done <"$tmp/bursts"
# How each burst went, from its insert's end: first start, half and 99% finished, last.
sql $db -F' ' -c "select b.burst, round((extract(epoch from min(t.started_at) - b.committed_at) * 1000)::numeric),
        round((extract(epoch from percentile_disc(0.5) within group (order by t.finished_at) - b.committed_at) * 1000)::numeric),
        round((extract(epoch from percentile_disc(0.99) within group (order by t.finished_at) - b.committed_at) * 1000)::numeric),
        round((extract(epoch from max(t.finished_at) - b.committed_at) * 1000)::numeric)
    from artex.tasks t join bench.bursts b on b.burst = (t.payload->>'burst')::int
    group by b.burst, b.committed_at order by 1" | while read -r b first half p99 last; do
    echo "# W5 burst $b: first start +$first ms, half finished +$half ms, 99% +$p99 ms, last +$last ms"
done
throughput w5_tasks_per_s_median "$(sort -n -k2 "$tmp/bursts" | awk '{ r[NR] = $2 } END { print r[int((NR + 1) / 2)] }')"
result w5_first_start_ms_median "$(sort -n -k3 "$tmp/bursts" | awk '{ r[NR] = $3 } END { print r[int((NR + 1) / 2)] }')" ms
result w5_first_start_ms_max "$(sort -n -k3 "$tmp/bursts" | tail -n 1 | cut -d' ' -f3)" ms
drop_db $db
fi

# ---- W2: latency on an idle system ------------------------------------------------------
# W2's floor: the latency ceiling of any PostgreSQL queue on this box, this run. Sets
# floor_p[p50|p95|p99] (ms) and reports them.
declare -A floor_p
w2_floor() { # db (its tables are used, its artex schema is not)
    "$tmp/latency-floor" setup "$(db_url "$1")"
    : >"$tmp/log/$1.floor"
    "$tmp/latency-floor" run "$(db_url "$1")" $((w2_warm + w2)) >>"$tmp/log/$1.floor" 2>&1 &
    local floor=$!
    procs+=($floor)
    for _ in $(seq 600); do grep -q '^listening' "$tmp/log/$1.floor" && break; sleep 0.1; done
    grep -q '^listening' "$tmp/log/$1.floor" || die "latency-floor is not listening: $(tail -n 5 "$tmp/log/$1.floor")"
    sql "$1" -c "do \$\$ begin for i in 1..$((w2_warm + w2)) loop
        perform pg_sleep(0.02); commit;
        insert into floor_jobs (warmup) values (i <= $w2_warm);
        commit;
    end loop; end \$\$"
    wait "$floor" || die "latency-floor failed: $(tail -n 5 "$tmp/log/$1.floor")"
    procs=() # the runtime was stopped before: the floor was the only one
    read -r floor_p[p50] floor_p[p95] floor_p[p99] <<<"$(sql "$1" -F' ' -c "select
            round(percentile_cont(0.5) within group (order by ms)::numeric, 2),
            round(percentile_cont(0.95) within group (order by ms)::numeric, 2),
            round(percentile_cont(0.99) within group (order by ms)::numeric, 2)
        from (select started_us / 1000.0 - extract(epoch from created_at) * 1000 ms
              from floor_jobs where not warmup) t")"
    for p in p50 p95 p99; do result "w2_floor_enqueue_to_start_ms_$p" "${floor_p[$p]}" ms; done
}
if want w2; then
db=bench_w2
new_db $db
start_runtime $db 1 "$tmp/artex-bench"
wait_until $db "exists (select 1 from artex.workers where state = 'online')" 60
sleep 1
# One session inserts and commits each task on its own, 20 ms apart. created_at is the
# inserting transaction's start (the server's clock), so a figure includes the insert's
# own commit, the planner's wake-up and assignment round, the worker's wake-up and its
# start transaction; the `stamp` kind returns the time its handler began (same clock).
if [ "$profile" = 1 ]; then sql $db -c "select pg_stat_statements_reset()" >/dev/null; fi
sql $db -c "do \$\$ begin for i in 1..$((w2_warm + w2)) loop
    perform pg_sleep(0.02); commit;
    insert into artex.tasks (id, kind, payload)
        values (bench.uuid7(), 'stamp', jsonb_build_object('warmup', i <= $w2_warm));
    commit;
end loop; end \$\$"
wait_until $db "$unfinished" 60
stop_runtime
if [ "$profile" = 1 ]; then statements $db "W2" $((w2_warm + w2)); fi
check_all_succeeded $db $((w2_warm + w2))
fields=$(sql $db -F' ' -c "select
        round(percentile_cont(0.5) within group (order by handler)::numeric, 2),
        round(percentile_cont(0.95) within group (order by handler)::numeric, 2),
        round(percentile_cont(0.99) within group (order by handler)::numeric, 2),
        round(percentile_cont(0.5) within group (order by db)::numeric, 2),
        round(percentile_cont(0.99) within group (order by db)::numeric, 2)
    from (select (result->>'t_us')::float8 / 1000 - extract(epoch from created_at) * 1000 handler,
                 extract(epoch from started_at - created_at) * 1000 db
          from artex.tasks where payload->>'warmup' = 'false') t")
read -r p50 p95 p99 d50 d99 <<<"$fields"
for p in p50:$p50 p95:$p95 p99:$p99; do
    result "w2_enqueue_to_handler_ms_${p%%:*}" "${p#*:}" ms
    if [ -n "$floor_ms" ]; then
        result "w2_enqueue_to_handler_ms_${p%%:*}_vs_limit_latency" "$(calc "${p#*:} / $floor_ms" 1)" ratio
    fi
done
# The floor, in the same run: a minimal LISTEN/NOTIFY + `for update skip locked` loop
# (examples/latency-floor.rs) fed by the same inserts 20 ms apart; artex's W2 as a
# multiple of it.
w2_floor $db
for p in p50:$p50 p95:$p95 p99:$p99; do
    result "w2_enqueue_to_handler_ms_${p%%:*}_vs_floor" "$(calc "${p#*:} / ${floor_p[${p%%:*}]}" 2)" ratio
done
# The same, up to the start of the worker's `running` transaction only (database clock).
result w2_enqueue_to_running_ms_p50 "$d50" ms
result w2_enqueue_to_running_ms_p99 "$d99" ms
# Where the median goes: each step from the start of one transaction to the start of the
# next (audit rows carry their transaction's start time).
sql $db -F' ' -c "select round(percentile_cont(0.5) within group (order by a)::numeric, 2),
        round(percentile_cont(0.5) within group (order by r)::numeric, 2),
        round(percentile_cont(0.5) within group (order by h)::numeric, 2)
    from (select extract(epoch from asg.at - t.created_at) * 1000 a,
                 extract(epoch from run.at - asg.at) * 1000 r,
                 (t.result->>'t_us')::float8 / 1000 - extract(epoch from run.at) * 1000 h
          from artex.tasks t
          join artex.task_transitions run on run.task_id = t.id and run.to_status = 'running'
          cross join lateral (select run.assigned_at as at) asg
          where t.payload->>'warmup' = 'false') s" | {
    read -r a r h
    result w2_p50_insert_to_assignment_ms "$a" ms
    result w2_p50_assignment_to_start_ms "$r" ms
    result w2_p50_start_to_handler_ms "$h" ms
}
drop_db $db
fi

# ---- W3: claim cost against the backlog ---------------------------------------------------
# The planner round's read (its roster and claim in one statement) as the runtime sends
# it (prepared; the 7 runs let PostgreSQL settle on the plan it keeps), for 500 tasks,
# with one simulated worker of ample capacity on the roster, in a transaction rolled back
# afterwards.
# The round's read lives once, as artex.dispatch_round's body.
dispatch_sql_of() { # db → the statement
    sql "$1" -c "select substring(prosrc from 'return query (.*);\s*end\s*$')
        from pg_proc where proname = 'dispatch_round' and pronamespace = 'artex'::regnamespace"
}
claim_ms() { # db → median execution time of 7 runs
    local dispatch_sql
    dispatch_sql=$(dispatch_sql_of "$1")
    { echo "begin;"
      echo "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
            values ('bench-sim', 'sim', 1, 'bench', 'artex_w_bench_sim', array['noop'], 100000);"
      echo "prepare claim as $dispatch_sql;"
      for _ in 1 2 3 4 5 6 7; do echo "explain (analyze) execute claim(600, 500, 1, '{}', '{}');"; done
      echo "rollback;"; } | sql "$1" | awk '/Execution Time/ { print $3 }' | sort -n | sed -n 4p
}
# Drain rate on top of the backlog: the first half of $w3_small completions (so a backlog
# is left in every case), from the first batch of finishes to the last (start-up
# excluded), 1 planner + 2 workers.
w3_drain=$((w3_small / 2))
drain_rate() { # db → $rate (not in a subshell: the processes it starts must stay ours)
    local base; base=$(sql "$1" -c "select coalesce(max(id), 0) from artex.task_transitions")
    start_runtime "$1" 2
    wait_until "$1" "exists (select 1 from artex.task_transitions where id > $base
        and to_status = 'succeeded' offset $((w3_drain - 1)))" 600
    stop_runtime
    [ "$(sql "$1" -c "select count(*) from artex.tasks where status in ('failed', 'timeout', 'canceled')")" = 0 ] \
        || die "$1: tasks failed"
    # Completions after the first batch over the time since it (a batch shares one
    # timestamp); 0 when a single batch did it all (--quick).
    rate=$(sql "$1" -c "select coalesce(round(count(*) filter (where at > first)
            / nullif(extract(epoch from max(at) - min(first)), 0)), 0)
        from (select at, min(at) over () as first from (
            select at from artex.task_transitions where id > $base and to_status = 'succeeded'
            order by id limit $w3_drain) e) t")
}
for backlog in small big finished; do
    want w3 || break
    db=bench_w3_$backlog
    new_db $db
    case $backlog in
        small) insert_tasks $db $w3_small noop; label=$w3_small ;;
        big) insert_tasks $db $w3_big noop; label=$w3_big ;;
        finished)
            # Finished tasks as the runtime leaves them, written directly (triggers off,
            # hence no audit rows for these): only the hot table's contents matter here.
            sql $db -c "set session_replication_role = replica" -c "insert into artex.tasks
                (id, kind, status, lease_epoch, result, created_at, updated_at, started_at, finished_at)
                select bench.uuid7(), 'noop', 'succeeded', 1, 'null', now(), now(), now(), now()
                from generate_series(1, $w3_big)"
            insert_tasks $db $w3_small noop
            label=${w3_small}_over_${w3_big}_finished ;;
    esac
    ms=$(claim_ms $db)
    result "w3_claim_ms_${label}_pending" "$ms" ms
    [ $backlog = small ] && claim_small=$ms
    [ $backlog = small ] || result "w3_claim_ms_${label}_pending_vs_${w3_small}" "$(calc "$ms / $claim_small" 2)" ratio
    drain_rate $db
    throughput "w3_drain_${w3_drain}_tasks_per_s_${label}_pending" "$rate"
    # The claim again right after the drain, before vacuum has caught up: the index it
    # walks now starts with the entries of the tasks just taken.
    ms=$(claim_ms $db)
    result "w3_claim_ms_${label}_pending_after_drain" "$ms" ms
    [ $backlog = small ] && drained_small=$ms
    [ $backlog = small ] || result "w3_claim_ms_${label}_pending_after_drain_vs_${w3_small}" "$(calc "$ms / $drained_small" 2)" ratio
    drop_db $db
done

# ---- W4: soak ---------------------------------------------------------------------------
if want w4; then
db=bench_w4
new_db $db
# ARTEX_BENCH_W4_RETENTION=2m: history and finished tasks kept that long (the planner's
# Maintenance drops history partitions and deletes finished tasks during the run).
# A fresh database's partitions (made at the default's day-wide slices) are made again at
# the short retention's slices first, as they would be had it been set from the start.
w4_keep=${ARTEX_BENCH_W4_RETENTION:-}
[ -z "$w4_keep" ] || sql $db -c "update artex.event_retention set keep = interval '$w4_keep'" \
    -c "do \$\$ declare p record; begin
            for p in select name from artex.history_partitions loop
                execute format('drop table artex.%I', p.name);
            end loop;
            delete from artex.history_partitions;
        end \$\$" -c "select count(*) from artex.make_history_partitions(now(), null)" >/dev/null
insert_tasks $db "$w4" noop
t0=$EPOCHREALTIME
start_runtime $db 2
wait_until $db "$unfinished" $((w4 / 100 + 300))
planner_kb=$(hwm_kb "${procs[0]}")
worker_kb=$(for p in "${procs[@]:1}"; do hwm_kb "$p"; done | sort -n | tail -n 1)
stop_runtime
sleep 1 # let the last statistics land
if [ -z "$w4_keep" ]; then
    check_all_succeeded $db "$w4"
else
    [ "$(sql $db -c "select count(*) from artex.tasks where status <> 'succeeded'")" = 0 ] \
        || die "$db: tasks did not succeed"
    echo "# W4 with a retention of $w4_keep: $(sql $db -c "select count(*) from artex.tasks") tasks left, history partitions: $(sql $db -c "select string_agg(name, ' ' order by lo) from artex.history_partitions"), feed pruned through $(sql $db -c "select pruned_xid || '-' || pruned_id || ' at ' || coalesce(pruned_at::text, 'never') from artex.event_retention")"
    result w4_tasks_left "$(sql $db -c "select count(*) from artex.tasks")" rows
    result w4_history_rows_left "$(sql $db -c "select count(*) from artex.task_transitions")" rows
fi
echo "# W4: $w4 tasks, 1 planner + 2 workers"
rate=$(sql $db -c "select round($w4 / (extract(epoch from max(finished_at)) - $t0)) from artex.tasks")
throughput w4_tasks_per_s "$rate"
# Tasks/s in each tenth of the run (by completion order), then slowest / fastest tenth.
sql $db -F' ' -c "select tenth, round(count(*) / greatest(extract(epoch from max(finished_at) - min(finished_at)), 0.001))
    from (select finished_at, ntile(10) over (order by finished_at) tenth from artex.tasks) t
    group by 1 order by 1" >"$tmp/tenths"
while read -r tenth rate; do result "w4_tasks_per_s_tenth_$(printf %02d "$tenth")" "$rate" tasks/s; done <"$tmp/tenths"
result w4_slowest_tenth_vs_fastest "$(awk 'NR == 1 || $2 < lo { lo = $2 } $2 > hi { hi = $2 } END { printf "%.2f", lo / hi }' "$tmp/tenths")" ratio
fields=$(sql $db -F' ' -c "select
        pg_relation_size('artex.tasks'), pg_total_relation_size('artex.tasks'), n_live_tup, n_dead_tup,
        (select coalesce(sum(pg_total_relation_size(inhrelid)), 0) from pg_inherits
         where inhparent = 'artex.task_transitions'::regclass),
        (select count(*) from pg_inherits where inhparent = 'artex.task_transitions'::regclass)
    from pg_stat_user_tables where relid = 'artex.tasks'::regclass")
read -r heap total live dead trans parts <<<"$fields"
result w4_tasks_heap_mb "$(calc "$heap / 1048576" 1)" MB
result w4_tasks_with_indexes_mb "$(calc "$total / 1048576" 1)" MB
result w4_tasks_live_tuples "$live" rows
result w4_tasks_dead_tuples "$dead" rows
result w4_task_transitions_mb "$(calc "$trans / 1048576" 1)" MB
result w4_task_transitions_partitions "$parts" partitions
result w4_planner_peak_rss_mb "$(calc "$planner_kb / 1024" 1)" MB
result w4_worker_peak_rss_mb "$(calc "$worker_kb / 1024" 1)" MB
drop_db $db
fi
# ---- W6: the planner against a fleet of 2,000 workers -------------------------------------
query_ms() { # db "prepare …" "execute …" → median execution time of 7 runs
    { echo "begin; $2;"
      for _ in 1 2 3 4 5 6 7; do echo "explain (analyze) $3;"; done
      echo "rollback;"; } | sql "$1" | awk '/Execution Time/ { print $3 }' | sort -n | sed -n 4p
}
w6_rates=()
for fleet in 10 2000; do
    want w6 || break
    db=bench_w6_$fleet
    new_db $db
    slots=$((w1 / fleet > 0 ? w1 / fleet : 1)) # --quick: fewer tasks than workers
    # Simulated workers: no session (the roster's liveness check is for real ones), seen
    # now, suspect only after the run.
    sql $db -c "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
        select 'sim-' || g, 'sim', 1, 'bench', 'artex_w_sim' || g, array['noop'], $slots
        from generate_series(1, $fleet) g" -c "analyze artex.workers"
    insert_tasks $db "$w1" noop
    dispatch_ms=$(query_ms $db "prepare dispatch as $(dispatch_sql_of $db)" "execute dispatch(600, 2000, 1, '{}', '{}')")
    ARTEX_DATABASE_URL=$(db_url $db) "$artex" planner --worker-suspect-ms 600000 \
        --worker-timeout-ms 600000 >>"$tmp/log/$db.planner" 2>&1 &
    procs+=($!)
    wait_until $db "not exists (select 1 from artex.tasks where listed = 'pending')" 600
    stop_runtime
    # An assignment writes no history row until it ends (the workers are simulated and
    # never start anything): the assigned rows' updated_at is the assigning round's time.
    fields=$(sql $db -F' ' -c "select round(count(*) / greatest(extract(epoch from max(updated_at) - min(updated_at)), 0.001)),
            count(distinct updated_at)
        from artex.tasks where status = 'assigned'")
    read -r rate rounds <<<"$fields"
    over=$(sql $db -c "select count(*) from artex.workers where held > capacity")
    [ "$over" = 0 ] || die "$db: $over workers hold more than their capacity"
    echo "# W6: $w1 tasks to $fleet simulated workers of $slots slots, 1 planner"
    throughput "w6_assign_per_s_${fleet}_workers" "$rate"
    result "w6_rounds_${fleet}_workers" "$rounds" rounds
    result "w6_dispatch_2000_ms_${fleet}_workers" "$dispatch_ms" ms
    w6_rates+=("$rate")
    drop_db $db
done
if [ ${#w6_rates[@]} = 2 ]; then
    result w6_2000_vs_10_workers "$(calc "${w6_rates[1]} / ${w6_rates[0]}" 2)" ratio
fi
# ---- History: rows and WAL per finished task, by table (issue 13) ----------------------
# W1's workload with 1 worker, from a checkpoint: history rows per task, and the WAL of
# the insert and of the run split by relation (pg_waldump: each record counted whole for
# the relation of its first block; commit records and the like under "none").
wal_by_table() { # db from_lsn to_lsn label tasks
    local waldump; waldump=$(command -v pg_waldump || ls /usr/lib/postgresql/*/bin/pg_waldump 2>/dev/null | sort -V | tail -n 1)
    [ -n "$waldump" ] || { echo "# history: pg_waldump not found, no WAL split"; return 0; }
    sql "$1" -F' ' -c "select c.relfilenode,
            coalesce(pp.relname, t.relname) || case when c.relkind = 'i' then '_indexes' else '' end
        from pg_class c
        left join pg_index i on i.indexrelid = c.oid
        left join pg_class t on t.oid = coalesce(i.indrelid, c.oid)
        left join pg_inherits h on h.inhrelid = t.oid
        left join pg_class pp on pp.oid = h.inhparent
        where c.relfilenode <> 0 and c.relnamespace = 'artex'::regnamespace" >"$tmp/relmap"
    "$waldump" -p "$tmp/db/pg/pg_wal" -s "$2" -e "$3" 2>/dev/null | awk -v map="$tmp/relmap" '
        BEGIN { while ((getline l < map) > 0) { split(l, f, " "); name[f[1]] = f[2] } }
        { tot = $0; sub(/.*len \(rec\/tot\): *[0-9]+\/ */, "", tot); sub(/,.*/, "", tot)
          rel = "none"
          if (match($0, /rel [0-9]+\/[0-9]+\/[0-9]+/)) {
              split(substr($0, RSTART + 4, RLENGTH - 4), r, "/")
              rel = (r[3] in name) ? name[r[3]] : "other"
          }
          sum[rel] += tot }
        END { for (k in sum) print k, sum[k] }' | sort >"$tmp/walsplit"
    while read -r rel bytes; do
        result "history_wal_bytes_per_task_$4_$rel" "$(calc "$bytes / $5")" bytes
    done <"$tmp/walsplit"
}
if want history; then
db=bench_history
new_db $db
# Keep the WAL of the whole part on disk for pg_waldump (checkpoints recycle it).
sql postgres -c "alter system set wal_keep_size = '4GB'" -c "select pg_reload_conf()" >/dev/null
sql $db -c "checkpoint" >/dev/null
lsn0=$(sql $db -c "select pg_current_wal_lsn()")
insert_tasks $db $w1 noop
sql $db -c "checkpoint" >/dev/null
lsn1=$(sql $db -c "select pg_current_wal_lsn()")
start_runtime $db 1
wait_until $db "$unfinished" 600
stop_runtime
wait_idle $db
lsn2=$(sql $db -c "select pg_current_wal_lsn()")
check_all_succeeded $db $w1
echo "# History: $w1 tasks, 1 planner + 1 worker"
result history_rows_per_task "$(sql $db -c "select round(count(*)::numeric / $w1, 2) from artex.task_transitions")" rows
result history_wal_bytes_per_task_insert "$(sql $db -c "select round(('$lsn1'::pg_lsn - '$lsn0'::pg_lsn) / $w1)")" bytes
result history_wal_bytes_per_task_run "$(sql $db -c "select round(('$lsn2'::pg_lsn - '$lsn1'::pg_lsn) / $w1)")" bytes
wal_by_table $db "$lsn0" "$lsn1" insert $w1
wal_by_table $db "$lsn1" "$lsn2" run $w1
sql postgres -c "alter system reset wal_keep_size" -c "select pg_reload_conf()" >/dev/null
drop_db $db
fi
# ---- Unique keys: what a key costs a submission (issue 24) ------------------------------
# 20,000 tasks in batches of 100, one transaction a batch, as artex sends them: without
# keys one insert a batch (the plain path); with distinct keys each task through
# `artex.submit` (the key's lock and lookup, then the insert); then the same keys again,
# every one a duplicate (a lookup, nothing written). Tasks/s and WAL bytes per task.
unique_round() { # db label sql-of-one-batch($b = batch number)
    local wal0 t0 t1 wal1
    read -r _ wal0 _ <<<"$(counters "$1")"
    t0=$EPOCHREALTIME
    sql "$1" -c "do \$\$ declare b int; begin for b in 1..$((w1 / 100)) loop
        $3; commit; end loop; end \$\$"
    t1=$EPOCHREALTIME
    read -r _ wal1 _ <<<"$(counters "$1")"
    result "unique_${2}_tasks_per_s" "$(calc "$w1 / ($t1 - $t0)")" tasks/s
    result "unique_${2}_wal_bytes_per_task" "$(calc "($wal1 - $wal0) / $w1")" bytes
}
if want unique; then
db=bench_unique
new_db $db
sql $db -c "checkpoint" >/dev/null
unique_round $db no_key "insert into artex.tasks (kind) select 'noop' from generate_series(1, 100)"
sql $db -c "checkpoint" >/dev/null
unique_round $db distinct_keys "perform count(*) from generate_series(1, 100) g cross join lateral
    artex.submit('noop', unique_key => b || '-' || g, allow_unregistered_kind => true)"
unique_round $db duplicates "perform count(*) from generate_series(1, 100) g cross join lateral
    artex.submit('noop', unique_key => b || '-' || g, allow_unregistered_kind => true)"
[ "$(sql $db -c "select count(*) from artex.tasks")" = $((w1 * 2)) ] || die "unique: duplicates were written"
# The API's and the library's path: a batch of 100 keyed tasks is its keys' locks, then
# one set-based statement (`artex-bench keyed-submit-sql`), one transaction a batch.
keyed_sql=$("$tmp/artex-bench" keyed-submit-sql)
lock_sql=${keyed_sql%%;*}
submit_sql=${keyed_sql#*;}
keyed_batches() { # file key-prefix
    local zeros payloads kinds keys
    zeros="{$(printf '0,%.0s' $(seq 100) | sed 's/,$//')}"
    payloads="{$(printf '"{}",%.0s' $(seq 100) | sed 's/,$//')}"
    kinds="{$(printf 'noop,%.0s' $(seq 100) | sed 's/,$//')}"
    {
        echo "prepare lk(text[]) as $lock_sql;"
        echo "prepare sk(text, text, text[], jsonb[], int4[], timestamptz[], int4[], int4[],
            text[], text[], float8[]) as $submit_sql;"
        for b in $(seq $((w1 / 100))); do
            keys="{$(seq -s, -f "$2$b-%g" 100)}"
            echo "begin; execute lk('$keys'); execute sk('bench', 'submitted', '$kinds',"
            echo "    '$payloads', '$zeros', '{}', '{}', '{}', '{}', '$keys', '{}'); commit;"
        done
    } >"$1"
}
keyed_round() { # db label file
    local wal0 t0 t1 wal1
    read -r _ wal0 _ <<<"$(counters "$1")"
    t0=$EPOCHREALTIME
    sql "$1" -o /dev/null -f "$3"
    t1=$EPOCHREALTIME
    read -r _ wal1 _ <<<"$(counters "$1")"
    result "unique_${2}_tasks_per_s" "$(calc "$w1 / ($t1 - $t0)")" tasks/s
    result "unique_${2}_wal_bytes_per_task" "$(calc "($wal1 - $wal0) / $w1")" bytes
}
keyed_batches "$tmp/keyed.sql" batch-
sql $db -c "checkpoint" >/dev/null
keyed_round $db batch_distinct_keys "$tmp/keyed.sql"
keyed_round $db batch_duplicates "$tmp/keyed.sql"
[ "$(sql $db -c "select count(*) from artex.tasks")" = $((w1 * 3)) ] || die "unique: a keyed batch wrote duplicates"
drop_db $db
fi

# ---- limits and tags: what they cost when used ----------------------------------------
# W1 from idle (2 workers at default flags) three times on one database: no-op tasks
# with a limit key each (1,000 keys) and no limits set; the same with the kind limited
# (per key 5, kind 10,000: room enough that the limits check every round without
# binding); tasks with two tags and no limit key. Tasks/s of the run, WAL bytes per
# task of the insert and of the run (the tags' GIN index costs at the insert, the
# limits' counting index at the assignment).
limits_round() { # db label insert-columns insert-values
    sql "$1" -c checkpoint >/dev/null
    read -r _ wal0 _ <<<"$(counters "$1")"
    sql "$1" -c "insert into artex.tasks (kind, run_at, $3)
        select 'noop', now() + interval '$w1idle_lead s', $4 from generate_series(1, $w1) g"
    read -r _ wal1 _ <<<"$(counters "$1")"
    wait_until "$1" "$unfinished" 600
    read -r _ wal2 _ <<<"$(counters "$1")"
    [ "$(sql "$1" -c "select count(*) from artex.tasks where status = 'succeeded'")" = "$w1" ] \
        || die "limits $2: not every task succeeded"
    local rate; rate=$(sql "$1" -c "select $w1 / extract(epoch from max(finished_at) - min(started_at))
        from artex.tasks")
    throughput "limits_${2}_tasks_per_s" "$(calc "$rate")"
    result "limits_${2}_wal_bytes_per_task_insert" "$(calc "($wal1 - $wal0) / $w1")" bytes
    result "limits_${2}_wal_bytes_per_task_run" "$(calc "($wal2 - $wal1) / $w1")" bytes
    sql "$1" -c "delete from artex.tasks" >/dev/null
}
if want limits; then
db=bench_limits
new_db $db
start_runtime_at_defaults $db 2
wait_until $db "$(online 2)" 60
limits_round $db keys_unlimited limit_key "'k' || (g % 1000)"
sql $db -c "insert into artex.kind_limits (kind, concurrency, key_concurrency, updated_by)
    values ('noop', 10000, 5, 'bench')" >/dev/null
limits_round $db keys_limited limit_key "'k' || (g % 1000)"
sql $db -c "delete from artex.kind_limits" >/dev/null
limits_round $db tagged tags "array['nightly', 'k' || (g % 1000)]"
stop_runtime
drop_db $db
fi

# ---- API: submit throughput through `artex serve` vs plain SQL --------------------------
# The same no-op tasks submitted through `POST /api/v1/tasks` (`artex serve --http`,
# examples/api-load.rs: 4 concurrent clients on keep-alive connections) and inserted
# with plain SQL (pgbench, 4 clients, `insert into artex.tasks (kind, payload)`), one
# task per request/transaction and 100 per request/transaction, in the same run against
# the same cluster: tasks/s of each and the API's ratio to SQL. No planner or worker
# runs: submission only (a simulated worker row declares the kind, as the API checks).
api_clients=4
api_sql() { # db tasks_per_tx transactions_per_client → tasks/s
    cat >"$tmp/api-insert.sql" <<SQL
insert into artex.tasks (kind, payload) select 'noop', '{}' from generate_series(1, $2);
SQL
    pgbench -n -M prepared -f "$tmp/api-insert.sql" -c $api_clients -j 2 -t "$3" "$(db_url "$1")" \
        >"$tmp/log/api-pgbench" 2>&1 || die "pgbench: $(cat "$tmp/log/api-pgbench")"
    awk -v n="$2" '/^tps/ { printf "%.0f", $3 * n }' "$tmp/log/api-pgbench"
}
api_http() { # addr tasks batch → tasks/s
    "$tmp/api-load" "$1" "$tmp/api-token" noop "$2" $api_clients "$3" >"$tmp/log/api-load" 2>&1 ||
        die "api-load: $(cat "$tmp/log/api-load")"
    sed -nE 's/.*tasks_per_s=([0-9]+).*/\1/p' "$tmp/log/api-load"
}
if want api; then
    if $quick; then api_single=400 api_batched=4000; else api_single=20000 api_batched=200000; fi
    cargo build --release --quiet --example api-load
    cp "$rel/examples/api-load" "$tmp/"
    db=bench_api
    new_db $db
    sql $db -c "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
        values ('sim-api', 'sim', 1, 'bench', 'artex_w_sim_api', array['noop'], 1)"
    printf 'bench-write-token' >"$tmp/api-token"
    serve_api $db --write-token-file "$tmp/api-token"
    api_addr=$serve_addr
    echo "# API: $api_clients clients; $api_single tasks one a request, $api_batched in batches of 100; plain SQL the same"
    api1=$(api_http "$api_addr" "$api_single" 1)
    sql1=$(api_sql $db 1 $((api_single / api_clients)))
    api100=$(api_http "$api_addr" "$api_batched" 100)
    sql100=$(api_sql $db 100 $((api_batched / 100 / api_clients)))
    stop_runtime
    n=$(sql $db -c "select count(*) from artex.tasks")
    [ "$n" = $((2 * api_single + 2 * api_batched)) ] || die "$db: $n tasks, expected $((2 * api_single + 2 * api_batched))"
    result api_submit_per_s_single "$api1" tasks/s
    result api_sql_insert_per_s_single "$sql1" tasks/s
    result api_vs_sql_single "$(calc "$api1 / $sql1" 2)" ratio
    result api_submit_per_s_batch_100 "$api100" tasks/s
    result api_sql_insert_per_s_batch_100 "$sql100" tasks/s
    result api_vs_sql_batch_100 "$(calc "$api100 / $sql100" 2)" ratio
    drop_db $db
fi
# ---- dash: the dashboard's first data with 1,000,000 tasks in the table -----------------
# The API calls each page makes before it shows anything, against `artex serve` on a
# database of ARTEX_BENCH_DASH_TASKS tasks (default 1,000,000) as a busy hour leaves them:
# 90% succeeded, finished over the last hour, 5% failed, 5% pending (written with the
# triggers off: the bench needs the rows, not their lives). Each figure is the median of
# 7 requests (curl, time to the last byte); a page shows its data when its slowest call
# has answered (they run in parallel).
dash_ms() { # url → median ms of 7 GETs
    for _ in 1 2 3 4 5 6 7; do curl -fsS -o /dev/null -w '%{time_total}\n' "$1"; done \
        | sort -n | sed -n 4p | awk '{ printf "%.1f", $1 * 1000 }'
}
# $2 tasks in database $1 as a busy hour leaves them (see above).
fill_busy_hour() { # db count
    local db=$1 n=$2
    sql $db -c "set session_replication_role = replica" -c "
        insert into artex.tasks (id, kind, status, created_at, updated_at, started_at,
                                 finished_at, error)
        select bench.uuid7(), (array['echo', 'resize', 'etl'])[1 + g % 3], s::artex.task_status,
            t - interval '2 s', t, case when s = 'pending' then null else t - interval '1 s' end,
            case when s = 'pending' then null else t end,
            case when s = 'failed' then 'bench failure' end
        from generate_series(1, $n) g,
            lateral (select now() - interval '60 min' * (1 - g::float8 / $n) as t,
                            case when g % 20 = 0 then 'failed' when g % 20 = 1 then 'pending'
                                 else 'succeeded' end as s) x" \
        -c "vacuum analyze artex.tasks" -c checkpoint
}
dash_bench() {
    local db=bench_dash n=${ARTEX_BENCH_DASH_TASKS:-1000000} addr='' ms
    $quick && n=20000
    new_db $db
    fill_busy_hour $db $n
    serve_api $db --public-read
    addr=$serve_addr
    echo "# dash: $n tasks ($(sql $db -c "select string_agg(status || ' ' || n, ', ') from
        (select status, count(*) n from artex.tasks group by 1 order by 1) c")), artex serve"
    dash_ms "http://$addr/" >/dev/null # warm-up: the first connection, the prepared statements
    dash_ms "http://$addr/api/v1/stats" >/dev/null
    result dash_page_ms "$(dash_ms "http://$addr/")" ms
    # The overview asks for a sample of 20,000 recent tasks; the API's default reads 100,000.
    result dash_overview_stats_ms "$(dash_ms "http://$addr/api/v1/stats?sample=20000")" ms
    result dash_stats_default_sample_ms "$(dash_ms "http://$addr/api/v1/stats")" ms
    result dash_events_head_ms "$(dash_ms "http://$addr/api/v1/events/head")" ms
    result dash_tasks_ms "$(dash_ms "http://$addr/api/v1/tasks?limit=50")" ms
    result dash_tasks_failed_ms "$(dash_ms "http://$addr/api/v1/tasks?status=failed&limit=50")" ms
    result dash_tasks_kind_ms "$(dash_ms "http://$addr/api/v1/tasks?kind=etl&limit=50")" ms
    result dash_flows_ms "$(dash_ms "http://$addr/api/v1/flows?limit=100")" ms
    result dash_workers_ms "$(dash_ms "http://$addr/api/v1/workers")" ms
    stop_runtime
    drop_db $db
}
if want dash; then
    dash_bench
fi
# ---- replica: W1 while a dashboard reads a streaming replica, or the primary ------------
# A hot standby of this cluster (pg_basebackup, streaming, asynchronous, on its own
# socket), a database of ARTEX_BENCH_REPLICA_TASKS finished tasks (default 1,000,000, as
# `dash` makes them, its pending ones paused), and two `artex serve`: one with --read-database-url on the standby,
# one on the primary alone. W1 ($w1 no-op tasks, 1 planner + 2 workers; a few seconds
# each) runs in rounds of three — with no dashboard load, with the dashboard's requests
# (`dash`'s, one client in a loop, or ARTEX_BENCH_REPLICA_CLIENTS of them) against the replica's serve, against the primary's —
# after one warm-up run; ARTEX_BENCH_REPLICA_ROUNDS rounds (default 5, interleaved, so
# that the table's growth and the box's other load fall on all three alike). Each as the
# median tasks/s, and as a ratio to the median without load; the dashboard's requests/s
# (and any failed request) beside it. With ARTEX_BENCH_REPLICA_PIN=1 (and 2 cores or more)
# the two sides stand in for two hosts: the primary, its serve, the planner and workers
# on core 0, the standby, its serve and the dashboard's client on core 1 (taskset), in
# all three runs alike; by default everything shares every core, the standby's replay
# and queries included. The standby runs
# on the same two cores as everything else: what it costs the box, it costs W1 too.
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
dash_paths=(/ "/api/v1/stats?sample=20000" /api/v1/stats /api/v1/events/head "/api/v1/tasks?limit=50"
    "/api/v1/tasks?status=failed&limit=50" "/api/v1/tasks?kind=etl&limit=50" "/api/v1/flows?limit=100" /api/v1/workers)
dash_loop() { # addr count_file: the dashboard's requests, one after the other, until killed
    local code body="$2.body.$BASHPID"
    while :; do
        for p in "${dash_paths[@]}"; do
            code=$(curl -sS -o "$body" -w '%{http_code}' "http://$1$p" 2>>"$2.failed" || true)
            if [ "$code" = 200 ]; then
                echo >>"$2"
            else # counted and kept: a failure is a figure too
                { echo "$code $p: $(head -c 300 "$body" 2>/dev/null)"; } >>"$2.failed"
            fi
        done
    done
}
# With ARTEX_BENCH_REPLICA_PIN=1: moves process $2 (all its threads; what it starts later
# inherits it) to core $1; nothing otherwise.
pin() { # core pid…
    [ "${ARTEX_BENCH_REPLICA_PIN:-0}" = 1 ] && [ "$(nproc)" -ge 2 ] || return 0
    local core=$1 p
    shift
    for p in "$@"; do taskset -a -cp "$core" "$p" >/dev/null; done
}
# The primary's postmaster and its processes (new backends inherit from the postmaster).
pin_primary() { # cores
    local pm; pm=$(head -n 1 "$tmp/db/pg/postmaster.pid")
    # shellcheck disable=SC2046
    pin "$1" "$pm" $(pgrep -P "$pm")
}
replica_w1() { # db label [serve address for the dashboard load]
    local load=() count="$tmp/replica.count" t0 t1 rate reqs
    sql "$1" -c "insert into artex.tasks (id, kind) select bench.uuid7(), 'noop' from generate_series(1, $w1)" \
        -c "vacuum analyze artex.tasks"
    wait_replayed
    if [ -n "${3:-}" ]; then
        for _ in $(seq "${ARTEX_BENCH_REPLICA_CLIENTS:-1}"); do
            dash_loop "$3" "$count" &
            load+=($!)
        done
        pin 1 "${load[@]}"
        sleep 1 # the load running before W1 starts
    fi
    : >"$count" # appended to with O_APPEND: emptied, it counts from here
    t0=$EPOCHREALTIME
    start_runtime "$1" 2
    pin 0 "${procs[@]}"
    wait_until "$1" "$unfinished" 600
    t1=$EPOCHREALTIME
    stop_runtime
    if [ ${#load[@]} -gt 0 ]; then kill "${load[@]}" 2>/dev/null || true; wait "${load[@]}" 2>/dev/null || true; fi
    rate=$(sql "$1" -c "select $w1 / (extract(epoch from max(finished_at)) - $t0) from artex.tasks
        where kind = 'noop' and status = 'succeeded' and finished_at > to_timestamp($t0)")
    reqs=$(wc -l <"$count")
    echo "# replica: W1 $2: $(calc "$rate") tasks/s; dashboard requests: $reqs in $(calc "$t1 - $t0" 1) s"
    if [ -s "$count.failed" ]; then
        echo "# replica: failed dashboard requests ($2):"
        sed 's/^/#   /' "$count.failed"
        cat "$count.failed" >>"$tmp/replica.failures"
        rm -f "$count.failed"
    fi
    echo "$rate" >>"$tmp/replica.w1.$2"
    echo "$(calc "$reqs / ($t1 - $t0)" 2)" >>"$tmp/replica.dash.$2"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# Until the standby has replayed everything the primary has written.
wait_replayed() {
    local target; target=$(sql postgres -c "select pg_current_wal_lsn()")
    for _ in $(seq 1200); do
        [ "$(psql "$standby_url" -XAtq -c "select pg_last_wal_replay_lsn() >= '$target'")" = t ] && return 0
        sleep 0.05
    done
    die "the standby did not replay up to $target"
}
replica_bench() {
    local db=bench_replica n=${ARTEX_BENCH_REPLICA_TASKS:-1000000} home="$tmp/standby" replica_addr primary_addr
    local base with_replica with_primary
    $quick && n=20000
    [ -n "$pgbin" ] || die "replica: no /usr/lib/postgresql/*/bin (pg_basebackup, pg_ctl)"
    mkdir "$home"
    [ "$(id -u)" = 0 ] && chown postgres "$home"
    as_pg "$pgbin/pg_basebackup" -D "$home/pg" -R -X stream -c fast -h "$tmp/db/pg" -p 5432 -U postgres \
        2>>"$tmp/log/standby" # (it warns of the socket it skips)
    # The primary's socket lock lives in its data folder and comes with the copy.
    rm -f "$home/pg/.s.PGSQL.5432.lock"
    echo "unix_socket_directories = '$home/pg'" >>"$home/pg/postgresql.auto.conf"
    standby="$home/pg"
    as_pg "$pgbin/pg_ctl" start -w -D "$standby" -l "$home/log" >/dev/null
    pin 1 "$(head -n 1 "$standby/postmaster.pid")" $(pgrep -P "$(head -n 1 "$standby/postmaster.pid")")
    pin_primary 0
    standby_url="host=$standby port=5432 user=postgres dbname=postgres"
    new_db $db
    fill_busy_hour $db $n
    # Its pending 5% held (paused): W1's workers run only W1's tasks.
    sql $db -c "set session_replication_role = replica" \
        -c "update artex.tasks set status = 'paused' where status = 'pending'" -c "vacuum analyze artex.tasks"
    wait_replayed
    echo "# replica: $n tasks, a streaming standby ($(psql "$standby_url" -XAtq -c "select pg_is_in_recovery()")), W1 $w1 tasks with 2 workers"
    serve_api $db --public-read --read-database-url "host=$standby port=5432 user=postgres dbname=$db"
    replica_addr=$serve_addr
    pin 1 "${procs[-1]}"
    serve_api $db --public-read
    primary_addr=$serve_addr
    pin 0 "${procs[-1]}"
    [ "${ARTEX_BENCH_REPLICA_PIN:-0}" = 1 ] && echo "# replica: pinned: the primary's side on core 0, the standby's on core 1"
    keep_procs=("${procs[@]}")
    procs=()
    # Warm-up: each serve's connections and statements, the caches of both servers.
    for a in "$replica_addr" "$primary_addr"; do
        for p in "${dash_paths[@]}"; do curl -fsS -o /dev/null "http://$a$p"; done
    done
    [ "$(curl -fsS -o /dev/null -D - "http://$replica_addr/api/v1/tasks?limit=1" | tr -d '\r' \
        | sed -n 's/^artex-read-from: //Ip')" = replica ] || die "replica: the serve does not read the replica"
    replica_w1 $db warm_up
    local rounds=${ARTEX_BENCH_REPLICA_ROUNDS:-5}
    $quick && rounds=1
    for _ in $(seq "$rounds"); do
        replica_w1 $db no_dashboard
        replica_w1 $db dashboard_on_replica "$replica_addr"
        replica_w1 $db dashboard_on_primary "$primary_addr"
    done
    base=$(median <"$tmp/replica.w1.no_dashboard")
    with_replica=$(median <"$tmp/replica.w1.dashboard_on_replica")
    with_primary=$(median <"$tmp/replica.w1.dashboard_on_primary")
    result replica_w1_tasks_per_s_no_dashboard "$(calc "$base")" "tasks/s (median of $rounds)"
    result replica_w1_tasks_per_s_dashboard_on_replica "$(calc "$with_replica")" "tasks/s (median of $rounds)"
    result replica_w1_tasks_per_s_dashboard_on_primary "$(calc "$with_primary")" "tasks/s (median of $rounds)"
    result replica_dash_requests_per_s_on_replica "$(median <"$tmp/replica.dash.dashboard_on_replica")" "requests/s (median)"
    result replica_dash_requests_per_s_on_primary "$(median <"$tmp/replica.dash.dashboard_on_primary")" "requests/s (median)"
    result replica_w1_ratio_dashboard_on_replica "$(calc "$with_replica / $base" 2)" "ratio (target >= 0.9)"
    result replica_w1_ratio_dashboard_on_primary "$(calc "$with_primary / $base" 2)" ratio
    result replica_dash_failed_requests "$(cat "$tmp/replica.failures" 2>/dev/null | wc -l)" requests
    pin_primary "0-$(($(nproc) - 1))"
    local lag; lag=$(curl -fsS "http://$replica_addr/api/v1/replica")
    echo "# replica: lag at the end: $lag"
    procs=("${keep_procs[@]}")
    keep_procs=()
    stop_runtime
    as_pg "$pgbin/pg_ctl" stop -m fast -D "$standby" >/dev/null
    standby=''
    drop_db $db
}
if want replica; then
    replica_bench
fi
# ---- Upload: a 1 GiB file over loopback, artex upload vs curl -T to a plain sink (issue 15)
# `artex upload` (10 MiB chunks, --parallel at its default) to a worker on this host, from
# start (the client hashes the file first) to the task's id, as a ratio to `curl -T` of
# the same file in the same run to examples/upload-sink.rs, twice: reading and
# discarding the body (`upload_vs_curl_sink`, the issue's target ≥ 0.8), and writing it
# to a file in the same folder, fsynced once at the end (`upload_vs_curl_file_sink`:
# what storing the file durably costs at least). Then the worker's peak RSS (VmHWM)
# over one upload each of 256 MiB and 1 GiB in 1 MiB and 10 MiB chunks, a fresh worker
# each: target, independent of both. Then the same over a 1 Gbit/s link between network
# namespaces (`upload_link_1gbit_vs_curl`; as root).
# Runs by default, or alone with ARTEX_BENCH_ONLY=upload (--quick: 64 and 16 MiB).
# $in_ns: empty, or `ip netns exec NS` (the link part); $bind: where the worker and the
# sink listen.
in_ns=() bind=127.0.0.1
upload_worker() { # db folder → $upload_pid, $upload_http
    "${in_ns[@]}" env ARTEX_DATABASE_URL="$(db_url "$1")" "$artex" worker --http "$bind:0" --kinds noop \
        --write-token-file "$2/token" --upload-dir "$2/uploads" \
        >>"$tmp/log/$1.worker" 2>&1 &
    upload_pid=$!
    procs+=("$upload_pid")
    upload_http=''
    for _ in $(seq 400); do
        upload_http=$(sql "$1" -c "select http_addr from artex.workers
            where pid = $upload_pid and state = 'online'")
        [ -n "$upload_http" ] && return 0
        sleep 0.05
    done
    die "the upload worker did not register"
}
upload_send() { # folder file chunk_bytes → seconds
    local t0 t1
    t0=$(date +%s.%N)
    XDG_CACHE_HOME="$1/cache" "$artex" upload "$2" --to "http://$upload_http" --kind noop \
        --token-file "$1/token" --chunk-size "$3" >"$1/task" 2>>"$tmp/log/upload.client" ||
        die "artex upload failed: $(tail -n 3 "$tmp/log/upload.client")"
    t1=$(date +%s.%N)
    calc "$t1 - $t0" 3
}
upload_curl() { # folder file [sink_file] → seconds of curl -T to a fresh sink
    "${in_ns[@]}" env UPLOAD_SINK_BIND="$bind:0" "$tmp/upload-sink" ${3:+"$3"} >"$1/sink" 2>>"$tmp/log/upload.sink" &
    local sink_pid=$! sink t0 t1
    procs+=("$sink_pid")
    for _ in $(seq 200); do [ -s "$1/sink" ] && break; sleep 0.05; done
    sink=$(head -n 1 "$1/sink")
    t0=$(date +%s.%N)
    curl -sS -f -H 'Expect:' -T "$2" "http://$sink/" -o /dev/null
    t1=$(date +%s.%N)
    kill "$sink_pid" 2>/dev/null || true
    wait "$sink_pid" 2>/dev/null || true
    rm -f "$1/sink"
    calc "$t1 - $t0" 3
}
upload_stop_worker() {
    kill -TERM "$upload_pid" 2>/dev/null || true
    wait "$upload_pid" 2>/dev/null || true
}
upload_bench() {
    cargo build --release --example upload-sink
    cp "$rel/examples/upload-sink" "$tmp/"
    local dir="$tmp/upload" big=$((1 << 30)) small=$((256 << 20)) db=bench_upload
    $quick && big=$((64 << 20)) small=$((16 << 20))
    mkdir -p "$dir"
    head -c "$big" /dev/urandom >"$dir/big.bin"
    head -c "$small" "$dir/big.bin" >"$dir/small.bin"
    printf bench-upload-token >"$dir/token"
    new_db $db
    # Warm the page cache for all readers alike.
    cat "$dir/big.bin" >/dev/null
    local curl_s curl_file_s artex_s
    curl_s=$(upload_curl "$dir" "$dir/big.bin")
    echo "# upload: $((big >> 20)) MiB, curl -T to a sink (examples/upload-sink.rs, discards) in $curl_s s"
    result upload_curl_sink_mib_per_s "$(calc "$big / 1048576 / $curl_s" 0)" MiB/s
    curl_file_s=$(upload_curl "$dir" "$dir/big.bin" "$dir/sink.out")
    rm -f "$dir/sink.out"
    echo "# upload: $((big >> 20)) MiB, curl -T to a file sink (written, fsynced at the end) in $curl_file_s s"
    result upload_curl_file_sink_mib_per_s "$(calc "$big / 1048576 / $curl_file_s" 0)" MiB/s
    local rss=()
    for size in "$small" "$big"; do
        for chunk in $((1 << 20)) $((10 << 20)); do
            rm -rf "$dir/uploads" "$dir/cache"
            upload_worker $db "$dir"
            local file="$dir/small.bin"
            [ "$size" = "$big" ] && file="$dir/big.bin"
            local secs; secs=$(upload_send "$dir" "$file" "$chunk")
            local kb; kb=$(hwm_kb "$upload_pid")
            upload_stop_worker
            echo "# upload: $((size >> 20)) MiB in $((chunk >> 20)) MiB chunks: $secs s, worker peak RSS $kb kB"
            result "upload_rss_kb_$((size >> 20))mib_$((chunk >> 20))mib_chunks" "$kb" kB
            rss+=("$kb")
            if [ "$size" = "$big" ] && [ "$chunk" = $((10 << 20)) ]; then artex_s=$secs; fi
        done
    done
    result upload_artex_mib_per_s "$(calc "$big / 1048576 / $artex_s" 0)" MiB/s
    result upload_vs_curl_sink "$(calc "$curl_s / $artex_s" 2)" "ratio (target >= 0.8)"
    result upload_vs_curl_file_sink "$(calc "$curl_file_s / $artex_s" 2)" "ratio (to a durable write of the file)"
    # The floor the protocol sets: the file hashed four times (the client, whole and per
    # chunk; the worker, per chunk and whole), here on the cores the client and the worker
    # share. Copies and the disk come on top; curl hashes nothing.
    local sha_s ncores floor_s
    sha_s=$("$tmp/artex-bench" sha256 "$dir/big.bin" | cut -d' ' -f1)
    ncores=$(nproc)
    floor_s=$(calc "4 * $sha_s / $ncores" 3)
    echo "# upload: sha256 of $((big >> 20)) MiB on one core $sha_s s; four passes on $ncores cores: $floor_s s at least"
    result upload_sha256_floor_s "$floor_s" "s (4 sha256 passes over $ncores cores)"
    result upload_vs_curl_sink_ceiling "$(calc "$curl_s / $floor_s" 2)" "ratio (the best any receiver of this protocol could reach here)"
    local lo hi
    lo=$(printf '%s\n' "${rss[@]}" | sort -n | head -n 1)
    hi=$(printf '%s\n' "${rss[@]}" | sort -n | tail -n 1)
    result upload_rss_spread "$(calc "$hi / $lo" 2)" "ratio of highest to lowest peak RSS"
    upload_link_bench "$dir" $db
    rm -rf "$dir"
    drop_db $db
}
# The same file over a 1 Gbit/s link, as between two hosts of a fleet: a veth pair into
# a network namespace of its own, its egress limited by `tc tbf`, the worker (and then
# the sink) in the namespace, the client (and curl) outside; the database by its Unix
# socket. Here the four sha256 passes run while the link is busy: what loopback's
# shared cores cannot show. Needs root, `ip` and `tc` (skipped otherwise).
upload_link_bench() { # folder db
    if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        echo "# upload over a 1 Gbit/s link: skipped (needs root, ip and tc)"
        return 0
    fi
    link_ns="artex-bench-$$"
    local outer="abu$$a" inner="abu$$b"
    ip netns add "$link_ns"
    ip link add "$outer" type veth peer name "$inner"
    ip link set "$inner" netns "$link_ns"
    ip addr add 10.231.77.1/24 dev "$outer"
    ip link set "$outer" up
    ip netns exec "$link_ns" ip addr add 10.231.77.2/24 dev "$inner"
    ip netns exec "$link_ns" ip link set "$inner" up
    ip netns exec "$link_ns" ip link set lo up
    tc qdisc add dev "$outer" root tbf rate 1gbit burst 1mb latency 50ms
    in_ns=(ip netns exec "$link_ns") bind=10.231.77.2
    local curl_s artex_s
    curl_s=$(upload_curl "$1" "$1/big.bin")
    rm -rf "$1/uploads" "$1/cache"
    upload_worker "$2" "$1"
    artex_s=$(upload_send "$1" "$1/big.bin" $((10 << 20)))
    upload_stop_worker
    in_ns=() bind=127.0.0.1
    ip netns del "$link_ns"
    link_ns=''
    echo "# upload over a 1 Gbit/s link (tbf on a veth pair into a namespace): curl -T $curl_s s, artex upload $artex_s s"
    result upload_link_1gbit_vs_curl "$(calc "$curl_s / $artex_s" 2)" "ratio (the same 10 MiB chunks, 4 in flight)"
}
if want upload; then
    upload_bench
fi
# ---- fleet: hundreds of real workers through pgbouncer in transaction mode (issue 22) ----
# A real pgbouncer (transaction mode, default_pool_size 40; a session-mode alias of 4 for
# the planners' LISTEN) in front of the cluster; ARTEX_BENCH_FLEET_WORKERS real `artex
# worker` processes (default 500; concurrency 10, default flags otherwise) and 2 planners,
# all through it. Reported: RSS per idle worker; what the idle fleet costs PostgreSQL
# (heartbeats and polls: transactions and CPU per worker per second); W1 from idle
# (20,000 tasks) with PostgreSQL's backends sampled every 100 ms throughout; W2 through the
# pooler; and the same W1 and W2 with 10 workers connected directly, for the ratios.
fleet_n=${ARTEX_BENCH_FLEET_WORKERS:-500}
$quick && fleet_n=${ARTEX_BENCH_FLEET_WORKERS:-20}
# The pgbouncer of database $1 (its session alias is ${1}_session), on a free port:
# its URLs in $bouncer_url and $bouncer_listen_url.
start_bouncer() { # db
    local dir="$tmp/bouncer" socket port
    mkdir -p "$dir"
    socket=$(python3 -c 'import sys, urllib.parse as u; q = u.parse_qs(u.urlparse(sys.argv[1]).query); print(q["host"][0], q["port"][0])' "$url")
    read -r socket port <<<"$socket"
    bouncer_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat >"$dir/pgbouncer.ini" <<INI
[databases]
$1 = host=$socket port=$port user=postgres dbname=$1 pool_size=40
${1}_session = host=$socket port=$port user=postgres dbname=$1 pool_mode=session pool_size=4
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 40
max_client_conn = 20000
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$dir"
        # runuser's PAM session sets the soft limit back: raise it inside.
        runuser -u postgres -- sh -c "ulimit -n \$(ulimit -Hn); exec pgbouncer $dir/pgbouncer.ini" \
            >>"$tmp/log/pgbouncer" 2>&1 &
    else
        (ulimit -n "$(ulimit -Hn)"; exec pgbouncer "$dir/pgbouncer.ini") >>"$tmp/log/pgbouncer" 2>&1 &
    fi
    bouncer_pid=$!
    bouncer_url="postgresql://postgres@127.0.0.1:$bouncer_port/$1"
    bouncer_listen_url="postgresql://postgres@127.0.0.1:$bouncer_port/${1}_session"
    for _ in $(seq 100); do psql "$bouncer_url" -XAtqc 'select 1' >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "pgbouncer did not start: $(tail -n 5 "$dir/pgbouncer.log")"
}
stop_bouncer() {
    [ -n "${bouncer_pid:-}" ] || return 0
    kill -TERM "$bouncer_pid" 2>/dev/null || true
    wait "$bouncer_pid" 2>/dev/null || true
    bouncer_pid=''
}
# Samples the cluster's client backends (every session but the sampler's own and the
# server's own processes) every 100 ms into $tmp/backends.$1 until $tmp/sampling.$1 goes.
sample_backends() { # label
    : >"$tmp/backends.$1"
    touch "$tmp/sampling.$1"
    while [ -f "$tmp/sampling.$1" ]; do
        sql postgres -c "select count(*) from pg_stat_activity
            where backend_type = 'client backend' and pid <> pg_backend_pid()" >>"$tmp/backends.$1"
        sleep 0.1
    done &
    sampler=$!
}
stop_sampling() { # label: the most backends seen, in $fleet_backends
    rm -f "$tmp/sampling.$1"
    wait "$sampler" 2>/dev/null || true
    fleet_backends=$(sort -n "$tmp/backends.$1" | tail -n 1)
}
# The fleet of $2 workers and 2 planners on database $1 through URL $3 (planners LISTEN
# through $4); returns once every worker is online.
start_fleet() { # db workers url listen_url
    ulimit -n "$(ulimit -Hn)" # a planner keeps a connection to each worker
    for p in 1 2; do
        ARTEX_DATABASE_URL=$3 ARTEX_LISTEN_DATABASE_URL=$4 "$artex" planner \
            >>"$tmp/log/$1.planner$p" 2>&1 &
        procs+=($!)
    done
    for i in $(seq "$2"); do
        ARTEX_DATABASE_URL=$3 "$tmp/artex-bench" worker --concurrency 10 \
            >>"$tmp/log/$1.worker$i" 2>&1 &
        procs+=($!)
        # Start in waves, so that start-up does not starve what already runs.
        [ $((i % 50)) = 0 ] && sleep 1
    done
    wait_until "$1" "$(online "$2")" 600
}
# W1 from idle on the running fleet of database $1: tasks/s from first start to last
# finish, the most backends seen meanwhile.
fleet_w1() { # db label
    sql "$1" -c checkpoint
    sample_backends "$2"
    sql "$1" -c "insert into artex.tasks (kind, run_at)
        select 'noop', now() + interval '$w1idle_lead s' from generate_series(1, $w1)"
    wait_until "$1" "$unfinished" 900
    stop_sampling "$2"
    check_all_succeeded "$1" "$w1"
    fleet_rate=$(sql "$1" -c "select round($w1 / extract(epoch from max(finished_at) - min(started_at))) from artex.tasks")
}
# W2 on the running fleet: 300 `stamp` tasks 20 ms apart; p50 and p99 enqueue → handler.
fleet_w2() { # db
    sql "$1" -c "delete from artex.tasks"
    sql "$1" -c "do \$\$ begin for i in 1..$((w2_warm + w2)) loop
        perform pg_sleep(0.02); commit;
        insert into artex.tasks (id, kind, payload)
            values (bench.uuid7(), 'stamp', jsonb_build_object('warmup', i <= $w2_warm));
        commit;
    end loop; end \$\$"
    wait_until "$1" "$unfinished" 120
    read -r fleet_w2_p50 fleet_w2_p99 <<<"$(sql "$1" -F' ' -c "select
            round(percentile_cont(0.5) within group (order by ms)::numeric, 2),
            round(percentile_cont(0.99) within group (order by ms)::numeric, 2)
        from (select (result->>'t_us')::float8 / 1000 - extract(epoch from created_at) * 1000 ms
              from artex.tasks where payload->>'warmup' = 'false') t")"
}
if want fleet; then
command -v pgbouncer >/dev/null || die "fleet: pgbouncer is not installed (apt-get install -y pgbouncer)"
# Direct: 10 workers and 2 planners connected to PostgreSQL itself.
db=bench_fleet_direct
new_db $db
start_fleet $db 10 "$(db_url $db)" "$(db_url $db)"
fleet_w1 $db direct
direct_rate=$fleet_rate
result fleet_direct_10_workers_w1_tasks_per_s "$direct_rate" tasks/s
result fleet_direct_10_workers_max_backends "$fleet_backends" backends
fleet_w2 $db
direct_w2=$fleet_w2_p50
result fleet_direct_w2_enqueue_to_handler_ms_p50 "$fleet_w2_p50" ms
result fleet_direct_w2_enqueue_to_handler_ms_p99 "$fleet_w2_p99" ms
stop_runtime
wait_idle $db
drop_db $db
# Through pgbouncer: the fleet.
db=bench_fleet
new_db $db
start_bouncer $db
t0=$EPOCHREALTIME
start_fleet $db "$fleet_n" "$bouncer_url" "$bouncer_listen_url"
echo "# fleet: $fleet_n workers online after $(calc "$EPOCHREALTIME - $t0" 1) s"
sleep 10 # past start-up: queues at their minimum, polls slowed by the first pushes
rss_files=()
for p in "${procs[@]:2}"; do rss_files+=("/proc/$p/status"); done
result fleet_rss_kb_per_idle_worker "$(awk -v n="$fleet_n" '/^VmRSS/ { s += $2 } END { printf "%d", s / n }' "${rss_files[@]}")" kB
# RSS counts the pages a worker shares with the others (the binary, the libraries): what
# each adds is its private memory.
result fleet_private_kb_per_idle_worker "$(for p in "${procs[@]:2}"; do echo "/proc/$p/smaps_rollup"; done | xargs awk '/^(Private_Clean|Private_Dirty):/ { s += $2 } END { printf "%d", s / '"$fleet_n"' }')" kB
# The idle fleet for 20 s: heartbeats (every 2 s), polls (every 2 s once pushed), nothing
# else; what PostgreSQL commits and spends on it, per worker.
if [ "$profile" = 1 ]; then sql $db -c "select pg_stat_statements_reset()" >/dev/null; fi
# One awk over every worker's /proc/PID/stat (a loop of a thousand processes would
# stretch the window it measures).
workers_cpu() {
    local files=()
    for p in "${procs[@]:2}"; do files+=("/proc/$p/stat"); done
    awk -v hz="$(getconf CLK_TCK)" '{ s += $14 + $15 } END { printf "%.2f", s / hz }' "${files[@]}"
}
w0=$(workers_cpu)
read -r commits0 _ _ <<<"$(counters $db)"
pg0=$(pg_cpu_s)
t_idle=$EPOCHREALTIME
sleep 20
read -r commits1 _ _ <<<"$(counters $db)"
pg1=$(pg_cpu_s)
w1cpu=$(workers_cpu)
idle_s=$(calc "$EPOCHREALTIME - $t_idle" 2)
result fleet_idle_worker_cpu_us_per_worker_per_s "$(calc "($w1cpu - $w0) * 1e6 / $idle_s / $fleet_n")" us
result fleet_idle_pg_transactions_per_worker_per_s "$(calc "($commits1 - $commits0) / $idle_s / $fleet_n" 3)" transactions
result fleet_idle_pg_cpu_us_per_worker_per_s "$(calc "($pg1 - $pg0) * 1e6 / $idle_s / $fleet_n")" us
result fleet_idle_pg_cpu_share "$(calc "($pg1 - $pg0) / $idle_s" 3)" cores
if [ "$profile" = 1 ]; then statements $db "the idle fleet, 20 s (per task = per worker)" "$fleet_n"; fi
fleet_w1 $db pooled
throughput "fleet_${fleet_n}_workers_w1_tasks_per_s" "$fleet_rate"
result fleet_max_backends "$fleet_backends" backends
result fleet_w1_vs_direct_10_workers "$(calc "$fleet_rate / $direct_rate" 2)" ratio
fleet_w2 $db
result fleet_w2_enqueue_to_handler_ms_p50 "$fleet_w2_p50" ms
result fleet_w2_enqueue_to_handler_ms_p99 "$fleet_w2_p99" ms
result fleet_w2_p50_vs_direct "$(calc "$fleet_w2_p50 / $direct_w2" 2)" ratio
errors=$(cat "$tmp"/log/$db.* | grep -c ' ERROR ' || true)
result fleet_error_lines "$errors" lines
stop_runtime
stop_bouncer
wait_idle $db
drop_db $db
fi
echo "# done"

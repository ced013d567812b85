#!/usr/bin/env bash
# The parts of the artex benchmark (issue 5) not yet moved to Rust (tests/bench, issue 34
# §5): w4, history, api, dash, replica, upload, fleet. scripts/bench.sh runs this
# script for them, with ARTEX_BENCH_ONLY naming only those, --quick passed on, and the
# ceilings of the `limit` it ran in Rust in ARTEX_BENCH_CEILING_1 and
# ARTEX_BENCH_CEILING_100. A part moved to Rust leaves this file. Like the Rust parts,
# it builds release, starts a private durable PostgreSQL cluster and prints one
# `RESULT name=value unit` line per figure; `# …` lines are context.
#
#   W4     ARTEX_BENCH_W4_TASKS tasks (default 1,000,000; ~5 min on an idle 2-core box)
#          through 1 planner + 2 workers: tasks/s per tenth of the run, table size and
#          dead tuples at the end, peak RSS of planner and workers.
#   fleet  ARTEX_BENCH_FLEET_WORKERS (default 500) real workers and 2 planners through a
#          real pgbouncer in transaction mode (pool of 40): RSS per idle worker, what the idle
#          fleet costs PostgreSQL per worker, W1 from idle with the backends sampled
#          throughout, W2; against 10 workers connected directly (issue 22).
#   api    submission through the HTTP API (`artex serve`, `POST /api/v1/tasks`, 4
#          clients) one task a request and 100 a request, against plain SQL inserts of the
#          same tasks in the same run: tasks/s and the API's ratio to SQL.
#   replica  W1 (20,000 tasks, 1 planner + 2 workers) on a database of 1,000,000 finished
#          tasks while a dashboard's requests (the `dash` part's, in a loop) go to
#          `artex serve --read-database-url` on a streaming standby of this cluster, then
#          to one on the primary; each as a ratio to W1 with no dashboard load.
#   history, dash, upload: see their sections below.
#
# Usage (through scripts/bench.sh): scripts/bench-legacy.sh [--quick]
# ARTEX_BENCH_ONLY=w4,api runs only those parts; ARTEX_BENCH_WORKER_ARGS replaces the
# workers' `--concurrency 10 --prefetch 2000` of W4;
# ARTEX_BENCH_PG_SETTINGS="shared_buffers=1GB max_wal_size=8GB" tries server settings.
# ARTEX_BENCH_DROP_INDEXES="tasks_listed tasks_kind_id" runs without those indexes.
# ARTEX_BENCH_PROFILE=1 also loads pg_stat_statements and prints, for the idle fleet,
# the statements that cost the time (it slows PostgreSQL down a little).
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
only=",${ARTEX_BENCH_ONLY:-w4,history,api,dash,replica,upload,fleet},"
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

# The ceilings of a `limit` run (in Rust, by scripts/bench.sh), for the ratios.
ceiling1=${ARTEX_BENCH_CEILING_1:-} ceiling100=${ARTEX_BENCH_CEILING_100:-}
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

# Exactly $1 workers online.
online() { echo "(select count(*) from artex.workers where state = 'online') = $1"; }
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

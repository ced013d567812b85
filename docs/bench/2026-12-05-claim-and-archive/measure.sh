#!/bin/bash
# Usage: measure.sh PGDATA DB [ROUNDS] — after setup.sql in DB (PGHOST, PGPORT, PGUSER
# as for psql). ROUNDS times (3 by default), each path in turn from a vacuum and a
# checkpoint: WAL bytes and the cluster's CPU per task over 20,000 tasks on one
# connection (insert included: insert.sql measures it alone) and each statement's mean
# latency in ms; then tasks/s with two clients (two workers) for 15 s.
set -euo pipefail
pgdata=$1 db=$2 rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
pm=$(head -1 "$pgdata/postmaster.pid")
psql_() { psql -X -q -At -d "$db" -c "$1"; }
ticks() { # the cluster's CPU in clock ticks: every live process and the exited ones
    local t=0 p s
    for p in $pm $(pgrep -P "$pm"); do
        s=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
        t=$((t + s))
    done
    echo $((t + $(awk '{print $16 + $17}' "/proc/$pm/stat")))
}
hz=$(getconf CLK_TCK)
settle() { psql_ "vacuum artex.tasks, artex.done, artex.task_history"; psql_ checkpoint; }
for round in $(seq "$rounds"); do
for path in insert current claim claim-archive; do
    settle
    w0=$(psql_ "select pg_current_wal_lsn()") c0=$(ticks)
    out=$(pgbench -n -r -t 40 -f "$here/$path.sql" "$db" 2>&1)
    w1=$(psql_ "select pg_current_wal_lsn()") c1=$(ticks)
    echo "$path: $(psql_ "select (pg_wal_lsn_diff('$w1', '$w0') / 20000)::int") B WAL," \
        "$(( (c1 - c0) * 1000000 / hz / 20000 )) us CPU per task; statements (ms):" \
        "$(echo "$out" | sed -n '/statement latencies/,$p' | tail -n +2 | awk '{printf "%s ", $1}')"
done
done
for round in $(seq "$rounds"); do
for path in current claim claim-archive; do
    settle
    tps=$(pgbench -n -c 2 -T 15 -f "$here/$path.sql" "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "$path, two clients: $(awk -v t="$tps" 'BEGIN {printf "%d", t * 500}') tasks/s (insert included)"
done
done

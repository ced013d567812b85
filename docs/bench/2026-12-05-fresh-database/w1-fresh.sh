#!/bin/bash
# W1 from idle by hand on a fresh blackboard, with PostgreSQL's default autovacuum (a
# minute between checks; the bench's embedded cluster checks every 2 s): a planner and
# two workers at defaults, then 20,000 no-op tasks runnable 3 s after their insert, RUNS
# times in the same database. Prints each burst's rate (first start to last finish) and
# when it started after run_at. MINDUR=ms logs the plans of statements slower than that
# (auto_explain, with row counts) to $D/log.
#   BIN=target/release/artex RUNS="1 2" docs/bench/2026-12-05-fresh-database/w1-fresh.sh
# Runs as root (the server as postgres); uses port 5498 and the folder $D.
set -e
D=${D:-/tmp/pgl}; BIN=${BIN:-target/release/artex}; BIN=$(realpath "$BIN")
PG=/usr/lib/postgresql/15/bin
if [ ! -d $D/data ]; then
  mkdir -p $D; chown postgres $D
  runuser -u postgres -- $PG/initdb -D $D/data -A trust >/dev/null
  cat >> $D/data/postgresql.conf <<CONF
shared_preload_libraries = 'auto_explain'
auto_explain.log_nested_statements = on
auto_explain.log_analyze = on
auto_explain.log_timing = off
max_connections = 200
CONF
fi
runuser -u postgres -- $PG/pg_ctl -D $D/data -l $D/log -w \
  -o "-p 5498 -k $D -c auto_explain.log_min_duration=${MINDUR:--1}" start >/dev/null
U="postgresql://postgres@/w1?host=$D&port=5498"
psql -h $D -p 5498 -U postgres -qc "drop database if exists w1" -c "create database w1"
$BIN migrate --database-url "$U" >/dev/null
export ARTEX_DATABASE_URL="$U" TMPDIR=$D
$BIN planner > $D/planner.log 2>&1 & P1=$!
$BIN worker > $D/w1.log 2>&1 & P2=$!
$BIN worker > $D/w2.log 2>&1 & P3=$!
until [ "$(psql "$U" -tAc "select count(*) from artex.workers where state = 'online'")" = 2 ]; do
  sleep 0.5
done
sleep 2
for r in ${RUNS:-1 2}; do
  psql "$U" -qc "delete from artex.tasks" -c "checkpoint"
  psql "$U" -qc "insert into artex.tasks (kind, run_at)
                 select 'noop', now() + interval '3 s' from generate_series(1, 20000)"
  until [ "$(psql "$U" -tAc "select count(*) from artex.tasks where finished_at is null")" = 0 ]; do
    sleep 0.2
  done
  psql "$U" -tAc "select 'burst $r', round(20000 / extract(epoch from max(finished_at) - min(started_at))::numeric)
                         || ' tasks/s', 'first start +'
                         || round(extract(epoch from min(started_at) - min(run_at))::numeric * 1000) || ' ms'
                  from artex.tasks"
done
kill $P1 $P2 $P3; wait $P1 $P2 $P3 2>/dev/null || true
runuser -u postgres -- $PG/pg_ctl -D $D/data -m fast -w stop >/dev/null

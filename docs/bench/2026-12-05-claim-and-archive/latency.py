#!/usr/bin/env python3
"""W2's shape against a worker that claims its own tasks (issue 39's prototype).

Usage: latency.py CONNINFO [N]  (needs `pip install "psycopg[binary]"`; a database
prepared by setup.sql). One task every 20 ms, N of them (300 by default), each inserted
and committed on its own by plain SQL. Two paths are measured one after the other with
the same client code:

- floor: W2's floor table (examples/latency-floor.rs's, made here) and its claim;
- claim: artex.tasks, whose insert trigger notifies `artex_tasks`, and claim.sql's
  claim for worker w0 (limit 100), the start written with the end by
  artex.record_attempts.

A listening session claims at each notification, and a task "starts" when the claim
returns, as in W2: the figure is the start's wall clock minus the insert's `now()`.
Prints p50 and p99 in ms for each path, and their ratio.
"""

import statistics
import sys
import threading
import time

import psycopg

FLOOR_SETUP = """
    create table if not exists floor_jobs (
        id bigint generated always as identity primary key,
        status smallint not null default 0,
        created_at timestamptz not null default now(),
        started_us bigint,
        warmup boolean not null default false);
    create index if not exists floor_jobs_runnable on floor_jobs (id) where status = 0;
    create or replace function floor_jobs_notify() returns trigger language plpgsql as $$
    begin perform pg_notify('floor_jobs', ''); return null; end $$;
    create or replace trigger floor_jobs_notify after insert on floor_jobs
        for each statement execute function floor_jobs_notify();"""

PATHS = {
    "floor": {
        "channel": "floor_jobs",
        "insert": "insert into floor_jobs default values returning extract(epoch from created_at)",
        "claim": """update floor_jobs set status = 1
            where id in (select id from floor_jobs where status = 0 order by id limit 100
                         for update skip locked)
            returning id, 0::int8""",
        "end": "update floor_jobs set status = 2 where id = any(%s)",
    },
    "claim": {
        "channel": "artex_tasks",
        "insert": """insert into artex.tasks (kind) values ('noop')
            returning extract(epoch from created_at)""",
        "claim": """with c as (
                select id from artex.tasks
                where listed = 'pending' and not limited and run_at <= now()
                  and kind = any('{noop}')
                order by priority desc, run_at, id limit 100 for update skip locked
            ),
            h as (select set_config('artex.hot', 'on', true) as on_,
                         artex.set_context('w0', 'assigned') as ctx),
            a as (
                update artex.tasks t
                set status = 'assigned', assigned_to = 'w0',
                    lease_until = now() + interval '30 s', lease_epoch = t.lease_epoch + 1,
                    updated_at = now()
                from c, h where t.id = c.id and h.ctx
                returning t.id, t.lease_epoch
            ),
            u as (update artex.workers w set taken = w.taken + (select count(*) from a)
                  where w.id = 'w0')
            select id, lease_epoch from a""",
        "end": None,
    },
}

RECORD = """select count(*) from artex.record_attempts('w0', %s::uuid[], %s::int8[],
    array_fill('succeeded'::text, array[%s]), array_fill(null::jsonb, array[%s]),
    array_fill(null::text, array[%s]), array_fill(false, array[%s]),
    array_fill(0::float8, array[%s]), array_fill(0::float8, array[%s]))"""


def serve(conninfo, path, started, ready, stop):
    p = PATHS[path]
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"listen {p['channel']}")
        ready.set()
        while not stop.is_set():
            for _ in c.notifies(timeout=0.2):
                break
            while True:
                rows = c.execute(p["claim"]).fetchall()
                if not rows:
                    break
                at = time.time()
                ids = [r[0] for r in rows]
                for i in ids:
                    started[i] = at
                if p["end"]:
                    c.execute(p["end"], (ids,))
                else:
                    n = len(ids)
                    c.execute(RECORD, (ids, [r[1] for r in rows], n, n, n, n, n, n))


def measure(conninfo, path, n):
    """Tasks left runnable by earlier runs are claimed too, and not counted."""
    started, ready, stop, created = {}, threading.Event(), threading.Event(), {}
    t = threading.Thread(target=serve, args=(conninfo, path, started, ready, stop))
    t.start()
    ready.wait()
    insert = PATHS[path]["insert"].replace("returning", "returning id,")
    with psycopg.connect(conninfo, autocommit=True) as c:
        for _ in range(n):
            row = c.execute(insert).fetchone()
            created[row[0]] = float(row[1])
            time.sleep(0.02)
    deadline = time.time() + 30
    while any(i not in started for i in created):
        if time.time() > deadline:
            stop.set()
            t.join()
            sys.exit(f"{path}: not every task was claimed within 30 s")
        time.sleep(0.05)
    stop.set()
    t.join()
    ms = sorted((started[i] - created[i]) * 1000 for i in created)
    return statistics.median(ms), ms[int(0.99 * (len(ms) - 1))]


def main():
    conninfo = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(FLOOR_SETUP)
    fp50, fp99 = measure(conninfo, "floor", n)
    cp50, cp99 = measure(conninfo, "claim", n)
    print(f"floor: p50 {fp50:.2f} ms, p99 {fp99:.2f} ms")
    print(f"claim: p50 {cp50:.2f} ms, p99 {cp99:.2f} ms "
          f"({cp50 / fp50:.2f}x / {cp99 / fp99:.2f}x the floor)")


if __name__ == "__main__":
    main()

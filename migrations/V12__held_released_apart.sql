-- A worker's finished tasks no longer wait for the planner (issue 13). Contract: builds up
-- to V11 read `workers.held` as the capacity counter, which this migration no longer
-- lowers when a task is given back (see below): their planners would stop assigning to a
-- worker once it had been full, so only builds that know V12 run against it.
--
-- V5 kept `workers.held` by a trigger in the same statement as every change of a task's
-- holder: an assignment added to it, and a start/outcome batch (the worker's RECORD)
-- subtracted from it. An assignment takes a worker's slots under the worker row's lock and
-- holds it until its commit, so the worker's RECORD, needing the same row, waited for the
-- planner's commit (its WAL flush), and the planner's next assignment for the worker's:
-- the two alternated on every worker row (profile: ~2 s of the 6.8 s RECORD took, W1).
--
-- Now the count is split in two counters that only grow, on two rows:
--
-- * `workers.taken`: tasks ever given to the worker, raised under the worker row's lock by
--   whatever gives it a task (an assignment, a handover), as `held` was;
-- * `worker_released.released`: tasks the worker ever stopped holding (finished, given
--   back, taken back, moved away), raised on a row of its own that no assignment locks.
--
-- The worker holds `taken - released`. An assignment reads `taken` under the worker row's
-- lock (the latest version, as before) and `released` without a lock: a `released` read
-- from an older snapshot is only smaller, never larger (it only grows), so the free slots
-- an assignment sees are at most the true ones — two or three planners still never give a
-- worker more than its capacity. A finishing worker writes only its own `released` row.
--
-- `workers.held` stays, for display only (the workers' list, the dashboard): it is set to
-- `taken - released` at each assignment and each heartbeat of the worker.

alter table artex.workers add column taken bigint not null default 0;

comment on column artex.workers.taken is
    'Tasks ever given to the worker (only grows); it holds taken minus worker_released.released.';
comment on column artex.workers.held is
    'Tasks the worker holds, for display: taken - released as of its last assignment or heartbeat.';

update artex.workers set taken = held;

-- No foreign key: its check would take a key-share lock on the worker row, the very row
-- this table keeps out of reach. A worker's row goes with it (trigger below): a worker
-- registered again under the same id starts from zero on both counters.
create table artex.worker_released (
    worker text primary key,
    released bigint not null default 0
);

comment on table artex.worker_released is
    'Tasks each worker ever stopped holding (only grows); written without the worker row''s lock.';

create function artex.workers_forget_released() returns trigger language plpgsql as $$
begin
    delete from artex.worker_released r using old_rows o where r.worker = o.id;
    return null;
end
$$;

create trigger workers_forget_released after delete on artex.workers
    referencing old table as old_rows
    for each statement execute function artex.workers_forget_released();

-- The change of what one statement's rows hold per worker (same signature as V5's, the
-- tasks triggers call it unchanged). Gains go to `workers.taken`, worker rows locked in
-- id order (two planners, a planner and a handover wait for each other instead of
-- deadlocking); `held` is refreshed for display on the way. Losses go to
-- `worker_released`, its rows upserted in worker order for the same reason.
create or replace function artex.apply_held(deltas jsonb) returns void language sql as $$
    with d as (
        select key as worker, value::int as delta from jsonb_each_text(deltas)
    ),
    locked as materialized (
        select w.id from artex.workers w join d on w.id = d.worker
        where d.delta > 0
        order by w.id
        for update of w
    ),
    gained as (
        update artex.workers w
        set taken = w.taken + d.delta,
            held = least(greatest(w.taken + d.delta - coalesce(
                (select r.released from artex.worker_released r where r.worker = w.id), 0),
                0), 2147483647)::int
        from d, locked
        where w.id = d.worker and w.id = locked.id
        returning 1
    ),
    lost as (
        insert into artex.worker_released as r (worker, released)
        select worker, -delta from d where delta < 0 order by worker
        on conflict (worker) do update set released = r.released + excluded.released
        returning 1
    )
    select
$$;

-- A fleet, not a box: capacity as a fact of the blackboard, and liveness the planner can
-- see for itself.
--
-- Capacity. Each planner used to count a worker's free slots on its own (a count of held
-- tasks per worker, every round): two planners could each fill the same free slots, and
-- with thousands of workers the count dominated a round. Now `workers.held` is the number
-- of tasks the worker holds (assigned or running), kept by the database in the same
-- statement as every change of a task's holder, and an assignment takes a worker's slots
-- under the worker row's lock: several planners never give a worker more than its
-- capacity, and the roster is a read of the workers table.
--
-- Leases. An assignment gets the lease its worker renews (`workers.lease_ms`), not
-- the planner's: a task assigned with a long lease to a worker that dies before its
-- first renewal would wait that long to be taken back.
--
-- Liveness. A worker's LISTEN session carries an application name of its own, recorded
-- in `workers.session`; while that session's backend is gone (the process was killed, its
-- host is cut off) the planner sees it missing from pg_stat_activity and assigns it
-- nothing, long before its heartbeats are missed.

alter table artex.workers
    add column held integer not null default 0,
    add column session text check (session <> '' and length(session) < 64),
    add column lease_ms integer check (lease_ms > 0);

comment on column artex.workers.held is
    'Tasks the worker holds (assigned or running), kept by the tasks triggers.';
comment on column artex.workers.session is
    'application_name of the worker''s LISTEN session; NULL for a worker without one.';
comment on column artex.workers.lease_ms is
    'The lease the worker renews; assignments to it get the same (the planner''s own when NULL).';

update artex.workers w
set held = (select count(*) from artex.tasks t
            where t.assigned_to = w.id and t.status in ('assigned', 'running'));

-- The change of `held` per worker that one statement's rows make. Worker rows are locked
-- in id order, so two statements changing the same workers (two planners, a planner and
-- a reaper) wait for each other instead of deadlocking.
create function artex.apply_held(deltas jsonb) returns void language sql as $$
    with d as (
        select key as worker, value::int as delta from jsonb_each_text(deltas)
    ),
    locked as materialized (
        select w.id from artex.workers w join d on w.id = d.worker
        order by w.id
        for update of w
    )
    update artex.workers w set held = greatest(w.held + d.delta, 0)
    from d, locked
    where w.id = d.worker and w.id = locked.id
$$;

-- Transition tables carry no statistics: hash joins only, and no JIT for statements of a
-- few milliseconds (see V3).
create function artex.tasks_held_after_update() returns trigger language plpgsql
set enable_nestloop = off set jit = off as $$
declare
    deltas jsonb;
begin
    select jsonb_object_agg(worker, delta) into deltas
    from (
        select worker, sum(delta) as delta
        from (
            select o.assigned_to as worker, -1 as delta
            from old_rows o join new_rows n using (id)
            where o.assigned_to is not null and o.status in ('assigned', 'running')
              and (n.status not in ('assigned', 'running')
                   or n.assigned_to is distinct from o.assigned_to)
            union all
            select n.assigned_to, 1
            from old_rows o join new_rows n using (id)
            where n.assigned_to is not null and n.status in ('assigned', 'running')
              and (o.status not in ('assigned', 'running')
                   or n.assigned_to is distinct from o.assigned_to)
        ) changes
        group by worker
        having sum(delta) <> 0
    ) per_worker;
    if deltas is not null then
        perform artex.apply_held(deltas);
    end if;
    return null;
end
$$;

create trigger tasks_held_after_update after update on artex.tasks
    referencing old table as old_rows new table as new_rows
    for each statement execute function artex.tasks_held_after_update();

create function artex.tasks_held_after_insert() returns trigger language plpgsql
set jit = off as $$
declare
    deltas jsonb;
begin
    select jsonb_object_agg(worker, delta) into deltas
    from (
        select assigned_to as worker, count(*) as delta
        from new_rows
        where assigned_to is not null and status in ('assigned', 'running')
        group by assigned_to
    ) per_worker;
    if deltas is not null then
        perform artex.apply_held(deltas);
    end if;
    return null;
end
$$;

create trigger tasks_held_after_insert after insert on artex.tasks
    referencing new table as new_rows
    for each statement execute function artex.tasks_held_after_insert();

-- A worker reads big payloads a few at a time, within a memory budget: it needs their
-- sizes before it reads them. Kept per row when the payload is written (a row trigger
-- that fires only when `payload` is set), so the read sums integers instead of turning
-- every held payload into text. Rows written before this migration have none; the read
-- measures those itself.
alter table artex.tasks add column payload_bytes integer;

create function artex.tasks_measure_payload() returns trigger language plpgsql as $$
begin
    new.payload_bytes := octet_length(new.payload::text);
    return new;
end
$$;

create trigger tasks_measure_payload before insert or update of payload on artex.tasks
    for each row execute function artex.tasks_measure_payload();

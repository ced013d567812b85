-- V64: a fair kind's task comes carried in its worker's wake-up, with its priority and
-- limit key (issue 37). Expand.
--
-- Since V44 the round's write did not carry a fair kind's tasks: the worker's local queue
-- takes their turns by priority and limit key, which the carried array did not hold, so
-- the worker got a plain wake-up and read them (`claim_and_read`, a round trip and a
-- statement per wake-up). On an idle fleet that read was one of the 5.5 ms a fair kind's
-- task waited from its insert to its start (the `fair` bench part), against 2.5 ms for a
-- kind without limits. A fair kind's carried array now ends with its traceparent (or
-- null), its priority and its limit key; the worker queues it by turns as it queues what
-- it reads. A worker of an earlier build cannot parse that longer array: it logs so and
-- reads the wake-up's tasks from the blackboard, as it did before.

create or replace function artex.assign_and_wake(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs double precision, p_limited uuid[]) RETURNS TABLE(task uuid, worker text, wake_addr text, payload text, notified text, task_traceparent text, task_run_at timestamp with time zone)
language plpgsql
set plan_cache_mode = force_generic_plan
as $_$
#variable_conflict use_column
begin
    p_limited := artex.over_limits(p_limited);
    perform set_config('artex.hot', 'on', true);
    -- pending → assigned, with the next fencing token; each worker's holdings counted.
    return query with room as materialized (
        select w.id,
               greatest(w.capacity - greatest(w.taken - coalesce(r.released, 0), 0), 0) as free,
               w.lease_ms, w.host
        from artex.workers w left join artex.worker_released r on r.worker = w.id
        where w.id = any($3::text[]) and w.state = 'online'
        order by w.id
        for update of w
    ),
    wanted as (
        select v.id, v.worker, row_number() over (partition by v.worker order by v.n) as k
        from unnest($2::uuid[], $3::text[]) with ordinality as v(id, worker, n)
        where v.id <> all($5::uuid[])
    ),
    assigned as (
        update artex.tasks t
        set status = 'assigned', assigned_to = wanted.worker,
            lease_until = now() + coalesce(make_interval(secs => room.lease_ms / 1000.0),
                                           make_interval(secs => $4::float8)),
            lease_epoch = t.lease_epoch + 1, updated_at = now(),
            limited = t.limited or t.kind in (select kind from artex.kind_limits)
        from artex.set_context($1, 'assigned') ctx, wanted, room
        where ctx and wanted.worker = room.id and wanted.k <= room.free
          and t.id = wanted.id and t.status::text = 'pending' -- by primary key: see RECORD
          and (t.host is null or t.host = room.host)
        returning t.id, t.assigned_to, t.kind, t.payload, t.lease_epoch, t.retries,
                  t.max_retries, t.timeout_ms, t.checkpoint, t.flow_id, t.payload_bytes,
                  t.xmin::text::int8 as version, t.lease_until, t.priority, t.run_at,
                  t.limited, t.traceparent, t.limit_key
    ),
    counted as (
        update artex.workers w
        set taken = w.taken + g.n,
            held = least(greatest(w.taken + g.n - coalesce(
                (select r.released from artex.worker_released r where r.worker = w.id), 0),
                0), 2147483647)::int
        from (select a.assigned_to as worker, count(*) as n from assigned a group by 1) g
        where w.id = g.worker
    ),
    -- The wake-ups, from the rows just written (V35; before, `wake_round` read them
    -- again in a transaction of its own): each chosen worker's tasks as its own read
    -- would return them, with the row version's `xmin` and the lease's end, in start
    -- order, in notifications of at most ~7,500 bytes; a task longer than 1,000 bytes as
    -- JSON is not carried (its worker gets a plain wake-up and reads it), nor one whose
    -- payload or checkpoint could not fit (measured before it is written: V27). A fair
    -- kind's task carries its traceparent (or null), priority and limit key after the
    -- rest (V64): the worker's local queue takes turns by them.
    held as materialized (
        select a.id, a.assigned_to as worker, a.traceparent, a.run_at,
               case when coalesce(a.payload_bytes, octet_length(a.payload::text)) <= 1000
                     and coalesce(pg_column_size(a.checkpoint), 0) <= 1000
               then case when a.limited
                          and a.kind in (select kind from artex.kind_limits where fair)
                    then json_build_array(a.id, a.kind, a.payload, a.lease_epoch, a.retries,
                        a.max_retries, a.timeout_ms, a.checkpoint, a.flow_id,
                        coalesce(a.payload_bytes, octet_length(a.payload::text)),
                        a.version,
                        (extract(epoch from a.lease_until) * 1000)::float8,
                        a.traceparent, a.priority, a.limit_key)::text
                    when a.traceparent is null
                    then json_build_array(a.id, a.kind, a.payload, a.lease_epoch, a.retries,
                        a.max_retries, a.timeout_ms, a.checkpoint, a.flow_id,
                        coalesce(a.payload_bytes, octet_length(a.payload::text)),
                        a.version,
                        (extract(epoch from a.lease_until) * 1000)::float8)::text
                    else json_build_array(a.id, a.kind, a.payload, a.lease_epoch, a.retries,
                        a.max_retries, a.timeout_ms, a.checkpoint, a.flow_id,
                        coalesce(a.payload_bytes, octet_length(a.payload::text)),
                        a.version,
                        (extract(epoch from a.lease_until) * 1000)::float8,
                        a.traceparent)::text
                    end
               end as task,
               row_number() over (partition by a.assigned_to
                                  order by a.priority desc, a.run_at, a.id) as n
        from assigned a
    ),
    carried as (
        select worker, n, task,
               sum(octet_length(task) + 1) over (partition by worker order by n) as upto
        from held where octet_length(task) <= 1000
    ),
    notes as (
        select worker, '[' || string_agg(task, ',' order by n) || ']' as payload
        from carried group by worker, upto / 6500
        union all
        select worker, '' from held where task is null or octet_length(task) > 1000
        union all
        select id, '' from artex.workers
        where id = any($3::text[]) and id not in (select worker from held)
    )
    -- The tasks assigned first (worker columns null), then the wake-ups by worker (task
    -- null). Those woken over HTTP come back as rows the planner pushes after the commit,
    -- the others are notified on their channels, which PostgreSQL delivers at the commit.
    select h.id, null::text, null::text, null::text, null::text, h.traceparent, h.run_at
    from held h
    union all
    (select null::uuid, w.id, w.wake_addr,
            case when w.wake_addr is not null then notes.payload end,
            case when w.wake_addr is null then pg_notify(w.channel, notes.payload)::text end,
            null::text, null::timestamptz
     from notes join artex.workers w on w.id = notes.worker
     order by w.id);
    perform set_config('artex.hot', '', true);
end
$_$;

comment on function artex.assign_and_wake(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs double precision, p_limited uuid[]) is 'The planner round''s write: the assignments, each worker''s slots under its row lock, within the kinds'' limits; the fencing tokens and the workers'' holdings in the same statement (V25); and the chosen workers'' wake-ups with the tasks they carry (V35), a fair kind''s with its priority and limit key (V64), a traced task with its traceparent (V45). Called by planner/dispatch.rs (ASSIGN_CALL); the statement lives only here.';

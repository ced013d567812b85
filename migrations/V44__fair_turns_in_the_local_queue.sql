-- V44: a fair kind's turns in the worker's local queue too (issue 37). Expand: the read
-- of a worker's assignments gains two trailing columns (older builds read by position
-- and never look past theirs), and the round's write stops carrying a fair kind's
-- tasks in its wake-ups (their worker reads them, as it does any task not carried).
--
-- A worker keeps about 100 ms of work in its local queue (worker/depth.rs), in the order
-- it read it. The round hands a fair kind's tasks out by turns across their limit keys
-- (V43), but a new key's task then waits behind the queued tasks of the key with the
-- backlog: 20 ms tasks behind a 20,000-task key waited 31 times as long as on an idle
-- fleet. The worker now takes a fair kind's queued tasks by turns as well
-- (worker/turns.rs), for which it needs each task's priority and limit key: the read
-- returns them, and the wake-up does not carry these tasks (the carried format stays
-- what older builds parse).

drop function artex.read_assigned(text, bigint, bigint, boolean);

create function artex.read_assigned(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text)
language plpgsql
set plan_cache_mode = force_generic_plan
as $_$
#variable_conflict use_column
begin
    return query select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
        checkpoint, flow_id, payload_bytes,
        (extract(epoch from lease_until - clock_timestamp()) * 1000)::float8,
        null::text, null::float8, n, priority, limit_key
    from (select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
                 checkpoint, flow_id, lease_until, priority, limit_key,
                 coalesce(payload_bytes, octet_length(payload::text))::bigint as payload_bytes,
                 sum(coalesce(payload_bytes, octet_length(payload::text))) over
                     (order by priority desc, run_at, id rows unbounded preceding) as upto,
                 row_number() over (order by priority desc, run_at, id) as n
          from artex.tasks
          where assigned_to = $1 and status = 'assigned'
          order by priority desc, run_at, id
          limit $2) t
    where upto <= $3 or (n = 1 and $4)
    union all
    select null, null, null, null, null, null, null, null, null, null, null,
           pg_current_snapshot()::text, (extract(epoch from clock_timestamp()) * 1000)::float8, 0,
           null, null
    order by n;
end
$_$;

comment on function artex.read_assigned is
    'A worker''s read of the tasks assigned to it and not started, with their priority and limit key (V44). Called by worker/attempts.rs (FETCH_CALL); the statement lives only here.';

create or replace function artex.assign_and_wake(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs double precision, p_limited uuid[]) RETURNS TABLE(task uuid, worker text, wake_addr text, payload text, notified text)
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
                  t.xmin::text::int8 as version, t.lease_until, t.priority, t.run_at, t.limited
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
    -- payload or checkpoint could not fit (measured before it is written: V27), nor
    -- (V44) one of a fair kind: the read brings its priority and limit key, which the
    -- worker's local queue takes turns by.
    held as materialized (
        select a.id, a.assigned_to as worker,
               case when coalesce(a.payload_bytes, octet_length(a.payload::text)) <= 1000
                     and coalesce(pg_column_size(a.checkpoint), 0) <= 1000
                     and not (a.limited and a.kind in (select kind from artex.kind_limits where fair))
               then json_build_array(a.id, a.kind, a.payload, a.lease_epoch, a.retries,
                   a.max_retries, a.timeout_ms, a.checkpoint, a.flow_id,
                   coalesce(a.payload_bytes, octet_length(a.payload::text)),
                   a.version,
                   (extract(epoch from a.lease_until) * 1000)::float8)::text
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
    select h.id, null::text, null::text, null::text, null::text from held h
    union all
    (select null::uuid, w.id, w.wake_addr,
            case when w.wake_addr is not null then notes.payload end,
            case when w.wake_addr is null then pg_notify(w.channel, notes.payload)::text end
     from notes join artex.workers w on w.id = notes.worker
     order by w.id);
    perform set_config('artex.hot', '', true);
end
$_$;

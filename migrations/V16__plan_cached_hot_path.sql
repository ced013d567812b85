-- V16: the hot path's statements run inside functions whose plans PostgreSQL caches
-- (issue 23). Expand: functions only.
--
-- Every statement artex sends is unnamed, so that a transaction pooler can carry it
-- (issue 22): parsed and planned at every call. For the planner's round and a worker's
-- batch the planning cost more than the execution (the round's read: 1.5 ms planning,
-- 0.8 ms execution on a small table), and the path from an insert to its handler's
-- start runs four of them. A PL/pgSQL function keeps the plans of its statements for
-- the life of the server session, whoever borrows it (PostgreSQL plans the first five
-- calls with their values, then settles on a generic plan unless it costs more), so
-- these statements are sent as `select * from artex.<function>($1, …)`: a call that
-- is planned in microseconds.
--
-- Each function's statement is the text of the Rust constant named beside it, with
-- its parameters as $1, $2, … (PL/pgSQL's names for the function's arguments); a test
-- (`tests/blackboard/plans.rs`) checks they are the same text, so a change to one of
-- those constants needs a migration that replaces the function. `#variable_conflict
-- use_column`: a name that is both a column and an output column means the column, as
-- it did in the statement.

create or replace function artex.dispatch_round(p_alive_secs float8, p_batch int8, p_shard_count int4, p_shards int4[], p_unreachable text[])
returns table (worker text, kinds text[], capacity integer, held integer, host text, task uuid, task_kind text, task_host text, wake_addr text)
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
    return query with roster as materialized (
        select w.id, w.kinds, w.capacity,
               least(greatest(w.taken - coalesce(r.released, 0), 0), 2147483647)::int4 as held,
               w.host, w.wake_addr
        from artex.workers w left join artex.worker_released r on r.worker = w.id
        where w.state = 'online'
          and w.last_seen > now() - make_interval(secs => $1::float8)
          and (w.session is null
               or w.session in (select application_name from pg_stat_activity))
          and w.id <> all($5::text[])
    ),
    claimed as (
        select id, kind, host from artex.tasks
        where listed = 'pending' and run_at <= now()
          and kind = any(array(select distinct unnest(r.kinds) from roster r
                               where r.capacity > r.held))
          and ($3::int4 <= 1 or shard % $3::int4 = any($4::int4[]))
        order by priority desc, run_at, id
        limit least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                               from roster r))
        for update skip locked
    )
    select r.id, r.kinds, r.capacity, r.held, r.host, null::uuid, null::text, null::text,
           r.wake_addr
    from roster r
    union all
    select null, null, null, null, null, c.id, c.kind, c.host, null from claimed c;
end
$fn$;

comment on function artex.dispatch_round is
    'The planner round''s read: the roster and the claim (planner/dispatch.rs, DISPATCH). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

create or replace function artex.assign_round(p_actor text, p_tasks uuid[], p_workers text[], p_lease_secs float8)
returns setof uuid
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
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
    )
    update artex.tasks t
    set status = 'assigned', assigned_to = wanted.worker,
        lease_until = now() + coalesce(make_interval(secs => room.lease_ms / 1000.0),
                                       make_interval(secs => $4::float8))
    from artex.set_context($1, 'assigned') ctx, wanted, room
    where ctx and wanted.worker = room.id and wanted.k <= room.free
      and t.id = wanted.id and t.status::text = 'pending' -- by primary key: see RECORD
      and (t.host is null or t.host = room.host)
    returning t.id;
end
$fn$;

comment on function artex.assign_round is
    'The planner round''s write: the assignments, each worker''s slots under its row lock (planner/dispatch.rs, ASSIGN). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

create or replace function artex.wake_round(p_workers text[], p_tasks uuid[])
returns table (worker text, wake_addr text, payload text, notified text)
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
    return query with held as materialized (
        select t.assigned_to as worker,
               json_build_array(t.id, t.kind, t.payload, t.lease_epoch, t.retries,
                   t.max_retries, t.timeout_ms, t.checkpoint, t.flow_id,
                   coalesce(t.payload_bytes, octet_length(t.payload::text)),
                   t.xmin::text::int8,
                   (extract(epoch from t.lease_until) * 1000)::float8)::text as task,
               row_number() over (partition by t.assigned_to
                                  order by t.priority desc, t.run_at, t.id) as n
        from artex.tasks t
        where t.id = any($2::uuid[]) and t.status::text = 'assigned'
          and t.assigned_to = any($1::text[])
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
        select worker, '' from held where octet_length(task) > 1000
        union all
        select id, '' from artex.workers
        where id = any($1::text[]) and id not in (select worker from held)
    )
    select w.id, w.wake_addr,
           case when w.wake_addr is not null then notes.payload end,
           case when w.wake_addr is null then pg_notify(w.channel, notes.payload)::text end
    from notes join artex.workers w on w.id = notes.worker
    order by w.id;
end
$fn$;

comment on function artex.wake_round is
    'The chosen workers'' wake-ups with the tasks they carry (planner/dispatch.rs, WAKE). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

create or replace function artex.record_attempts(p_worker text, p_ids uuid[], p_epochs int8[], p_statuses text[], p_results jsonb[], p_errors text[], p_failed bool[], p_delays_ms float8[], p_started_ago_ms float8[])
returns setof uuid
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
    return query update artex.tasks t
    set status = v.status::artex.task_status,
        result = v.result,
        error = coalesce(v.error, t.error),
        retries = t.retries + v.failed::int,
        run_at = case when v.status = 'pending'
                      then now() + make_interval(secs => v.delay_ms / 1000.0) else t.run_at end,
        started_at = case when t.status = 'assigned' and v.started_ago_ms is not null
                          then now() - make_interval(secs => v.started_ago_ms / 1000.0)
                          else t.started_at end
    from artex.set_context($1, null) ctx, artex.defer_wakeups() deferred,
         unnest($2::uuid[], $3::int8[], $4::text[], $5::jsonb[], $6::text[], $7::bool[],
                $8::float8[], $9::float8[])
             as v(id, epoch, status, result, error, failed, delay_ms, started_ago_ms)
    where ctx and deferred and t.id = v.id and t.lease_epoch = v.epoch and t.assigned_to = $1
      and (t.status::text = 'running'
           or (t.status::text = 'assigned'
               and (v.started_ago_ms is not null or v.status = 'pending')))
    returning t.id;
end
$fn$;

comment on function artex.record_attempts is
    'A worker''s batch of starts and outcomes (worker/attempts.rs, RECORD). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

create or replace function artex.read_assigned(p_worker text, p_limit int8, p_max_bytes int8, p_holds_nothing bool)
returns table (id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms float8, snapshot text, db_clock_ms float8, n bigint)
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
    return query select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
        checkpoint, flow_id, payload_bytes,
        (extract(epoch from lease_until - clock_timestamp()) * 1000)::float8,
        null::text, null::float8, n
    from (select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
                 checkpoint, flow_id, lease_until,
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
           pg_current_snapshot()::text, (extract(epoch from clock_timestamp()) * 1000)::float8, 0
    order by n;
end
$fn$;

comment on function artex.read_assigned is
    'A worker''s read of the tasks assigned to it and not started (worker/attempts.rs, FETCH). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

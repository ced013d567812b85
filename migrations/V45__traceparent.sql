-- V45: a task carries the W3C trace context it was submitted in (issue 37, item 1:
-- OpenTelemetry traces from the submitter to the handler). Expand: a nullable column,
-- a check that only a set value meets, and `artex.submit` with one more argument that
-- defaults to none (a call with the fourteen before it, an older build's or a user's,
-- submits as before); the round's write and a worker's read return it (the columns an
-- older build reads are where they were).
--
-- `traceparent` is the W3C header's value (https://www.w3.org/TR/trace-context/):
-- version-traceid-spanid-flags in lowercase hex, `00-<32>-<16>-<2>`; version ff and
-- all-zero ids are invalid. The submitting process stores its submission span's context
-- here; the planner and the worker get it from the hot path's own reads (below) to make
-- their spans children of it. Plain-SQL
-- inserts that leave it out keep working: a task without it is simply not traced.
-- The check is NOT VALID: every existing row holds NULL, and a check that scanned the
-- table would hold its lock for the scan; new and updated rows are checked.

alter table artex.tasks add column traceparent text;
alter table artex.tasks add constraint tasks_traceparent_check
    check (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
           and left(traceparent, 2) <> 'ff'
           and substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
           and substr(traceparent, 37, 16) <> '0000000000000000') not valid;
comment on column artex.tasks.traceparent is
    'The W3C trace context (traceparent header value) the task was submitted in, or NULL: its spans are children of it (V45, docs/tracing.md).';

drop function artex.submit(text, jsonb, integer, timestamptz, integer, integer, text, text,
                           interval, boolean, text, text, text[], text);
create function artex.submit(
    kind text,
    payload jsonb default '{}',
    priority integer default 0,
    run_at timestamptz default null,
    max_retries integer default null,
    timeout_ms integer default null,
    shard_key text default null,
    unique_key text default null,
    unique_for interval default null,
    allow_unregistered_kind boolean default false,
    actor text default null,
    reason text default null,
    tags text[] default null,
    limit_key text default null,
    traceparent text default null)
returns table (id uuid, duplicate boolean)
language plpgsql as $$
#variable_conflict use_variable
declare
    existing uuid;
    new_id uuid;
begin
    if kind is null then
        raise exception 'artex.submit: kind must not be null' using errcode = 'not_null_violation';
    end if;
    if payload is null then
        raise exception 'artex.submit: payload must not be null (''{}'' for none)'
            using errcode = 'not_null_violation';
    end if;
    if max_retries is not null and (max_retries < 0 or max_retries > 1000) then
        raise exception 'artex.submit: max_retries %; expected 0 to 1000', max_retries
            using errcode = 'check_violation';
    end if;
    if timeout_ms is not null and timeout_ms <= 0 then
        raise exception 'artex.submit: timeout_ms %; expected a positive number of milliseconds',
            timeout_ms using errcode = 'check_violation';
    end if;
    if unique_for is not null and (unique_key is null or unique_for < interval '0') then
        raise exception 'artex.submit: unique_for % needs a unique_key and must not be negative',
            unique_for using errcode = 'check_violation';
    end if;
    if traceparent is not null
       and (traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            or left(traceparent, 2) = 'ff'
            or substr(traceparent, 4, 32) = '00000000000000000000000000000000'
            or substr(traceparent, 37, 16) = '0000000000000000') then
        raise exception 'artex.submit: traceparent %; expected a W3C traceparent: version-traceid-spanid-flags in lowercase hex (00-<32 hex>-<16 hex>-<2 hex>), ids not all zero',
            quote_literal(traceparent) using errcode = 'check_violation';
    end if;
    if not allow_unregistered_kind and artex.is_kind_name(kind)
       and not exists (select 1 from artex.kinds k where k.kind = submit.kind) then
        raise exception 'artex.submit: no worker has declared kind %', quote_literal(kind)
            using errcode = 'check_violation',
                  hint = 'start a worker that handles it, or pass allow_unregistered_kind => true';
    end if;
    if unique_key is not null then
        perform artex.lock_unique_key(unique_key);
        existing := artex.task_with_unique_key(unique_key, unique_for);
        if existing is not null then
            return query select existing, true;
            return;
        end if;
    end if;
    if actor is not null or reason is not null then
        perform artex.set_context(coalesce(actor, current_user::text), coalesce(reason, 'submitted'));
    end if;
    insert into artex.tasks as t (kind, payload, priority, run_at, max_retries, timeout_ms,
                                  shard_key, unique_key, tags, limit_key, traceparent)
    values (kind, payload, coalesce(priority, 0), coalesce(run_at, now()),
            coalesce(max_retries, artex.default_max_retries(kind)), timeout_ms, shard_key,
            unique_key, tags, limit_key, traceparent)
    returning t.id into new_id;
    return query select new_id, false;
end
$$;
comment on function artex.submit is
    'Submits a task inside the caller''s transaction, with every check the CLI and the API make; tags and limit_key are checked by the table; traceparent (W3C) is the trace the task joins (V45); returns its id, or the existing task''s id with duplicate = true when a task with unique_key is unfinished (or finished within unique_for).';

-- The hot path hands the context on where it already reads the row, so no process reads
-- it again: a round's write returns each assigned task's context and the time it became
-- runnable (the planner's queue and assignment spans), and a wake-up carries a traced
-- task's context as a 13th element of its array (an untraced task's array is as before,
-- so an older worker reads every untraced wake-up as it did); a worker's read returns it
-- as a last column. The plans are unchanged: the same rows, one more column of each.
-- Both functions change their result's shape, so they are dropped and made again;
-- older planners and workers read their columns by position and ignore the new ones.
drop function artex.assign_and_wake(text, uuid[], text[], double precision, uuid[]);
create function artex.assign_and_wake(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs double precision, p_limited uuid[]) RETURNS TABLE(task uuid, worker text, wake_addr text, payload text, notified text, task_traceparent text, task_run_at timestamp with time zone)
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
                  t.limited, t.traceparent
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
        select a.id, a.assigned_to as worker, a.traceparent, a.run_at,
               case when coalesce(a.payload_bytes, octet_length(a.payload::text)) <= 1000
                     and coalesce(pg_column_size(a.checkpoint), 0) <= 1000
                     and not (a.limited and a.kind in (select kind from artex.kind_limits where fair))
               then case when a.traceparent is null
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
comment on function artex.assign_and_wake(text, uuid[], text[], double precision, uuid[]) is
    'The planner round''s write: the assignments, each worker''s slots under its row lock, within the kinds'' limits; the fencing tokens and the workers'' holdings in the same statement (V25); and the chosen workers'' wake-ups with the tasks they carry (V35), not a fair kind''s (V44), a traced task with its traceparent (V45). Called by planner/dispatch.rs (ASSIGN_CALL); the statement lives only here.';

drop function artex.read_assigned(text, bigint, bigint, boolean);
create function artex.read_assigned(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text)
language plpgsql
set plan_cache_mode = force_generic_plan
as $_$
#variable_conflict use_column
begin
    return query select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
        checkpoint, flow_id, payload_bytes,
        (extract(epoch from lease_until - clock_timestamp()) * 1000)::float8,
        null::text, null::float8, n, priority, limit_key, traceparent
    from (select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
                 checkpoint, flow_id, lease_until, priority, limit_key, traceparent,
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
           null, null, null
    order by n;
end
$_$;
comment on function artex.read_assigned(text, bigint, bigint, boolean) is
    'A worker''s read of the tasks assigned to it and not started, with their priority and limit key (V44) and traceparent (V45). Called by worker/attempts.rs (FETCH_CALL); the statement lives only here.';

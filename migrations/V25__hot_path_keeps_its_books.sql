-- V25: the hot path keeps its own books, and a start written with its end is one history
-- row (issue 39). Expand: the functions' calls, results and effects are unchanged, and the
-- history reads as before through the view `task_transitions`; older builds read and
-- write through it and the triggers unchanged.
--
-- Every write of `tasks` ran the status machine's row trigger and three statement
-- triggers over the transition tables (the history, the workers' counters, the flows):
-- a third of PostgreSQL's time per task, for the two writes every task makes (its
-- assignment, and its start with its outcome). The two hot functions now write what those
-- triggers wrote in their own statement: `assign_round` bumps the fencing token and
-- counts the worker's new holdings; `record_attempts` applies the retry budget, releases
-- the holder, writes the history rows and the released counts, and hands the tasks it
-- ended to the flows (promotion, cancel cascade) after its statement. While one of them
-- runs, `artex.hot` is `on` for the transaction and the triggers step aside; every other
-- write (submissions, cancels, the reaper, operators' SQL, the flows' own updates) goes
-- through the triggers as before. The rows each path writes are the same: the status
-- model test and the history tests hold for both.
--
-- A task that starts and ends between two of its worker's flushes (most short tasks) got
-- two history rows in the write that ended it: assigned → running and running → its end.
-- Each row cost ~160 B of WAL, two index entries and their CPU. The write now stores one
-- row that holds both events: `started_at` (when the handler started) and `end_id` (the
-- end's event id, drawn right after the row's `id`, which is the start's).
--
-- - `artex.task_history` is the stored history (the partitioned table, renamed back to
--   its V10 name; partitions, indexes and the sequence keep theirs).
-- - `artex.task_transitions` is a view with one row per transition, as the table was:
--   `artex task show`, the API and every SQL reader see the same rows as before.
-- - The feed reads the stored rows by `(xid, id)` and gives a two-event row's events in
--   order; a position is still `(xid, event id)`, and event ids already handed out keep
--   their meaning. Retention and pruning count a row up to its last event.
alter table artex.task_transitions rename to task_history;
alter table artex.task_history
    add column started_at timestamptz,
    add column end_id bigint;

comment on table artex.task_history is
    'The audit trail and the change feed as stored: one row per transition, except a start and an end written together, one row holding both (V25). Read artex.task_transitions for one row per transition.';
comment on column artex.task_history.started_at is
    'Set on a row holding a start and an end (V25): when the handler started; the start''s event is the row''s id, the end''s end_id.';
comment on column artex.task_history.end_id is
    'Set on a row holding a start and an end (V25): the end''s event id, drawn right after the row''s id.';

create view artex.task_transitions as
    select h.id, h.task_id, h.from_status,
           case when h.end_id is null then h.to_status else 'running' end as to_status,
           case when h.end_id is null then h.reason else 'started' end as reason,
           h.actor, h.worker, h.lease_epoch,
           case when h.end_id is null then h.at else h.started_at end as at,
           h.xid, h.flow_id, h.kind, h.assigned_at
    from artex.task_history h
    union all
    select h.end_id, h.task_id, 'running'::artex.task_status, h.to_status, h.reason,
           h.actor, h.worker, h.lease_epoch, h.at, h.xid, h.flow_id, h.kind, null
    from artex.task_history h
    where h.end_id is not null;

comment on view artex.task_transitions is
    'The audit trail: one row per transition a task went through (a table until V25; now a view of artex.task_history).';

create function artex.hot_write() returns boolean
    language sql stable
    as $$
    select coalesce(current_setting('artex.hot', true) = 'on', false)
$$;

comment on function artex.hot_write() is
    'True while assign_round or record_attempts writes: they keep the history, the counters and the flows themselves, and the triggers of tasks step aside (V25).';

-- What the flows do when tasks end: dependents promoted when all their upstream tasks
-- succeeded, unfinished dependents canceled when one ended otherwise. Was the body of the
-- flows trigger; the trigger and record_attempts both call it.
create function artex.tasks_ended(p_ids uuid[], p_status artex.task_status[]) returns void
    language plpgsql
    as $$
declare
    saved_actor  text := coalesce(current_setting('artex.actor', true), '');
    saved_reason text := coalesce(current_setting('artex.reason', true), '');
    changed      boolean := false;
    ids          uuid[];
    ns           integer[];
    root         record;
begin
    -- Promotion.
    select array_agg(x.task_id order by x.task_id), array_agg(x.n order by x.task_id)
      into ids, ns
    from (select d.task_id, count(*)::int as n
          from artex.task_dependencies d
          where d.depends_on = any(array(select u.id
                                         from unnest(p_ids, p_status) as u(id, status)
                                         where u.status = 'succeeded'))
          group by d.task_id) x;
    if ids is not null then
        perform 1 from artex.task_waits w
        where w.task_id = any(ids) order by w.task_id for update;
        with counted as (
            update artex.task_waits w set upstream_left = w.upstream_left - v.n
            from unnest(ids, ns) as v(task_id, n)
            where w.task_id = v.task_id
            returning w.task_id, w.upstream_left
        )
        select array_agg(c.task_id order by c.task_id) into ids
        from counted c where c.upstream_left = 0;
        if ids is not null then
            perform 1 from artex.tasks t
            where t.id = any(ids) and t.status = 'blocked' order by t.id for update;
            perform artex.set_context(saved_actor, 'all upstream tasks succeeded');
            changed := true;
            -- Runnable from now on: queued behind what was runnable before it.
            update artex.tasks t set status = 'pending', run_at = greatest(t.run_at, now())
            where t.id = any(ids) and t.status = 'blocked';
        end if;
    end if;

    -- Cancel cascade, one ended upstream task at a time so that each canceled task's
    -- audit row names the task that caused it. Only roots with a downstream task still
    -- unfinished take a turn (canceling a whole flow at once makes none).
    for root in
        select t.id, t.flow_task, t.status::text as status
        from artex.tasks t
        where t.id = any(array(select u.id
                               from unnest(p_ids, p_status) as u(id, status)
                               where u.status <> 'succeeded'))
          and exists (select 1 from artex.task_dependencies d
                      join artex.tasks dt on dt.id = d.task_id
                      where d.depends_on = t.id
                        and dt.status not in ('succeeded', 'failed', 'timeout', 'canceled'))
        order by t.id
    loop
        with recursive down(id) as (
            select d.task_id from artex.task_dependencies d where d.depends_on = root.id
            union
            select d.task_id from down join artex.task_dependencies d on d.depends_on = down.id
        )
        select array_agg(t.id order by t.id) into ids
        from down join artex.tasks t on t.id = down.id
        where t.status not in ('succeeded', 'failed', 'timeout', 'canceled');
        continue when ids is null;
        perform 1 from artex.tasks t where t.id = any(ids) order by t.id for update;
        perform artex.set_context(saved_actor,
            format('upstream task %s (%s) ended %s',
                   coalesce(quote_literal(root.flow_task), 'outside any flow'), root.id,
                   root.status));
        changed := true;
        update artex.tasks t set status = 'canceled'
        where t.id = any(ids) and t.status not in ('succeeded', 'failed', 'timeout', 'canceled');
    end loop;

    if changed then
        perform artex.set_context(saved_actor, saved_reason);
    end if;
end
$$;

comment on function artex.tasks_ended(uuid[], artex.task_status[]) is
    'The flows'' response to tasks that ended (ids sorted, with their statuses): promotion of dependents, cancel cascade. Called by the flows trigger and by record_attempts (V25).';

create or replace function artex.tasks_after_update_flows() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
declare
    ended_ids    uuid[];
    ended_status artex.task_status[];
begin
    if artex.hot_write() then
        return null;
    end if;
    -- The tasks this statement ended. Transition tables carry no statistics, so they are
    -- never joined (a nested loop over two of them is quadratic): a terminal status can
    -- only be entered, never left or changed, so "ended now" is exactly "terminal in
    -- new_rows and not already terminal in old_rows", a set difference (hashed or
    -- sorted). Everything after looks up real tables by index with `= any(array)`.
    select array_agg(x.id order by x.id), array_agg(x.status order by x.id)
      into ended_ids, ended_status
    from (select id, status from new_rows
          where status in ('succeeded', 'failed', 'timeout', 'canceled')
          except
          select id, status from old_rows
          where status in ('succeeded', 'failed', 'timeout', 'canceled')) x;
    -- Most updates (lease renewals, checkpoints, assignments) end nothing: leave at once.
    if ended_ids is null then
        return null;
    end if;

    -- A worker woken over HTTP (wake_addr set) listens on no channel of its own: the
    -- planners listen on artex_wake and pass the cancel on to it.
    perform case when w.wake_addr is null then pg_notify(w.channel, 'cancel')
                 else pg_notify('artex_wake', 'cancel:' || w.id) end
    from artex.workers w
    where w.id in (select o.assigned_to from old_rows o
                   where o.status in ('assigned', 'running')
                     and o.id = any(array(select u.id
                                          from unnest(ended_ids, ended_status) as u(id, status)
                                          where u.status = 'canceled')));

    perform artex.tasks_ended(ended_ids, ended_status);
    return null;
end
$$;
create or replace function artex.make_history_partitions(p_now timestamp with time zone, p_ahead interval) RETURNS SETOF text
    LANGUAGE plpgsql
    SET lock_timeout TO '5s'
    AS $_$
declare
    width interval := artex.history_partition_width((select keep from artex.event_retention));
    lo    timestamptz;
    hi    timestamptz;
    part  text;
    made  integer := 0;
    ahead record;
    busy  boolean;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    -- After the retention was shortened: the empty partitions ahead that are wider than a
    -- slice is now are made again at the new width (the newest first, so what stays is
    -- contiguous), and shorter history leaves in smaller steps from then on.
    for ahead in select p.name, p.lo, p.hi from artex.history_partitions p
                 where p.lo > p_now order by p.lo desc loop
        exit when ahead.hi - ahead.lo <= width;
        execute format('select exists (select 1 from artex.%I)', ahead.name) into busy;
        exit when busy;
        execute format('drop table artex.%I', ahead.name);
        delete from artex.history_partitions p where p.name = ahead.name;
    end loop;
    select max(p.hi) into lo from artex.history_partitions p;
    if lo is null or lo < p_now - width then
        lo := date_bin(width, p_now, timestamptz '2000-01-01 00:00:00+00');
    end if;
    while lo < p_now + coalesce(p_ahead, width * 3) and made < 100 loop
        -- Slices end on multiples of the width (the first one may be shorter).
        hi := date_bin(width, lo, timestamptz '2000-01-01 00:00:00+00') + width;
        part := 'task_transitions_' || to_char(lo at time zone 'UTC', 'YYYYMMDD"_"HH24MISS');
        if exists (select 1 from artex.task_transitions_default d
                   where d.at >= lo and d.at < hi) then
            execute format('create table artex.%I (like artex.task_history)
                            with (autovacuum_vacuum_insert_threshold = -1)', part);
            execute format('with moved as (delete from artex.task_transitions_default d
                                            where d.at >= $1 and d.at < $2 returning d.*)
                            insert into artex.%I select * from moved', part) using lo, hi;
            execute format('alter table artex.task_history attach partition artex.%I
                            for values from (%L) to (%L)', part, lo, hi);
        else
            execute format('create table artex.%I partition of artex.task_history
                            for values from (%L) to (%L)
                            with (autovacuum_vacuum_insert_threshold = -1)', part, lo, hi);
        end if;
        insert into artex.history_partitions (name, lo, hi) values (part, lo, hi);
        made := made + 1;
        return next part;
        lo := hi;
    end loop;
end
$_$;

create or replace function artex.drop_history_partitions(p_now timestamp with time zone) RETURNS SETOF text
    LANGUAGE plpgsql
    SET lock_timeout TO '5s'
    AS $_$
declare
    keep    interval := (select r.keep from artex.event_retention r);
    cutoff  timestamptz := p_now - keep;
    slow_x  xid8;
    slow_i  bigint;
    part    record;
    needed  boolean;
    last_x  xid8;
    last_i  bigint;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    select c.last_xid, c.last_event into slow_x, slow_i
    from artex.event_cursors c where c.updated_at >= cutoff
    order by c.last_xid, c.last_event limit 1;
    for part in select p.name, p.hi from artex.history_partitions p
                where p.hi <= cutoff order by p.hi loop
        if slow_x is not null and part.hi > cutoff - keep then
            execute format('select exists (select 1 from artex.%I e
                                           where (e.xid, coalesce(e.end_id, e.id)) > ($1, $2) and e.xid > ''1''
                                             and e.to_status <> ''assigned''
                                             and e.from_status is distinct from e.to_status)',
                           part.name)
                into needed using slow_x, slow_i;
            exit when needed;
        end if;
        last_x := null;
        execute format('select e.xid, coalesce(e.end_id, e.id) from artex.%I e where e.xid > ''1''
                        order by e.xid desc, e.id desc limit 1', part.name)
            into last_x, last_i;
        execute format('drop table if exists artex.%I', part.name);
        delete from artex.history_partitions p where p.name = part.name;
        update artex.event_retention r
        set pruned_xid = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                              then last_x else r.pruned_xid end,
            pruned_id = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                             then last_i else r.pruned_id end,
            pruned_at = now();
        return next part.name;
    end loop;
end
$_$;

create or replace function artex.prune_history_rows(p_now timestamp with time zone, p_batch integer) RETURNS bigint
    LANGUAGE plpgsql
    SET lock_timeout TO '5s'
    AS $_$
declare
    keep    interval := (select r.keep from artex.event_retention r);
    cutoff  timestamptz := p_now - keep;
    width   interval := artex.history_partition_width(keep);
    slow_x  xid8;
    slow_i  bigint;
    part    record;
    n       bigint;
    total   bigint := 0;
    last_x  xid8;
    last_i  bigint;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    select c.last_xid, c.last_event into slow_x, slow_i
    from artex.event_cursors c where c.updated_at >= cutoff
    order by c.last_xid, c.last_event limit 1;
    for part in select p.name from artex.history_partitions p
                where isfinite(p.lo) and p.lo < cutoff and p.hi > cutoff
                  and p.hi - p.lo > width
                order by p.lo loop
        exit when total >= p_batch;
        execute format('with doomed as (
                            select e.ctid from artex.%I e
                            where e.at < $1
                              and ($3::xid8 is null or e.at < $1 - $5
                                   or (e.xid, coalesce(e.end_id, e.id)) <= ($3, $4))
                            order by e.at limit $2),
                        gone as (
                            delete from artex.%I e using doomed where e.ctid = doomed.ctid
                            returning e.xid, coalesce(e.end_id, e.id) as id),
                        top as (
                            select g.xid, g.id from gone g where g.xid > ''1''
                            order by g.xid desc, g.id desc limit 1)
                        select (select count(*) from gone), top.xid, top.id
                        from (select 1) one left join top on true',
                       part.name, part.name)
            into n, last_x, last_i
            using cutoff, p_batch - total, slow_x, slow_i, keep;
        total := total + n;
        if last_x is not null then
            update artex.event_retention r
            set pruned_xid = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                                  then last_x else r.pruned_xid end,
                pruned_id = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                                 then last_i else r.pruned_id end,
                pruned_at = now();
        end if;
    end loop;
    return total;
end
$_$;

create or replace function artex.tasks_after_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
begin
    insert into artex.task_history
        (task_id, from_status, to_status, reason, actor, lease_epoch, flow_id, kind)
    select n.id, null, n.status, coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0, n.flow_id, n.kind
    from new_rows n;
    if not artex.wakeups_deferred() then
        perform pg_notify('artex_events', '');
    end if;
    if exists (select 1 from new_rows where status = 'pending') then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

create or replace function artex.tasks_after_update() RETURNS trigger
    LANGUAGE plpgsql
    SET enable_nestloop TO 'off'
    SET jit TO 'off'
    AS $$
declare
    wake   boolean;
    events boolean;
begin
    -- The hot functions (assign_round, record_attempts) keep the history, the counters
    -- and the flows in their own statement (V25).
    if artex.hot_write() then
        return null;
    end if;
    with pairs as materialized (
        select n.id, n.flow_id, n.kind, n.error, n.lease_epoch, n.started_at,
               o.status as old_status, n.status as new_status, o.lease_epoch as old_epoch,
               o.updated_at as old_at, o.assigned_to as old_worker,
               coalesce(n.assigned_to, o.assigned_to) as worker,
               o.status = 'assigned' and n.status not in ('assigned', 'running', 'canceled')
                   and n.started_at is not null
                   and n.started_at is distinct from o.started_at as ran
        from new_rows n join old_rows o using (id)
        where (n.status <> o.status and n.status <> 'assigned')
           -- A handover (hot upgrade) moves a held task to another worker without a
           -- status change; it is recorded all the same (not in the feed).
           or (n.status = o.status and n.assigned_to is distinct from o.assigned_to
               and n.assigned_to is not null)
    ),
    changed as materialized (
        -- An assignment that ends without a start (given back, reclaimed, canceled,
        -- ended, or handed over to another worker before it started).
        select p.id, p.flow_id, p.kind, 0 as step, 'pending'::artex.task_status as from_status,
               'assigned'::artex.task_status as to_status, p.old_worker as worker,
               p.old_epoch as lease_epoch, 'assigned'::text as reason, p.old_at as at,
               null::timestamptz as assigned_at
        from pairs p
        where p.old_status = 'assigned' and p.new_status <> 'running' and not p.ran
        union all
        select p.id, p.flow_id, p.kind, 1, p.old_status,
               case when p.ran then 'running'::artex.task_status else p.new_status end,
               p.worker, p.lease_epoch,
               case when p.old_status = p.new_status
                    then coalesce(artex.current_reason(), 'handed over')
                    when p.ran then 'started'
                    when p.old_status = 'assigned' and p.new_status = 'running'
                    then coalesce(artex.current_reason(), 'started')
                    else coalesce(artex.current_reason(),
                                  case when p.new_status in ('failed', 'pending')
                                        and p.old_status = 'running' then p.error end)
               end,
               case when p.ran then p.started_at else now() end,
               case when p.old_status = 'assigned'
                         and (p.ran or p.new_status = 'running') then p.old_at end
        from pairs p
        union all
        select p.id, p.flow_id, p.kind, 2, 'running', p.new_status, p.worker, p.lease_epoch,
               coalesce(artex.current_reason(),
                        case when p.new_status in ('failed', 'pending') then p.error end),
               now(), null
        from pairs p
        where p.ran
    ),
    history as (
        insert into artex.task_history
            (task_id, from_status, to_status, reason, actor, worker, lease_epoch, at,
             flow_id, kind, assigned_at)
        select id, from_status, to_status, reason, artex.current_actor(), worker,
               lease_epoch, at, flow_id, kind, assigned_at
        from changed order by id, step
    )
    -- Wake the planners, once per statement: new runnable work, or freed capacity (a
    -- task left a worker), both mean another assignment round may place more.
    select exists (select 1 from changed
                   where from_status <> to_status and to_status <> 'assigned'
                     and (to_status = 'pending'
                          or (from_status in ('assigned', 'running')
                              and to_status not in ('assigned', 'running')))),
           exists (select 1 from changed
                   where from_status <> to_status and to_status <> 'assigned')
    into wake, events;
    if not artex.wakeups_deferred() then
        if wake then
            perform pg_notify('artex_tasks', '');
        end if;
        -- Feed readers: a hint only, they poll as a safety net.
        if events then
            perform pg_notify('artex_events', '');
        end if;
    end if;
    return null;
end
$$;

create or replace function artex.tasks_held_after_update() RETURNS trigger
    LANGUAGE plpgsql
    SET enable_nestloop TO 'off'
    SET jit TO 'off'
    AS $$
declare
    deltas jsonb;
begin
    -- The hot functions (assign_round, record_attempts) keep the history, the counters
    -- and the flows in their own statement (V25).
    if artex.hot_write() then
        return null;
    end if;
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

-- The status machine's row trigger: not for the hot functions' writes, which only make
-- the transitions it allows and set what it would set.
drop trigger tasks_before_update on artex.tasks;
create trigger tasks_before_update before update on artex.tasks
    for each row when (not artex.hot_write())
    execute function artex.tasks_before_update();

-- The status an outcome leaves a task in: what the worker asked for, except a retry past
-- the budget, which ends the task (timed out if it never started or said nothing,
-- failed otherwise), as the status machine's trigger decides for other writers.
create function artex.attempt_status(p_wanted text, p_unstarted boolean, p_retries integer,
                                     p_max_retries integer, p_error text)
    returns artex.task_status
    language sql immutable
    as $$
    select case when p_wanted = 'pending' and p_retries > p_max_retries
                then case when p_unstarted or p_error is null then 'timeout' else 'failed' end
                else p_wanted
           end::artex.task_status
$$;

create or replace function artex.assign_round(p_actor text, p_ids uuid[], p_workers text[],
                                              p_lease_secs double precision, p_limited uuid[])
    returns setof uuid
    language plpgsql
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
        returning t.id, t.assigned_to
    ),
    counted as (
        update artex.workers w
        set taken = w.taken + g.n,
            held = least(greatest(w.taken + g.n - coalesce(
                (select r.released from artex.worker_released r where r.worker = w.id), 0),
                0), 2147483647)::int
        from (select a.assigned_to as worker, count(*) as n from assigned a group by 1) g
        where w.id = g.worker
    )
    select a.id from assigned a;
    perform set_config('artex.hot', '', true);
end
$_$;

create or replace function artex.record_attempts(p_worker text, p_ids uuid[], p_epochs bigint[],
        p_statuses text[], p_results jsonb[], p_errors text[], p_failed boolean[],
        p_delays_ms double precision[], p_started_ago_ms double precision[])
    returns setof uuid
    language plpgsql
    as $_$
#variable_conflict use_column
declare
    ended text;
begin
    perform artex.set_context($1, null), artex.defer_wakeups(),
            set_config('artex.hot', 'on', true), set_config('artex.ended', '', true);
    -- Starts and outcomes; the history rows the status machine's triggers would write
    -- (an unstarted task given back: its assignment and its return; a start; a start and
    -- an end in one write: both), the holder's released count, and the ended tasks that
    -- have dependents, for the flows after the statement.
    return query with v as (
        select * from unnest($2::uuid[], $3::int8[], $4::text[], $5::jsonb[], $6::text[],
                             $7::bool[], $8::float8[], $9::float8[])
            as v(id, epoch, status, result, error, failed, delay_ms, started_ago_ms)
    ),
    written as (
        update artex.tasks t
        set status = artex.attempt_status(v.status,
                         t.status::text = 'assigned' and v.started_ago_ms is null,
                         t.retries + v.failed::int, t.max_retries, coalesce(v.error, t.error)),
            result = v.result,
            error = coalesce(v.error, t.error),
            retries = t.retries + v.failed::int,
            run_at = case when v.status = 'pending'
                          then now() + make_interval(secs => v.delay_ms / 1000.0) else t.run_at end,
            started_at = case when t.status::text = 'assigned' and v.started_ago_ms is not null
                              then now() - make_interval(secs => greatest(v.started_ago_ms, 0) / 1000.0)
                              else t.started_at end,
            assigned_to = case when v.status = 'running' then t.assigned_to end,
            lease_until = case when v.status = 'running' then t.lease_until end,
            -- Ended: an outcome that ends it, or a retry past the budget (attempt_status).
            finished_at = case when v.status in ('succeeded', 'failed', 'timeout')
                                    or (v.status = 'pending'
                                        and t.retries + v.failed::int > t.max_retries)
                               then now() else t.finished_at end,
            updated_at = now()
        from v join artex.tasks o on o.id = v.id
        where t.id = v.id and t.lease_epoch = v.epoch and t.assigned_to = $1
          and (t.status::text = 'running'
               or (t.status::text = 'assigned'
                   and (v.started_ago_ms is not null or v.status = 'pending')))
        returning t.id, t.status, t.flow_id, t.kind, t.error, t.lease_epoch, t.started_at,
                  o.status as was, o.updated_at as was_at,
                  o.status = 'assigned' and v.started_ago_ms is not null
                      and t.status not in ('assigned', 'running') as ran
    ),
    steps as (
        select w.id, 0 as step, 'pending'::artex.task_status as from_status,
               'assigned'::artex.task_status as to_status, w.lease_epoch,
               'assigned'::text as reason, w.was_at as at, null::timestamptz as assigned_at,
               null::timestamptz as started_at, w.flow_id, w.kind
        from written w
        where w.was = 'assigned' and w.status <> 'running' and not w.ran
        union all
        -- A start and an end in one write: one row, two events (task_transitions).
        select w.id, 1, w.was, w.status, w.lease_epoch,
               case when w.ran then
                        case when w.status in ('failed', 'pending') then w.error end
                    when w.status = 'running' then 'started'
                    when w.status in ('failed', 'pending') and w.was = 'running' then w.error
               end,
               now(),
               case when w.was = 'assigned' and (w.ran or w.status = 'running')
                    then w.was_at end,
               case when w.ran then w.started_at end,
               w.flow_id, w.kind
        from written w
        where w.was <> w.status
    ),
    history as (
        -- Ids drawn in the rows' order, the start's before its end's: the feed's order.
        insert into artex.task_history
            (id, end_id, task_id, from_status, to_status, reason, actor, worker,
             lease_epoch, at, flow_id, kind, assigned_at, started_at)
        select nextval('artex.history_id_seq'),
               case when s.started_at is not null then nextval('artex.history_id_seq') end,
               s.id, s.from_status, s.to_status, s.reason, $1, $1, s.lease_epoch, s.at,
               s.flow_id, s.kind, s.assigned_at, s.started_at
        from (select * from steps order by id, step) s
    ),
    released as (
        insert into artex.worker_released as r (worker, released)
        select $1, count(*) from written w where w.status not in ('assigned', 'running')
        having count(*) > 0
        on conflict (worker) do update set released = r.released + excluded.released
    ),
    flows as (
        select set_config('artex.ended', coalesce(string_agg(w.id || ' ' || w.status, ','), ''),
                          true) as ended
        from written w
        where w.status in ('succeeded', 'failed', 'timeout')
          and exists (select 1 from artex.task_dependencies d where d.depends_on = w.id)
    )
    select w.id from written w, flows;
    perform set_config('artex.hot', '', true);
    ended := current_setting('artex.ended');
    if ended <> '' then
        perform set_config('artex.ended', '', true);
        perform artex.tasks_ended(array_agg(split_part(e, ' ', 1)::uuid order by e),
                                  array_agg(split_part(e, ' ', 2)::artex.task_status order by e))
        from unnest(string_to_array(ended, ',')) e;
    end if;
end
$_$;


comment on function artex.assign_round(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs double precision, p_limited uuid[]) IS 'The planner round''s write: the assignments, each worker''s slots under its row lock, within the kinds'' limits; the fencing tokens and the workers'' holdings in the same statement (V25). Called by planner/dispatch.rs (ASSIGN_CALL); the statement lives only here.';
comment on function artex.record_attempts(p_worker text, p_ids uuid[], p_epochs bigint[], p_statuses text[], p_results jsonb[], p_errors text[], p_failed boolean[], p_delays_ms double precision[], p_started_ago_ms double precision[]) IS 'A worker''s batch of starts and outcomes, with their history rows and the holder''s released count in the same statement, then the flows (V25). Called by worker/attempts.rs (RECORD_CALL); the statement lives only here.';

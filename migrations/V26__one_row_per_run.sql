-- V26: one history row for a start and an end written together (issue 39). Expand: the
-- history reads as before through the view `task_transitions`; older builds' reads and
-- writes go through it and the triggers unchanged.
--
-- A task that starts and ends between two of its worker's flushes (most short tasks) got
-- two history rows in the write that ended it: assigned → running and running → its end.
-- Each row cost ~160 B of WAL, two index entries and their CPU: with the task's own three
-- versions, the history was a third of a task's WAL. The write now stores one row that
-- holds both events: `started_at` (when the handler started) and `end_id` (the end's event
-- id, drawn right after the row's `id`, which is the start's). Everything else keeps its
-- meaning.
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
    'The audit trail and the change feed as stored: one row per transition, except a start and an end written together, one row holding both (V26). Read artex.task_transitions for one row per transition.';
comment on column artex.task_history.started_at is
    'Set on a row holding a start and an end (V26): when the handler started; the start''s event is the row''s id, the end''s end_id.';
comment on column artex.task_history.end_id is
    'Set on a row holding a start and an end (V26): the end''s event id, drawn right after the row''s id.';

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
    'The audit trail: one row per transition a task went through (a table until V26; now a view of artex.task_history).';

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
            finished_at = case when artex.attempt_status(v.status,
                                   t.status::text = 'assigned' and v.started_ago_ms is null,
                                   t.retries + v.failed::int, t.max_retries,
                                   coalesce(v.error, t.error))
                                   in ('succeeded', 'failed', 'timeout')
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

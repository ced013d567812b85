-- V21: two fixes found by the property tests of issue 25. Expand: functions redefined;
-- every write older builds make is treated as before.
--
-- 1. A write that clears a task's start time does not say that it ran (found by the
-- status machine's model test, tests/blackboard/status_model.rs).
--
-- V3 reads a write that moves a task from `assigned` straight to an outcome and changes
-- `started_at` as "it ran": its start, then its outcome. A write that set `started_at` to
-- NULL counted too — a task assigned again after an earlier attempt (whose start time it
-- keeps) and then ended by plain SQL clearing that time (`set status = 'failed',
-- started_at = null`) — and its start row was dated NULL: the history refused it with
-- "null value in column "at" … violates not-null constraint", so a legal `assigned →
-- failed` (or `pending`, `timeout`) was refused with a message about another table, and
-- an illegal `assigned → succeeded` with the same one instead of "illegal task
-- transition". A start time that is not given says nothing: such a write is what it
-- would be without it (given back, reclaimed or ended unstarted; refused when illegal).
--
-- The functions are V3's and V10's with that one condition added to `ran`.

-- V3's function.
create or replace function artex.tasks_before_update() returns trigger language plpgsql as $$
declare
    -- The write records that the task ran: it started and finished since it was assigned.
    ran boolean := old.status = 'assigned'
                   and new.status not in ('assigned', 'running', 'canceled')
                   and new.started_at is not null
                   and new.started_at is distinct from old.started_at;
    was artex.task_status := case when ran then 'running'::artex.task_status else old.status end;
begin
    new.updated_at := now();
    if new.id <> old.id then
        raise exception 'artex: task % cannot change its id', old.id
            using errcode = 'check_violation';
    end if;
    if new.lease_epoch < old.lease_epoch then
        raise exception 'artex: the fencing token of task % cannot go back (% -> %)',
            old.id, old.lease_epoch, new.lease_epoch
            using errcode = 'check_violation';
    end if;
    if new.status = old.status then
        -- Not a transition: a lease renewal, a checkpoint, or a handover to another worker
        -- (which must bump the fencing token so the previous holder is fenced off).
        if new.assigned_to is distinct from old.assigned_to and new.lease_epoch = old.lease_epoch then
            new.lease_epoch := old.lease_epoch + 1;
        end if;
        return new;
    end if;
    if not artex.transition_allowed(old.status, new.status)
       and not (ran and artex.transition_allowed(was, new.status)) then
        raise exception 'artex: illegal task transition % -> % for task %',
            old.status, new.status, old.id
            using errcode = 'check_violation',
                  hint = 'allowed from ' || old.status || ': see artex.transition_allowed';
    end if;
    if ran and new.started_at > now() then
        raise exception 'artex: task % cannot have started in the future (%)', old.id, new.started_at
            using errcode = 'check_violation';
    end if;
    -- A retry past the budget ends the task for good instead of queueing it again.
    if new.status = 'pending' and was in ('assigned', 'running')
       and new.retries > new.max_retries then
        new.status := case when was = 'assigned' or new.error is null
                           then 'timeout'::artex.task_status
                           else 'failed'::artex.task_status end;
    end if;
    if new.status = 'assigned' then
        if new.assigned_to is null or new.lease_until is null then
            raise exception 'artex: assigning task % needs assigned_to and lease_until', old.id
                using errcode = 'check_violation';
        end if;
        new.lease_epoch := old.lease_epoch + 1;
    elsif new.status = 'running' then
        if new.assigned_to is distinct from old.assigned_to then
            raise exception 'artex: task % is assigned to %, not to %',
                old.id, old.assigned_to, new.assigned_to
                using errcode = 'check_violation';
        end if;
        -- The writer may say when the handler started (a start recorded after the fact).
        if new.started_at is not distinct from old.started_at or new.started_at > now() then
            new.started_at := now();
        end if;
    else
        -- Leaving the held states releases the holder and the lease.
        new.assigned_to := null;
        new.lease_until := null;
    end if;
    if new.status in ('succeeded', 'failed', 'timeout', 'canceled') then
        new.finished_at := now();
    end if;
    return new;
end
$$;

-- V10's function.
create or replace function artex.tasks_after_update() returns trigger language plpgsql
set enable_nestloop = off set jit = off as $$
declare
    wake   boolean;
    events boolean;
begin
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
        insert into artex.task_transitions
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

-- 2. A unique key's window reaches back 100 years at most. `artex.submit(…, unique_for =>
-- interval '10000 years')` (or the API's `"unique_for": "1000000000d"`) computed
-- `now() - window`, before the oldest time PostgreSQL holds: once a finished task had the
-- key, every submission with it failed with "timestamp out of range" (the API answered
-- 500). A longer window means the same as 100 years: any task with the key finished
-- since. (The API, the CLI and the library refuse windows over 100 years: a clear
-- message naming `unique_for`.)
create or replace function artex.task_with_unique_key(key text, window_ interval) returns uuid
language sql stable as $$
    select id from artex.tasks
    where unique_key = key
      and (finished_at is null
           -- (`least` skips NULLs: without a window, finished tasks do not count.)
           or (window_ is not null
               and finished_at > now() - least(window_, interval '100 years')))
    order by id desc limit 1
$$;

-- V3: the batched hot path. Append-only from here: add V4__… for the next change.
--
-- 1. Wake-ups after the commit instead of inside it. PostgreSQL holds one cluster-wide
--    lock from the moment a transaction that sent a NOTIFY starts to commit until its
--    commit record is flushed to disk: notifying commits queue behind each other's flush.
--    artex's hot-path statements (a worker's starts and outcomes, a planner's
--    assignments) mark their transaction with artex.defer_wakeups() and send the wake-ups
--    themselves right after the commit, from a session that does not wait for the flush.
--    Every other writer (psql, other tools, artex's rarer writes) still gets its wake-ups
--    from the triggers.
-- 2. A worker runs a task as soon as it reads the assignment and records the start
--    afterwards: in its next batch of writes, or together with the outcome when the task
--    finished first. One row update instead of two for a short task, and no durable
--    commit between the assignment and the handler. The combined write moves a task from
--    `assigned` straight to its outcome and says that it ran by setting `started_at` (to
--    when its handler started). The status machine treats it as
--    `assigned → running → outcome`: both steps must be legal, and the audit trail and
--    the change feed get both rows, in order, the first one at `started_at`. Without a
--    new `started_at` an `assigned → pending | failed | timeout` write stays what it was:
--    a task given back or reclaimed before it ran.
-- 3. One index fewer on the hot table (below).

create function artex.defer_wakeups() returns boolean language sql volatile as $$
    select set_config('artex.wakeups', 'deferred', true) is not null
$$;
create function artex.wakeups_deferred() returns boolean language sql stable as $$
    select coalesce(current_setting('artex.wakeups', true) = 'deferred', false)
$$;

-- V2's function, with its wake-up skipped when the writer sends it itself.
create or replace function artex.task_events_after_insert() returns trigger language plpgsql as $$
begin
    if not artex.wakeups_deferred() and exists (select 1 from new_events) then
        perform pg_notify('artex_events', '');
    end if;
    return null;
end
$$;

-- Nothing reads by it (listings order by creation), and a status change, never a HOT
-- update, added an entry to it every time.
drop index artex.tasks_status_updated;

-- V1's function, accepting the combined write of 2.
create or replace function artex.tasks_before_update() returns trigger language plpgsql as $$
declare
    -- The write records that the task ran: it started and finished since it was assigned.
    ran boolean := old.status = 'assigned'
                   and new.status not in ('assigned', 'running', 'canceled')
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

-- V1's function, with the combined write audited as its two steps and its wake-up
-- skipped when the writer sends it itself. The transition tables are joined once (one statement: the audit and outbox inserts are its CTEs). No JIT:
-- these statements take milliseconds, and compiling them took hundreds.
create or replace function artex.tasks_after_update() returns trigger language plpgsql
set enable_nestloop = off set jit = off as $$
declare
    wake boolean;
begin
    with pairs as materialized (
        select n.id, n.flow_id, n.kind, n.error, n.assigned_to, n.lease_epoch, n.started_at,
               o.status as old_status, n.status as new_status,
               coalesce(n.assigned_to, o.assigned_to) as worker,
               o.status = 'assigned' and n.status not in ('assigned', 'running', 'canceled')
                   and n.started_at is distinct from o.started_at as ran
        from new_rows n join old_rows o using (id)
        where n.status <> o.status
           -- A handover (hot upgrade) moves a held task to another worker without a
           -- status change; it is audited all the same (not an event).
           or (n.assigned_to is distinct from o.assigned_to and n.assigned_to is not null)
    ),
    -- Each change as audit rows: one, or two for a task that ran (its start, then its
    -- outcome).
    changed as materialized (
        select p.id, p.flow_id, p.kind, 1 as step, p.old_status as from_status,
               case when p.ran then 'running'::artex.task_status else p.new_status end
                   as to_status,
               p.old_status <> p.new_status as moved, p.worker, p.lease_epoch,
               case when p.old_status = p.new_status
                    then coalesce(artex.current_reason(), 'handed over')
                    when p.ran then 'started'
                    when p.old_status = 'assigned' and p.new_status = 'running'
                    then coalesce(artex.current_reason(), 'started')
                    else coalesce(artex.current_reason(),
                                  case when p.new_status in ('failed', 'pending')
                                        and p.old_status = 'running' then p.error end)
               end as reason,
               case when p.ran then p.started_at else now() end as at
        from pairs p
        union all
        select p.id, p.flow_id, p.kind, 2, 'running', p.new_status, true, p.worker,
               p.lease_epoch,
               coalesce(artex.current_reason(),
                        case when p.new_status in ('failed', 'pending') then p.error end),
               now()
        from pairs p
        where p.ran
    ),
    audit as (
        insert into artex.task_transitions
            (task_id, from_status, to_status, reason, actor, worker, lease_epoch, at)
        select id, from_status, to_status, reason, artex.current_actor(), worker,
               lease_epoch, at
        from changed order by id, step
    ),
    -- Assignment is transient plumbing between planner and worker: not an event.
    events as (
        insert into artex.task_events (task_id, flow_id, kind, from_status, to_status, reason, at)
        select id, flow_id, kind, from_status, to_status, reason, at
        from changed where moved and to_status <> 'assigned' order by id, step
    )
    -- Wake the planners, once per statement: new runnable work, or freed capacity (a
    -- task left a worker), both mean another assignment round may place more.
    select exists (select 1 from changed
                   where moved and (to_status = 'pending'
                                    or (from_status in ('assigned', 'running')
                                        and to_status not in ('assigned', 'running'))))
    into wake;
    if wake and not artex.wakeups_deferred() then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

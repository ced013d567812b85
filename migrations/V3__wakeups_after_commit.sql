-- V3: wake-ups after the commit instead of inside it; one index fewer on the hot table.
--
-- PostgreSQL holds one cluster-wide lock from the moment a transaction that sent a NOTIFY
-- starts to commit until its commit record is flushed to disk: notifying commits queue
-- behind each other's flush and never share one. artex's hot-path statements (a worker's
-- starts and completions, a planner's assignments) therefore mark their transaction with
-- artex.defer_wakeups() and send the wake-ups themselves right after the commit, from a
-- session that does not wait for the flush. Every other writer (psql, other tools,
-- artex's rarer writes) still gets its wake-ups from the triggers, as before.
create function artex.defer_wakeups() returns boolean language sql volatile as $$
    select set_config('artex.wakeups', 'deferred', true) is not null
$$;
create function artex.wakeups_deferred() returns boolean language sql stable as $$
    select coalesce(current_setting('artex.wakeups', true) = 'deferred', false)
$$;

-- V1's function, with its wake-up skipped when the writer sends it itself.
create or replace function artex.tasks_after_update() returns trigger language plpgsql
set enable_nestloop = off as $$
begin
    insert into artex.task_transitions
        (task_id, from_status, to_status, reason, actor, worker, lease_epoch)
    select n.id, o.status, n.status,
           coalesce(artex.current_reason(),
                    case when n.status in ('failed', 'pending') and o.status = 'running'
                         then n.error end),
           artex.current_actor(), coalesce(n.assigned_to, o.assigned_to), n.lease_epoch
    from new_rows n join old_rows o using (id)
    where n.status <> o.status
    union all
    select n.id, o.status, n.status, coalesce(artex.current_reason(), 'handed over'),
           artex.current_actor(), n.assigned_to, n.lease_epoch
    from new_rows n join old_rows o using (id)
    where n.status = o.status and n.assigned_to is distinct from o.assigned_to
      and n.assigned_to is not null;
    insert into artex.task_events (task_id, flow_id, kind, from_status, to_status, reason)
    select n.id, n.flow_id, n.kind, o.status, n.status,
           coalesce(artex.current_reason(),
                    case when n.status in ('failed', 'pending') and o.status = 'running'
                         then n.error end)
    from new_rows n join old_rows o using (id)
    where n.status <> o.status and n.status <> 'assigned';
    if not artex.wakeups_deferred()
       and exists (select 1 from new_rows n join old_rows o using (id)
                   where n.status <> o.status
                     and (n.status = 'pending'
                          or (o.status in ('assigned', 'running')
                              and n.status not in ('assigned', 'running')))) then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

-- V2's function, likewise.
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

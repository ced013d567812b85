-- V60: a task made pending and due later by an update announces its time. Expand.
--
-- V57 made an insert of tasks due later say when they are due (`at:<Unix ms>` on
-- artex_tasks), and a worker's retries and snoozes likewise, so the planners' Scanner
-- times a round for them instead of finding them at its poll (up to
-- `--planner-poll-ms`, 200 ms, late). An update that leaves tasks pending and due later
-- said nothing: the Reaper's rescue of an expired lease (due after its backoff), an
-- operator's or a program's `update ... set run_at`. The update's statement trigger now
-- sends the soonest such time, once per statement, when it sends its other wake-ups.
-- The hot functions write no pending task due later but through a worker's outcomes,
-- which announce theirs (V57); they skip this trigger, as before.

create or replace function artex.tasks_after_update()
returns trigger
language plpgsql
set enable_nestloop to 'off'
set jit to 'off'
as $fn$
declare
    wake   boolean;
    events boolean;
    due    timestamptz;
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
        -- Pending tasks due later (a rescue's backoff, a run_at moved by SQL): the
        -- planners' Scanner times a round for the soonest, as for an insert (V57).
        select min(n.run_at) into due
        from new_rows n where n.status = 'pending' and n.run_at > now();
        if due is not null then
            perform pg_notify('artex_tasks', 'at:' || floor(extract(epoch from due) * 1000)::int8);
        end if;
    end if;
    return null;
end
$fn$;

comment on function artex.tasks_after_update() is
    'After an update (not the hot functions'' own): the history rows of status changes and handovers, the planners'' wake-up (new runnable work or freed capacity), the feed''s, and `at:<Unix ms>` for the soonest pending task due later (V60).';

-- V61: a flow's wait, once reached, announces when it is due. Expand.
--
-- The planners' Scheduler ends due waits at its pass of every second, and at a pass it
-- times for the soonest wait or slot it read at its last pass. A wait reached after that
-- read and due before the next pass (a `for` timer of 300 ms after its upstream task, an
-- `until` already past) waited for the pass of every second: up to a second late. Its
-- reach now sends `wait-at:<Unix ms>` on artex_tasks, the soonest due time of the waits
-- reached, and the planners' Scanner hands it to their Scheduler, which runs a pass then.
-- Planners of earlier builds take the payload as any wake-up (a round that finds
-- nothing). The notification goes with the reaching transaction's commit, whatever
-- wrote it (a worker's outcomes included): waits are few, and each reach is one.

create or replace function artex.reach_waits(p_ids uuid[])
returns void
language plpgsql
as $fn$
declare
    s   record;
    due timestamptz;
begin
    with reached as (
        update artex.flow_waits w
        set reached_at = coalesce(w.reached_at, now()),
            due_at = coalesce(w.until,
                              coalesce(w.reached_at, now()) + coalesce(w.wait_for, w.timeout))
        from artex.tasks t
        where w.task_id = any(p_ids) and t.id = w.task_id and t.status = 'blocked'
          and w.ended_at is null
          and not exists (select 1 from artex.task_waits c
                          where c.task_id = w.task_id and c.upstream_left > 0)
        returning w.due_at
    )
    select min(r.due_at) into due from reached r;
    for s in
        select w.task_id, g.name, g.payload, g.actor
        from artex.flow_waits w
        join artex.flow_signals g on g.flow_id = w.flow_id and g.name = w.signal
        where w.task_id = any(p_ids) and w.reached_at is not null and w.ended_at is null
          and g.delivered_at is null
        order by w.task_id
    loop
        perform artex.deliver_signal(s.task_id, s.name, s.payload, s.actor);
    end loop;
    -- A signal wait without a timeout has no due time; one that a kept signal ended
    -- above is announced all the same (the pass finds nothing).
    if due is not null then
        perform pg_notify('artex_tasks',
                          'wait-at:' || floor(extract(epoch from due) * 1000)::int8);
    end if;
end
$fn$;

comment on function artex.reach_waits(uuid[]) is
    'Reaches the waits among p_ids whose upstream tasks all succeeded: their timers start (due_at), a kept signal ends its wait, and the soonest due time is announced as wait-at:<Unix ms> on artex_tasks for the planners'' Scheduler (V40, V61).';

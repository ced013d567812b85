-- V52: an insert of runnable tasks wakes the planners with the payload 'new' (issue 39).
-- Expand.
--
-- `artex_tasks` says two things: tasks were submitted, or a task left a worker (its
-- capacity is free again), both with an empty payload until now. A planner that finds
-- its fleet quiet (its last round found nothing waiting, and workers with a free
-- handler slot) answers a submission by waking one such worker to claim it at once,
-- ahead of its own round (`scanner.rs`, "A quiet fleet"): the worker's claim is one
-- durable statement where the round is a read, a write and a push. A task that ends
-- leaves nothing to claim, so it must not wake a worker for nothing: the payload tells
-- the two apart. Planners of earlier builds treat any payload but a cancel's as work,
-- as before; planners of this build on an older schema never see 'new' and keep to
-- their rounds.

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
        perform pg_notify('artex_tasks', 'new');
    end if;
    return null;
end
$$;

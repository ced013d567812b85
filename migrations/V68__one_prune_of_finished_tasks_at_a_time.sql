-- V68: one prune of finished tasks at a time. Expand.
--
-- Every planner runs the maintenance, and each prunes the finished tasks past the
-- retention, a batch at a time. Two prunes at once read the same oldest tasks and
-- delete them, each locking rows in the order its own plan met them: the fleet soak
-- (seed 879141162, two planners reconnecting after a failover) logged a deadlock
-- between two `prune_finished_tasks`, each waiting for a row the other had locked.
-- Now a prune that finds another under way leaves the retention to it and deletes
-- nothing (a transaction-level advisory lock, tried, never waited for); the next run
-- of its maintenance looks again.

create or replace function artex.prune_finished_tasks(p_now timestamp with time zone, p_batch integer) returns bigint
language plpgsql
as $$
declare
    cutoff timestamptz := p_now - (select r.keep from artex.event_retention r);
    n      bigint;
begin
    if not pg_try_advisory_xact_lock(hashtext('artex.prune_finished_tasks')) then
        return 0;
    end if;
    with doomed as (
        select t.id from artex.tasks t
        where t.finished_at < cutoff
          and (t.flow_id is null
               or not exists (select 1 from artex.tasks u
                              where u.flow_id = t.flow_id and u.finished_at is null))
        order by t.finished_at
        limit p_batch
    )
    delete from artex.tasks t using doomed where t.id = doomed.id;
    get diagnostics n = row_count;
    delete from artex.flows f
    where f.created_at < cutoff
      and not exists (select 1 from artex.tasks t where t.flow_id = f.id);
    return n;
end
$$;

comment on function artex.prune_finished_tasks(timestamp with time zone, integer) is
    'Deletes up to p_batch finished tasks past the retention that no unfinished flow needs, oldest first, and the flows left empty; returns how many tasks. One at a time (V68): a call while another runs deletes nothing and returns 0.';

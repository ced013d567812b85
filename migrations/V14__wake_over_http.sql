-- V14: wake-ups without a LISTEN session per worker (issue 22). Expand: a nullable
-- column, a column with a default, and a trigger function that older writes satisfy and
-- that treats the workers older builds register (wake_addr null) as before.
--
-- A worker used to hold a LISTEN session of its own, on which planners woke it (and its
-- presence in pg_stat_activity told them it was alive): one more PostgreSQL backend per
-- worker, which no transaction pooler can share. A worker of this build registers where
-- planners reach its HTTP port instead (`wake_addr`), and the planner that assigned it
-- tasks pushes the wake-up there (`POST /wake`, carrying the tasks as the NOTIFY did);
-- a push that fails marks the worker unreachable for that planner and gives its unstarted
-- tasks back. The push is authenticated with `wake_secret`, readable by whoever can read
-- the blackboard (who could write its tasks anyway).
--
-- A canceled task a push worker holds is announced on the planners' channel
-- `artex_wake` (payload `cancel:<worker id>`), which they pass on to the worker.

alter table artex.workers
    add column wake_addr text check (wake_addr <> '' and length(wake_addr) < 300);

comment on column artex.workers.wake_addr is
    'host:port where planners push this worker''s wake-ups (POST /wake); NULL for a worker woken by NOTIFY on its channel.';

alter table artex.blackboard
    add column wake_secret text not null
        default replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');

comment on column artex.blackboard.wake_secret is
    'The bearer token of planners'' wake-up pushes to workers (POST /wake).';

create or replace function artex.tasks_after_update_flows() returns trigger language plpgsql as $$
declare
    saved_actor  text := coalesce(current_setting('artex.actor', true), '');
    saved_reason text := coalesce(current_setting('artex.reason', true), '');
    changed      boolean := false;
    ended_ids    uuid[];
    ended_status artex.task_status[];
    ids          uuid[];
    ns           integer[];
    root         record;
begin
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

    -- Promotion.
    select array_agg(x.task_id order by x.task_id), array_agg(x.n order by x.task_id)
      into ids, ns
    from (select d.task_id, count(*)::int as n
          from artex.task_dependencies d
          where d.depends_on = any(array(select u.id
                                         from unnest(ended_ids, ended_status) as u(id, status)
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
                               from unnest(ended_ids, ended_status) as u(id, status)
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
    return null;
end
$$;

-- Flows (DAGs of tasks), operator controls and the change feed.
-- Append-only: never edit a released migration, add V3__… instead.

-- How many upstream tasks of a flow task have not succeeded yet. One row per task that
-- has upstream tasks. The counter row is the one place where concurrent completions of
-- sibling upstream tasks meet: each decrements it under its row lock, so exactly one of
-- them sees it reach zero and promotes the task, at any isolation level. (Checking "do
-- all my upstream tasks look succeeded?" instead is a write skew under READ COMMITTED:
-- two siblings finishing at once each see the other still running, and the downstream
-- task stays blocked forever.) It also keeps promotion O(1) per finished edge, however
-- wide the fan-in.
create table artex.task_waits (
    task_id        uuid primary key references artex.tasks (id) on delete cascade,
    upstream_left  integer not null check (upstream_left >= 0)
);

-- Flow bookkeeping that must happen in the transaction that finishes a task:
--   * a task that succeeded counts down its downstream tasks' `upstream_left`; those that
--     reach zero and are `blocked` become `pending` (a `paused` one stays paused; resume
--     then makes it pending);
--   * a task that ended failed/timeout/canceled (terminal: a retry goes back to pending
--     instead) cancels every transitive downstream task that has not ended, with a reason
--     naming it;
--   * a canceled task that a worker held wakes that worker (its channel, payload
--     'cancel'), which stops the handler at once instead of at its next lease renewal.
-- Cost is proportional to the edges leaving the finished tasks (index
-- task_dependencies_upstream), never to the size of the flow. The cascades' own updates
-- fire this trigger again; that nested run finds nothing left to do (promoted tasks are
-- not terminal; the cancel covered the whole downstream closure at once), so the
-- recursion is bounded at depth two, even for a chain of 10,000 tasks.
-- Row locks are always taken in id order (counters, then tasks) so that concurrent
-- completions and operator controls in one flow cannot deadlock each other.
create function artex.tasks_after_update_flows() returns trigger language plpgsql as $$
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

    perform pg_notify(w.channel, 'cancel')
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

-- Named to sort after V1's `tasks_after_update` (statement triggers fire in name order),
-- so the finishing statement is audited under its own actor and reason first.
create trigger tasks_after_update_flows after update on artex.tasks
    referencing old table as old_rows new table as new_rows
    for each statement execute function artex.tasks_after_update_flows();

-- The change feed's order. Identity ids are handed out at insert time but become visible
-- at commit, so a reader following `id > cursor` can skip an id that commits after a
-- larger one. Each event therefore records the id of the transaction that wrote it, and
-- readers deliver only events whose transaction is older than every transaction still
-- in flight (`xid < pg_snapshot_xmin(pg_current_snapshot())`), in (xid, id) order. No
-- transaction with an xid below that horizon can ever commit again, so the delivered
-- prefix is final: nothing is skipped, nothing is delivered twice. The price: a
-- long-running transaction anywhere in the cluster holds delivery back until it ends.
alter table artex.task_events add column xid xid8;
-- Events written before this migration sort first, in id order ('2' is the frozen xid).
update artex.task_events set xid = '2' where xid is null;
alter table artex.task_events alter column xid set default pg_current_xact_id();
alter table artex.task_events alter column xid set not null;
create index task_events_feed on artex.task_events (xid, id);

-- A consumer's cursor is the (xid, id) of the last event it acknowledged.
alter table artex.event_cursors add column last_xid xid8 not null default '0';

-- Retention of the outbox: events older than `keep` are pruned (by the planner's Reaper)
-- from the head of the feed, but never past the cursor of a consumer heard from within
-- `keep` (a live consumer loses nothing). Everything at or below `pruned_*` is gone: a
-- consumer whose cursor is below it has missed events and is told so instead of
-- silently skipping. (Pruning walks the (xid, id) index from the oldest event; no index
-- on `at` is needed.)
create table artex.event_retention (
    singleton   boolean primary key default true check (singleton),
    keep        interval not null default '7 days' check (keep >= interval '0'),
    pruned_xid  xid8 not null default '0',
    pruned_id   bigint not null default 0,
    pruned_at   timestamptz
);
insert into artex.event_retention default values;

-- Wake feed readers (`artex events tail --follow`, `/events`) once per statement that
-- wrote events. A hint only: readers poll as a safety net.
create function artex.task_events_after_insert() returns trigger language plpgsql as $$
begin
    if exists (select 1 from new_events) then
        perform pg_notify('artex_events', '');
    end if;
    return null;
end
$$;

create trigger task_events_after_insert after insert on artex.task_events
    referencing new table as new_events
    for each statement execute function artex.task_events_after_insert();

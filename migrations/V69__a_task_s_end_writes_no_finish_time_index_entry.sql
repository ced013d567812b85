-- V69: a task's end writes no entry of a finish-time index (issue 39). Expand: builds
-- that predate it prune and sample as before, by plans that no longer find the index
-- (a walk of the primary key: slower on a large table, the same answers).
--
-- `tasks_finished` (finished_at, V8) took an entry at every task's end: one of the
-- eight index entries a task writes in W1 from idle's run, ~5% of its rate
-- (docs/performance.md, "What an index entry costs"). Its two readers go elsewhere:
--
-- * The retention (`prune_finished_tasks`) walks `tasks_listed` by status and id. The
--   ids artex makes are UUIDv7, time-ordered (V7), taken at or before the task's
--   creation, hence before its end: every such task that ended before the cutoff lies
--   below the cutoff's smallest id, where the walk stops. (An id made by a host whose
--   clock runs ahead of the database's lies later: its task goes once the cutoff
--   passes the id's time, late by the skew.) Ids that are not UUIDv7 (a plain-SQL
--   insert naming a random one) are pruned by their end as before, through a partial
--   index of their finish times, `tasks_finished_unordered`, that holds no entry for
--   a UUIDv7: no task artex makes writes to it. Status by status, oldest created
--   first, then the others oldest ended.
-- * The overview's sample of recent finishes (operator/overview.rs, RECENT) walks the
--   history's feed index backwards, from its end to the position of the window's start
--   less a margin (`feed_position_at`, a binary search of that index), and reads each
--   terminal transition's task by its id: a terminal transition is written with the
--   task's end, and a terminal status is never left.

drop index if exists artex.tasks_finished;

-- Built inside the migration's transaction, so not `concurrently`; on a large table it
-- reads the table once and, for artex's own ids, writes nothing.
create index tasks_finished_unordered on artex.tasks (finished_at)
    where finished_at is not null and get_byte(uuid_send(id), 6) >> 4 <> 7;

comment on index artex.tasks_finished_unordered is
    'Finish times of the finished tasks whose ids are not UUIDv7 (named by plain SQL): the retention prunes them by this (V69); a task artex makes has a UUIDv7 and no entry here.';

-- JIT off, as for the hot functions: the walk's plan is estimated at the whole range
-- below the bound (a million-row table: a cost past jit_above_cost), and PostgreSQL
-- would compile it at every call (150 ms) to read nothing.
create or replace function artex.prune_finished_tasks(p_now timestamp with time zone, p_batch integer) returns bigint
language plpgsql
set jit to 'off'
as $$
declare
    cutoff timestamptz := p_now - (select r.keep from artex.event_retention r);
    -- The smallest UUIDv7 of the cutoff's millisecond.
    below  uuid := artex.uuid_v7_floor(cutoff);
    n      bigint;
    m      bigint := 0;
begin
    if not pg_try_advisory_xact_lock(hashtext('artex.prune_finished_tasks')) then
        return 0;
    end if;
    with doomed as (
        select t.id from artex.tasks t
        where t.listed in ('succeeded', 'failed', 'timeout', 'canceled')
          and t.id < below
          and t.finished_at < cutoff
          and (t.flow_id is null
               or not exists (select 1 from artex.tasks u
                              where u.flow_id = t.flow_id and u.finished_at is null))
        -- In the index's order: without it, the generic plan of a table holding many
        -- tasks below the bound scans it whole (190 ms on 1,200,000 rows, 3 ms so).
        order by t.listed, t.id
        limit p_batch
    )
    delete from artex.tasks t using doomed where t.id = doomed.id;
    get diagnostics n = row_count;
    if n < p_batch then
        with doomed as (
            select t.id from artex.tasks t
            where t.finished_at < cutoff
              and get_byte(uuid_send(t.id), 6) >> 4 <> 7
              and (t.flow_id is null
                   or not exists (select 1 from artex.tasks u
                                  where u.flow_id = t.flow_id and u.finished_at is null))
            order by t.finished_at
            limit p_batch - n
        )
        delete from artex.tasks t using doomed where t.id = doomed.id;
        get diagnostics m = row_count;
    end if;
    delete from artex.flows f
    where f.created_at < cutoff
      and not exists (select 1 from artex.tasks t where t.flow_id = f.id);
    return n + m;
end
$$;

comment on function artex.prune_finished_tasks(timestamp with time zone, integer) is
    'Deletes up to p_batch finished tasks past the retention that no unfinished flow needs, status by status and oldest created first, and the flows left empty; returns how many tasks. One at a time (V68): a call while another runs deletes nothing and returns 0. Walks tasks_listed by status and id below the cutoff''s smallest UUIDv7, then the tasks whose ids are not UUIDv7 by tasks_finished_unordered (V69).';

create or replace function artex.uuid_v7_floor(p_at timestamp with time zone) returns uuid
language sql immutable parallel safe
as $$
    select encode(substring(int8send(floor(extract(epoch from p_at) * 1000)::bigint) from 3)
                  || '\x7000'::bytea || '\x8000000000000000'::bytea, 'hex')::uuid
$$;

comment on function artex.uuid_v7_floor(timestamp with time zone) is
    'The smallest UUIDv7 of the millisecond of p_at: every id artex.uuid_v7() made at that millisecond or later is at least this (V69): the retention''s bound, and the id bounds of the task lists'' time ranges (operator/tasks.rs).';

create or replace function artex.feed_position_at(p_at timestamp with time zone) returns xid8
language plpgsql stable
set plan_cache_mode to 'force_custom_plan'
as $$
declare
    lo numeric;
    hi numeric;
    mid numeric;
    x xid8;
    a timestamptz;
begin
    select h.xid::text::numeric into lo from artex.task_history h order by h.xid, h.id limit 1;
    select h.xid::text::numeric into hi from artex.task_history h
    order by h.xid desc, h.id desc limit 1;
    if lo is null then
        return '0'::xid8;
    end if;
    -- The smallest transaction id whose first history row is dated p_at or later, by a
    -- search of the feed index: rows are dated by their transaction's start and ordered
    -- by the id it drew at its first write, so the dates rise with the position but for
    -- a transaction that waited before it wrote (callers give a margin for those).
    hi := hi + 1;
    while lo < hi loop
        mid := floor((lo + hi) / 2);
        select h.xid, h.at into x, a from artex.task_history h
        where h.xid >= mid::text::xid8 order by h.xid, h.id limit 1;
        if a < p_at then
            lo := x::text::numeric + 1;
        else
            hi := mid;
        end if;
    end loop;
    -- The transaction before it: the search reads a transaction's first row, and one
    -- may write rows of several dates (a worker's batch dates an assignment it gives
    -- back by when it was made), so the one that straddles p_at is walked too.
    select h.xid into x from artex.task_history h
    where h.xid < lo::text::xid8 order by h.xid desc, h.id desc limit 1;
    return coalesce(x, lo::text::xid8);
end
$$;

comment on function artex.feed_position_at(timestamp with time zone) is
    'The feed position from which the history''s rows are dated p_at or later: the transaction id of the last row before the first transaction whose first row is so dated (the one that straddles p_at is walked too), found by a binary search of the feed index (V69). Rows of a transaction that waited before its first write are dated earlier than their position says: give a margin.';

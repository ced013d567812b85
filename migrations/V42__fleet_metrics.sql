-- V42: what `artex serve`'s /metrics reads (issue 37): the fleet's tasks, workers,
-- pauses and limits by kind in one call, and outcomes per kind as counters that only
-- grow. Expand: new tables and functions, nothing on the tasks' hot path.
--
-- Outcomes per kind are folded from the history (the change feed): each fold reads the
-- history rows after its cursor, in the feed's order and below its horizon (rows of
-- transactions older than any in flight, so none can appear behind the cursor later),
-- adds the ends (succeeded, failed, timeout, canceled) to `artex.kind_outcomes` and
-- moves the cursor. The hot path writes nothing more; the fold's cost is per task ended
-- since the last one, paid by whoever scrapes. Retention may drop history before it is
-- folded (no scrape for longer than the retention): those ends are never counted, and
-- the counters still only grow. The first fold counts the history kept then.

create table artex.kind_outcomes (
    kind text not null,
    outcome artex.task_status not null
        check (outcome in ('succeeded', 'failed', 'timeout', 'canceled')),
    n bigint not null default 0 check (n >= 0),
    primary key (kind, outcome)
);
comment on table artex.kind_outcomes is
    'Tasks ended per kind and outcome, folded from the history by artex.fold_outcomes; only grows (migrations/V42).';

create table artex.kind_outcomes_folded (
    only_row boolean primary key default true check (only_row),
    last_xid xid8 not null default '0',
    last_id bigint not null default 0,
    folded_at timestamptz
);
comment on table artex.kind_outcomes_folded is
    'How far artex.fold_outcomes has read the history: its feed position (migrations/V42).';
insert into artex.kind_outcomes_folded default values;

-- Folds at most `p_batch` history rows after the cursor; returns how many it read (0
-- when another session is folding: it does not wait). Its read is the feed's: a walk of
-- each partition's (xid, id) index from the cursor (the planner's own settings, whoever
-- calls it).
create function artex.fold_outcomes(p_batch integer)
returns bigint language plpgsql
set enable_indexscan = on
set enable_seqscan = on
as $fn$
declare
    c record;
    n bigint;
begin
    select last_xid, last_id into c from artex.kind_outcomes_folded for update skip locked;
    if not found then
        return 0;
    end if;
    with batch as materialized (
        select e.xid, e.id, e.kind, e.from_status, e.to_status
        from artex.task_history e
        where (e.xid, e.id) > (c.last_xid, c.last_id)
          and e.xid < pg_snapshot_xmin(pg_current_snapshot())
          and e.xid > '1'
        order by e.xid, e.id
        limit p_batch
    ),
    counted as (
        insert into artex.kind_outcomes as k (kind, outcome, n)
        select b.kind, b.to_status, count(*) from batch b
        where b.to_status in ('succeeded', 'failed', 'timeout', 'canceled')
          and b.from_status is distinct from b.to_status and b.kind is not null
        group by 1, 2
        on conflict (kind, outcome) do update set n = k.n + excluded.n
    ),
    moved as (
        update artex.kind_outcomes_folded f
        set last_xid = l.xid, last_id = l.id, folded_at = now()
        from (select b.xid, b.id from batch b order by b.xid desc, b.id desc limit 1) l
    )
    select count(*) into n from batch;
    return n;
end
$fn$;
comment on function artex.fold_outcomes(integer) is
    'Adds the ends found in the next p_batch history rows to artex.kind_outcomes; returns the rows read (migrations/V42).';

-- The fleet as /metrics shows it, one row per sample: (metric, kind, label, value).
-- Waiting tasks are read through the partial index `tasks_listed`, their rows visited
-- up to `p_cap` per status; held tasks through `tasks_holder` (at most the fleet's
-- capacity). Never a walk of the table or of its primary key: finished tasks, however
-- many the retention keeps, cost nothing. Sequential and plain index scans are off for
-- that reason: while waiting tasks were a large share, PostgreSQL chose to scan the
-- whole table (or, with an order, to walk the primary key), crossing every finished
-- task; bitmap scans of the partial indexes visit only the matching rows, in the
-- table's order (tests/metrics/fleet.rs EXPLAINs it). When a status reaches the cap, its
-- count says "at least" (`counts_capped`) and the oldest age is that of the rows
-- visited. `p_fold`: history rows folded first.
create function artex.fleet_metrics(p_cap bigint, p_fold integer)
returns table (metric text, kind text, label text, value float8)
language plpgsql
-- Its estimates are large and vague (counts of counts): JIT compiled it for ~1 s per
-- call to save nothing.
set jit = off
set enable_indexscan = off
set enable_seqscan = off
as $fn$
#variable_conflict use_column
begin
    perform artex.fold_outcomes(p_fold);
    return query with waiting as (
        select w.kind, w.listed as status, count(*) as n, min(w.due) as due from (
            (select t.kind, t.listed, case when t.run_at <= now()
                    then greatest(t.created_at, t.run_at) end as due
             from artex.tasks t where t.listed = 'pending' limit p_cap)
            union all
            (select t.kind, t.listed, null from artex.tasks t
             where t.listed = 'blocked' limit p_cap)
            union all
            (select t.kind, t.listed, null from artex.tasks t
             where t.listed = 'paused' limit p_cap)) w
        group by 1, 2
    ),
    held as (
        select t.kind, t.status, count(*) as n, count(*) filter (where t.limited) as limited
        from artex.tasks t where t.assigned_to is not null
        group by 1, 2
    ),
    counts as materialized (
        select w.kind, w.status, w.n, w.due, 0::bigint as limited from waiting w
        union all
        select h.kind, h.status, h.n, null, h.limited from held h
    ),
    known as materialized (
        select k.kind from artex.kinds k
        union select c.kind from counts c
    )
    select 'tasks', k.kind, s.status::text, coalesce(c.n, 0)::float8
    from known k
    cross join unnest(array['pending', 'blocked', 'paused', 'assigned', 'running']
                      ::artex.task_status[]) s(status)
    left join counts c on c.kind = k.kind and c.status = s.status
    union all
    select 'oldest_runnable_age_seconds', k.kind, null,
           greatest(coalesce(extract(epoch from now() - c.due), 0), 0)::float8
    from known k left join counts c on c.kind = k.kind and c.status = 'pending'
    union all
    select 'counts_capped', null, c.status::text, 1
    from counts c where c.status in ('pending', 'blocked', 'paused')
    group by c.status having sum(c.n) >= p_cap
    union all
    select 'ended', o.kind, o.outcome::text, o.n::float8 from artex.kind_outcomes o
    union all
    select 'workers', null, s.state::text,
           (select count(*) from artex.workers w where w.state = s.state)::float8
    from unnest(enum_range(null::artex.worker_state)) s(state)
    union all
    select 'kind_workers', k.kind, null,
           (select count(*) from artex.workers w
            where w.state = 'online' and k.kind = any(w.kinds))::float8
    from known k
    union all
    select 'kind_paused', p.kind, null, 1 from artex.kind_pauses p
    union all
    select 'limit_concurrency', l.kind, null, l.concurrency::float8
    from artex.kind_limits l where l.concurrency is not null
    union all
    select 'limit_key_concurrency', l.kind, null, l.key_concurrency::float8
    from artex.kind_limits l where l.key_concurrency is not null
    union all
    select 'limit_rate_per_second', l.kind, null, l.rate_per_sec
    from artex.kind_limits l where l.rate_per_sec is not null
    union all
    select 'limit_held', l.kind, null,
           coalesce((select sum(c.limited) from counts c where c.kind = l.kind), 0)::float8
    from artex.kind_limits l;
end
$fn$;
comment on function artex.fleet_metrics(bigint, integer) is
    'The fleet as artex serve''s /metrics shows it: tasks by kind and status, the oldest runnable task''s age per kind, ends per kind, workers by state and per kind, pauses and limits (migrations/V42).';

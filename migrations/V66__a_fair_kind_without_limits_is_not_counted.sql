-- V66: a kind that is only fair is not counted at its assignment. Expand.
--
-- A round's write (`assign_and_wake`) asks `over_limits` which of its tasks of limited
-- kinds would exceed their kind's limits: it locks each such kind's row, counts every
-- task the fleet holds of it by key, and refuses what does not fit. A kind that is fair
-- (V43) and nothing else has no limit to exceed, yet its tasks went through all of it:
-- the lock, which made every planner's write of the kind wait for the others', and the
-- count of what the fleet holds, which behind a backlog is the whole of every worker's
-- queue, at every round. Only kinds with a concurrency, a key concurrency or a rate are
-- locked and counted now; when none is among the round's tasks, nothing is.
-- The answer is the same: a fair kind's tasks were never refused.

create or replace function artex.over_limits(ids uuid[]) returns uuid[]
language plpgsql
set enable_nestloop = off
as $$
declare
    denied uuid[];
begin
    if ids is null or cardinality(ids) = 0 then
        return '{}';
    end if;
    -- Only a kind with a limit can refuse a task (V66).
    perform 1 from artex.kind_limits l
    where l.kind in (select t.kind from artex.tasks t where t.id = any(ids))
      and (l.concurrency is not null or l.key_concurrency is not null
           or l.rate_per_sec is not null)
    order by l.kind
    for update;
    if not found then
        return '{}';
    end if;
    with lim as materialized (
        select l.kind, l.concurrency, l.key_concurrency, l.rate_per_sec,
               case when l.rate_per_sec is not null then
                   least(greatest(l.rate_per_sec, 1),
                         l.tokens + l.rate_per_sec
                                    * extract(epoch from clock_timestamp() - l.refilled_at))
               end as tokens
        from artex.kind_limits l
        where l.kind in (select t.kind from artex.tasks t where t.id = any(ids))
          and (l.concurrency is not null or l.key_concurrency is not null
               or l.rate_per_sec is not null)
    ),
    held as materialized (
        select t.kind, t.limit_key, count(*) as n
        from artex.tasks t
        where t.assigned_to is not null and t.limited and t.kind in (select kind from lim)
        group by t.kind, t.limit_key
    ),
    asked as materialized (
        select v.id, v.n, t.kind, t.limit_key,
               row_number() over (partition by t.kind, t.limit_key order by v.n) as nth_of_key
        from unnest(ids) with ordinality as v(id, n) join artex.tasks t on t.id = v.id
        where t.id = any(ids) and t.kind in (select kind from lim)
    ),
    held_kind as materialized (
        select h.kind, sum(h.n) as n from held h group by h.kind
    ),
    fits_key as (
        select a.*, row_number() over (partition by a.kind order by a.n) as nth_of_kind
        from asked a join lim l on l.kind = a.kind
             left join held h on h.kind = a.kind and h.limit_key = a.limit_key
        where l.key_concurrency is null or a.limit_key is null
           or a.nth_of_key <= l.key_concurrency - coalesce(h.n, 0)
    ),
    allowed as materialized (
        select f.id, f.kind from fits_key f join lim l on l.kind = f.kind
             left join held_kind hk on hk.kind = f.kind
        where (l.concurrency is null or f.nth_of_kind <= l.concurrency - coalesce(hk.n, 0))
          and (l.tokens is null or f.nth_of_kind <= floor(l.tokens))
    ),
    took as (
        update artex.kind_limits k
        set tokens = l.tokens - (select count(*) from allowed a where a.kind = k.kind),
            refilled_at = clock_timestamp()
        from lim l
        where l.kind = k.kind and l.rate_per_sec is not null
    )
    select coalesce(array_agg(a.id), '{}') into denied
    from asked a
    where a.id not in (select id from allowed);
    return denied;
end
$$;

comment on function artex.over_limits(uuid[]) is
    'Of the tasks a planner is about to assign, those that would exceed their kind''s limits, counted under the kinds'' row locks (migrations/V18__tags_and_limits.sql); run with nested loops off, so that no join of its CTEs compares every pair of rows (V49). A kind that is only fair has no limit to exceed: it is neither locked nor counted (V66).';

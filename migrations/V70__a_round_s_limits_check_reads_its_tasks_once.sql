-- V70: a round's limits check reads the tasks it was asked about once. Expand.
--
-- `over_limits` (the round's write, for the tasks of limited kinds) looked each task up
-- by its primary key three times: for the kinds whose limits to lock, for those limits
-- again, and for the keys it counts. A kind limit that does not bind is paid for by the
-- planner's rounds alone (a worker never claims a limited kind's task), one after the
-- other: a round of 2,000 such tasks took 11–23 ms to read and 31–49 ms to write
-- (auto_explain, timing off), so the check's lookups were the limited kind's pace. Now
-- one read gathers each task's kind and key, in the order asked, and the rest works
-- from it: 8.7–8.9 ms a call for 2,000 tasks instead of 12.1–12.5 (a scratch cluster,
-- 20,000 pending tasks on 1,000 keys). Its answers are the same: compared on 2,000 tasks
-- in random order against 3,000 held, under a kind limit, a key limit and both.

create or replace function artex.over_limits(ids uuid[]) returns uuid[]
    language plpgsql
    set enable_nestloop to 'off'
    as $$
declare
    denied uuid[];
    a_ids uuid[];
    a_ns int8[];
    a_kinds text[];
    a_keys text[];
    kinds text[];
begin
    if ids is null or cardinality(ids) = 0 then
        return '{}';
    end if;
    -- The tasks asked for, read once: their kinds name the limits to lock, and their keys
    -- are counted below. The round holds their rows locked (its read's `for update`).
    select array_agg(v.id order by v.n), array_agg(v.n order by v.n),
           array_agg(t.kind order by v.n), array_agg(t.limit_key order by v.n),
           array_agg(distinct t.kind)
    into a_ids, a_ns, a_kinds, a_keys, kinds
    from unnest(ids) with ordinality as v(id, n) join artex.tasks t on t.id = v.id
    where t.id = any(ids);
    -- Only a kind with a limit can refuse a task (V66).
    perform 1 from artex.kind_limits l
    where l.kind = any(kinds)
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
        where l.kind = any(kinds)
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
        select a.id, a.n, a.kind, a.limit_key,
               row_number() over (partition by a.kind, a.limit_key order by a.n) as nth_of_key
        from unnest(a_ids, a_ns, a_kinds, a_keys) as a(id, n, kind, limit_key)
        where a.kind in (select kind from lim)
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

comment on function artex.over_limits(uuid[]) is 'Of the tasks a planner is about to assign, those that would exceed their kind''s limits, counted under the kinds'' row locks (migrations/V18__tags_and_limits.sql); run with nested loops off, so that no join of its CTEs compares every pair of rows (V49). A kind that is only fair has no limit to exceed: it is neither locked nor counted (V66). The tasks asked for are read once, for their kinds and keys (V70).';

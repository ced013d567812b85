-- V30: the assignment's limits check finds the tasks it is asked about by their ids (a
-- fix, issue 39). Expand: the same function, calls and results.
--
-- `over_limits` joined the ids it was given to `tasks` on the id alone, and PostgreSQL
-- planned that join as a hash of the whole table: a sequential scan of `tasks` in every
-- round that assigned tasks of a limited kind (15 ms of a 20 ms check with 20,000 tasks
-- waiting; a table of a million tasks would be read whole each round). The ids are now
-- also said as `t.id = any(ids)`, which the primary key serves.
create or replace function artex.over_limits(ids uuid[]) returns uuid[]
language plpgsql as $$
declare
    denied uuid[];
begin
    if ids is null or cardinality(ids) = 0 then
        return '{}';
    end if;
    perform 1 from artex.kind_limits l
    where l.kind in (select t.kind from artex.tasks t where t.id = any(ids))
    order by l.kind
    for update;
    with lim as materialized (
        select l.kind, l.concurrency, l.key_concurrency, l.rate_per_sec,
               case when l.rate_per_sec is not null then
                   least(greatest(l.rate_per_sec, 1),
                         l.tokens + l.rate_per_sec
                                    * extract(epoch from clock_timestamp() - l.refilled_at))
               end as tokens
        from artex.kind_limits l
        where l.kind in (select t.kind from artex.tasks t where t.id = any(ids))
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

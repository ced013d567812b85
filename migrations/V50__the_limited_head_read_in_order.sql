-- V50: a limited kind's round reads the head of its queue in order (issue 39). Expand.
--
-- The round's read takes the head of the limited tasks' queue (`ahead`: twice the
-- round's free places, by priority and age) and checks it against the limits. Whenever
-- PostgreSQL's statistics said few limited tasks wait (as they do when `tasks` was
-- analyzed before a backlog came, and autovacuum analyzes a minute later at best),
-- every plan looked alike to it, and it chose to gather every pending limited task
-- (from `tasks_limited_waiting` or `tasks_listed`) and sort them to keep the first few
-- thousand. In a copy of the bench's `limits` part every logged round did so (15,701
-- tasks read and sorted for a head of 4,000; reads of 15-28 ms on average). Across
-- bench runs the read's mean moved from 5.7 to 23 ms with the plan, and the limited
-- kind's throughput from 15,862 to 8,361 tasks/s.
--
-- The head is now read by `artex.limited_head`, one statement run with sorts off: the
-- only plan left without a sort walks `tasks_limited_runnable` in its order and stops
-- at the head's size, whatever the statistics say. (Sorts off for the whole round's
-- read made its other statements' plans far worse: 1.8 s a round.) And the tasks that
-- fit are locked by a lookup of each by its primary key: with the head's new estimate
-- PostgreSQL joined them to `tasks` by scanning the list of those that fit once per
-- task (2,000 × 2,000). tests/blackboard/plans.rs checks its plan with statistics
-- taken before the backlog.
--
-- With the head's read stable, ranking it by key and by kind (two window functions,
-- each a sort of twice the round's places, then a third back into queue order) was the
-- largest part of the read: about 5.7 of 10.8 ms in a logged round. The head is now
-- numbered as `limited_head` returns it (`with ordinality`, no sort), one grouping
-- checks whether any key or kind among its first places is over its room, and only a
-- head that is over is ranked. The same tasks are claimed: the first places fit whole
-- exactly when every one of them passes the ranking's checks (a task's rank in its key
-- and its kind counts only the tasks ahead of it, which are among those places too),
-- and the write counts again under the kinds' locks (`over_limits`). Measured as a
-- step of its own (docs/bench/2026-12-05.md): the read 3.2–3.6 ms a round against
-- 4.0–5.4, the limited kind 0.71–0.84× of its run's unlimited tasks against 0.63–0.81×.
--
-- The round's read keeps its signature and rows.

create function artex.limited_head(p_kinds text[], p_shard_count int4, p_shards int4[], p_n int8)
returns table (id uuid, kind text, key text, priority integer, run_at timestamptz)
language plpgsql stable
set enable_sort = off
as $fn$
begin
    return query
    select t.id, t.kind, coalesce(t.limit_key, ''), t.priority, t.run_at
    from artex.tasks t
    where t.listed = 'pending' and t.limited and t.run_at <= now()
      and t.kind = any(p_kinds)
      and (p_shard_count <= 1 or t.shard % p_shard_count = any(p_shards))
    order by t.priority desc, t.run_at, t.id
    limit p_n;
end
$fn$;

comment on function artex.limited_head(text[], int4, int4[], int8) is
    'The first p_n runnable tasks of limited kinds among p_kinds, in the shards given, by priority and age: the head of the limited queue a planner round checks against the limits (V50). Run with sorts off, so that it always walks tasks_limited_runnable in its order and stops there, whatever the statistics.';

create or replace function artex.dispatch_round(p_alive_secs float8, p_batch int8, p_shard_count int4, p_shards int4[], p_unreachable text[],
                                     p_walk boolean default true)
returns table (worker text, kinds text[], capacity integer, held integer, host text, task uuid, task_kind text, task_host text, wake_addr text, task_limited boolean, slots integer, task_fresh boolean)
language plpgsql
set plan_cache_mode = force_generic_plan
as $fn$
#variable_conflict use_column
begin
    -- No kind is limited and no task of a limited kind waits: the round is the roster
    -- and the claim, without the limits' dozen nodes that a plan starts and ends at
    -- every call (V34). (With limits set, the probe of the limited queue would walk the
    -- same index entries as the whole statement's head of that queue: it is skipped.)
    if not exists (select 1 from artex.kind_limits)
       and not exists (select 1 from artex.tasks t where t.listed = 'pending' and t.limited) then
        return query with roster as materialized (
            select w.id, w.kinds, w.capacity,
                   least(greatest(w.taken - coalesce(r.released, 0), 0), 2147483647)::int4 as held,
                   w.host, w.wake_addr, w.slots
            from artex.workers w left join artex.worker_released r on r.worker = w.id
            where w.state = 'online'
              and w.last_seen > now() - make_interval(secs => $1::float8)
              and (w.session is null
                   or w.session in (select application_name from pg_stat_activity))
              and w.id <> all($5::text[])
        ),
        claimed as (
            select id, kind, host, priority, run_at, false as limited from artex.tasks
            where listed = 'pending' and not limited and run_at <= now()
              and kind = any(array(select unnest(r.kinds) from roster r
                                   where r.capacity > r.held
                                   except select p.kind from artex.kind_pauses p))
              and ($3::int4 <= 1 or shard % $3::int4 = any($4::int4[]))
            order by priority desc, run_at, id
            limit least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                                   from roster r))
            for update skip locked
        )
        select r.id, r.kinds, r.capacity, r.held, r.host, null::uuid, null::text, null::text,
               r.wake_addr, null::bool, r.slots, null::bool
        from roster r
        union all
        (select null, null, null, null, null, c.id, c.kind, c.host, null, c.limited, null,
                null::bool
         from claimed c
         order by c.priority desc, c.run_at, c.id);
        return;
    end if;
    return query with roster as materialized (
        select w.id, w.kinds, w.capacity,
               least(greatest(w.taken - coalesce(r.released, 0), 0), 2147483647)::int4 as held,
               w.host, w.wake_addr, w.slots
        from artex.workers w left join artex.worker_released r on r.worker = w.id
        where w.state = 'online'
          and w.last_seen > now() - make_interval(secs => $1::float8)
          and (w.session is null
               or w.session in (select application_name from pg_stat_activity))
          and w.id <> all($5::text[])
    ),
    limits as materialized (
        select l.kind, l.concurrency, l.key_concurrency, l.fair,
               case when l.rate_per_sec is not null then
                   floor(least(greatest(l.rate_per_sec, 1),
                               l.tokens + l.rate_per_sec
                                          * extract(epoch from now() - l.refilled_at)))
               end as tokens
        from artex.kind_limits l
    ),
    held as materialized (
        select t.kind, coalesce(t.limit_key, '') as key, count(*) as n
        from artex.tasks t
        where t.assigned_to is not null and t.limited and t.kind in (select kind from limits)
        group by t.kind, coalesce(t.limit_key, '')
    ),
    keys as (
        with recursive k (kind, key) as (
            (select t.kind, coalesce(t.limit_key, '') from artex.tasks t
             where t.listed = 'pending' and t.limited
             order by t.kind, coalesce(t.limit_key, '') limit 1)
            union all
            select n.kind, n.key from k cross join lateral (
                select t.kind, coalesce(t.limit_key, '') as key from artex.tasks t
                where t.listed = 'pending' and t.limited
                  and (t.kind, coalesce(t.limit_key, '')) > (k.kind, k.key)
                order by t.kind, coalesce(t.limit_key, '') limit 1) n
        )
        select k.kind, k.key from k
        where k.kind = any(array(select unnest(r.kinds) from roster r
                                 where r.capacity > r.held
                                 except select p.kind from artex.kind_pauses p))
    ),
    room as materialized (
        select l.kind, l.concurrency, l.key_concurrency, l.tokens, l.fair,
               l.concurrency - coalesce((select sum(h.n) from held h where h.kind = l.kind), 0)
                   as kind_room
        from limits l
    ),
    places as materialized (
        select least($2::int8, coalesce(sum(greatest(r.capacity - r.held, 0)), 0)) as n
        from roster r
    ),
    -- The free slots of the workers that run each kind: what a walk may take of it.
    kind_places as materialized (
        select k.kind, least($2::int8, sum(greatest(r.capacity - r.held, 0))) as n
        from roster r cross join lateral unnest(r.kinds) as k(kind)
        group by k.kind
    ),
    waiting as (
        select w.*, k.key, coalesce(l.fair, false) as fair, h.n is null as idle_key
        from keys k left join room l on l.kind = k.kind
             left join held h on h.kind = k.kind and h.key = k.key
        cross join lateral (
            select t.id, t.kind, t.priority, t.run_at from artex.tasks t
            where t.listed = 'pending' and t.limited and t.kind = k.kind
              and coalesce(t.limit_key, '') = k.key and t.run_at <= now()
              and ($3::int4 <= 1 or t.shard % $3::int4 = any($4::int4[]))
            order by t.priority desc, t.run_at, t.id
            limit greatest(least((select p.n from kind_places p where p.kind = k.kind),
                case when k.key <> '' then l.key_concurrency - coalesce(h.n, 0) end,
                l.kind_room, l.tokens), 0)
        ) w
    ),
    -- A fair kind's tasks go round by round: every key's first, then every key's
    -- second… (`turn`), at one priority; a higher priority goes first whatever its turn.
    -- Other kinds' tasks are all of turn 1: priority, then age (V43). Each kind takes at
    -- most the free slots of its workers (`kind_places`), so that one kind's queue does
    -- not crowd another's out of the round: the plan gives each worker its kinds' tasks
    -- in this order. A fair kind's task is `fresh` when it is the first of a key that
    -- holds no task in the fleet (V48): it goes at turn 0, ahead of the first turns of
    -- keys that hold some, and it may take the place each worker's local queue keeps,
    -- which the plan gives no other task of a fair kind.
    turns as (
        select w.*,
               case when not w.fair then 1
                    when w.idle_key and w.nth_of_key = 1 then 0
                    else w.nth_of_key end as turn,
               case when w.fair then w.idle_key and w.nth_of_key = 1 end as fresh
        from (
            select w.*, row_number() over (
                       partition by w.kind, w.key order by w.priority desc, w.run_at, w.id)
                       as nth_of_key
            from waiting w
        ) w
    ),
    walked as (
        select f.id, f.turn, f.fresh from (
            select w.*,
                   row_number() over (partition by w.kind
                                      order by w.priority desc, w.turn, w.run_at, w.id)
                       as nth_of_kind
            from turns w
        ) f left join room l on l.kind = f.kind
        where (l.kind_room is null or f.nth_of_kind <= l.kind_room)
          and (l.tokens is null or f.nth_of_kind <= l.tokens)
          and f.nth_of_kind <= (select p.n from kind_places p where p.kind = f.kind)
        order by f.priority desc, f.turn, f.run_at, f.id
        limit $2::int8
    ),
    -- The head of the limited queue, numbered in its order (`nth`, as `limited_head`
    -- returns it: no sort).
    ahead as materialized (
        select h.* from artex.limited_head(
            array(select unnest(r.kinds) from roster r
                  where r.capacity > r.held
                  except select p.kind from artex.kind_pauses p),
            $3::int4, $4::int4[], (select 2 * n from places))
            with ordinality as h(id, kind, key, priority, run_at, nth)
    ),
    -- The head's first `places` fit whole when no key among them has more tasks than
    -- its room and no kind more than its room or its tokens: they are then what fits,
    -- as they are (V50). Only a head that does not fit is ranked by key and by kind
    -- (three sorts of `ahead`'s rows).
    head_whole as materialized (
        select not exists (
                   select 1 from ahead a
                   left join room l on l.kind = a.kind
                   left join held h on h.kind = a.kind and h.key = a.key
                   where a.nth <= (select n from places) and a.key <> ''
                     and l.key_concurrency is not null
                   group by a.kind, a.key, l.key_concurrency, h.n
                   having count(*) > l.key_concurrency - coalesce(h.n, 0))
               and not exists (
                   select 1 from ahead a join room l on l.kind = a.kind
                   where a.nth <= (select n from places)
                   group by a.kind, l.kind_room, l.tokens
                   having count(*) > l.kind_room or count(*) > l.tokens) as whole
    ),
    ahead_fits as (
        select a.id from ahead a
        where (select whole from head_whole) and a.nth <= (select n from places)
        union all
        (select f.id from (
            select k.*,
                   row_number() over (partition by k.kind collate "C"
                                      order by k.priority desc, k.run_at, k.id) as nth_of_kind
            from (
                select a.*,
                       row_number() over (partition by a.kind collate "C", a.key collate "C"
                                          order by a.priority desc, a.run_at, a.id) as nth_of_key
                from ahead a
            ) k left join room l on l.kind = k.kind
                left join held h on h.kind = k.kind and h.key = k.key
            where k.key = '' or l.key_concurrency is null
               or k.nth_of_key <= l.key_concurrency - coalesce(h.n, 0)
        ) f left join room l on l.kind = f.kind
        where (l.kind_room is null or f.nth_of_kind <= l.kind_room)
          and (l.tokens is null or f.nth_of_kind <= l.tokens)
          and not (select whole from head_whole)
        order by f.priority desc, f.run_at, f.id
        limit (select n from places))
    ),
    settled as materialized (
        select not exists (select 1 from limits l where l.fair)
               and ((select count(*) from ahead_fits) >= (select n from places)
                    or (select count(*) from ahead) < (select 2 * n from places)
                    or not $6) as by_the_head
    ),
    fits as (
        select id, 1::int8 as turn, null::bool as fresh from ahead_fits
        where (select by_the_head from settled)
        union all
        select id, turn, fresh from walked where not (select by_the_head from settled)
    ),
    claimed as (
        select id, kind, host, priority, run_at, false as limited, 1::int8 as turn,
               null::bool as fresh
        from artex.tasks
        where listed = 'pending' and not limited and run_at <= now()
          and kind = any(array(select unnest(r.kinds) from roster r
                               where r.capacity > r.held
                               except select p.kind from artex.kind_pauses p))
          and ($3::int4 <= 1 or shard % $3::int4 = any($4::int4[]))
        order by priority desc, run_at, id
        limit least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                               from roster r))
        for update skip locked
    ),
    -- Each task that fits, looked up by its id and locked (V50): a join of `fits` with
    -- `tasks` let PostgreSQL scan `fits` again for every task when its statistics
    -- were stale (2,000 × 2,000 rows compared). The check of its state is one no
    -- partial index can take (`is true`), so the lookup goes by the primary key.
    claimed_limited as (
        select t.id, t.kind, t.host, t.priority, t.run_at, true as limited, f.turn, f.fresh
        from fits f
        cross join lateral (
            select t.id, t.kind, t.host, t.priority, t.run_at from artex.tasks t
            where t.id = f.id and (t.listed = 'pending' and t.limited) is true
            for update skip locked
        ) t
        order by t.priority desc, f.turn, t.run_at, t.id
        limit $2::int8
    )
    select r.id, r.kinds, r.capacity, r.held, r.host, null::uuid, null::text, null::text,
           r.wake_addr, null::bool, r.slots, null::bool
    from roster r
    union all
    (select null, null, null, null, null, c.id, c.kind, c.host, null, c.limited, null, c.fresh
     from (select * from claimed union all select * from claimed_limited) c
     order by c.priority desc, c.turn, c.run_at, c.id);
end
$fn$;

comment on function artex.dispatch_round(float8, int8, int4, int4[], text[], boolean) is
    'The planner round''s read: the roster and the claim, of the kinds of workers with a free slot but the paused ones (V38); the tasks of limited kinds by the head of their queue when the limits do not bind there and no kind is fair, else (when p_walk, or always with a fair kind) by a walk of their keys, a fair kind''s round-robin across its keys (V29, V37, V43), a head whose first places fit whole taken as it is (V50); each roster row with the worker''s slots, each fair kind''s task saying whether it may take the place a worker''s local queue keeps for a key holding nothing (V48); the head of the limited queue read in its order (V50). Called by planner/dispatch.rs (DISPATCH_CALL); the statement lives only here.';

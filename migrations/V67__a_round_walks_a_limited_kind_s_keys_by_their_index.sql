-- V67: a round walks a limited kind's keys by their index whatever the statistics. Expand.
--
-- A round of a fair kind (or one whose limits bind) walks the keys that wait and takes
-- each key's first tasks. Each key's tasks were ordered by priority and age, an order two
-- partial indexes hold: `tasks_limited_waiting` (kind, key, priority, age), which goes
-- straight to the key, and `tasks_limited_runnable` (priority, age), which walks every
-- limited task and skips the other keys'. When the statistics said few tasks were
-- pending (the table analyzed while the queue was empty, or a planner's session that
-- made its plans then), PostgreSQL costed the two alike and sometimes took the second:
-- behind a backlog of 20,000 tasks of one key, every round walked all of them to find
-- another key's task, 120–145 ms a round instead of about 1.4, and that key's tasks
-- waited 195–225 ms instead of 7–8 (scratch runs: 2 of 15 at one code, and the one
-- whose table was analyzed empty before the burst). With the statistics of an empty
-- table the same plan also walked the keys and each key's tasks by scanning the table
-- and sorting it, and looked up each task it took by scanning the table again.
-- Each key's tasks are now ordered by key first (the same order: the key is fixed),
-- which only `tasks_limited_waiting` holds; the key is written as a range of one
-- (`>=` and `<=`), because PostgreSQL drops an order by a column its equality fixes.
-- And the statement runs with sorts and sequential scans off (`runnable_head` and
-- `limited_head` run with sorts off since V51): every table it reads has the index its
-- reads need, and no plan reads a key's tasks, walks the keys or looks a task up by
-- scanning (and sorting) the table. It also runs with JIT off: the sorts the statement cannot do without (its
-- windows, its final order) carry the planner's penalty for a disabled node in their
-- cost, which would otherwise start a JIT compilation at every call (2.3 s a round,
-- measured).

create or replace function artex.dispatch_round(p_alive_secs double precision, p_batch bigint, p_shard_count integer, p_shards integer[], p_unreachable text[], p_walk boolean DEFAULT true) RETURNS TABLE(worker text, kinds text[], capacity integer, held integer, host text, task uuid, task_kind text, task_host text, wake_addr text, task_limited boolean, slots integer, task_fresh boolean)
language plpgsql
set plan_cache_mode = force_generic_plan
set enable_sort = off
set enable_seqscan = off
set jit = off
as $_$
#variable_conflict use_column
begin
    -- No kind is limited and no task of a limited kind waits: the round is the roster
    -- and the claim, without the limits' dozen nodes that a plan starts and ends at
    -- every call (V34). (With limits set, the probe of the limited queue would walk the
    -- same index entries as the whole statement's head of that queue: it is skipped.)
    if not exists (select 1 from artex.kind_limits) and not artex.limited_waiting() then
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
        -- The head of the queue, locked (V51: `runnable_head`, in its order).
        claimed as (
            select h.id, h.kind, h.host, h.nth from artex.runnable_head(
                array(select unnest(r.kinds) from roster r
                      where r.capacity > r.held
                      except select p.kind from artex.kind_pauses p),
                null, $3::int4, $4::int4[],
                least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                                 from roster r)))
                with ordinality as h(id, kind, host, priority, run_at, nth)
        )
        select r.id, r.kinds, r.capacity, r.held, r.host, null::uuid, null::text, null::text,
               r.wake_addr, null::bool, r.slots, null::bool
        from roster r
        union all
        (select null, null, null, null, null, c.id, c.kind, c.host, null, false, null,
                null::bool
         from claimed c
         order by c.nth);
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
    -- Each waiting key with the tasks the fleet holds of it, by an aggregate over both
    -- (V65): never a join of two CTEs, which PostgreSQL may run as a nested loop, every
    -- key against every held one, when its estimate of `held` is small.
    keys_held as (
        select x.kind, x.key, sum(x.n)::int8 as n
        from (select k.kind, k.key, 0::int8 as n, true as waiting from keys k
              union all
              select h.kind, h.key, h.n, false from held h) x
        group by x.kind, x.key
        having bool_or(x.waiting)
    ),
    waiting as (
        select w.*, k.key, coalesce(l.fair, false) as fair, k.n = 0 as idle_key
        from keys_held k left join room l on l.kind = k.kind
        cross join lateral (
            select t.id, t.kind, t.priority, t.run_at from artex.tasks t
            -- The key as a range of one (V67): an equality would make the key's place
            -- in the order below redundant, and then `tasks_limited_runnable` would hold
            -- that order too; as it is, only `tasks_limited_waiting` does.
            where t.listed = 'pending' and t.limited and t.kind = k.kind
              and coalesce(t.limit_key, '') >= k.key and coalesce(t.limit_key, '') <= k.key
              and t.run_at <= now()
              and ($3::int4 <= 1 or t.shard % $3::int4 = any($4::int4[]))
            order by coalesce(t.limit_key, ''), t.priority desc, t.run_at, t.id
            limit greatest(least((select p.n from kind_places p where p.kind = k.kind),
                case when k.key <> '' then l.key_concurrency - k.n end,
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
        -- Counted by an aggregate over the head and `held` together, not a join of the
        -- two (V65: a nested loop of 1,447 × 754 rows took 35–130 ms a round).
        select not exists (
                   select 1 from (
                       select a.kind, a.key, 1 as asked, 0::int8 as held from ahead a
                       where a.nth <= (select n from places) and a.key <> ''
                       union all
                       select h.kind, h.key, 0, h.n from held h
                   ) x join room l on l.kind = x.kind
                   where l.key_concurrency is not null
                   group by x.kind, x.key, l.key_concurrency
                   having sum(x.asked) > 0
                      and sum(x.asked) > l.key_concurrency - sum(x.held))
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
                -- The head's tasks with their keys' held tasks beside them, by window
                -- over both (V65; a join of `ahead` and `held` could go by nested loop).
                select u.*,
                       row_number() over (partition by u.kind collate "C", u.key collate "C"
                                          order by u.id is null, u.priority desc, u.run_at,
                                                   u.id) as nth_of_key,
                       sum(u.held) over (partition by u.kind collate "C", u.key collate "C")
                           as key_held
                from (select a.id, a.kind, a.key, a.priority, a.run_at, 0::int8 as held
                      from ahead a
                      union all
                      select null, h.kind, h.key, null, null, h.n from held h) u
            ) k left join room l on l.kind = k.kind
            where k.id is not null
              and (k.key = '' or l.key_concurrency is null
                   or k.nth_of_key <= l.key_concurrency - k.key_held)
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
        select h.id, h.kind, h.host, h.priority, h.run_at, false as limited, 1::int8 as turn,
               null::bool as fresh
        from artex.runnable_head(
            array(select unnest(r.kinds) from roster r
                  where r.capacity > r.held
                  except select p.kind from artex.kind_pauses p),
            null, $3::int4, $4::int4[],
            least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                             from roster r))) h
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
$_$;

comment on function artex.dispatch_round(p_alive_secs double precision, p_batch bigint, p_shard_count integer, p_shards integer[], p_unreachable text[], p_walk boolean) is 'The planner round''s read: the roster and the claim, of the kinds of workers with a free slot but the paused ones (V38); the tasks of limited kinds by the head of their queue when the limits do not bind there and no kind is fair, else (when p_walk, or always with a fair kind) by a walk of their keys, a fair kind''s round-robin across its keys (V29, V37, V43), a head whose first places fit whole taken as it is (V50); each roster row with the worker''s slots, each fair kind''s task saying whether it may take the place a worker''s local queue keeps for a key holding nothing (V48); the head of the limited queue read in its order (V50), and the unlimited one''s by runnable_head (V51). What the keys hold is set beside the head and the keys by aggregates and windows, never a join of two CTEs (V65). Run with sorts and sequential scans off (and JIT off, which the penalty of its sorts in its cost would start), so that its walks of the limited queue and its lookups go by their indexes whatever the statistics (V67). Called by planner/dispatch.rs (DISPATCH_CALL); the statement lives only here.';

-- V51: the claims of unlimited tasks walk the queue in order, whatever the statistics
-- (issue 39). Expand.
--
-- A fresh blackboard's `tasks` is empty when its planners and workers first claim, and
-- its statistics say so: building its indexes counted no row. Each session plans the
-- round's read then (its statements' plans are generic and cached) and keeps that plan
-- until the table is analyzed again, which PostgreSQL's autovacuum does a minute or
-- more after a burst by default. With a table it believed empty, PostgreSQL chose to
-- read every pending task and sort them to keep the round's head: in a hand-run W1 from
-- idle on such a database (20,000 tasks), every logged round read 14,644–19,860 task
-- rows and sorted them, 9–11 ms a round against about 1 ms. The same holds for a queue
-- that was emptied (retention) and analyzed so before a backlog came.
--
-- The round's first look, whether any task of a limited kind waits, read the whole
-- table the same way (3.6 ms for 20,000 tasks, to find none); it is now
-- `artex.limited_waiting`, a SQL function, whose statement is planned at each call
-- (not kept from the table's empty days), and run with sequential scans off, so that
-- it looks in the limited tasks' index.
--
-- The head of the runnable queue is now `artex.runnable_head`, one statement run with
-- sorts off, as V50 did for the limited queue: the only plan left walks
-- `tasks_runnable` in its order, locks as it goes (`for update skip locked`) and stops
-- at the head's size. The round's read (both of its statements) and a worker's claim
-- take their tasks from it, so the two claims of unlimited tasks are one statement.
-- The tasks claimed and their order are the same. tests/blackboard/plans.rs checks
-- the round and a worker's claim and read with plans made on an empty table.

create function artex.runnable_head(p_kinds text[], p_host text, p_shard_count int4, p_shards int4[], p_n int8)
returns table (id uuid, kind text, host text, priority integer, run_at timestamptz)
language plpgsql
set enable_sort = off
as $fn$
begin
    return query
    select t.id, t.kind, t.host, t.priority, t.run_at
    from artex.tasks t
    where t.listed = 'pending' and not t.limited and t.run_at <= now()
      and t.kind = any(p_kinds)
      and (p_host is null or t.host is null or t.host = p_host)
      and (p_shard_count <= 1 or t.shard % p_shard_count = any(p_shards))
    order by t.priority desc, t.run_at, t.id
    limit p_n
    for update of t skip locked;
end
$fn$;

comment on function artex.runnable_head(text[], text, int4, int4[], int8) is
    'The first p_n runnable tasks of kinds that are not limited among p_kinds, in the shards given, bound to no host or to p_host (any host when p_host is null), by priority and age, locked for update (skip locked): the head of the queue a planner round or a worker''s claim takes (V51). Run with sorts off, so that it always walks tasks_runnable in its order and stops there, whatever the statistics.';

create function artex.limited_waiting()
returns boolean
language sql stable
set enable_seqscan = off
as $fn$
    select exists (select 1 from artex.tasks t where t.listed = 'pending' and t.limited)
$fn$;

comment on function artex.limited_waiting() is
    'Whether any task of a limited kind waits: the round''s probe for its small statement (V34). Run with sequential scans off, so that it always looks in the limited tasks'' index, whatever the statistics (V51).';

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
$fn$;

comment on function artex.dispatch_round(float8, int8, int4, int4[], text[], boolean) is
    'The planner round''s read: the roster and the claim, of the kinds of workers with a free slot but the paused ones (V38); the tasks of limited kinds by the head of their queue when the limits do not bind there and no kind is fair, else (when p_walk, or always with a fair kind) by a walk of their keys, a fair kind''s round-robin across its keys (V29, V37, V43), a head whose first places fit whole taken as it is (V50); each roster row with the worker''s slots, each fair kind''s task saying whether it may take the place a worker''s local queue keeps for a key holding nothing (V48); the head of the limited queue read in its order (V50), and the unlimited one''s by runnable_head (V51). Called by planner/dispatch.rs (DISPATCH_CALL); the statement lives only here.';

create or replace function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean)
RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean)
language plpgsql
set plan_cache_mode = force_generic_plan
-- Plain index scans, as for `read_assigned` (below): the claim's look and pick walk the
-- runnable tasks' index, where every task claimed leaves a dead entry until a vacuum.
set enable_bitmapscan = off
as $_$
#variable_conflict use_column
declare
    v_claimed text;
    v_room boolean;
    v_waiting boolean;
begin
    -- How many it claimed, for the read below (a statement of its own that `plans.rs`
    -- prepares alone: it names no variable of this function).
    perform set_config('artex.claimed', '0', true);
    -- Anything to claim, and a free slot to claim it in? A look without a lock: an idle
    -- queue costs no write.
    select w.capacity > w.taken - coalesce(
               (select r.released from artex.worker_released r where r.worker = w.id), 0),
           exists (
               select 1 from artex.tasks t
               where t.listed = 'pending' and not t.limited and t.run_at <= now()
                 and t.kind = any(w.kinds)
                 and (t.host is null or t.host = w.host))
    into v_room, v_waiting
    from artex.workers w
    where w.id = $1 and w.state = 'online';
    if v_waiting and not v_room then
        -- Tasks it may run wait, and the blackboard counts every slot of it taken: its
        -- outcomes are not written yet. It claims again once they are (V47).
        perform set_config('artex.claimed', '-1', true);
    elsif v_waiting then
        perform set_config('artex.hot', 'on', true);
        with room as materialized (
            select w.id, w.host, w.lease_ms,
                   array(select unnest(w.kinds)
                         except select p.kind from artex.kind_pauses p
                         except select l.kind from artex.kind_limits l) as kinds,
                   greatest(w.capacity - greatest(w.taken - coalesce(r.released, 0), 0), 0)
                       as free
            from artex.workers w left join artex.worker_released r on r.worker = w.id
            where w.id = $1 and w.state = 'online'
            for update of w
        ),
        picked as (
            select h.id from artex.runnable_head(
                (select kinds from room), (select host from room), 1, '{}',
                (select free from room)) h
        ),
        assigned as (
            update artex.tasks t
            set status = 'assigned', assigned_to = room.id,
                lease_until = now() + make_interval(secs => coalesce(room.lease_ms, 30000) / 1000.0),
                lease_epoch = t.lease_epoch + 1, updated_at = now()
            from artex.set_context($1, 'assigned') ctx, room
            where ctx and t.id in (select id from picked)
              and t.status::text = 'pending' -- by primary key: see record_attempts
            returning t.id
        ),
        counted as (
            update artex.workers w
            set taken = w.taken + g.n,
                held = least(greatest(w.taken + g.n - coalesce(
                    (select r.released from artex.worker_released r where r.worker = w.id), 0),
                    0), 2147483647)::int
            from (select count(*) as n from assigned) g
            where w.id = $1 and g.n > 0
            returning g.n
        )
        select set_config('artex.claimed', coalesce((select c.n from counted c), 0)::text, true)
        into v_claimed;
        perform set_config('artex.hot', '', true);
    end if;
    -- The read is `read_assigned`'s own, the snapshot's row (n = 0) saying how many the
    -- claim took.
    return query select r.*,
           case when r.n = 0 then greatest(current_setting('artex.claimed')::int8, 0) end,
           case when r.n = 0 then current_setting('artex.claimed') = '-1' end
    from artex.read_assigned($1, $2, $3, $4) r
    order by r.n;
end
$_$;
comment on function artex.claim_and_read(text, bigint, bigint, boolean) is
    'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host; the head of the queue by runnable_head, V51), then read_assigned''s rows (the read itself), the snapshot row saying how many it claimed and, in no_room, whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

-- A worker's read of its assignments (its claim's second half, and its read alone) found
-- its tasks the same way on a table it believed empty: every task row read, 20,000 for
-- the 100 it held. Its only index is the holders' (`tasks_holder`), which it now always
-- takes, as V49 set the limits' check.
alter function artex.read_assigned(text, bigint, bigint, boolean) set enable_seqscan = off;

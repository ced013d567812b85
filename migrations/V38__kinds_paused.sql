-- V38: a kind can be paused (issue 37): its tasks stay pending — submissions accepted,
-- schedules firing, tasks already handed out finishing — until it is resumed. Expand:
-- new tables and functions; `dispatch_round` keeps its arguments and results.
--
-- `artex.kind_pauses` holds the paused kinds (one row each, with why, who and since
-- when): planners read it at every round, so a pause holds across restarts and for
-- every planner. A round's claim takes only the kinds of workers with a free slot less
-- the paused ones (the same array the claim already computed; `kind_pauses` is a few
-- rows). `artex.kind_changes` is the audit: one row per pause and resume, with its
-- reason and actor. `artex.pause_kind` and `artex.resume_kind` are what the CLI, the API
-- and plain SQL call; a resume wakes the planners (`artex_tasks`), as a submission does.

create table artex.kind_pauses (
    kind text primary key check (artex.is_kind_name(kind)),
    reason text check (char_length(reason) <= 10000),
    paused_by text not null,
    paused_at timestamptz not null default now()
);
comment on table artex.kind_pauses is
    'Paused task kinds: their tasks stay pending until resumed (migrations/V38). Written by artex.pause_kind and artex.resume_kind.';

create table artex.kind_changes (
    id bigint generated always as identity primary key,
    kind text not null,
    change text not null check (change in ('paused', 'resumed')),
    reason text,
    actor text not null,
    at timestamptz not null default now()
);
create index kind_changes_kind on artex.kind_changes (kind, id);
comment on table artex.kind_changes is
    'The audit of kind pauses and resumes, with their reasons (migrations/V38).';

-- Pauses `p_kind` (true), or leaves a paused kind as it is (false).
create function artex.pause_kind(p_kind text, p_reason text default null,
                                 p_actor text default current_user)
returns boolean language plpgsql as $fn$
begin
    insert into artex.kind_pauses (kind, reason, paused_by)
    values (p_kind, p_reason, p_actor)
    on conflict (kind) do nothing;
    if not found then
        return false;
    end if;
    insert into artex.kind_changes (kind, change, reason, actor)
    values (p_kind, 'paused', p_reason, p_actor);
    return true;
end
$fn$;
comment on function artex.pause_kind(text, text, text) is
    'Pauses a task kind: its tasks stay pending until artex.resume_kind. False when it was paused already (nothing written). Audited in artex.kind_changes (V38).';

-- Resumes `p_kind` (true), or does nothing to a kind that is not paused (false).
create function artex.resume_kind(p_kind text, p_reason text default null,
                                  p_actor text default current_user)
returns boolean language plpgsql as $fn$
begin
    delete from artex.kind_pauses where kind = p_kind;
    if not found then
        return false;
    end if;
    insert into artex.kind_changes (kind, change, reason, actor)
    values (p_kind, 'resumed', p_reason, p_actor);
    perform pg_notify('artex_tasks', '');
    return true;
end
$fn$;
comment on function artex.resume_kind(text, text, text) is
    'Resumes a paused task kind and wakes the planners. False when it was not paused (nothing written). Audited in artex.kind_changes (V38).';

create or replace function artex.dispatch_round(p_alive_secs float8, p_batch int8, p_shard_count int4, p_shards int4[], p_unreachable text[],
                                     p_walk boolean default true)
returns table (worker text, kinds text[], capacity integer, held integer, host text, task uuid, task_kind text, task_host text, wake_addr text, task_limited boolean)
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
                   w.host, w.wake_addr
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
               r.wake_addr, null::bool
        from roster r
        union all
        (select null, null, null, null, null, c.id, c.kind, c.host, null, c.limited
         from claimed c
         order by c.priority desc, c.run_at, c.id);
        return;
    end if;
    return query with roster as materialized (
        select w.id, w.kinds, w.capacity,
               least(greatest(w.taken - coalesce(r.released, 0), 0), 2147483647)::int4 as held,
               w.host, w.wake_addr
        from artex.workers w left join artex.worker_released r on r.worker = w.id
        where w.state = 'online'
          and w.last_seen > now() - make_interval(secs => $1::float8)
          and (w.session is null
               or w.session in (select application_name from pg_stat_activity))
          and w.id <> all($5::text[])
    ),
    limits as materialized (
        select l.kind, l.concurrency, l.key_concurrency,
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
        select l.kind, l.concurrency, l.key_concurrency, l.tokens,
               l.concurrency - coalesce((select sum(h.n) from held h where h.kind = l.kind), 0)
                   as kind_room
        from limits l
    ),
    waiting as (
        select w.* from keys k left join room l on l.kind = k.kind
             left join held h on h.kind = k.kind and h.key = k.key
        cross join lateral (
            select t.id, t.kind, t.priority, t.run_at from artex.tasks t
            where t.listed = 'pending' and t.limited and t.kind = k.kind
              and coalesce(t.limit_key, '') = k.key and t.run_at <= now()
              and ($3::int4 <= 1 or t.shard % $3::int4 = any($4::int4[]))
            order by t.priority desc, t.run_at, t.id
            limit greatest(least($2::int8,
                case when k.key <> '' then l.key_concurrency - coalesce(h.n, 0) end,
                l.kind_room, l.tokens), 0)
        ) w
    ),
    walked as (
        select f.id from (
            select w.*,
                   row_number() over (partition by w.kind
                                      order by w.priority desc, w.run_at, w.id) as nth_of_kind
            from waiting w
        ) f left join room l on l.kind = f.kind
        where (l.kind_room is null or f.nth_of_kind <= l.kind_room)
          and (l.tokens is null or f.nth_of_kind <= l.tokens)
        order by f.priority desc, f.run_at, f.id
        limit least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                               from roster r))
    ),
    places as materialized (
        select least($2::int8, coalesce(sum(greatest(r.capacity - r.held, 0)), 0)) as n
        from roster r
    ),
    ahead as materialized (
        select t.id, t.kind, coalesce(t.limit_key, '') as key, t.priority, t.run_at
        from artex.tasks t
        where t.listed = 'pending' and t.limited and t.run_at <= now()
          and t.kind = any(array(select unnest(r.kinds) from roster r
                                 where r.capacity > r.held
                                 except select p.kind from artex.kind_pauses p))
          and ($3::int4 <= 1 or t.shard % $3::int4 = any($4::int4[]))
        order by t.priority desc, t.run_at, t.id
        limit (select 2 * n from places)
    ),
    ahead_fits as (
        select f.id from (
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
        order by f.priority desc, f.run_at, f.id
        limit (select n from places)
    ),
    settled as materialized (
        select (select count(*) from ahead_fits) >= (select n from places)
               or (select count(*) from ahead) < (select 2 * n from places)
               or not $6 as by_the_head
    ),
    fits as (
        select id from ahead_fits where (select by_the_head from settled)
        union all
        select id from walked where not (select by_the_head from settled)
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
    ),
    claimed_limited as (
        select id, kind, host, priority, run_at, true as limited from artex.tasks
        where id = any(array(select id from fits)) and listed = 'pending' and limited
        order by priority desc, run_at, id
        limit least($2::int8, (select coalesce(sum(greatest(r.capacity - r.held, 0)), 0)
                               from roster r))
        for update skip locked
    )
    select r.id, r.kinds, r.capacity, r.held, r.host, null::uuid, null::text, null::text,
           r.wake_addr, null::bool
    from roster r
    union all
    (select null, null, null, null, null, c.id, c.kind, c.host, null, c.limited
     from (select * from claimed union all select * from claimed_limited) c
     order by c.priority desc, c.run_at, c.id);
end
$fn$;

comment on function artex.dispatch_round(float8, int8, int4, int4[], text[], boolean) is
    'The planner round''s read: the roster and the claim, of the kinds of workers with a free slot but the paused ones (V38); the tasks of limited kinds by the head of their queue when the limits do not bind there, else (when p_walk) by a walk of their keys (V29, V37). Called by planner/dispatch.rs (DISPATCH_CALL); the statement lives only here.';

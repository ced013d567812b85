-- V18: tags, and concurrency and rate limits per kind and per key (issue 24, features 3
-- and 7). Contract: the planner round's two plan-cached functions change their
-- signatures (the claim says which tasks are limited; the assignment takes them), so
-- an older planner cannot call them; older workers and API servers run on as before.
--
-- Tags: `tasks.tags`, a few short labels given at submission, found through a GIN index
-- that holds only tagged tasks: a task without tags writes no entry in it.
--
-- Limits: `artex.kind_limits` holds, per kind, at most how many of its tasks are held
-- (assigned or running) at once fleet-wide (`concurrency`), at most how many of one
-- `limit_key` (`key_concurrency`: a submission's key, e.g. a customer, so that one tenant
-- cannot fill the fleet), and how many may start per second (`rate_per_sec`, a token
-- bucket holding at most one second's worth, never less than one token).
--
-- Where they are enforced: in the planner round's write, under a lock. The round's read
-- (DISPATCH) proposes the tasks of limited kinds that should fit, by its snapshot; the
-- write (`artex.assign_round`) first calls `artex.over_limits`, which locks the kinds'
-- rows in one order and then counts, in a fresh snapshot, the tasks held: every
-- assignment committed by another planner before the lock was taken is counted, and a
-- worker's end only lowers the count. So with any number of planners, never more than
-- the limit are held. A task of a limited kind is marked `limited` (at its insert, by
-- `artex kind limit` for those already there, by its assignment at the latest): marked,
-- it waits in an index of its own (`tasks_limited_waiting`) and, held, it is counted
-- (`tasks_held_limited`). Without limits, no task is marked and neither index is written.

create function artex.tags_valid(tags text[]) returns boolean
language sql immutable as $$
    select tags is null
        or (cardinality(tags) between 1 and 20
            and array_ndims(tags) = 1
            and not exists (select 1 from unnest(tags) t
                            where t is null or t = '' or octet_length(t) > 64))
$$;

-- A batch's tags arrive as one JSON array per task (a text[][] cannot hold lists of
-- different lengths); null stays null.
create function artex.tags_of(tags jsonb) returns text[]
language sql immutable as $$
    select case when tags is not null then
        array(select jsonb_array_elements_text(tags))
    end
$$;

comment on function artex.tags_valid is
    'A task''s tags: 1 to 20, each 1 to 64 bytes (migrations/V18__tags_and_limits.sql).';

alter table artex.tasks
    add column tags text[] constraint tasks_tags_valid check (artex.tags_valid(tags)),
    add column limit_key text check (limit_key <> '' and octet_length(limit_key) <= 200),
    add column limited boolean not null default false;

comment on column artex.tasks.tags is
    'Labels given at submission, for search: migrations/V18__tags_and_limits.sql.';
comment on column artex.tasks.limit_key is
    'Within its kind''s key_concurrency, at most that many tasks with this key are held at once: migrations/V18__tags_and_limits.sql.';
comment on column artex.tasks.limited is
    'Its kind has limits: it waits in tasks_limited_waiting, and once held is counted against them (tasks_held_limited). Set at insert, by artex kind limit, and by the assignment.';

-- Neither tags nor the key changes after submission, and `limited` changes only with the
-- assignment (which moves the task between sets anyway): a task's start, renewals and
-- checkpoints stay HOT (V15).
create index tasks_tags on artex.tasks using gin (tags) where tags is not null;
-- Held tasks of limited kinds, which the limits count.
create index tasks_held_limited on artex.tasks (kind, limit_key)
    where assigned_to is not null and limited;
-- Runnable tasks of limited kinds wait here, by kind and key (a task without one under
-- '', which no key can be), in claim order: the round walks the keys (a skip scan) and
-- reads of each only what its limits leave room for...
create index tasks_limited_waiting
    on artex.tasks (kind, coalesce(limit_key, ''), priority desc, run_at, id)
    where listed = 'pending' and limited;
-- ...and the others where they always did (V15), so that the claim of unlimited tasks
-- never walks past a limited backlog.
drop index artex.tasks_runnable;
create index tasks_runnable on artex.tasks (priority desc, run_at, id)
    where listed = 'pending' and not limited;

-- A task of a kind with limits is marked at its insert (one lookup in a table of a few
-- rows); `artex kind limit` marks the kind's waiting tasks when it sets limits and
-- unmarks them when it clears them.
create or replace function artex.tasks_before_insert() returns trigger language plpgsql as $$
declare
    existing uuid;
begin
    if new.status not in ('pending', 'blocked', 'paused') then
        raise exception 'artex: a new task starts pending, blocked or paused, not %', new.status
            using errcode = 'check_violation';
    end if;
    if new.assigned_to is not null or new.lease_until is not null then
        raise exception 'artex: a new task cannot be assigned yet'
            using errcode = 'check_violation';
    end if;
    if new.unique_key is not null then
        perform artex.lock_unique_key(new.unique_key);
        existing := artex.task_with_unique_key(new.unique_key, null);
        if existing is not null then
            raise exception 'artex: task % is unfinished with unique_key %', existing,
                quote_literal(new.unique_key)
                using errcode = 'unique_violation', detail = existing::text,
                      hint = 'artex.submit(…, unique_key => …) returns the existing task instead';
        end if;
    end if;
    new.limited := exists (select 1 from artex.kind_limits k where k.kind = new.kind);
    new.lease_epoch := 0;
    -- Planner shards split the keyspace: one business key always lands on one shard.
    new.shard := abs(hashtext(coalesce(new.shard_key, new.id::text)) % 1024);
    new.created_at := now();
    new.updated_at := now();
    return new;
end
$$;

-- A bulk delete (`artex tasks delete`, `POST /api/v1/tasks/bulk`) records each task it
-- deletes here, with who and why; the task's history stays.
create table artex.task_deletions (
    task_id    uuid primary key,
    kind       text not null,
    status     artex.task_status not null,
    actor      text not null,
    reason     text,
    deleted_at timestamptz not null default now()
);

comment on table artex.task_deletions is
    'Tasks deleted by an operator''s bulk delete, with who and why (their history stays in artex.task_transitions).';

create table artex.kind_limits (
    kind            text primary key check (artex.is_kind_name(kind)),
    concurrency     integer check (concurrency > 0),
    key_concurrency integer check (key_concurrency > 0),
    rate_per_sec    float8 check (rate_per_sec > 0 and rate_per_sec <= 1000000),
    -- The rate's bucket: tokens left at `refilled_at`.
    tokens          float8 not null default 0,
    refilled_at     timestamptz not null default now(),
    updated_at      timestamptz not null default now(),
    updated_by      text not null,
    check (concurrency is not null or key_concurrency is not null or rate_per_sec is not null)
);

comment on table artex.kind_limits is
    'Fleet-wide limits per task kind, enforced where tasks are assigned: migrations/V18__tags_and_limits.sql.';

-- Of `ids` (the tasks of limited kinds a planner is about to assign, in its order), the
-- ones that would exceed a limit. Locks the kinds' rows first, in kind order (planners
-- wait for each other, never deadlock); each statement after that reads a snapshot
-- taken after the lock (a volatile function's statements each take a new one under
-- READ COMMITTED), so the count includes every assignment committed before. Takes the
-- tokens of the ones it allows. A task whose kind has no limits (any more) is allowed.
create function artex.over_limits(ids uuid[]) returns uuid[]
language plpgsql volatile as $$
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
        where t.kind in (select kind from lim)
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

comment on function artex.over_limits is
    'Of the tasks a planner is about to assign, those that would exceed their kind''s limits, counted under the kinds'' row locks (migrations/V18__tags_and_limits.sql).';

-- The round's read (planner/dispatch.rs, DISPATCH): the tasks of limited kinds wait in
-- an index of their own and are claimed only if the limits leave them room by this
-- snapshot, so that a backlog of one kind or one key neither holds the claim's places
-- nor is walked by the claim of the others.
drop function artex.dispatch_round(float8, int8, int4, int4[], text[]);
create function artex.dispatch_round(p_alive_secs float8, p_batch int8, p_shard_count int4, p_shards int4[], p_unreachable text[])
returns table (worker text, kinds text[], capacity integer, held integer, host text, task uuid, task_kind text, task_host text, wake_addr text, task_limited boolean)
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
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
        where k.kind = any(array(select distinct unnest(r.kinds) from roster r
                                 where r.capacity > r.held))
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
    fits as (
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
    claimed as (
        select id, kind, host, priority, run_at, false as limited from artex.tasks
        where listed = 'pending' and not limited and run_at <= now()
          and kind = any(array(select distinct unnest(r.kinds) from roster r
                               where r.capacity > r.held))
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

comment on function artex.dispatch_round is
    'The planner round''s read: the roster and the claim (planner/dispatch.rs, DISPATCH). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

-- The round's write (planner/dispatch.rs, ASSIGN): $5, the tasks of limited kinds among
-- those to assign, becomes the ones `artex.over_limits` refuses, and those stay pending.
drop function artex.assign_round(text, uuid[], text[], float8);
create function artex.assign_round(p_actor text, p_ids uuid[], p_workers text[], p_lease_secs float8, p_limited uuid[])
returns setof uuid
language plpgsql volatile as $fn$
#variable_conflict use_column
begin
    p_limited := artex.over_limits(p_limited);
    return query with room as materialized (
        select w.id,
               greatest(w.capacity - greatest(w.taken - coalesce(r.released, 0), 0), 0) as free,
               w.lease_ms, w.host
        from artex.workers w left join artex.worker_released r on r.worker = w.id
        where w.id = any($3::text[]) and w.state = 'online'
        order by w.id
        for update of w
    ),
    wanted as (
        select v.id, v.worker, row_number() over (partition by v.worker order by v.n) as k
        from unnest($2::uuid[], $3::text[]) with ordinality as v(id, worker, n)
        where v.id <> all($5::uuid[])
    )
    update artex.tasks t
    set status = 'assigned', assigned_to = wanted.worker,
        lease_until = now() + coalesce(make_interval(secs => room.lease_ms / 1000.0),
                                       make_interval(secs => $4::float8)),
        limited = t.limited or t.kind in (select kind from artex.kind_limits)
    from artex.set_context($1, 'assigned') ctx, wanted, room
    where ctx and wanted.worker = room.id and wanted.k <= room.free
      and t.id = wanted.id and t.status::text = 'pending' -- by primary key: see RECORD
      and (t.host is null or t.host = room.host)
    returning t.id;
end
$fn$;

comment on function artex.assign_round is
    'The planner round''s write: the assignments, each worker''s slots under its row lock, within the kinds'' limits (planner/dispatch.rs, ASSIGN). Its statement is the constant''s text: see migrations/V16__plan_cached_hot_path.sql.';

-- `artex.submit` takes tags and a limit key (after its earlier arguments, so calls that
-- name them by position keep their meaning).
drop function artex.submit(text, jsonb, integer, timestamptz, integer, integer, text, text,
                           interval, boolean, text, text);
create function artex.submit(
    kind text,
    payload jsonb default '{}',
    priority integer default 0,
    run_at timestamptz default null,
    max_retries integer default null,
    timeout_ms integer default null,
    shard_key text default null,
    unique_key text default null,
    unique_for interval default null,
    allow_unregistered_kind boolean default false,
    actor text default null,
    reason text default null,
    tags text[] default null,
    limit_key text default null
) returns table (id uuid, duplicate boolean)
language plpgsql volatile as $$
#variable_conflict use_variable
declare
    existing uuid;
    new_id uuid;
begin
    if kind is null then
        raise exception 'artex.submit: kind must not be null' using errcode = 'not_null_violation';
    end if;
    if payload is null then
        raise exception 'artex.submit: payload must not be null (''{}'' for none)'
            using errcode = 'not_null_violation';
    end if;
    if max_retries is not null and (max_retries < 0 or max_retries > 1000) then
        raise exception 'artex.submit: max_retries %; expected 0 to 1000', max_retries
            using errcode = 'check_violation';
    end if;
    if timeout_ms is not null and timeout_ms <= 0 then
        raise exception 'artex.submit: timeout_ms %; expected a positive number of milliseconds',
            timeout_ms using errcode = 'check_violation';
    end if;
    if unique_for is not null and (unique_key is null or unique_for < interval '0') then
        raise exception 'artex.submit: unique_for % needs a unique_key and must not be negative',
            unique_for using errcode = 'check_violation';
    end if;
    if not allow_unregistered_kind and artex.is_kind_name(kind)
       and not exists (select 1 from artex.kinds k where k.kind = submit.kind) then
        raise exception 'artex.submit: no worker has declared kind %', quote_literal(kind)
            using errcode = 'check_violation',
                  hint = 'start a worker that handles it, or pass allow_unregistered_kind => true';
    end if;
    if unique_key is not null then
        perform artex.lock_unique_key(unique_key);
        existing := artex.task_with_unique_key(unique_key, unique_for);
        if existing is not null then
            return query select existing, true;
            return;
        end if;
    end if;
    if actor is not null or reason is not null then
        perform artex.set_context(coalesce(actor, current_user::text), coalesce(reason, 'submitted'));
    end if;
    insert into artex.tasks as t (kind, payload, priority, run_at, max_retries, timeout_ms,
                                  shard_key, unique_key, tags, limit_key)
    values (kind, payload, coalesce(priority, 0), coalesce(run_at, now()),
            coalesce(max_retries, 3), timeout_ms, shard_key, unique_key, tags, limit_key)
    returning t.id into new_id;
    return query select new_id, false;
end
$$;

comment on function artex.submit is
    'Submits a task inside the caller''s transaction, with every check the CLI and the API make; tags and limit_key are checked by the table; returns its id, or the existing task''s id with duplicate = true when a task with unique_key is unfinished (or finished within unique_for).';

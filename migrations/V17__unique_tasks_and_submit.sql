-- V17: unique tasks, and a submission in SQL (issue 24, features 1 and 9). Expand: a
-- nullable column, an index on it, a check older builds' inserts satisfy (they never set
-- the column), and a function.
--
-- A task may carry a `unique_key`. While a task with that key is unfinished, no second
-- task with it is written: `artex.submit` returns the existing task's id and says it is
-- a duplicate; a plain insert naming the key fails with unique_violation, the existing
-- task named in the message. With a window (`unique_for`), a task with the key that
-- finished within it counts too. Race-free: a submission with a key takes a transaction-
-- scoped advisory lock on the key before it looks, so of concurrent submitters the first
-- writes and the others, waiting for its commit, find its task (or, if it rolled back,
-- write their own). A unique index on the unfinished tasks' keys is the guarantee
-- underneath: a submitter in a REPEATABLE READ transaction, whose snapshot cannot see
-- the task committed while it waited, gets unique_violation instead of a second task.
--
-- `artex.submit(kind, payload, …)` is the submission path for any language: the same
-- checks as the CLI's and the API's (kind name and payload size by the table's
-- triggers; retries, timeout, shard key and the kinds workers declared here), inside the
-- caller's transaction: the task exists, and wakes the planners, only if the caller
-- commits.

alter table artex.tasks
    add column unique_key text check (unique_key <> '' and octet_length(unique_key) <= 200);

comment on column artex.tasks.unique_key is
    'While a task with this key is unfinished, no other task gets it (artex.submit returns the existing one): migrations/V17__unique_tasks_and_submit.sql.';

-- The guarantee, whatever the isolation level: one unfinished task per key. (Neither
-- the key nor `finished_at` changes before a task's end, so a task's start, renewals
-- and checkpoints stay HOT: V15.)
create unique index tasks_unique_unfinished on artex.tasks (unique_key)
    where unique_key is not null and finished_at is null;
-- What a window looks through: the key's tasks, finished or not.
create index tasks_unique_key on artex.tasks (unique_key, finished_at)
    where unique_key is not null;

-- The lock every writer of a key takes first: one key, one writer at a time (a 64-bit
-- hash of the key, seeded so that it is not the migrations' lock).
create function artex.lock_unique_key(key text) returns void
language sql volatile as $$
    select pg_advisory_xact_lock(hashtextextended(key, 7021802748184063338))
$$;

-- The newest task with the key that is unfinished, or finished within `window` (none
-- when NULL) of now.
create function artex.task_with_unique_key(key text, window_ interval) returns uuid
language sql stable as $$
    select id from artex.tasks
    where unique_key = key
      and (finished_at is null or finished_at > now() - window_)
    order by id desc limit 1
$$;

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
    new.lease_epoch := 0;
    -- Planner shards split the keyspace: one business key always lands on one shard.
    new.shard := abs(hashtext(coalesce(new.shard_key, new.id::text)) % 1024);
    new.created_at := now();
    new.updated_at := now();
    return new;
end
$$;

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
    reason text default null
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
                                  shard_key, unique_key)
    values (kind, payload, coalesce(priority, 0), coalesce(run_at, now()),
            coalesce(max_retries, 3), timeout_ms, shard_key, unique_key)
    returning t.id into new_id;
    return query select new_id, false;
end
$$;

comment on function artex.submit is
    'Submits a task inside the caller''s transaction, with every check the CLI and the API make; returns its id, or the existing task''s id with duplicate = true when a task with unique_key is unfinished (or finished within unique_for).';

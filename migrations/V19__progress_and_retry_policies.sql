-- V19: a running task's progress (issue 24, feature 6) and per-kind retry policies
-- (feature 4). Expand: nullable columns older builds never write nor read, new
-- functions, and `artex.submit` redefined with the same signature (a kind's policy may
-- give a submission's default retry budget).
--
-- 1. Progress.
--
-- A handler calls `ctx.progress(fraction, message)` as often as it likes; its worker
-- keeps the latest value and writes the values of all its tasks in one statement at most
-- once a second (and a task's last value just before its outcome). The columns are in no
-- index and no status changes, so that write is a HOT update (V15) and writes no history
-- row (the history triggers record status changes and handovers only: V10). It NOTIFYs
-- `artex_progress` with each task's new value: `/events` passes them on as `progress`
-- events, which are not durable (the history is the feed; progress is only the latest
-- value, kept in the row).
--
-- The checks scan the table once when added (the new columns are NULL in every row: no
-- rewrite).

alter table artex.tasks
    add column progress real check (progress >= 0 and progress <= 1),
    add column progress_message text check (char_length(progress_message) <= 200),
    add column progress_at timestamptz;

comment on column artex.tasks.progress is
    'How far the running handler says it is, 0 to 1 (ctx.progress): the latest value its worker wrote, at most once a second. In no index, so its updates stay HOT (migrations/V18).';
comment on column artex.tasks.progress_message is
    'What the handler said with its latest progress, at most 200 characters.';
comment on column artex.tasks.progress_at is
    'When the latest progress was written.';

-- 2. Retry policies, one per kind, on the kind's row (`artex kind retry K …`): the
-- backoff after a failed attempt (exponential base·2^n, linear base·(n+1) or fixed
-- base, n the attempts that failed before it, capped; exact, no jitter) and the attempts
-- a task of the kind gets when its submission states no `max_retries`. A kind without
-- one keeps the fleet's default (exponential from the planner's and workers'
-- --retry-base-ms to --retry-cap-ms, with jitter; 3 retries). Workers read the policies
-- every few seconds; the reaper's retry of an expired lease reads the row
-- (`artex.kind_retry_delay`). Older builds ignore the columns: their retries keep the
-- default backoff.

alter table artex.kinds
    add column retry_backoff text check (retry_backoff in ('exponential', 'linear', 'fixed')),
    add column retry_base_ms bigint check (retry_base_ms between 1 and 2592000000),
    add column retry_cap_ms bigint check (retry_cap_ms between 1 and 2592000000),
    add column retry_max_attempts integer check (retry_max_attempts between 1 and 1001),
    -- A backoff is whole (its kind, base and cap) or absent; attempts need a backoff.
    add constraint kinds_retry_policy_whole check (
        (retry_backoff is null) = (retry_base_ms is null)
        and (retry_backoff is null) = (retry_cap_ms is null)
        and (retry_max_attempts is null or retry_backoff is not null)
        and retry_cap_ms >= retry_base_ms);

comment on column artex.kinds.retry_backoff is
    'The kind''s retry backoff (exponential, linear or fixed; NULL: the fleet''s default), with retry_base_ms, retry_cap_ms and retry_max_attempts: migrations/V18.';

-- The wait after a failed attempt when `retries` attempts had failed before it, in
-- milliseconds: the same as `RetryPolicy::delay_ms` in actors/src/retry.rs (a test
-- compares them).
create function artex.policy_delay_ms(backoff text, base_ms float8, cap_ms float8, retries integer)
returns float8 language sql immutable as $$
    select least(case backoff
                     when 'fixed' then base_ms
                     when 'linear' then base_ms * (greatest(retries, 0)::float8 + 1)
                     else base_ms * power(2::float8, least(greatest(retries, 0), 40))
                 end, cap_ms)
$$;

-- The wait before the retry of a task of `kind`: its kind's policy, else the default
-- (`artex.retry_delay`: exponential with jitter from `base_ms` to `cap_ms`).
create function artex.kind_retry_delay(kind text, retries integer, base_ms float8, cap_ms float8)
returns interval language sql volatile as $$
    select coalesce(
        (select make_interval(secs => artex.policy_delay_ms(k.retry_backoff, k.retry_base_ms,
                                                            k.retry_cap_ms, retries) / 1000.0)
         from artex.kinds k
         where k.kind = kind_retry_delay.kind and k.retry_backoff is not null),
        artex.retry_delay(retries, base_ms, cap_ms))
$$;

-- The retry budget of a new task of `kind` whose submission states none: its kind's
-- attempts less one, else 3.
create function artex.default_max_retries(kind text) returns integer
language sql stable as $$
    select coalesce((select k.retry_max_attempts - 1 from artex.kinds k
                     where k.kind = default_max_retries.kind), 3)
$$;

-- V18's function, its default retry budget the kind's (`artex.default_max_retries`).
create or replace function artex.submit(
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
            coalesce(max_retries, artex.default_max_retries(kind)), timeout_ms, shard_key,
            unique_key, tags, limit_key)
    returning t.id into new_id;
    return query select new_id, false;
end
$$;

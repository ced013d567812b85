-- V44: a task carries the W3C trace context it was submitted in (issue 37, item 1:
-- OpenTelemetry traces from the submitter to the handler). Expand: a nullable column,
-- a check that only a set value meets, and `artex.submit` with one more argument that
-- defaults to none (a call with the fourteen before it, an older build's or a user's,
-- submits as before).
--
-- `traceparent` is the W3C header's value (https://www.w3.org/TR/trace-context/):
-- version-traceid-spanid-flags in lowercase hex, `00-<32>-<16>-<2>`; version ff and
-- all-zero ids are invalid. The submitting process stores its submission span's context
-- here; the planner and the worker read it to make their spans children of it. Plain-SQL
-- inserts that leave it out keep working: a task without it is simply not traced.
-- The check is NOT VALID: every existing row holds NULL, and a check that scanned the
-- table would hold its lock for the scan; new and updated rows are checked.

alter table artex.tasks add column traceparent text;
alter table artex.tasks add constraint tasks_traceparent_check
    check (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
           and left(traceparent, 2) <> 'ff'
           and substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
           and substr(traceparent, 37, 16) <> '0000000000000000') not valid;
comment on column artex.tasks.traceparent is
    'The W3C trace context (traceparent header value) the task was submitted in, or NULL: its spans are children of it (V44, docs/tracing.md).';

drop function artex.submit(text, jsonb, integer, timestamptz, integer, integer, text, text,
                           interval, boolean, text, text, text[], text);
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
    limit_key text default null,
    traceparent text default null)
returns table (id uuid, duplicate boolean)
language plpgsql as $$
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
    if traceparent is not null
       and (traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            or left(traceparent, 2) = 'ff'
            or substr(traceparent, 4, 32) = '00000000000000000000000000000000'
            or substr(traceparent, 37, 16) = '0000000000000000') then
        raise exception 'artex.submit: traceparent %; expected a W3C traceparent: version-traceid-spanid-flags in lowercase hex (00-<32 hex>-<16 hex>-<2 hex>), ids not all zero',
            quote_literal(traceparent) using errcode = 'check_violation';
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
                                  shard_key, unique_key, tags, limit_key, traceparent)
    values (kind, payload, coalesce(priority, 0), coalesce(run_at, now()),
            coalesce(max_retries, artex.default_max_retries(kind)), timeout_ms, shard_key,
            unique_key, tags, limit_key, traceparent)
    returning t.id into new_id;
    return query select new_id, false;
end
$$;
comment on function artex.submit is
    'Submits a task inside the caller''s transaction, with every check the CLI and the API make; tags and limit_key are checked by the table; traceparent (W3C) is the trace the task joins (V44); returns its id, or the existing task''s id with duplicate = true when a task with unique_key is unfinished (or finished within unique_for).';

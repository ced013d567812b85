-- V58: a task's trace context is checked when it is written, not at every write of the
-- task. Expand.
--
-- V45 checked `traceparent` with a CHECK constraint. PostgreSQL evaluates a table's
-- checks on every new row version, whatever columns the statement sets: a traced task
-- ran the check's regular expression at its assignment and at its end too. On a
-- scratch database, 20,000 traced rows updated (`set priority`) in 329–344 ms with the
-- check and 216–239 ms without it, against 199–234 ms for untraced rows: about 5 µs a
-- row version, 10 µs of a traced task's life, on a hot path whose PostgreSQL CPU is
-- about 56 µs a task. The trace part of the bench showed it: its untraced runs, whose
-- tasks all carry a context, ran at 25,000–26,000 tasks/s where W1 from idle, the
-- same without contexts, ran at 33,000 the same hour. And every statement that writes
-- `tasks` read the check's 3.1 KB stored expression back.
--
-- The same rule is now checked where the value is written: by the insert's row trigger
-- (`tasks_before_insert`) and by the update trigger that already checks the kind and
-- the payload when they change (`tasks_check_input_update`, now also `OF traceparent`).
-- The error keeps the constraint's name and SQLSTATE (23514, check_violation), so what
-- reads them reads the same. The hot functions never write the column.

create function artex.traceparent_valid(tp text)
returns boolean
language sql immutable parallel safe
as $fn$
    select tp ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       and left(tp, 2) <> 'ff'
       and substr(tp, 4, 32) <> '00000000000000000000000000000000'
       and substr(tp, 37, 16) <> '0000000000000000'
$fn$;

comment on function artex.traceparent_valid(text) is
    'Whether a task''s trace context is a W3C traceparent: version-traceid-spanid-flags in lowercase hex, version not ff, no all-zero id (V45''s check; V58 checks it where the value is written).';

create or replace function artex.tasks_before_insert()
returns trigger
language plpgsql
as $fn$
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
    if new.traceparent is not null and not artex.traceparent_valid(new.traceparent) then
        perform artex.traceparent_refused(new.id, new.traceparent);
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
$fn$;

create or replace function artex.tasks_check_input_update()
returns trigger
language plpgsql
as $fn$
declare
    bytes integer;
    lim integer;
begin
    if new.kind is distinct from old.kind and not artex.is_kind_name(new.kind) then
        raise exception 'artex: kind % of task % is not a kind name: expected letters, digits and ._:- (starting with a letter or digit), at most 100 bytes',
            quote_literal(new.kind), new.id
            using errcode = 'check_violation';
    end if;
    if new.payload is distinct from old.payload then
        bytes := octet_length(new.payload::text);
        lim := artex.max_payload_bytes();
        if bytes > lim then
            raise exception 'artex: the payload of task % is % bytes, more than the limit of % bytes',
                new.id, bytes, lim
                using errcode = 'program_limit_exceeded',
                      hint = 'the limit is artex.limits.max_payload_bytes (artex limits --max-payload-bytes N)';
        end if;
    end if;
    if new.traceparent is distinct from old.traceparent and new.traceparent is not null
       and not artex.traceparent_valid(new.traceparent) then
        perform artex.traceparent_refused(new.id, new.traceparent);
    end if;
    return new;
end
$fn$;

-- The error both triggers raise: the message says what was wrong, and the constraint's
-- name and SQLSTATE are V45's.
create function artex.traceparent_refused(p_task uuid, p_traceparent text)
returns void
language plpgsql
as $fn$
begin
    raise exception 'artex: trace context % of task % is not a W3C traceparent: expected 00-<32 hex>-<16 hex>-<2 hex> in lowercase, version not ff, no all-zero id (tasks_traceparent_check)',
        quote_literal(left(p_traceparent, 100)), p_task
        using errcode = 'check_violation', schema = 'artex', table = 'tasks',
              column = 'traceparent', constraint = 'tasks_traceparent_check';
end
$fn$;

comment on function artex.traceparent_refused(uuid, text) is
    'Raises the error of a trace context that is not a W3C traceparent, under V45''s constraint name (V58).';

drop trigger tasks_check_input_update on artex.tasks;
create trigger tasks_check_input_update
    before update of kind, payload, traceparent on artex.tasks
    for each row execute function artex.tasks_check_input_update();

alter table artex.tasks drop constraint tasks_traceparent_check;

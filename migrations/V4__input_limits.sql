-- V4: what the blackboard accepts. Append-only from here: add V5__… for the next change.
--
-- 1. A payload size limit, held in a one-row table an operator can change
--    (`artex limits --max-payload-bytes N`, or `update artex.limits set
--    max_payload_bytes = N`). A 100 MB payload is read whole by every worker that runs
--    the task and by every listing: refused at the door instead. The size counted is the
--    payload as PostgreSQL prints it (`octet_length(payload::text)`), what a user sees.
-- 2. Kinds are names: letters, digits and `._:-`, starting with a letter or digit, at
--    most 100 bytes. A kind with a newline, a quote or `../` matches no handler and
--    would wait forever; it is also the shape a kind has in logs, metrics and URLs.
--    Checked for new rows and changed kinds only (a trigger, not a check constraint: a
--    `not valid` constraint is still checked on every update of an old row, so a task
--    already stored with an odd kind could not even be canceled).
-- 3. The kinds workers have declared (`artex.kinds`), recorded by the database whenever
--    a worker registers, so `artex submit` can refuse a kind nothing has ever run.

create table artex.limits (
    -- One row only: the primary key is the constant true.
    only_row           boolean primary key default true check (only_row),
    max_payload_bytes  integer not null default 1048576 check (max_payload_bytes > 0),
    updated_at         timestamptz not null default now()
);
insert into artex.limits default values;

-- The limit as one value; a missing row (deleted by hand) means the default.
create function artex.max_payload_bytes() returns integer language sql stable as $$
    select coalesce((select max_payload_bytes from artex.limits where only_row), 1048576)
$$;

create function artex.is_kind_name(kind text) returns boolean language sql immutable as $$
    select kind ~ '^[A-Za-z0-9][A-Za-z0-9._:-]*$' and octet_length(kind) <= 100
$$;

-- Inserts are checked once per statement over the inserted rows (one look-up of the
-- limit for a batch of thousands), after the rows are in: raising here aborts the whole
-- statement, so nothing of a refused batch is written.
create function artex.tasks_check_input() returns trigger language plpgsql as $$
declare
    bad record;
    lim integer := artex.max_payload_bytes();
begin
    select n.id, n.kind into bad
    from new_rows n where not artex.is_kind_name(n.kind) limit 1;
    if found then
        raise exception 'artex: kind % of task % is not a kind name: expected letters, digits and ._:- (starting with a letter or digit), at most 100 bytes',
            quote_literal(bad.kind), bad.id
            using errcode = 'check_violation';
    end if;
    select n.id, octet_length(n.payload::text) as bytes into bad
    from new_rows n where octet_length(n.payload::text) > lim limit 1;
    if found then
        raise exception 'artex: the payload of task % is % bytes, more than the limit of % bytes',
            bad.id, bad.bytes, lim
            using errcode = 'program_limit_exceeded',
                  hint = 'the limit is artex.limits.max_payload_bytes (artex limits --max-payload-bytes N)';
    end if;
    return null;
end
$$;

create trigger tasks_check_input after insert on artex.tasks
    referencing new table as new_rows
    for each statement execute function artex.tasks_check_input();

-- Updates are checked per row, and only when the statement sets the payload or the kind
-- (`update of`): the hot path's updates set neither and pay nothing.
create function artex.tasks_check_input_update() returns trigger language plpgsql as $$
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
    return new;
end
$$;

create trigger tasks_check_input_update before update of kind, payload on artex.tasks
    for each row execute function artex.tasks_check_input_update();

-- Every kind a worker ever declared: first and last time a worker registered with it.
create table artex.kinds (
    kind        text primary key check (kind <> ''),
    first_seen  timestamptz not null default now(),
    last_seen   timestamptz not null default now()
);

-- Registration writes `kinds` (an insert, or the upsert's update); heartbeats do not,
-- so this runs once per registration.
create function artex.workers_record_kinds() returns trigger language plpgsql as $$
begin
    insert into artex.kinds (kind)
    select distinct k from unnest(new.kinds) k where k <> ''
    on conflict (kind) do update set last_seen = now();
    return null;
end
$$;

create trigger workers_record_kinds after insert or update of kinds on artex.workers
    for each row execute function artex.workers_record_kinds();

-- The workers registered before this migration.
insert into artex.kinds (kind, first_seen, last_seen)
select k, min(w.started_at), max(w.last_seen)
from artex.workers w, unnest(w.kinds) k
where k <> ''
group by k;

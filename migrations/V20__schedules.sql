-- V20: schedules (issue 24, feature 2). Expand: two new tables, functions and a trigger
-- on them; nothing older builds read or write changes.
--
-- A schedule submits a task at each slot of a cron expression read in a time zone. The
-- planners' Scheduler (actors/src/scheduler.rs) fires them: in one transaction per due
-- schedule it locks the row (`for update skip locked`: of several planners, one takes
-- it), submits a task per slot through `artex.submit` with the unique key
-- `schedule:<name>:<slot>`, and moves `next_slot` past them. The row lock makes each slot
-- fire once however many planners run; the unique key (with a long window) is the
-- guarantee underneath, across restarts and failovers: a slot whose task exists never
-- gets a second one. Slots are computed by the planner (croner, chrono-tz), not here:
-- the table stores the expression and where the schedule stands.

-- Whether PostgreSQL knows `tz` as a time zone. The planners read zones with their own
-- IANA database (a stricter set of names); this check keeps a writer in SQL from storing
-- what no one can read.
create function artex.is_time_zone(tz text) returns boolean language plpgsql stable as $$
begin
    perform now() at time zone tz;
    return true;
exception when invalid_parameter_value then
    return false;
end
$$;

create table artex.schedules (
    -- The rule of kind names: no quoting needed in URLs, shells or unique keys.
    name text primary key check (artex.is_kind_name(name)),
    -- Five fields or a nickname (`@hourly`); what the fields hold is checked by artex.
    cron text not null
        check (octet_length(cron) <= 200 and cron ~ '^\s*(@[A-Za-z]+|\S+(\s+\S+){4})\s*$'),
    timezone text not null default 'UTC' check (artex.is_time_zone(timezone)),
    -- The task each slot submits, with a submission's options.
    kind text not null check (artex.is_kind_name(kind)),
    payload jsonb not null default '{}',
    priority integer not null default 0,
    max_retries integer check (max_retries between 0 and 1000),
    timeout_ms integer check (timeout_ms > 0),
    shard_key text,
    -- Slots missed while no planner ran: none, the latest only, or each.
    catch_up text not null default 'last' check (catch_up in ('none', 'last', 'all')),
    paused boolean not null default false,
    -- The first slot not yet fired or skipped, or a moment before it (NULL: the
    -- expression has no slot left). artex sets it on add and resume to the first slot
    -- after that moment (slots while paused are skipped, not caught up); a writer in SQL
    -- may leave it to its default, the insert's time, which the next pass turns into the
    -- first slot at or after it.
    next_slot timestamptz default now(),
    -- The last slot fired, its task, and how many slots fired in all.
    last_slot timestamptz,
    last_task uuid,
    fired bigint not null default 0,
    created_at timestamptz not null default now(),
    created_by text not null,
    updated_at timestamptz not null default now(),
    updated_by text not null
);

comment on table artex.schedules is
    'Cron schedules, fired by the planners once per slot: migrations/V20__schedules.sql.';

-- What the Scheduler looks for every second: the due schedules, by when they are due.
create index schedules_due on artex.schedules (next_slot) where not paused;

-- Who changed which schedule, when and how (added, paused, resumed, removed), written by
-- the trigger below for every writer, as task_transitions is for tasks. A removed
-- schedule's row keeps what it was.
create table artex.schedule_changes (
    id bigint generated always as identity primary key,
    schedule text not null,
    change text not null check (change in ('added', 'paused', 'resumed', 'removed')),
    actor text not null,
    reason text,
    at timestamptz not null default now(),
    -- The schedule as added or removed.
    detail jsonb
);

create index schedule_changes_by_schedule on artex.schedule_changes (schedule, id);

-- The actor and reason come from `artex.set_context` in the writing transaction (the
-- operator statements call it), else the database user. The Scheduler's own updates
-- (next_slot, last_slot) are not operator changes and write nothing here.
create function artex.schedules_audit() returns trigger language plpgsql as $$
declare
    who text := coalesce(nullif(current_setting('artex.actor', true), ''), current_user::text);
    why text := nullif(current_setting('artex.reason', true), '');
begin
    if tg_op = 'INSERT' then
        insert into artex.schedule_changes (schedule, change, actor, reason, detail)
        values (new.name, 'added', who, why, to_jsonb(new));
    elsif tg_op = 'DELETE' then
        insert into artex.schedule_changes (schedule, change, actor, reason, detail)
        values (old.name, 'removed', who, why, to_jsonb(old));
    elsif new.paused is distinct from old.paused then
        insert into artex.schedule_changes (schedule, change, actor, reason)
        values (new.name, case when new.paused then 'paused' else 'resumed' end, who, why);
    end if;
    return null;
end
$$;

create trigger schedules_audit after insert or delete or update of paused on artex.schedules
    for each row execute function artex.schedules_audit();

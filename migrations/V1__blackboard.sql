-- The artex blackboard: every state change of the runtime is a row change here.
-- Append-only: never edit a released migration, add V2__… instead.
create schema if not exists artex;

create type artex.task_status as enum (
    'pending', 'assigned', 'running', 'succeeded', 'failed', 'timeout',
    'paused', 'blocked', 'canceled'
);

create type artex.worker_state as enum ('online', 'draining', 'upgrading', 'gone');

-- A flow is a DAG of tasks; its tasks point at it and at each other (task_dependencies).
create table artex.flows (
    id          uuid primary key default gen_random_uuid(),
    name        text not null check (name <> ''),
    created_at  timestamptz not null default now()
);

create table artex.tasks (
    id           uuid primary key default gen_random_uuid(),
    kind         text not null check (kind <> '' and length(kind) <= 200),
    status       artex.task_status not null default 'pending',
    payload      jsonb not null default '{}'::jsonb,
    result       jsonb,
    error        text check (error <> ''),
    -- The worker holding the task; NULL unless it is assigned or running.
    assigned_to  text check (assigned_to <> ''),
    lease_until  timestamptz,
    -- The fencing token: bumped by the trigger at every assignment. Every write a worker
    -- makes names it, so a worker that lost its lease can never overwrite the task.
    lease_epoch  bigint not null default 0 check (lease_epoch >= 0),
    retries      integer not null default 0 check (retries >= 0),
    max_retries  integer not null default 3 check (max_retries >= 0),
    priority     integer not null default 0,
    run_at       timestamptz not null default now(),
    -- Per-attempt handler timeout; NULL means the handler's own default.
    timeout_ms   integer check (timeout_ms > 0),
    -- Business shard key (e.g. a site): tasks with one key stay on one planner shard.
    shard_key    text check (shard_key <> ''),
    shard        smallint not null default 0 check (shard >= 0 and shard < 1024),
    flow_id      uuid references artex.flows (id),
    flow_task    text check (flow_task <> ''),
    -- A task's saved progress, used to resume it elsewhere (hot upgrade, reclaim).
    checkpoint   jsonb,
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    constraint holder_only_while_held check (
        (status in ('assigned', 'running')) = (assigned_to is not null)
    ),
    constraint lease_only_while_held check (
        (status in ('assigned', 'running')) = (lease_until is not null)
    ),
    constraint retries_within_budget check (retries <= max_retries + 1),
    constraint flow_task_named check ((flow_id is null) = (flow_task is null)),
    constraint unique_flow_task unique (flow_id, flow_task)
) with (
    -- A task row is rewritten at every transition; status changes cannot be HOT (status is
    -- in the partial indexes' predicates), but free space on the page keeps the new
    -- version next to the old one. Vacuum early and without throttling: dead versions of
    -- this hot table are what slows the claim down.
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- The scanner's claim query walks this index: runnable rows only, in dispatch order.
create index tasks_runnable on artex.tasks (priority desc, run_at, id)
    where status = 'pending';
-- A worker's assigned tasks in start order: the worker's start query walks this.
create index tasks_assigned_to on artex.tasks (assigned_to, priority desc, run_at, id)
    where status = 'assigned';
-- Held tasks by holder: capacity accounting, lease expiry, reclaim of gone workers.
create index tasks_held on artex.tasks (assigned_to, lease_until)
    where status in ('assigned', 'running');
create index tasks_flow on artex.tasks (flow_id) where flow_id is not null;
create index tasks_status_updated on artex.tasks (status, updated_at);

create table artex.task_dependencies (
    task_id     uuid not null references artex.tasks (id) on delete cascade,
    depends_on  uuid not null references artex.tasks (id) on delete cascade,
    primary key (task_id, depends_on),
    check (task_id <> depends_on)
);
create index task_dependencies_upstream on artex.task_dependencies (depends_on);

-- The audit trail: one row per status change, written by the statement trigger below.
create table artex.task_transitions (
    id           bigint generated always as identity primary key,
    task_id      uuid not null,
    from_status  artex.task_status,           -- NULL for the row that created the task
    to_status    artex.task_status not null,
    reason       text,
    actor        text not null,
    worker       text,
    lease_epoch  bigint not null,
    at           timestamptz not null default now()
);
create index task_transitions_task on artex.task_transitions (task_id, id);

-- The outbox: meaningful changes only (no lease renewals, no transient assignment),
-- read by consumers with a durable cursor (event_cursors).
create table artex.task_events (
    id           bigint generated always as identity primary key,
    task_id      uuid not null,
    flow_id      uuid,
    kind         text not null,
    from_status  artex.task_status,
    to_status    artex.task_status not null,
    reason       text,
    at           timestamptz not null default now()
);

create table artex.event_cursors (
    consumer     text primary key check (consumer <> ''),
    last_event   bigint not null default 0,
    updated_at   timestamptz not null default now()
);

create table artex.workers (
    id           text primary key check (id <> ''),
    host         text not null check (host <> ''),
    pid          integer not null check (pid > 0),
    version      text not null check (version <> ''),
    http_addr    text check (http_addr <> ''),
    -- The NOTIFY channel the planner wakes this worker on.
    channel      text not null check (channel <> '' and length(channel) < 64),
    kinds        text[] not null,
    capacity     integer not null check (capacity > 0),
    inflight     integer not null default 0 check (inflight >= 0),
    state        artex.worker_state not null default 'online',
    started_at   timestamptz not null default now(),
    last_seen    timestamptz not null default now()
) with (fillfactor = 50); -- heartbeats rewrite every row every few seconds
create index workers_last_seen on artex.workers (last_seen);

-- Who wrote a change and why: set per transaction by artex (set_config(..., true));
-- plain SQL writers get their database role as actor.
create function artex.current_actor() returns text language sql stable as $$
    select coalesce(nullif(current_setting('artex.actor', true), ''), current_user::text)
$$;
create function artex.current_reason() returns text language sql stable as $$
    select nullif(current_setting('artex.reason', true), '')
$$;
-- Names the actor and reason for the rest of the transaction; artex joins it into its
-- statements (`from artex.set_context($1, $2)`) so a single statement carries both.
create function artex.set_context(actor text, reason text) returns boolean
language sql volatile as $$
    select set_config('artex.actor', coalesce(actor, ''), true) is not null
       and set_config('artex.reason', coalesce(reason, ''), true) is not null
$$;

-- Exponential backoff with jitter for the n-th retry: base·2^n, capped, times 0.5–1.
create function artex.retry_delay(retries integer, base_ms float8, cap_ms float8)
returns interval language sql volatile as $$
    select make_interval(secs => least(base_ms * power(2, least(retries, 30)), cap_ms)
                                 * (0.5 + random() * 0.5) / 1000.0)
$$;

-- The status machine. Legal moves (anything else raises):
--   pending  → assigned | paused | canceled
--   assigned → running | pending | canceled | failed | timeout
--   running  → succeeded | failed | timeout | pending | canceled
--   paused   → pending | blocked | canceled
--   blocked  → pending | paused | canceled
--   succeeded, failed, timeout, canceled: terminal.
create function artex.transition_allowed(from_s artex.task_status, to_s artex.task_status)
returns boolean language sql immutable as $$
    select case from_s
        when 'pending'  then to_s in ('assigned', 'paused', 'canceled')
        when 'assigned' then to_s in ('running', 'pending', 'canceled', 'failed', 'timeout')
        when 'running'  then to_s in ('succeeded', 'failed', 'timeout', 'pending', 'canceled')
        when 'paused'   then to_s in ('pending', 'blocked', 'canceled')
        when 'blocked'  then to_s in ('pending', 'paused', 'canceled')
        else false
    end
$$;

create function artex.tasks_before_update() returns trigger language plpgsql as $$
begin
    new.updated_at := now();
    if new.id <> old.id then
        raise exception 'artex: task % cannot change its id', old.id
            using errcode = 'check_violation';
    end if;
    if new.lease_epoch < old.lease_epoch then
        raise exception 'artex: the fencing token of task % cannot go back (% -> %)',
            old.id, old.lease_epoch, new.lease_epoch
            using errcode = 'check_violation';
    end if;
    if new.status = old.status then
        -- Not a transition: a lease renewal, a checkpoint, or a handover to another worker
        -- (which must bump the fencing token so the previous holder is fenced off).
        if new.assigned_to is distinct from old.assigned_to and new.lease_epoch = old.lease_epoch then
            new.lease_epoch := old.lease_epoch + 1;
        end if;
        return new;
    end if;
    if not artex.transition_allowed(old.status, new.status) then
        raise exception 'artex: illegal task transition % -> % for task %',
            old.status, new.status, old.id
            using errcode = 'check_violation',
                  hint = 'allowed from ' || old.status || ': see artex.transition_allowed';
    end if;
    -- A retry past the budget ends the task for good instead of queueing it again.
    if new.status = 'pending' and old.status in ('assigned', 'running')
       and new.retries > new.max_retries then
        new.status := case when old.status = 'assigned' or new.error is null
                           then 'timeout'::artex.task_status
                           else 'failed'::artex.task_status end;
    end if;
    if new.status = 'assigned' then
        if new.assigned_to is null or new.lease_until is null then
            raise exception 'artex: assigning task % needs assigned_to and lease_until', old.id
                using errcode = 'check_violation';
        end if;
        new.lease_epoch := old.lease_epoch + 1;
    elsif new.status = 'running' then
        if new.assigned_to is distinct from old.assigned_to then
            raise exception 'artex: task % is assigned to %, not to %',
                old.id, old.assigned_to, new.assigned_to
                using errcode = 'check_violation';
        end if;
        new.started_at := now();
    else
        -- Leaving the held states releases the holder and the lease.
        new.assigned_to := null;
        new.lease_until := null;
    end if;
    if new.status in ('succeeded', 'failed', 'timeout', 'canceled') then
        new.finished_at := now();
    end if;
    return new;
end
$$;

create trigger tasks_before_update before update on artex.tasks
    for each row execute function artex.tasks_before_update();

create function artex.tasks_before_insert() returns trigger language plpgsql as $$
begin
    if new.status not in ('pending', 'blocked', 'paused') then
        raise exception 'artex: a new task starts pending, blocked or paused, not %', new.status
            using errcode = 'check_violation';
    end if;
    if new.assigned_to is not null or new.lease_until is not null then
        raise exception 'artex: a new task cannot be assigned yet'
            using errcode = 'check_violation';
    end if;
    new.lease_epoch := 0;
    -- Planner shards split the keyspace: one business key always lands on one shard.
    new.shard := abs(hashtext(coalesce(new.shard_key, new.id::text)) % 1024);
    new.created_at := now();
    new.updated_at := now();
    return new;
end
$$;

create trigger tasks_before_insert before insert on artex.tasks
    for each row execute function artex.tasks_before_insert();

-- Audit, outbox and wake-ups once per statement over its transition tables, so a batch
-- of 1,000 completions costs three set-based inserts, not 3,000 single ones.
create function artex.tasks_after_insert() returns trigger language plpgsql as $$
begin
    insert into artex.task_transitions (task_id, from_status, to_status, reason, actor, lease_epoch)
    select n.id, null, n.status, coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0
    from new_rows n;
    insert into artex.task_events (task_id, flow_id, kind, from_status, to_status, reason)
    select n.id, n.flow_id, n.kind, null, n.status, coalesce(artex.current_reason(), 'submitted')
    from new_rows n;
    if exists (select 1 from new_rows where status = 'pending') then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

create trigger tasks_after_insert after insert on artex.tasks
    referencing new table as new_rows
    for each statement execute function artex.tasks_after_insert();

-- Transition tables carry no statistics: with large statements the planner may join
-- old and new rows in a nested loop, quadratic in the statement's size. Hash joins only.
create function artex.tasks_after_update() returns trigger language plpgsql
set enable_nestloop = off as $$
begin
    insert into artex.task_transitions
        (task_id, from_status, to_status, reason, actor, worker, lease_epoch)
    select n.id, o.status, n.status,
           coalesce(artex.current_reason(),
                    case when n.status in ('failed', 'pending') and o.status = 'running'
                         then n.error end),
           artex.current_actor(), coalesce(n.assigned_to, o.assigned_to), n.lease_epoch
    from new_rows n join old_rows o using (id)
    where n.status <> o.status
    union all
    -- A handover (hot upgrade) moves a held task to another worker without a status
    -- change; it is audited all the same.
    select n.id, o.status, n.status, coalesce(artex.current_reason(), 'handed over'),
           artex.current_actor(), n.assigned_to, n.lease_epoch
    from new_rows n join old_rows o using (id)
    where n.status = o.status and n.assigned_to is distinct from o.assigned_to
      and n.assigned_to is not null;
    -- Assignment is transient plumbing between planner and worker: not an event.
    insert into artex.task_events (task_id, flow_id, kind, from_status, to_status, reason)
    select n.id, n.flow_id, n.kind, o.status, n.status,
           coalesce(artex.current_reason(),
                    case when n.status in ('failed', 'pending') and o.status = 'running'
                         then n.error end)
    from new_rows n join old_rows o using (id)
    where n.status <> o.status and n.status <> 'assigned';
    -- Wake the planners, once per statement: new runnable work, or freed capacity (a
    -- task left a worker), both mean another assignment round may place more.
    -- (assigned → running frees nothing: no wake-up for it.)
    if exists (select 1 from new_rows n join old_rows o using (id)
               where n.status <> o.status
                 and (n.status = 'pending'
                      or (o.status in ('assigned', 'running')
                          and n.status not in ('assigned', 'running')))) then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

create trigger tasks_after_update after update on artex.tasks
    referencing old table as old_rows new table as new_rows
    for each statement execute function artex.tasks_after_update();

-- Deleting a task that is still held would orphan its worker's writes: refuse it.
create function artex.tasks_before_delete() returns trigger language plpgsql as $$
begin
    if old.status in ('assigned', 'running') then
        raise exception 'artex: task % is % by %; cancel it before deleting it',
            old.id, old.status, old.assigned_to
            using errcode = 'check_violation';
    end if;
    return old;
end
$$;

create trigger tasks_before_delete before delete on artex.tasks
    for each row execute function artex.tasks_before_delete();

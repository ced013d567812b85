-- V59: a task's and a worker's own facts (kind, keys, tags, host, addresses, …) are
-- checked where they are written, not at every write of the row. Expand.
--
-- PostgreSQL 15 reads a table's CHECK constraints back from their stored text and
-- prepares them at every statement that writes the table, and evaluates them on every
-- new row version, whatever the statement sets. `tasks` had 20 and `workers` 13, so a
-- worker's claim (which writes both), a round's assignment and a worker's outcomes paid
-- for rules about columns they never write. A lone task's cycle by plain SQL (insert,
-- `claim_and_read`, `record_attempts`; `pgbench -M prepared`, four alternating pairs of
-- 15 s) ran 548–585 cycles/s before and 578–603 after: 0.02 ms less for the insert,
-- 0.05 for the claim and 0.04 for the outcome.
--
-- What moves: the rules about what a task or a worker is given (its kind, keys, tags,
-- host, shard, timeout, flow name and progress; a worker's id, host, pid, version,
-- channel, addresses, lease, binary, session and slots). They are checked by the
-- insert's row trigger and by a row trigger that fires only for an update that sets
-- one of those columns; the hot functions set none of them.
-- What stays a constraint: the rules of a task's state, which the status machine's
-- model names (holder and lease only while held, the retry budget, non-empty holder and
-- error, `max_retries` ≥ 0), and the two counters a worker's heartbeat writes
-- (`capacity` > 0, `inflight` ≥ 0).
--
-- Each rule is its constraint's expression, word for word: a rule that comes out NULL
-- passes, as a CHECK does. A row that breaks one is refused with SQLSTATE 23514
-- (check_violation) and the constraint's name, as before; the message says which
-- column and what is wrong.

-- The name of the first task rule the values break, or NULL. A SQL function of one
-- expression: PostgreSQL inlines it into the trigger's test.
create function artex.task_fact_broken(
    p_kind text, p_flow_id uuid, p_flow_task text, p_host text, p_limit_key text,
    p_shard smallint, p_shard_key text, p_tags text[], p_timeout_ms integer,
    p_unique_key text, p_progress real, p_progress_message text)
returns text
language sql immutable parallel safe
as $fn$
    select case
        when not (p_kind <> '' and length(p_kind) <= 200) then 'tasks_kind_check'
        when not ((p_flow_id is null) = (p_flow_task is null)) then 'flow_task_named'
        when not (p_flow_task <> '') then 'tasks_flow_task_check'
        when not (p_host <> '') then 'tasks_host_check'
        when not (p_limit_key <> '' and octet_length(p_limit_key) <= 200) then 'tasks_limit_key_check'
        when not (p_shard >= 0 and p_shard < 1024) then 'tasks_shard_check'
        when not (p_shard_key <> '') then 'tasks_shard_key_check'
        when not (p_tags is null or artex.tags_valid(p_tags)) then 'tasks_tags_valid'
        when not (p_timeout_ms > 0) then 'tasks_timeout_ms_check'
        when not (p_unique_key <> '' and octet_length(p_unique_key) <= 200) then 'tasks_unique_key_check'
        when not (p_progress >= 0 and p_progress <= 1) then 'tasks_progress_check'
        when not (char_length(p_progress_message) <= 200) then 'tasks_progress_message_check'
    end
$fn$;

comment on function artex.task_fact_broken(text, uuid, text, text, text, smallint, text, text[], integer, text, real, text) is
    'The name of the first rule of a task''s given facts that these values break (the CHECK constraints of V1–V45 it replaces, word for word), or NULL (V59).';

-- The same for a worker's facts.
create function artex.worker_fact_broken(
    p_id text, p_host text, p_pid integer, p_version text, p_channel text,
    p_http_addr text, p_lease_ms integer, p_binary_sha256 text, p_session text,
    p_slots integer, p_wake_addr text)
returns text
language sql immutable parallel safe
as $fn$
    select case
        when not (p_id <> '') then 'workers_id_check'
        when not (p_host <> '') then 'workers_host_check'
        when not (p_pid > 0) then 'workers_pid_check'
        when not (p_version <> '') then 'workers_version_check'
        when not (p_channel <> '' and length(p_channel) < 64) then 'workers_channel_check'
        when not (p_http_addr <> '') then 'workers_http_addr_check'
        when not (p_lease_ms > 0) then 'workers_lease_ms_check'
        when not (p_binary_sha256 ~ '^[0-9a-f]{64}$') then 'workers_binary_sha256_check'
        when not (p_session <> '' and length(p_session) < 64) then 'workers_session_check'
        when not (p_slots > 0) then 'workers_slots_check'
        when not (p_wake_addr <> '' and length(p_wake_addr) < 300) then 'workers_wake_addr_check'
    end
$fn$;

comment on function artex.worker_fact_broken(text, text, integer, text, text, text, integer, text, text, integer, text) is
    'The name of the first rule of a worker''s facts that these values break (the CHECK constraints it replaces, word for word), or NULL (V59).';

-- The error of a broken rule: SQLSTATE 23514 and the constraint's name, as the
-- constraint raised it, and a message that says what is wrong.
create function artex.fact_refused(p_table text, p_row text, p_constraint text)
returns void
language plpgsql
as $fn$
declare
    what text := case p_constraint
        when 'tasks_kind_check' then 'kind is empty or longer than 200 characters'
        when 'flow_task_named' then 'flow_id and flow_task are set together or not at all'
        when 'tasks_flow_task_check' then 'flow_task is empty'
        when 'tasks_host_check' then 'host is empty'
        when 'tasks_limit_key_check' then 'limit_key is empty or longer than 200 bytes'
        when 'tasks_shard_check' then 'shard is outside 0 to 1023'
        when 'tasks_shard_key_check' then 'shard_key is empty'
        when 'tasks_tags_valid' then 'tags are not 1 to 20 tags of 1 to 64 bytes each'
        when 'tasks_timeout_ms_check' then 'timeout_ms is not positive'
        when 'tasks_unique_key_check' then 'unique_key is empty or longer than 200 bytes'
        when 'tasks_progress_check' then 'progress is outside 0 to 1'
        when 'tasks_progress_message_check' then 'progress_message is longer than 200 characters'
        when 'workers_id_check' then 'id is empty'
        when 'workers_host_check' then 'host is empty'
        when 'workers_pid_check' then 'pid is not positive'
        when 'workers_version_check' then 'version is empty'
        when 'workers_channel_check' then 'channel is empty or 64 characters or longer'
        when 'workers_http_addr_check' then 'http_addr is empty'
        when 'workers_lease_ms_check' then 'lease_ms is not positive'
        when 'workers_binary_sha256_check' then 'binary_sha256 is not 64 lowercase hex digits'
        when 'workers_session_check' then 'session is empty or 64 characters or longer'
        when 'workers_slots_check' then 'slots is not positive'
        when 'workers_wake_addr_check' then 'wake_addr is empty or 300 characters or longer'
        else 'a rule is broken'
    end;
begin
    raise exception 'artex: % % refused: % (%)', rtrim(p_table, 's'), p_row, what, p_constraint
        using errcode = 'check_violation', schema = 'artex', table = p_table,
              constraint = p_constraint;
end
$fn$;

comment on function artex.fact_refused(text, text, text) is
    'Raises the error of a task''s or a worker''s fact that breaks its rule, under the name of the constraint that checked it before V59.';

create or replace function artex.tasks_before_insert()
returns trigger
language plpgsql
as $fn$
declare
    existing uuid;
    broken text;
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
    -- Planner shards split the keyspace: one business key always lands on one shard.
    new.shard := abs(hashtext(coalesce(new.shard_key, new.id::text)) % 1024);
    broken := artex.task_fact_broken(new.kind, new.flow_id, new.flow_task, new.host,
        new.limit_key, new.shard, new.shard_key, new.tags, new.timeout_ms, new.unique_key,
        new.progress, new.progress_message);
    if broken is not null then
        perform artex.fact_refused('tasks', new.id::text, broken);
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
    broken text;
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
    broken := artex.task_fact_broken(new.kind, new.flow_id, new.flow_task, new.host,
        new.limit_key, new.shard, new.shard_key, new.tags, new.timeout_ms, new.unique_key,
        new.progress, new.progress_message);
    if broken is not null then
        perform artex.fact_refused('tasks', new.id::text, broken);
    end if;
    return new;
end
$fn$;

-- Every column a rule reads: an update that sets none of them (the hot functions, the
-- status machine's writes, leases, checkpoints) is not checked again.
drop trigger tasks_check_input_update on artex.tasks;
create trigger tasks_check_input_update
    before update of kind, payload, traceparent, flow_id, flow_task, host, limit_key,
        shard, shard_key, tags, timeout_ms, unique_key, progress, progress_message
    on artex.tasks
    for each row execute function artex.tasks_check_input_update();

alter table artex.tasks
    drop constraint tasks_kind_check,
    drop constraint flow_task_named,
    drop constraint tasks_flow_task_check,
    drop constraint tasks_host_check,
    drop constraint tasks_limit_key_check,
    drop constraint tasks_shard_check,
    drop constraint tasks_shard_key_check,
    drop constraint tasks_tags_valid,
    drop constraint tasks_timeout_ms_check,
    drop constraint tasks_unique_key_check,
    drop constraint tasks_progress_check,
    drop constraint tasks_progress_message_check;

create function artex.workers_check_facts()
returns trigger
language plpgsql
as $fn$
declare
    broken text;
begin
    broken := artex.worker_fact_broken(new.id, new.host, new.pid, new.version, new.channel,
        new.http_addr, new.lease_ms, new.binary_sha256, new.session, new.slots,
        new.wake_addr);
    if broken is not null then
        perform artex.fact_refused('workers', quote_literal(left(new.id, 100)), broken);
    end if;
    return new;
end
$fn$;

comment on function artex.workers_check_facts() is
    'Checks a worker''s facts when they are written (V59): its registration, and an update that sets one of them. Heartbeats and the counters of claims and rounds set none.';

create trigger workers_check_facts
    before insert or update of id, host, pid, version, channel, http_addr, lease_ms,
        binary_sha256, session, slots, wake_addr
    on artex.workers
    for each row execute function artex.workers_check_facts();

alter table artex.workers
    drop constraint workers_id_check,
    drop constraint workers_host_check,
    drop constraint workers_pid_check,
    drop constraint workers_version_check,
    drop constraint workers_channel_check,
    drop constraint workers_http_addr_check,
    drop constraint workers_lease_ms_check,
    drop constraint workers_binary_sha256_check,
    drop constraint workers_session_check,
    drop constraint workers_slots_check,
    drop constraint workers_wake_addr_check;

-- V62: a task submitted to an idle fleet is born assigned to an idle worker. Expand.
--
-- A lone task waited for two statements and a planner's hop: its insert, the planner's
-- push, then the worker's claim (`claim_and_read`, a write and a commit of its own:
-- 1.0–1.5 ms of W2's 2.7). Now an idle worker leaves an offer: one slot of it, counted
-- in its `taken` under its own row lock (`artex.offer_slot`, called by the worker after
-- a read that found nothing waiting, while two slots or more are free). An insert of a
-- task runnable now, of a kind the worker runs, that is not limited, not paused, not
-- traced, not bound to another host, with no runnable task of its kind waiting before
-- it, takes the oldest such offer (`for update skip locked`) and is written `assigned`
-- to that worker with its lease: the claim's write rides on the insert, and the worker
-- takes it from its wake-up, which carries it as a round's do: the insert's commit
-- tells the worker on its channel for a worker woken by NOTIFY, and through the
-- planners for one woken over HTTP (`given:[worker, payload]` on artex_wake, passed on
-- as `cancel:` is).
--
-- The offer is a row of its own, not a column of the worker: the users' inserting
-- transactions may stay open for seconds, and they lock only the offer they took,
-- never the worker's row that its heartbeats, claims and outcomes write. A rolled-back
-- insert gives the offer back. An offer is given back (its slot released, as an
-- outcome releases one) when the worker's claim finds tasks waiting for it, and when
-- the worker drains. A worker that is not online, not heard from within its lease, or
-- that a planner could not reach, is offered nothing by its offer.
--
-- The history is a claimed task's: the insert's row (to `pending`, `submitted`), then
-- the start's row from `assigned`, whose `assigned_at` is the insert's time.
--
-- Older builds: a worker of an earlier build never offers, so nothing changes for it;
-- a planner of an earlier build ignores `given:` (its Scanner takes an artex_wake
-- payload it does not know as a hint to run a round, which finds nothing), and the
-- worker then reads its task at its next poll.

create table artex.worker_offers (
    id         bigint generated always as identity primary key,
    worker     text not null references artex.workers (id) on delete cascade,
    offered_at timestamptz not null default now()
);

create index worker_offers_worker on artex.worker_offers (worker);

comment on table artex.worker_offers is
    'Slots idle workers offer to new tasks (V62): one row per offered slot, counted in the worker''s taken; an insert that takes it deletes it and is born assigned to the worker.';

-- Whether a runnable task of a limited kind among `p_kinds` waits: the planners place
-- those, and a slot offered to new tasks (which a limited kind's never take) would keep
-- one of them waiting. Walks `tasks_limited_waiting` by kind. PL/pgSQL, so that its
-- plan is kept (V56).
create function artex.limited_waiting_for(p_kinds text[])
returns boolean
language plpgsql
stable
as $fn$
begin
    return exists (select 1 from artex.tasks t
                   where t.listed = 'pending' and t.limited and t.kind = any(p_kinds)
                     and t.run_at <= now());
end
$fn$;

comment on function artex.limited_waiting_for(text[]) is
    'Whether a runnable task of a limited kind among p_kinds waits (V62): no slot is offered to new tasks then, and one offered is given back.';

-- The worker leaves one offer: only while it is online, has no offer out, has two free
-- slots or more (the last free slot is never offered, so that tasks that become runnable
-- by an update — retries, flows, tasks due later — always find room), and no runnable
-- task of its kinds waits (it claims those, or the planners place them: a limited
-- kind's). True when an offer of it is out after the call.
create function artex.offer_slot(p_worker text)
returns boolean
language plpgsql
as $fn$
declare
    offered boolean;
begin
    if exists (select 1 from artex.worker_offers o where o.worker = p_worker) then
        return true;
    end if;
    with room as materialized (
        select w.id
        from artex.workers w
        where w.id = p_worker and w.state = 'online'
          and w.capacity - (w.taken - coalesce(
                  (select r.released from artex.worker_released r where r.worker = w.id), 0)) >= 2
          and not exists (
              select 1 from artex.tasks t
              where t.listed = 'pending' and not t.limited and t.run_at <= now()
                and t.kind = any(w.kinds) and (t.host is null or t.host = w.host))
          and not artex.limited_waiting_for(w.kinds)
        for update of w
    ),
    offer as (
        insert into artex.worker_offers (worker) select r.id from room r returning worker
    )
    update artex.workers w set taken = w.taken + 1
    from offer o where w.id = o.worker
    returning true into offered;
    return coalesce(offered, false);
end
$fn$;

comment on function artex.offer_slot(text) is
    'An idle worker offers one slot to new tasks (V62): counted in its taken under its row lock, a row of artex.worker_offers; at most one out, never its last free slot, none while runnable tasks of its kinds wait. True when an offer of it is out after the call.';

-- Gives back the worker's offers no insert is taking (`skip locked`): their slots are
-- released as an outcome releases one. How many.
create function artex.withdraw_offers(p_worker text)
returns integer
language plpgsql
as $fn$
declare
    n integer;
begin
    with gone as (
        delete from artex.worker_offers o
        where o.id in (select x.id from artex.worker_offers x where x.worker = p_worker
                       for update skip locked)
        returning 1
    )
    select count(*) into n from gone;
    if n > 0 then
        insert into artex.worker_released as r (worker, released) values (p_worker, n)
        on conflict (worker) do update set released = r.released + excluded.released;
    end if;
    return n;
end
$fn$;

comment on function artex.withdraw_offers(text) is
    'Gives back the worker''s offers no insert holds (V62), releasing their slots; how many.';

create or replace function artex.tasks_before_insert() returns trigger
    language plpgsql
    as $$
declare
    existing uuid;
    broken text;
    offer record;
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
    -- Born assigned (V62): a task runnable now takes an idle worker's offer, when one
    -- fits and nothing of its kind waits before it. A traced task goes the planners' way,
    -- which makes its assignment's span. A transaction that found no offer for a task
    -- looks for none again (`artex.offerless`): a bulk insert of runnable tasks pays
    -- the look once, not once a row (20,000 rows: 369–390 ms looking at each, 331–346
    -- with the mark, 337–351 without the look at all).
    if new.status = 'pending' and new.run_at <= now() and not new.limited
       and new.traceparent is null
       and current_setting('artex.offerless', true) is distinct from 'on' then
        select o.id, w.id as worker, w.lease_ms into offer
        from artex.worker_offers o join artex.workers w on w.id = o.worker
        where w.state = 'online' and w.wake_failed_at is null
          and w.last_seen > now() - make_interval(secs => coalesce(w.lease_ms, 30000) / 1000.0)
          and new.kind = any(w.kinds)
          and (new.host is null or new.host = w.host)
          and not exists (select 1 from artex.kind_pauses p where p.kind = new.kind)
          and not exists (select 1 from artex.tasks t
                          where t.listed = 'pending' and not t.limited and t.run_at <= now()
                            and t.kind = new.kind)
        order by o.id
        limit 1
        for update of o skip locked;
        if offer.id is null then
            perform set_config('artex.offerless', 'on', true);
        else
            delete from artex.worker_offers o where o.id = offer.id;
            new.status := 'assigned';
            new.assigned_to := offer.worker;
            new.lease_until := now() + make_interval(secs => coalesce(offer.lease_ms, 30000) / 1000.0);
            new.lease_epoch := 1;
        end if;
    end if;
    return new;
end
$$;

create or replace function artex.tasks_after_insert() returns trigger
    language plpgsql
    as $$
declare
    due      timestamptz;
    runnable boolean;
begin
    -- A task born assigned (V62) was submitted pending: its history is a claimed task's.
    insert into artex.task_history
        (task_id, from_status, to_status, reason, actor, lease_epoch, flow_id, kind)
    select n.id, null,
           case when n.status = 'assigned' then 'pending'::artex.task_status else n.status end,
           coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0, n.flow_id, n.kind
    from new_rows n;
    if not artex.wakeups_deferred() then
        perform pg_notify('artex_events', '');
    end if;
    -- The workers given tasks born assigned, told at the commit with the tasks carried
    -- as a planner's round carries them (`artex.wake_round`): on the worker's own
    -- channel, or through the planners for a worker woken over HTTP: `given:` and the
    -- JSON array [worker, the push's payload], the payload empty (a plain wake-up) when
    -- the note would not fit a notification.
    if exists (select 1 from new_rows n where n.status = 'assigned') then
        perform pg_notify('artex_wake', 'given:' ||
                          case when octet_length(g.note) <= 7900 then g.note
                               else json_build_array(g.worker, '')::text end)
        from (select r.worker, json_build_array(r.worker, r.payload)::text as note
              from artex.wake_round(
                  array(select distinct n.assigned_to from new_rows n where n.status = 'assigned'),
                  array(select n.id from new_rows n where n.status = 'assigned')) r
              where r.wake_addr is not null) g;
    end if;
    -- The latest time among the pending rows: at or before now (every insert of
    -- runnable tasks only) they are all runnable, and one look suffices; the insert
    -- then costs what it did before (a one-row insert: within 0.01 ms).
    select max(n.run_at) into due from new_rows n where n.status = 'pending';
    if due is null then
        return null;
    elsif due <= now() then
        perform pg_notify('artex_tasks', 'new');
        return null;
    end if;
    select bool_or(n.run_at <= now()), min(n.run_at) filter (where n.run_at > now())
    into runnable, due
    from new_rows n where n.status = 'pending';
    if runnable then
        perform pg_notify('artex_tasks', 'new');
    end if;
    perform pg_notify('artex_tasks', 'at:' || floor(extract(epoch from due) * 1000)::int8);
    return null;
end
$$;

comment on function artex.tasks_after_insert() is
    'After an insert: the history''s first row of each task (to pending for a task born assigned, V62), and the wake-ups: the workers given tasks born assigned, carrying them (their channel, or given:[worker, payload] on artex_wake), `new` on artex_tasks for tasks runnable now (V52), `at:<Unix ms>` for the soonest pending task due later (V57), artex_events for the feed.';

-- A worker's claim that finds tasks waiting for it gives its offer back first: that slot
-- takes one of them now (or, for a limited kind's tasks, the planners place one there). The rest of the function is V51's and V53's.
create or replace function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean, traced_claims uuid[], traced_runnable_at timestamp with time zone[])
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_bitmapscan TO 'off'
    AS $_$
#variable_conflict use_column
declare
    v_claimed text;
    v_room boolean;
    v_waiting boolean;
    v_offered boolean;
    v_kinds text[];
begin
    -- How many it claimed, for the read below (a statement of its own that `plans.rs`
    -- prepares alone: it names no variable of this function).
    perform set_config('artex.claimed', '0', true), set_config('artex.traced', '', true),
            set_config('artex.traced_at', '', true);
    -- Anything to claim, and a free slot to claim it in? A look without a lock: an idle
    -- queue costs no write.
    select w.capacity > w.taken - coalesce(
               (select r.released from artex.worker_released r where r.worker = w.id), 0),
           exists (
               select 1 from artex.tasks t
               where t.listed = 'pending' and not t.limited and t.run_at <= now()
                 and t.kind = any(w.kinds)
                 and (t.host is null or t.host = w.host)),
           exists (select 1 from artex.worker_offers o where o.worker = w.id),
           w.kinds
    into v_room, v_waiting, v_offered, v_kinds
    from artex.workers w
    where w.id = $1 and w.state = 'online';
    -- Tasks wait for it: the slot it offered to new tasks (V62) goes back, to take one
    -- of them now (or, for a limited kind's, for the planners to place one there).
    if v_offered and (v_waiting or artex.limited_waiting_for(v_kinds)) then
        if artex.withdraw_offers($1) > 0 then
            v_room := v_room or v_waiting;
        end if;
    end if;
    if v_waiting and not v_room then
        -- Tasks it may run wait, and the blackboard counts every slot of it taken: its
        -- outcomes are not written yet. It claims again once they are (V47).
        perform set_config('artex.claimed', '-1', true);
    elsif v_waiting then
        perform set_config('artex.hot', 'on', true);
        with room as materialized (
            select w.id, w.host, w.lease_ms,
                   array(select unnest(w.kinds)
                         except select p.kind from artex.kind_pauses p
                         except select l.kind from artex.kind_limits l) as kinds,
                   greatest(w.capacity - greatest(w.taken - coalesce(r.released, 0), 0), 0)
                       as free
            from artex.workers w left join artex.worker_released r on r.worker = w.id
            where w.id = $1 and w.state = 'online'
            for update of w
        ),
        picked as (
            select h.id from artex.runnable_head(
                (select kinds from room), (select host from room), 1, '{}',
                (select free from room)) h
        ),
        assigned as (
            update artex.tasks t
            set status = 'assigned', assigned_to = room.id,
                lease_until = now() + make_interval(secs => coalesce(room.lease_ms, 30000) / 1000.0),
                lease_epoch = t.lease_epoch + 1, updated_at = now()
            from artex.set_context($1, 'assigned') ctx, room
            where ctx and t.id in (select id from picked)
              and t.status::text = 'pending' -- by primary key: see record_attempts
            returning t.id, t.run_at, t.traceparent
        ),
        counted as (
            update artex.workers w
            set taken = w.taken + g.n,
                held = least(greatest(w.taken + g.n - coalesce(
                    (select r.released from artex.worker_released r where r.worker = w.id), 0),
                    0), 2147483647)::int
            from (select count(*) as n from assigned) g
            where w.id = $1 and g.n > 0
            returning g.n
        )
        select set_config('artex.claimed', coalesce((select c.n from counted c), 0)::text, true)
               || set_config('artex.traced', coalesce(traced.ids::text, ''), true)
               || set_config('artex.traced_at', coalesce(traced.runnable_at::text, ''), true)
        into v_claimed
        from (select array_agg(a.id order by a.id) as ids,
                     array_agg(a.run_at order by a.id) as runnable_at
              from assigned a where a.traceparent is not null) traced;
        perform set_config('artex.hot', '', true);
    end if;
    -- The read is `read_assigned`'s own, the snapshot's row (n = 0) saying how many the
    -- claim took, and which of them carry a trace context, with when each became
    -- runnable.
    return query select r.*,
           case when r.n = 0 then greatest(current_setting('artex.claimed')::int8, 0) end,
           case when r.n = 0 then current_setting('artex.claimed') = '-1' end,
           case when r.n = 0 then nullif(current_setting('artex.traced'), '')::uuid[] end,
           case when r.n = 0 then nullif(current_setting('artex.traced_at'), '')::timestamptz[] end
    from artex.read_assigned($1, $2, $3, $4) r
    order by r.n;
end
$_$;
comment on function artex.claim_and_read(text, bigint, bigint, boolean) is
    'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host; the head of the queue by runnable_head, V51), then read_assigned''s rows (the read itself), the snapshot row saying how many it claimed, in no_room whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47), and in traced_claims and traced_runnable_at the claimed tasks that carry a trace context with their run_at, for the worker''s spans (V53). Tasks waiting for it take back the slot it offered to new tasks first (V62). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

comment on column artex.workers.taken is
    'Tasks ever given to the worker, and slots it offered to new tasks (V62) (only grows); it holds taken minus worker_released.released, less the slots it offers.';
comment on column artex.workers.held is
    'Tasks the worker holds, for display: taken - released as of its last assignment or heartbeat; a heartbeat leaves the slot it offers to new tasks out (V62).';

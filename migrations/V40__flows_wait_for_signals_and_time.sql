-- V40: flows that wait for a signal or for time (issue 37). Expand: new tables and
-- functions; two functions of the status machine learn about waits.
--
-- A wait is a task of its flow (kind `artex:wait`) that no worker ever takes: it is
-- inserted `blocked` and stays so until it ends, so it is never in the runnable indexes
-- and costs a dispatch round nothing. `artex.flow_waits` says what it waits for: a
-- signal (with an optional timeout), a time (`until`) or a delay (`for`). When its
-- upstream tasks have all succeeded (the promotion of `tasks_ended`, or at submission
-- for a wait without upstream tasks) it is *reached*: `reached_at` and `due_at` (the
-- timer, or the signal's timeout) are set, and a signal kept from before completes it
-- at once. `artex.signal_flow` records a signal (`artex.flow_signals`, one per name and
-- flow) and completes its wait in the same transaction if the wait is reached; the
-- planners' Scheduler completes or times out the due waits (`artex.fire_due_waits`,
-- `for update skip locked`: each wait ends once whatever the number of planners). Every
-- end is a transition of the task, audited with its actor and reason (the signal's
-- sender and "signal 'name'", or the planner and "timer" / "timeout"), so the feed
-- delivers it and the flow's promotion and cancel cascade follow as for any task.
-- State lives only in these rows: restarts and failovers lose nothing.

create table artex.flow_waits (
    task_id    uuid primary key,
    flow_id    uuid not null references artex.flows (id) on delete cascade,
    signal     text check (artex.is_kind_name(signal)),
    until      timestamptz,
    wait_for   interval check (wait_for > interval '0'),
    timeout    interval check (timeout > interval '0'),
    on_timeout text not null default 'fail' check (on_timeout in ('fail', 'succeed')),
    -- The wait as submitted (`{"signal": …, "timeout": "24h"}`), for people.
    spec       jsonb not null,
    reached_at timestamptz,
    due_at     timestamptz,
    ended_at   timestamptz,
    check (num_nonnulls(signal, until, wait_for) = 1),
    check (timeout is null or signal is not null),
    check (on_timeout = 'fail' or timeout is not null)
);
create unique index flow_waits_signal on artex.flow_waits (flow_id, signal)
    where signal is not null;
-- The Scheduler's due waits: reached, with a time, not ended.
create index flow_waits_due on artex.flow_waits (due_at)
    where due_at is not null and ended_at is null;
comment on table artex.flow_waits is
    'What each wait of a flow waits for (a signal, a time, a delay), when it was reached and is due (migrations/V40).';

create table artex.flow_signals (
    flow_id      uuid not null references artex.flows (id) on delete cascade,
    name         text not null check (artex.is_kind_name(name)),
    payload      jsonb,
    actor        text not null,
    received_at  timestamptz not null default now(),
    -- The wait it is for, and when it completed it (null while it is kept).
    task_id      uuid not null,
    delivered_at timestamptz,
    primary key (flow_id, name)
);
comment on table artex.flow_signals is
    'Signals flows received (artex.signal_flow), one per name and flow: kept until their wait is reached, then delivered (migrations/V40).';

-- Completes the reached wait `p_task` with a signal: succeeded, its result the payload,
-- audited as the signal's sender with the reason "signal 'name'". False if the wait was
-- no longer blocked. The caller's context (actor, reason) is restored.
create function artex.deliver_signal(p_task uuid, p_name text, p_payload jsonb, p_actor text)
returns boolean language plpgsql as $fn$
declare
    saved_actor  text := coalesce(current_setting('artex.actor', true), '');
    saved_reason text := coalesce(current_setting('artex.reason', true), '');
    done         boolean;
begin
    perform artex.set_context(p_actor, format('signal %s', quote_literal(p_name)));
    update artex.tasks t set status = 'succeeded', result = p_payload
    where t.id = p_task and t.status = 'blocked';
    done := found;
    if done then
        update artex.flow_waits w set ended_at = now() where w.task_id = p_task;
        update artex.flow_signals g set delivered_at = now()
        where g.task_id = p_task and g.name = p_name;
    end if;
    perform artex.set_context(saved_actor, saved_reason);
    return done;
end
$fn$;

-- Reaches the waits among `p_ids` that are blocked with every upstream task succeeded:
-- their timer starts (`due_at`), and a signal kept from before completes them. Called by
-- the promotion (tasks_ended), at submission and at a resume; a wait reached already
-- keeps its times.
create function artex.reach_waits(p_ids uuid[]) returns void language plpgsql as $fn$
declare
    s record;
begin
    update artex.flow_waits w
    set reached_at = coalesce(w.reached_at, now()),
        due_at = coalesce(w.until,
                          coalesce(w.reached_at, now()) + coalesce(w.wait_for, w.timeout))
    from artex.tasks t
    where w.task_id = any(p_ids) and t.id = w.task_id and t.status = 'blocked'
      and w.ended_at is null
      and not exists (select 1 from artex.task_waits c
                      where c.task_id = w.task_id and c.upstream_left > 0);
    for s in
        select w.task_id, g.name, g.payload, g.actor
        from artex.flow_waits w
        join artex.flow_signals g on g.flow_id = w.flow_id and g.name = w.signal
        where w.task_id = any(p_ids) and w.reached_at is not null and w.ended_at is null
          and g.delivered_at is null
        order by w.task_id
    loop
        perform artex.deliver_signal(s.task_id, s.name, s.payload, s.actor);
    end loop;
end
$fn$;

-- A signal to flow `p_flow`: its wait for `p_name` completes now if reached (outcome
-- `completed`), or the signal is kept until it is (`stored`). Refused, with a message,
-- for an unknown flow (no_data_found), a name that is no name (invalid_parameter_value),
-- a name no wait of the flow has (undefined_object), a payload over the limit
-- (program_limit_exceeded), a second signal of the name or a wait that has ended
-- (object_not_in_prerequisite_state).
create function artex.signal_flow(p_flow uuid, p_name text, p_payload jsonb default null,
                                  p_actor text default current_user)
returns table (outcome text, task_id uuid, task_name text)
language plpgsql as $fn$
#variable_conflict use_column
declare
    w    record;
    got  record;
    lim  integer := artex.max_payload_bytes();
begin
    perform 1 from artex.flows f where f.id = p_flow;
    if not found then
        raise exception 'artex: no flow with id %', p_flow using errcode = 'no_data_found';
    end if;
    if p_name is null or not artex.is_kind_name(p_name) then
        raise exception 'artex: signal name %: expected letters, digits and ._:- (starting with a letter or digit), at most 100 bytes',
            coalesce(quote_literal(p_name), 'null')
            using errcode = 'invalid_parameter_value';
    end if;
    if octet_length(p_payload::text) > lim then
        raise exception 'artex: the payload of signal % is % bytes, more than the limit of % bytes',
            quote_literal(p_name), octet_length(p_payload::text), lim
            using errcode = 'program_limit_exceeded';
    end if;
    -- The wait's row lock first: a promotion reaching it, the timer ending it and
    -- another signal take it too. Then read it in a snapshot taken after the lock.
    perform 1 from artex.tasks t
    where t.id = (select fw.task_id from artex.flow_waits fw
                  where fw.flow_id = p_flow and fw.signal = p_name)
    for update;
    select fw.task_id, t.flow_task, t.status, fw.reached_at into w
    from artex.flow_waits fw join artex.tasks t on t.id = fw.task_id
    where fw.flow_id = p_flow and fw.signal = p_name;
    if not found then
        raise exception 'artex: flow % has no wait for signal %; it waits for %', p_flow,
            quote_literal(p_name),
            coalesce((select string_agg(quote_literal(fw.signal), ', ' order by fw.signal)
                      from artex.flow_waits fw
                      where fw.flow_id = p_flow and fw.signal is not null),
                     'no signal')
            using errcode = 'undefined_object';
    end if;
    select g.actor, g.received_at into got
    from artex.flow_signals g where g.flow_id = p_flow and g.name = p_name;
    if found then
        raise exception 'artex: flow % received signal % already (at %, from %); a signal is taken once',
            p_flow, quote_literal(p_name), got.received_at, got.actor
            using errcode = 'object_not_in_prerequisite_state';
    end if;
    if w.status in ('succeeded', 'failed', 'timeout', 'canceled') then
        raise exception 'artex: wait % (task %) of flow % has ended %; the signal is not kept',
            quote_literal(w.flow_task), w.task_id, p_flow, w.status
            using errcode = 'object_not_in_prerequisite_state';
    end if;
    insert into artex.flow_signals (flow_id, name, payload, actor, task_id)
    values (p_flow, p_name, p_payload, coalesce(p_actor, current_user), w.task_id);
    if w.status = 'blocked' and w.reached_at is not null
       and artex.deliver_signal(w.task_id, p_name, p_payload, coalesce(p_actor, current_user)) then
        return query select 'completed'::text, w.task_id, w.flow_task;
    else
        return query select 'stored'::text, w.task_id, w.flow_task;
    end if;
end
$fn$;
comment on function artex.signal_flow(uuid, text, jsonb, text) is
    'Sends a signal to a flow: completes its reached wait for that name in this transaction (completed), or keeps the signal until the wait is reached (stored). V40.';

-- The Scheduler's pass over due waits (at most `p_limit`, the earliest first): a timer
-- (`until`, `for`) succeeds with the reason "timer"; a signal's timeout ends the wait
-- `timeout` (its downstream tasks canceled as for any failure), or succeeded if it says
-- `on_timeout: succeed`, with the reason "timeout"; as `p_actor`. The waits are locked
-- `for update skip locked` and each update requires `blocked`: with several planners,
-- or a signal arriving at the same moment, each wait ends once. `p_now` moves the clock
-- for tests.
create function artex.fire_due_waits(p_now timestamptz, p_actor text, p_limit integer)
returns table (task_id uuid, flow_id uuid, outcome text)
language plpgsql as $fn$
#variable_conflict use_column
declare
    at_   timestamptz := coalesce(p_now, now());
    due   uuid[];
    saved_actor  text := coalesce(current_setting('artex.actor', true), '');
    saved_reason text := coalesce(current_setting('artex.reason', true), '');
begin
    -- Waits canceled (or paused and canceled) after they were reached leave the index.
    update artex.flow_waits w set ended_at = now()
    from artex.tasks t
    where w.due_at <= at_ and w.ended_at is null and t.id = w.task_id
      and t.status in ('succeeded', 'failed', 'timeout', 'canceled');
    select array_agg(d.task_id order by d.task_id) into due
    from (select w.task_id from artex.flow_waits w join artex.tasks t on t.id = w.task_id
          where w.due_at <= at_ and w.ended_at is null and t.status = 'blocked'
          order by w.due_at
          limit p_limit
          for update of t skip locked) d;
    if due is null then
        return;
    end if;
    perform artex.set_context(p_actor, 'timer');
    return query
    with done as (
        update artex.tasks t set status = 'succeeded'
        from artex.flow_waits w
        where t.id = any(due) and w.task_id = t.id and w.signal is null
          and t.status = 'blocked'
        returning t.id, t.flow_id
    )
    select d.id, d.flow_id, 'timer'::text from done d;
    perform artex.set_context(p_actor, 'timeout');
    return query
    with done as (
        update artex.tasks t
        set status = case when w.on_timeout = 'succeed' then 'succeeded'::artex.task_status
                          else 'timeout'::artex.task_status end,
            error = case when w.on_timeout = 'fail'
                         then format('no signal %s within %s', quote_literal(w.signal),
                                     coalesce(w.spec->>'timeout', w.timeout::text)) end
        from artex.flow_waits w
        where t.id = any(due) and w.task_id = t.id and w.signal is not null
          and t.status = 'blocked'
        returning t.id, t.flow_id, t.status
    )
    select d.id, d.flow_id, case when d.status = 'succeeded' then 'timeout: succeeded'
                                 else 'timeout' end
    from done d;
    update artex.flow_waits w set ended_at = now() where w.task_id = any(due);
    perform artex.set_context(saved_actor, saved_reason);
end
$fn$;
comment on function artex.fire_due_waits(timestamptz, text, integer) is
    'Ends the due waits of flows (timers succeed; signal timeouts time out, or succeed with on_timeout = succeed), each once across planners. Called by the Scheduler (V40).';

create or replace function artex.tasks_before_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
declare
    -- The write records that the task ran: it started and finished since it was assigned.
    ran boolean := old.status = 'assigned'
                   and new.status not in ('assigned', 'running', 'canceled')
                   and new.started_at is not null
                   and new.started_at is distinct from old.started_at;
    was artex.task_status := case when ran then 'running'::artex.task_status else old.status end;
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
    -- A flow's wait (V40) ends from `blocked`: succeeded by its signal or timer, or timed
    -- out. The lookup runs only for a transition that is otherwise illegal.
    if not artex.transition_allowed(old.status, new.status)
       and not (ran and artex.transition_allowed(was, new.status))
       and not (old.status = 'blocked' and new.status in ('succeeded', 'timeout')
                and exists (select 1 from artex.flow_waits w where w.task_id = old.id)) then
        raise exception 'artex: illegal task transition % -> % for task %',
            old.status, new.status, old.id
            using errcode = 'check_violation',
                  hint = 'allowed from ' || old.status || ': see artex.transition_allowed';
    end if;
    -- A wait is never runnable: no worker ever takes it (V40). Looked up only when a
    -- blocked or paused task is released (a promotion, a resume).
    if new.status = 'pending' and old.status in ('blocked', 'paused')
       and exists (select 1 from artex.flow_waits w where w.task_id = old.id) then
        raise exception 'artex: task % is a wait of flow %: it ends by its signal or timer, never runs',
            old.id, old.flow_id
            using errcode = 'check_violation';
    end if;
    if ran and new.started_at > now() then
        raise exception 'artex: task % cannot have started in the future (%)', old.id, new.started_at
            using errcode = 'check_violation';
    end if;
    -- A retry past the budget ends the task for good instead of queueing it again.
    if new.status = 'pending' and was in ('assigned', 'running')
       and new.retries > new.max_retries then
        new.status := case when was = 'assigned' or new.error is null
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
        -- The writer may say when the handler started (a start recorded after the fact).
        if new.started_at is not distinct from old.started_at or new.started_at > now() then
            new.started_at := now();
        end if;
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

create or replace function artex.tasks_ended(p_ids uuid[], p_status artex.task_status[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
declare
    saved_actor  text := coalesce(current_setting('artex.actor', true), '');
    saved_reason text := coalesce(current_setting('artex.reason', true), '');
    changed      boolean := false;
    ids          uuid[];
    ns           integer[];
    root         record;
    reached      uuid[];
begin
    -- Promotion.
    select array_agg(x.task_id order by x.task_id), array_agg(x.n order by x.task_id)
      into ids, ns
    from (select d.task_id, count(*)::int as n
          from artex.task_dependencies d
          where d.depends_on = any(array(select u.id
                                         from unnest(p_ids, p_status) as u(id, status)
                                         where u.status = 'succeeded'))
          group by d.task_id) x;
    if ids is not null then
        perform 1 from artex.task_waits w
        where w.task_id = any(ids) order by w.task_id for update;
        with counted as (
            update artex.task_waits w set upstream_left = w.upstream_left - v.n
            from unnest(ids, ns) as v(task_id, n)
            where w.task_id = v.task_id
            returning w.task_id, w.upstream_left
        )
        select array_agg(c.task_id order by c.task_id) into ids
        from counted c where c.upstream_left = 0;
        if ids is not null then
            perform 1 from artex.tasks t
            where t.id = any(ids) and t.status = 'blocked' order by t.id for update;
            perform artex.set_context(saved_actor, 'all upstream tasks succeeded');
            changed := true;
            -- A wait (V40) is reached instead: it stays blocked, its timer starts, a
            -- signal that came before completes it.
            select array_agg(w.task_id order by w.task_id) into reached
            from artex.flow_waits w where w.task_id = any(ids);
            -- Runnable from now on: queued behind what was runnable before it.
            update artex.tasks t set status = 'pending', run_at = greatest(t.run_at, now())
            where t.id = any(ids) and t.status = 'blocked'
              and (reached is null or t.id <> all(reached));
            if reached is not null then
                perform artex.reach_waits(reached);
            end if;
        end if;
    end if;

    -- Cancel cascade, one ended upstream task at a time so that each canceled task's
    -- audit row names the task that caused it. Only roots with a downstream task still
    -- unfinished take a turn (canceling a whole flow at once makes none).
    for root in
        select t.id, t.flow_task, t.status::text as status
        from artex.tasks t
        where t.id = any(array(select u.id
                               from unnest(p_ids, p_status) as u(id, status)
                               where u.status <> 'succeeded'))
          and exists (select 1 from artex.task_dependencies d
                      join artex.tasks dt on dt.id = d.task_id
                      where d.depends_on = t.id
                        and dt.status not in ('succeeded', 'failed', 'timeout', 'canceled'))
        order by t.id
    loop
        with recursive down(id) as (
            select d.task_id from artex.task_dependencies d where d.depends_on = root.id
            union
            select d.task_id from down join artex.task_dependencies d on d.depends_on = down.id
        )
        select array_agg(t.id order by t.id) into ids
        from down join artex.tasks t on t.id = down.id
        where t.status not in ('succeeded', 'failed', 'timeout', 'canceled');
        continue when ids is null;
        perform 1 from artex.tasks t where t.id = any(ids) order by t.id for update;
        perform artex.set_context(saved_actor,
            format('upstream task %s (%s) ended %s',
                   coalesce(quote_literal(root.flow_task), 'outside any flow'), root.id,
                   root.status));
        changed := true;
        update artex.tasks t set status = 'canceled'
        where t.id = any(ids) and t.status not in ('succeeded', 'failed', 'timeout', 'canceled');
    end loop;

    if changed then
        perform artex.set_context(saved_actor, saved_reason);
    end if;
end
$$;

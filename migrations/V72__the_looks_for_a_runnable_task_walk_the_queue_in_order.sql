-- V72: the looks for a runnable task walk the runnable queue's index in its order. Expand.
--
-- A worker's claim first looks whether a runnable task of its kinds waits, and an idle
-- worker looks the same before it offers a slot (V62): `exists (select 1 from artex.tasks
-- where listed = 'pending' and not limited and run_at <= now() …)`. An `exists` keeps no
-- order, and PostgreSQL costs its first row as if the rows it wants were spread evenly
-- over the table: with statistics that say most tasks are runnable (a session that made
-- its plan on a backlog, or a table analyzed then) it scans the table from its start,
-- where the finished tasks are. Seen: 18,981 rows read for the first runnable one after
-- 19,000 of a backlog of 20,000 had ended, 2.7 ms a claim; and the plan, cached by the
-- session, stays. `runnable_waiting_for` asks for the head of the runnable queue in its
-- order (priority, run_at, id), which only `tasks_runnable` gives without a sort (sorts
-- off, as in `runnable_head`): it reads the queue's first rows, whatever the statistics.
-- The claim and the offer call it; their answers are the same.

create function artex.runnable_waiting_for(p_kinds text[], p_host text) returns boolean
    language plpgsql stable
    set enable_sort to 'off'
    as $$
begin
    return coalesce((
        select true from artex.tasks t
        where t.listed = 'pending' and not t.limited and t.run_at <= now()
          and t.kind = any(p_kinds)
          and (t.host is null or p_host is null or t.host = p_host)
        order by t.priority desc, t.run_at, t.id
        limit 1), false);
end
$$;

comment on function artex.runnable_waiting_for(p_kinds text[], p_host text) is 'Whether a runnable task of p_kinds that may run on p_host (any host when null) waits, not counting limited kinds'' (V72): the head of the runnable queue looked up in its order, so that it reads tasks_runnable''s first rows whatever the statistics (sorts off). The look of a worker''s claim (claim_and_read_unknown) and of an idle worker''s offer (offer_slot).';

create or replace function artex.claim_and_read_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean, traced_claims uuid[], traced_runnable_at timestamp with time zone[])
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
           artex.runnable_waiting_for(w.kinds, w.host),
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
    -- The read is `read_assigned_unknown`'s own, the snapshot's row (n = 0) saying how
    -- many the claim took, and which of them carry a trace context, with when each
    -- became runnable.
    return query select r.*,
           case when r.n = 0 then greatest(current_setting('artex.claimed')::int8, 0) end,
           case when r.n = 0 then current_setting('artex.claimed') = '-1' end,
           case when r.n = 0 then nullif(current_setting('artex.traced'), '')::uuid[] end,
           case when r.n = 0 then nullif(current_setting('artex.traced_at'), '')::timestamptz[] end
    from artex.read_assigned_unknown($1, $2, $3, $4, $5, $6) r
    order by r.n;
end
$_$;

comment on function artex.claim_and_read_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) is 'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host; the head of the queue by runnable_head, V51), then read_assigned_unknown''s rows (the read itself, leaving out the tasks at the epochs it knows: V71), the snapshot row saying how many it claimed, in no_room whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47), and in traced_claims and traced_runnable_at the claimed tasks that carry a trace context with their run_at, for the worker''s spans (V53). Tasks waiting for it take back the slot it offered to new tasks first (V62). Whether anything waits is artex.runnable_waiting_for''s look (V72). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

create or replace function artex.offer_slot(p_worker text) returns boolean
    language plpgsql
    as $$
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
          and not artex.runnable_waiting_for(w.kinds, w.host)
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
$$;

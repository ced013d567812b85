-- V71: a worker's read leaves out the tasks it already holds. Expand.
--
-- A worker's read (`read_assigned`, and `claim_and_read` after its claim) returned every
-- task still `assigned` to it, up to its capacity, and the worker's ledger dropped the ones
-- it held. A task stays `assigned` until its start is written, which for a short task rides
-- with its outcome, and a worker claims again after each written outcome: in a burst each
-- claim sent back the ~2,000 tasks of its queue, 3.6 rows per task in W1 from idle's shape
-- (the read of 2,000 takes 2.5 ms in PostgreSQL before a row is sent).
-- `read_assigned_unknown` and `claim_and_read_unknown` take the (task, epoch) pairs the
-- worker's ledger knows and leave them out (a hashed subplan: 1.7 ms for 2,000 known of
-- 2,100 assigned, against 3.8 ms for the whole read): a task comes back at a new epoch
-- (given back and assigned here again), never at one the worker has. The byte budget's
-- running sum now counts only what is sent, which the worker's budget (its room after
-- what it holds) meant. `read_assigned` and `claim_and_read` stay for workers
-- of earlier builds, as the new ones with nothing known (new names, not overloads: a
-- name with one function is what `::regproc` and the model's review of the SQL take).

create function artex.read_assigned_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_bitmapscan TO 'off'
    SET enable_seqscan TO 'off'
    AS $_$
#variable_conflict use_column
begin
    return query select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
        checkpoint, flow_id, payload_bytes,
        (extract(epoch from lease_until - clock_timestamp()) * 1000)::float8,
        null::text, null::float8, n, priority, limit_key, traceparent
    from (select id, kind, payload, lease_epoch, retries, max_retries, timeout_ms,
                 checkpoint, flow_id, lease_until, priority, limit_key, traceparent,
                 coalesce(payload_bytes, octet_length(payload::text))::bigint as payload_bytes,
                 sum(coalesce(payload_bytes, octet_length(payload::text))) over
                     (order by priority desc, run_at, id rows unbounded preceding) as upto,
                 row_number() over (order by priority desc, run_at, id) as n
          from artex.tasks
          where assigned_to = $1 and status = 'assigned'
            and (id, lease_epoch) not in (
                select k.id, k.epoch from unnest($5::uuid[], $6::int8[]) as k(id, epoch))
          order by priority desc, run_at, id
          limit $2) t
    where upto <= $3 or (n = 1 and $4)
    union all
    select null, null, null, null, null, null, null, null, null, null, null,
           pg_current_snapshot()::text, (extract(epoch from clock_timestamp()) * 1000)::float8, 0,
           null, null, null
    order by n;
end
$_$;

create function artex.claim_and_read_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean, traced_claims uuid[], traced_runnable_at timestamp with time zone[])
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

create or replace function artex.read_assigned(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text)
    language plpgsql
    set plan_cache_mode to 'force_generic_plan'
    as $$
begin
    return query select * from artex.read_assigned_unknown($1, $2, $3, $4, '{}', '{}');
end
$$;

create or replace function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean, traced_claims uuid[], traced_runnable_at timestamp with time zone[])
    language plpgsql
    set plan_cache_mode to 'force_generic_plan'
    as $$
begin
    return query select * from artex.claim_and_read_unknown($1, $2, $3, $4, '{}', '{}');
end
$$;

comment on function artex.read_assigned_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) is 'A worker''s read of the tasks assigned to it and not started but those at the epochs it knows (p_known, p_known_epochs: V71), with their priority and limit key (V44) and traceparent (V45). Called by worker/attempts.rs (FETCH_CALL); the statement lives only here.';
comment on function artex.claim_and_read_unknown(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean, p_known uuid[], p_known_epochs bigint[]) is 'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host; the head of the queue by runnable_head, V51), then read_assigned_unknown''s rows (the read itself, leaving out the tasks at the epochs it knows: V71), the snapshot row saying how many it claimed, in no_room whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47), and in traced_claims and traced_runnable_at the claimed tasks that carry a trace context with their run_at, for the worker''s spans (V53). Tasks waiting for it take back the slot it offered to new tasks first (V62). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';
comment on function artex.read_assigned(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) is 'The read of workers of builds before V71: read_assigned_unknown with nothing known.';
comment on function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean) is 'The claim and read of workers of builds before V71: claim_and_read_unknown with nothing known.';

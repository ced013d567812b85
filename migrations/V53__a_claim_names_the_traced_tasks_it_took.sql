-- V53: a worker's claim says which tasks carrying a trace context it claimed, and when
-- each became runnable (issues 37 and 39). Expand.
--
-- A planner's round makes the spans of the time in queue and of the assignment for the
-- traced tasks it assigns (the round's write returns their contexts, V45). A task a
-- worker claims (V46; and since V52 a quiet fleet's new task, claimed at the planner's
-- wake-up) had neither: its trace went from the submission to the attempt. The worker
-- makes them now, from what its claim returns on the snapshot's row (n = 0; passed to
-- the read as settings of the transaction, as the count claimed is): the ids of
-- the traced tasks it claimed (`traced_claims`, in id order) and their `run_at`
-- (`traced_runnable_at`, the same order). Both are null when it claimed none that
-- carries a context, which is every claim of a fleet that does not trace.
--
-- Two columns more in the result: the function is dropped and made again, in this
-- migration's transaction. Workers of earlier builds read the columns they know, by
-- position and by name; this build's workers read the new ones by name and take their
-- absence (an older schema) as none.

drop function artex.claim_and_read(text, bigint, bigint, boolean);

create function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean)
RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean, traced_claims uuid[], traced_runnable_at timestamptz[])
language plpgsql
set plan_cache_mode = force_generic_plan
-- Plain index scans, as for `read_assigned` (below): the claim's look and pick walk the
-- runnable tasks' index, where every task claimed leaves a dead entry until a vacuum.
set enable_bitmapscan = off
as $_$
#variable_conflict use_column
declare
    v_claimed text;
    v_room boolean;
    v_waiting boolean;
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
                 and (t.host is null or t.host = w.host))
    into v_room, v_waiting
    from artex.workers w
    where w.id = $1 and w.state = 'online';
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
    'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host; the head of the queue by runnable_head, V51), then read_assigned''s rows (the read itself), the snapshot row saying how many it claimed, in no_room whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47), and in traced_claims and traced_runnable_at the claimed tasks that carry a trace context with their run_at, for the worker''s spans (V53). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

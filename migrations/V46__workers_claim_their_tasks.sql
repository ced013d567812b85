-- V46: a worker claims its own tasks in its read (issue 39: "how a task is claimed: the
-- worker claiming in the write that starts it while the planner places capacity").
--
-- Until now a task reached a worker in two hops: the insert woke a planner, whose round
-- (`dispatch_round`, `assign_and_wake`, a commit) assigned it and woke the worker, whose
-- read or wake-up brought it. Now a worker's read first claims, for itself, the runnable
-- tasks it may run, up to its free slots, and then reads what is assigned to it as
-- `read_assigned` does: one statement. A worker reads at its poll, when a wake-up leaves
-- tasks to the read, and (new) each time a written outcome gives slots back while its
-- latest claim found tasks: a busy worker refills itself without a planner's round.
-- (An insert still wakes the planners only: a worker is woken over HTTP, which the
-- database cannot push.)
--
-- What a worker claims is what the Assigner would give it, nothing more:
-- - only while its own row says `online` (not draining, not gone), its row locked, and
--   within `capacity` minus what it holds (`taken` − `released`, as the round counts);
-- - tasks that are `pending` and due, of its kinds, not paused (`kind_pauses`), bound to
--   no host or to its own;
-- - never a task of a limited kind (`limited`, or a kind with a row in `kind_limits`,
--   fair kinds included): the Assigner alone places those, by their limits and turns.
-- A worker that claims is reachable by definition, so the exclusion of unreachable
-- workers (planners that cannot push to them) holds. Shards stay a planner matter: they
-- keep planners from placing the same task twice, which the row locks here do too.
-- The Assigner's rounds run as before, for everything, and stay the safety net (their
-- poll); both take rows `for update skip locked`, and the worker's row lock orders the
-- counts, so a task is assigned once.
--
-- The claim writes nothing when there is nothing to claim: it looks before it locks, so a
-- worker's poll of an idle queue stays a read with no commit to flush. The history row of
-- the assignment is written with the start, as for a round's (V25: `record_attempts`),
-- naming the worker as its actor.

create function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean)
RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint)
language plpgsql
set plan_cache_mode = force_generic_plan
-- Plain index scans, as for `read_assigned` (below): the claim's look and pick walk the
-- runnable tasks' index, where every task claimed leaves a dead entry until a vacuum.
set enable_bitmapscan = off
as $_$
#variable_conflict use_column
declare
    v_claimed text;
begin
    -- How many it claimed, for the read below (a statement of its own that `plans.rs`
    -- prepares alone: it names no variable of this function).
    perform set_config('artex.claimed', '0', true);
    -- Anything to claim? A look without a lock: an idle queue costs no write.
    if exists (
        select 1 from artex.workers w
        where w.id = $1 and w.state = 'online'
          and w.capacity > w.taken - coalesce(
                  (select r.released from artex.worker_released r where r.worker = w.id), 0)
          and exists (
              select 1 from artex.tasks t
              where t.listed = 'pending' and not t.limited and t.run_at <= now()
                and t.kind = any(w.kinds)
                and (t.host is null or t.host = w.host)))
    then
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
            select t.id from artex.tasks t
            where t.listed = 'pending' and not t.limited and t.run_at <= now()
              and t.kind = any((select kinds from room)::text[])
              and (t.host is null or t.host = (select host from room))
            order by t.priority desc, t.run_at, t.id
            limit (select free from room)
            for update skip locked
        ),
        assigned as (
            update artex.tasks t
            set status = 'assigned', assigned_to = room.id,
                lease_until = now() + make_interval(secs => coalesce(room.lease_ms, 30000) / 1000.0),
                lease_epoch = t.lease_epoch + 1, updated_at = now()
            from artex.set_context($1, 'assigned') ctx, room
            where ctx and t.id in (select id from picked)
              and t.status::text = 'pending' -- by primary key: see record_attempts
            returning t.id
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
        into v_claimed;
        perform set_config('artex.hot', '', true);
    end if;
    -- The read is `read_assigned`'s own, the snapshot's row (n = 0) saying how many the
    -- claim took.
    return query select r.*, case when r.n = 0 then current_setting('artex.claimed')::int8 end
    from artex.read_assigned($1, $2, $3, $4) r
    order by r.n;
end
$_$;
comment on function artex.claim_and_read(text, bigint, bigint, boolean) is
    'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host), then read_assigned''s rows (the read itself), the snapshot row saying how many it claimed (V46). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

-- The read walks `tasks_holder` for the worker's own rows. A bitmap scan (the plan
-- PostgreSQL picks) never marks the index entries of dead row versions, and every task
-- the worker ever held leaves one until a vacuum: on a database that had run 4,500
-- tasks, an empty read took 0.38 ms. A plain index scan marks them as it passes, and the
-- next reads skip them (0.13 ms). Set on `read_assigned` itself, so that its plan is the
-- same whoever calls it first in a session (a cached plan keeps the settings it was made
-- under).
alter function artex.read_assigned(text, bigint, bigint, boolean) set enable_bitmapscan = off;

-- V47: a worker's claim says when tasks wait that it found no free slot for.
--
-- V46's worker claims again after each written outcome while its latest claim found
-- tasks. A read sent while its outcomes were still unwritten found no free slot (the
-- blackboard still counted those tasks as held) and claimed nothing, which the worker
-- took for an empty queue: it stopped claiming, and the rest waited for its poll. The
-- snapshot row now says which it was: `claimed` as before, and `no_room`, true when
-- tasks it may run wait but every slot of it is counted taken. (Its look for waiting
-- tasks is V46's: its kinds, paused ones included, so a paused kind's tasks can cost one
-- more read, which then finds room and claims nothing.) A trailing column of the
-- snapshot row: older builds read the row by position and by name, and never see it.

drop function artex.claim_and_read(text, bigint, bigint, boolean);

create function artex.claim_and_read(p_worker text, p_limit bigint, p_max_bytes bigint, p_holds_nothing boolean)
RETURNS TABLE(id uuid, kind text, payload jsonb, lease_epoch bigint, retries integer, max_retries integer, timeout_ms integer, checkpoint jsonb, flow_id uuid, payload_bytes bigint, lease_left_ms double precision, snapshot text, db_clock_ms double precision, n bigint, priority integer, limit_key text, traceparent text, claimed bigint, no_room boolean)
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
    perform set_config('artex.claimed', '0', true);
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
    return query select r.*,
           case when r.n = 0 then greatest(current_setting('artex.claimed')::int8, 0) end,
           case when r.n = 0 then current_setting('artex.claimed') = '-1' end
    from artex.read_assigned($1, $2, $3, $4) r
    order by r.n;
end
$_$;
comment on function artex.claim_and_read(text, bigint, bigint, boolean) is
    'A worker''s read: first the runnable tasks it may run claimed for itself, up to its free slots, under its row lock (online only; its kinds but the paused and the limited; no task bound to another host), then read_assigned''s rows (the read itself), the snapshot row saying how many it claimed and, in no_room, whether such tasks wait while the blackboard counts every slot of it taken (its outcomes not yet written: it claims again once they are) (V46, V47). Called by worker/attempts.rs (CLAIM_CALL); the statement lives only here.';

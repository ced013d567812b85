-- V74: a worker's written outcomes say whether the planners must hear of them.
-- Expand.
--
-- A worker woke the planners after each written batch (capacity given back), and each
-- wake-up started a round. In a burst the workers refill what they give back by their
-- own claims (V46, V47), so those rounds only contended with the claims for the same
-- slots and the same worker rows (W1 from idle, profiled on 2026-12-07: 17
-- `assign_and_wake` calls taking 292 ms of statement time to place 1,691 of 20,000
-- tasks, mostly waiting on the workers' transactions; 60 `dispatch_round` calls, 87 ms).
-- `record_attempts` now also answers, for the batch, whether a round has something only
-- a planner places: a limited kind's place given back or a limited task waiting for the
-- worker's kinds (no claim takes a limited kind's task), a task sent back to pending,
-- dependents to promote. A worker with a backlog (its latest claim took tasks, so it
-- claims what it gives back itself) wakes the planners only then; one without a backlog
-- wakes them after every batch, as before. The body is V73's but for the returned
-- `limited` and the answer's second column.

drop function artex.record_attempts(p_worker text, p_ids uuid[], p_epochs bigint[], p_statuses text[], p_results jsonb[], p_errors text[], p_failed boolean[], p_delays_ms double precision[], p_started_ago_ms double precision[]);

create function artex.record_attempts(p_worker text, p_ids uuid[], p_epochs bigint[], p_statuses text[], p_results jsonb[], p_errors text[], p_failed boolean[], p_delays_ms double precision[], p_started_ago_ms double precision[])
    RETURNS TABLE(id uuid, planners boolean)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $_$
#variable_conflict use_column
declare
    ended text;
    nestloop text := current_setting('enable_nestloop');
begin
    perform artex.set_context($1, null), artex.defer_wakeups(),
            set_config('artex.hot', 'on', true), set_config('artex.ended', '', true);
    -- Starts and outcomes; the history rows the status machine's triggers would write
    -- (an unstarted task given back: its assignment and its return; a start; a start and
    -- an end in one write: both), the holder's released count, and the ended tasks that
    -- have dependents, for the flows after the statement.
    -- Planned (once a session) with hash joins only: see V73.
    perform set_config('enable_nestloop', 'off', true);
    return query with v as (
        select * from unnest($2::uuid[], $3::int8[], $4::text[], $5::jsonb[], $6::text[],
                             $7::bool[], $8::float8[], $9::float8[])
            as v(id, epoch, status, result, error, failed, delay_ms, started_ago_ms)
    ),
    written as (
        update artex.tasks t
        set status = artex.attempt_status(v.status,
                         t.status::text = 'assigned' and v.started_ago_ms is null,
                         t.retries + v.failed::int, t.max_retries, coalesce(v.error, t.error)),
            result = v.result,
            error = coalesce(v.error, t.error),
            retries = t.retries + v.failed::int,
            run_at = case when v.status = 'pending'
                          then now() + make_interval(secs => v.delay_ms / 1000.0) else t.run_at end,
            started_at = case when t.status::text = 'assigned' and v.started_ago_ms is not null
                              then now() - make_interval(secs => greatest(v.started_ago_ms, 0) / 1000.0)
                              else t.started_at end,
            assigned_to = case when v.status = 'running' then t.assigned_to end,
            lease_until = case when v.status = 'running' then t.lease_until end,
            -- Ended: an outcome that ends it, or a retry past the budget (attempt_status).
            finished_at = case when v.status in ('succeeded', 'failed', 'timeout')
                                    or (v.status = 'pending'
                                        and t.retries + v.failed::int > t.max_retries)
                               then now() else t.finished_at end,
            updated_at = now()
        -- Each task's row as it was, by its key (offset 0: a lookup per outcome, never a
        -- scan joined with them).
        from v cross join lateral (
            select o.status, o.updated_at from artex.tasks o where o.id = v.id offset 0) o
        -- The batch's rows read by their keys once, hashed against the outcomes (V73):
        -- the key's test is the only one an index serves.
        where t.id = any($2) and t.id::text = v.id::text and t.lease_epoch = v.epoch
          and coalesce(t.assigned_to, '') = $1
          and (t.status::text = 'running'
               or (t.status::text = 'assigned'
                   and (v.started_ago_ms is not null or v.status = 'pending')))
        returning t.id, t.status, t.flow_id, t.kind, t.error, t.lease_epoch, t.started_at,
                  t.limited,
                  o.status as was, o.updated_at as was_at,
                  o.status = 'assigned' and v.started_ago_ms is not null
                      and t.status not in ('assigned', 'running') as ran
    ),
    steps as (
        select w.id, 0 as step, 'pending'::artex.task_status as from_status,
               'assigned'::artex.task_status as to_status, w.lease_epoch,
               'assigned'::text as reason, w.was_at as at, null::timestamptz as assigned_at,
               null::timestamptz as started_at, w.flow_id, w.kind
        from written w
        where w.was = 'assigned' and w.status <> 'running' and not w.ran
        union all
        -- A start and an end in one write: one row, two events (task_transitions).
        select w.id, 1, w.was, w.status, w.lease_epoch,
               case when w.ran then
                        case when w.status in ('failed', 'pending') then w.error end
                    when w.status = 'running' then 'started'
                    when w.status in ('failed', 'pending') and w.was = 'running' then w.error
               end,
               now(),
               case when w.was = 'assigned' and (w.ran or w.status = 'running')
                    then w.was_at end,
               case when w.ran then w.started_at end,
               w.flow_id, w.kind
        from written w
        where w.was <> w.status
    ),
    history as (
        -- Ids drawn in the rows' order, the start's before its end's: the feed's order.
        insert into artex.task_history
            (id, end_id, task_id, from_status, to_status, reason, actor, worker,
             lease_epoch, at, flow_id, kind, assigned_at, started_at)
        select nextval('artex.history_id_seq'),
               case when s.started_at is not null then nextval('artex.history_id_seq') end,
               s.id, s.from_status, s.to_status, s.reason, $1, $1, s.lease_epoch, s.at,
               s.flow_id, s.kind, s.assigned_at, s.started_at
        from (select * from steps order by id, step) s
    ),
    released as (
        insert into artex.worker_released as r (worker, released)
        select $1, count(*) from written w where w.status not in ('assigned', 'running')
        having count(*) > 0
        on conflict (worker) do update set released = r.released + excluded.released
    ),
    flows as (
        select set_config('artex.ended', coalesce(string_agg(w.id || ' ' || w.status, ','), ''),
                          true) as ended
        from written w
        where w.status in ('succeeded', 'failed', 'timeout')
          -- A lookup per ended task (offset 0 keeps it a subplan, not a join).
          and exists (select 1 from artex.task_dependencies d where d.depends_on = w.id
                      offset 0)
    ),
    -- Whether the planners must hear of the write (V74): a limited kind's place given
    -- back or a limited task waiting for this worker's kinds (no worker's claim takes
    -- one), a task sent back to pending, dependents to promote (the flows, after the
    -- statement). Materialized: asked once a statement (inlined, its look for limited
    -- tasks ran once per row).
    asks as materialized (
        select exists (select 1 from written x
                       where x.status not in ('assigned', 'running')
                         and (x.limited or x.status = 'pending'))
               or (exists (select 1 from written x
                           where x.status not in ('assigned', 'running'))
                   and artex.limited_waiting_for(
                           (select k.kinds from artex.workers k where k.id = $1)))
               as wake
    )
    select w.id, p.wake or f.ended <> '' from written w, flows f, asks p;
    perform set_config('artex.hot', '', true), set_config('enable_nestloop', nestloop, true);
    ended := current_setting('artex.ended');
    if ended <> '' then
        perform set_config('artex.ended', '', true);
        perform artex.tasks_ended(array_agg(split_part(e, ' ', 1)::uuid order by e),
                                  array_agg(split_part(e, ' ', 2)::artex.task_status order by e))
        from unnest(string_to_array(ended, ',')) e;
    end if;
end
$_$;

COMMENT ON FUNCTION artex.record_attempts(p_worker text, p_ids uuid[], p_epochs bigint[], p_statuses text[], p_results jsonb[], p_errors text[], p_failed boolean[], p_delays_ms double precision[], p_started_ago_ms double precision[]) IS 'A worker''s batch of starts and outcomes, with their history rows and the holder''s released count in the same statement, then the flows (V25). Its tasks are found by key from the outcomes, never by the holder''s index (V73); the second column says whether the planners must hear of the write beyond the places the worker''s claims refill (V74). Called by worker/attempts.rs (RECORD_CALL); the statement lives only here.';

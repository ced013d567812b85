-- V27: a planner's wake-up measures a task before it writes the task into a notification
-- (a fix). Expand: the same calls and results.
--
-- `wake_round` wrote every assigned task as JSON text (its payload and checkpoint
-- included) and only then kept those of at most 1,000 bytes to carry. Eight 50 MB tasks
-- made each wake-up write 250 MB of text to throw away: four seconds of a PostgreSQL core
-- per planner round, rounds repeated while the worker read one task at a time, and the
-- worker's lease renewals starved on a two-core host until its tasks were taken back and
-- failed (exposure's eight 50 MB payloads test, in CI). A task is now written out only
-- when its payload (its measured size, `payload_bytes`) and its checkpoint (its stored
-- size) could fit; the written text is measured as before. A task not carried is read by
-- the worker, as every task that does not fit is.
create or replace function artex.wake_round(p_workers text[], p_tasks uuid[])
returns table (worker text, wake_addr text, payload text, notified text)
language plpgsql as $$
#variable_conflict use_column
begin
    return query with held as materialized (
        select t.assigned_to as worker,
               case when coalesce(t.payload_bytes, octet_length(t.payload::text)) <= 1000
                     and coalesce(pg_column_size(t.checkpoint), 0) <= 1000
               then json_build_array(t.id, t.kind, t.payload, t.lease_epoch, t.retries,
                   t.max_retries, t.timeout_ms, t.checkpoint, t.flow_id,
                   coalesce(t.payload_bytes, octet_length(t.payload::text)),
                   t.xmin::text::int8,
                   (extract(epoch from t.lease_until) * 1000)::float8)::text
               end as task,
               row_number() over (partition by t.assigned_to
                                  order by t.priority desc, t.run_at, t.id) as n
        from artex.tasks t
        where t.id = any($2::uuid[]) and t.status::text = 'assigned'
          and t.assigned_to = any($1::text[])
    ),
    carried as (
        select worker, n, task,
               sum(octet_length(task) + 1) over (partition by worker order by n) as upto
        from held where octet_length(task) <= 1000
    ),
    notes as (
        select worker, '[' || string_agg(task, ',' order by n) || ']' as payload
        from carried group by worker, upto / 6500
        union all
        select worker, '' from held where task is null or octet_length(task) > 1000
        union all
        select id, '' from artex.workers
        where id = any($1::text[]) and id not in (select worker from held)
    )
    select w.id, w.wake_addr,
           case when w.wake_addr is not null then notes.payload end,
           case when w.wake_addr is null then pg_notify(w.channel, notes.payload)::text end
    from notes join artex.workers w on w.id = notes.worker
    order by w.id;
end
$$;

comment on function artex.wake_round is
    'The chosen workers'' wake-ups with the tasks they carry (those whose JSON is at most 1,000 bytes, measured before it is written: V27). Called by planner/dispatch.rs (WAKE_CALL); the statement lives only here.';

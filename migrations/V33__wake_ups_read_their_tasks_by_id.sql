-- V33: a planner's wake-up reads the tasks it announces by their ids (issue 39). Expand:
-- the same function, calls and results.
--
-- `wake_round` found its tasks with `t.id = any($2) and t.assigned_to = any($1)`, which
-- PostgreSQL served from the holder index: every task the chosen workers hold, each
-- checked against the round's array of ids one element at a time (a generic plan's array
-- is a parameter, never hashed). In W1 from idle a worker holds up to 2,010 tasks and a
-- round announces up to 2,000: millions of uuid comparisons per round
-- (`ExecEvalScalarArrayOp` was a third of the planner's backend in a perf profile). Each
-- id is now looked up through the primary key, in a lateral subquery that the planner
-- cannot turn back into that scan.
create or replace function artex.wake_round(p_workers text[], p_tasks uuid[])
returns table (worker text, wake_addr text, payload text, notified text)
language plpgsql
set plan_cache_mode = force_generic_plan
as $fn$
#variable_conflict use_column
begin
    return query with held as materialized (
        select t.assigned_to as worker,
               case when coalesce(t.payload_bytes, octet_length(t.payload::text)) <= 1000
                     and coalesce(pg_column_size(t.checkpoint), 0) <= 1000
               then json_build_array(t.id, t.kind, t.payload, t.lease_epoch, t.retries,
                   t.max_retries, t.timeout_ms, t.checkpoint, t.flow_id,
                   coalesce(t.payload_bytes, octet_length(t.payload::text)),
                   t.version,
                   (extract(epoch from t.lease_until) * 1000)::float8)::text
               end as task,
               row_number() over (partition by t.assigned_to
                                  order by t.priority desc, t.run_at, t.id) as n
        -- Each task by its id through the primary key (a nested loop that cannot become
        -- a read of everything the workers hold, filtered against the array: V33).
        from unnest($2::uuid[]) as i(id)
        cross join lateral (
            select t.*, t.xmin::text::int8 as version from artex.tasks t
            where t.id = i.id and t.status::text = 'assigned'
              and t.assigned_to = any($1::text[])
            offset 0
        ) t
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
$fn$;

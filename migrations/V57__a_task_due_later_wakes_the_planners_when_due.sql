-- V57: a task due later is assigned when it is due, not at the planners' next poll.
-- Expand.
--
-- An insert of runnable tasks tells the planners at once (`artex_tasks`, payload `new`,
-- V52). An insert of tasks due later (`run_at` ahead) told them `new` as well, which
-- found nothing runnable, and the tasks then waited for a planner's safety-net poll
-- after their `run_at`: up to `--planner-poll-ms` (200 ms) late, 100-150 ms in W1 from
-- idle, whose tasks are inserted 8 s ahead.
--
-- The insert now says `new` only for tasks runnable now, and when the soonest of the
-- others is due: payload `at:<ms>`, the Unix time in milliseconds of the earliest
-- `run_at` among its pending rows that are not runnable yet. A planner keeps a timer
-- for it and assigns them then (a planner of an earlier build takes the payload as any
-- other wake-up: a round at once, which finds nothing, and its poll as before). A worker's retries and snoozes say the same
-- after their write (worker/attempts.rs). The time is the database's clock; a planner
-- whose clock differs wakes that much early (its round finds nothing and the poll
-- stays the net) or late (by the difference, within its poll).

create or replace function artex.tasks_after_insert()
returns trigger
language plpgsql
as $fn$
declare
    due      timestamptz;
    runnable boolean;
begin
    insert into artex.task_history
        (task_id, from_status, to_status, reason, actor, lease_epoch, flow_id, kind)
    select n.id, null, n.status, coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0, n.flow_id, n.kind
    from new_rows n;
    if not artex.wakeups_deferred() then
        perform pg_notify('artex_events', '');
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
$fn$;

comment on function artex.tasks_after_insert() is
    'After an insert: the history''s first row of each task, and the wake-ups: `new` on artex_tasks for tasks runnable now (V52), `at:<Unix ms>` for the soonest pending task due later (V57), artex_events for the feed.';

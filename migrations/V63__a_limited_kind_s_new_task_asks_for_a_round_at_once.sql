-- V63: an insert of runnable tasks of a limited kind asks the planners for a round at
-- once. Expand.
--
-- An insert of runnable tasks says `new` on artex_tasks. On a quiet fleet the planner's
-- Scanner then wakes an idle worker to claim them itself, and runs its round 5 ms later
-- (`CLAIM_FIRST`) for what the claim left. A worker never claims a task of a limited
-- kind (kind limits and fair kinds, V18 and V43; the round counts them), so such a task
-- waited out those 5 ms and then the round: on an idle fleet, a fair kind's task was
-- assigned 8.0 ms after its insert (median, the `fair` bench part), against 0.0 ms for
-- a kind without limits (born assigned, V62). The insert now says `new limited` when a
-- runnable row is limited, and the Scanner starts its round at once. A planner of an
-- earlier build takes any other payload on artex_tasks as a request for a round now,
-- which is what `new limited` asks of it.

create or replace function artex.tasks_after_insert() returns trigger
    language plpgsql
    as $$
declare
    due      timestamptz;
    runnable boolean;
    limited  boolean;
begin
    -- A task born assigned (V62) was submitted pending: its history is a claimed task's.
    insert into artex.task_history
        (task_id, from_status, to_status, reason, actor, lease_epoch, flow_id, kind)
    select n.id, null,
           case when n.status = 'assigned' then 'pending'::artex.task_status else n.status end,
           coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0, n.flow_id, n.kind
    from new_rows n;
    if not artex.wakeups_deferred() then
        perform pg_notify('artex_events', '');
    end if;
    -- The workers given tasks born assigned, told at the commit with the tasks carried
    -- as a planner's round carries them (`artex.wake_round`): on the worker's own
    -- channel, or through the planners for a worker woken over HTTP: `given:` and the
    -- JSON array [worker, the push's payload], the payload empty (a plain wake-up) when
    -- the note would not fit a notification.
    if exists (select 1 from new_rows n where n.status = 'assigned') then
        perform pg_notify('artex_wake', 'given:' ||
                          case when octet_length(g.note) <= 7900 then g.note
                               else json_build_array(g.worker, '')::text end)
        from (select r.worker, json_build_array(r.worker, r.payload)::text as note
              from artex.wake_round(
                  array(select distinct n.assigned_to from new_rows n where n.status = 'assigned'),
                  array(select n.id from new_rows n where n.status = 'assigned')) r
              where r.wake_addr is not null) g;
    end if;
    -- The latest time among the pending rows: at or before now (every insert of
    -- runnable tasks only) they are all runnable, and one look suffices; the insert
    -- then costs what it did before (a one-row insert: within 0.01 ms). `new limited`
    -- when a runnable row is of a limited kind: no worker claims it, the round must.
    select max(n.run_at), bool_or(n.limited) into due, limited
    from new_rows n where n.status = 'pending';
    if due is null then
        return null;
    elsif due <= now() then
        perform pg_notify('artex_tasks', case when limited then 'new limited' else 'new' end);
        return null;
    end if;
    select bool_or(n.run_at <= now()), bool_or(n.limited and n.run_at <= now()),
           min(n.run_at) filter (where n.run_at > now())
    into runnable, limited, due
    from new_rows n where n.status = 'pending';
    if runnable then
        perform pg_notify('artex_tasks', case when limited then 'new limited' else 'new' end);
    end if;
    perform pg_notify('artex_tasks', 'at:' || floor(extract(epoch from due) * 1000)::int8);
    return null;
end
$$;

comment on function artex.tasks_after_insert() is
    'After an insert: the history''s first row of each task (to pending for a task born assigned, V62), and the wake-ups: the workers given tasks born assigned, carrying them (their channel, or given:[worker, payload] on artex_wake), `new` on artex_tasks for tasks runnable now (V52), `new limited` when one of them is of a limited kind (V63: no worker claims it, a round now), `at:<Unix ms>` for the soonest pending task due later (V57), artex_events for the feed.';

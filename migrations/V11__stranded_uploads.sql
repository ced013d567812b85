-- V11: a task that can never run may fail while pending (issue 15). Expand: one more
-- legal move (`pending → failed`), which older builds never write, and an index.
--
-- A task bound to a host (its upload lies on that host's disk, `tasks.host`) waits,
-- pending, for a worker there. When every worker of that host has been gone past a
-- deadline, no worker can ever read the file: the reaper fails the task with the reason
-- (see actors/src/upload_guard.rs), instead of leaving it pending for ever. `canceled`
-- would say an operator or an upstream task decided; this is a failure of the fleet,
-- and a failed task can be retried as a new one once the host is back.

create or replace function artex.transition_allowed(from_s artex.task_status, to_s artex.task_status)
returns boolean language sql immutable as $$
    select case from_s
        when 'pending'  then to_s in ('assigned', 'paused', 'canceled', 'failed')
        when 'assigned' then to_s in ('running', 'pending', 'canceled', 'failed', 'timeout')
        when 'running'  then to_s in ('succeeded', 'failed', 'timeout', 'pending', 'canceled')
        when 'paused'   then to_s in ('pending', 'blocked', 'canceled')
        when 'blocked'  then to_s in ('pending', 'paused', 'canceled')
        else false
    end
$$;

-- The reaper's look for stranded tasks: only the few bound to a host, pending.
create index tasks_pending_by_host on artex.tasks (host)
    where status = 'pending' and host is not null;

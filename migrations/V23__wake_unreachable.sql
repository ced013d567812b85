-- V23: a worker the planners cannot push to is still given work (issue 33). Expand: one
-- nullable column, which older builds neither read nor write.
--
-- Since V14 planners push wake-ups to a worker's HTTP port, and a worker whose push
-- failed was given nothing until a push went through again: right for a worker that
-- died (its first failed push finds it), wrong for one that is alive where the planners
-- cannot reach it (a `--http 127.0.0.1:PORT` on another host, a network namespace of its
-- own), which stayed `online` and never got a task.
--
-- A planner whose push to a worker fails records when (`wake_failed_at`, kept from the
-- first failure until a push goes through). A worker heard from since (`last_seen` past
-- it) is alive and only unreachable: planners give it work again and it takes its tasks
-- by polling. A killed worker is never heard from again, so it still gets nothing after
-- the round that finds it. The worker reads the column with each heartbeat and says so
-- (its log, `/health`); the roster shows it ("wake-ups: unreachable, polling").
alter table artex.workers add column wake_failed_at timestamptz;

comment on column artex.workers.wake_failed_at is
    'When a planner''s wake-up push to this worker first failed, until one goes through (null: reachable, or woken by NOTIFY). A worker heard from since is given work and polls for it.';

-- V15: a task's row is updated in place (HOT) between the facts that place it: its
-- start, lease renewals and checkpoints write no index entry (issue 23). Contract,
-- compatible from 15: it replaces the indexes older builds claim, read assignments and
-- list by (their statements would still be right, but would read the whole table).
--
-- In PostgreSQL 15 an update is HOT (a new row version on the same page, no new index
-- entry) only if no column that any index mentions changed: as a key, in an expression
-- or in a partial index's predicate. Every transition changes `status`, and `status`
-- was in five indexes (the runnable set, the held set, a worker's assignments, the
-- host-bound pending tasks and the operators' `(status, id)`): so no update of a task
-- was ever HOT, and each wrote an entry in every index of the table, `(kind, id)` and
-- the primary key included.
--
-- Now the indexes name `status` only through `listed`, a stored generated column that
-- is the status while it is one a task enters once or rarely (pending, paused, blocked,
-- the four ends) and NULL while the task is assigned or running:
--
-- * The runnable set: `tasks_runnable (priority desc, run_at, id) where listed =
--   'pending'`; the host-bound pending tasks likewise.
-- * The held set: `tasks_holder (assigned_to, id) where assigned_to is not null` (a
--   worker's tasks; the reaper reads the held set's lease ends from the rows).
-- * The operators' lists by status: `tasks_listed (listed, id)`; assigned and running
--   tasks from the held set.
--
-- A task's claim (it leaves pending and gets a holder) and its end (it gets a final
-- status and `finished_at`, which retention walks) are new facts, written as new
-- versions with their index entries. Its start, its lease renewals and its checkpoints
-- change no indexed column: HOT. (Measured before this layout, and on the branch
-- `issue23-side-tables`: the runnable and held sets as narrow tables kept by a trigger
-- made every update HOT, but wrote as much WAL in the two tables as they saved and cost
-- more PostgreSQL time than the index entries they replaced.)
--
-- `tasks_flow (flow_id)` repeated the first column of `tasks_flow_id (flow_id, id)`.
--
-- Adding the generated column rewrites the table once, under its exclusive lock (a few
-- seconds per million tasks): run `artex migrate` when a short pause of every writer is
-- acceptable. Every task keeps its row.

-- Room on each page for a new version of every row on it: the runtime writes tasks in
-- batches, which update most rows of a page in one statement, and a version that does
-- not fit on its page is not HOT. (Dead versions are pruned at the page's next visit.)
alter table artex.tasks set (fillfactor = 50);

alter table artex.tasks add column listed artex.task_status generated always as (
    case when status not in ('assigned', 'running') then status end) stored;

comment on column artex.tasks.listed is
    'The status, except while assigned or running (NULL): what indexes name instead of status, so that a start, a lease renewal or a checkpoint stays a HOT update (migrations/V15__hot_task_rows.sql).';

drop index artex.tasks_runnable;
drop index artex.tasks_held;
drop index artex.tasks_assigned_to;
drop index artex.tasks_pending_by_host;
drop index artex.tasks_status_id;
drop index artex.tasks_flow;

-- What planners claim by, in claim order (ids are time-ordered: among equals the oldest).
create index tasks_runnable on artex.tasks (priority desc, run_at, id)
    where listed = 'pending';
-- Pending tasks bound to one host (an upload's file): few.
create index tasks_pending_on_host on artex.tasks (host)
    where listed = 'pending' and host is not null;
-- The held set: a worker's tasks (assigned or running: held is "has a holder", the
-- check `holder_only_while_held`).
create index tasks_holder on artex.tasks (assigned_to, id) where assigned_to is not null;
-- Operators' lists and counts by status, newest first.
create index tasks_listed on artex.tasks (listed, id) where listed is not null;

analyze artex.tasks;

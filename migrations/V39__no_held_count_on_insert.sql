-- V39: an insert into artex.tasks no longer runs a statement trigger that can find
-- nothing to do (issue 39). Expand: the same rules, one trigger fewer.
--
-- `tasks_held_after_insert` (V5) added the inserted tasks that were already assigned to
-- their workers' held counts. None can be: `tasks_before_insert` (V1) refuses a new task
-- that is assigned or leased. Yet the trigger ran at every insert statement, a PL/pgSQL
-- call and a query of the inserted rows: 35–40 µs of a one-row insert's 230–310 µs
-- (2,000 one-row inserts, three alternations, a throwaway cluster), which W2's insert
-- pays on its way to the planner.

drop trigger tasks_held_after_insert on artex.tasks;
drop function artex.tasks_held_after_insert();

-- V54: the round's probe for waiting limited tasks keeps its plan (issue 39). Expand.
--
-- V51 made `artex.limited_waiting` a SQL function run with sequential scans off, so
-- that it looks in the limited tasks' index whatever the table's statistics. A SQL
-- function with a setting of its own is neither inlined nor cached: its one statement
-- was planned again at every call. `tasks` has fourteen indexes to weigh, so that was
-- 0.15 ms of planning in a 0.22 ms probe, at every round of every planner (W2's
-- profile at 94e8de7: 675 calls, 675 plans, 102 ms of planning).
--
-- In PL/pgSQL the statement is planned once per session and the plan kept. It is
-- planned under the function's own setting, so the plan kept is the index's even when
-- the table looked empty then (tests/blackboard/plans.rs plans it on an empty table).

create or replace function artex.limited_waiting()
returns boolean
language plpgsql stable
set enable_seqscan = off
as $fn$
begin
    return exists (select 1 from artex.tasks t where t.listed = 'pending' and t.limited);
end
$fn$;

comment on function artex.limited_waiting() is
    'Whether any task of a limited kind waits: the round''s probe for its small statement (V34). Run with sequential scans off, so that it always looks in the limited tasks'' index, whatever the statistics (V51); PL/pgSQL, so that its plan is made once per session and kept (V54).';

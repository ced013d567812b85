-- V49: the limits' check at assignment no longer compares every task asked for with
-- every key that holds tasks (issue 39). Expand.
--
-- `over_limits` joins the tasks a round assigns to the held tasks counted per key (its
-- `held` CTE). PostgreSQL estimates a CTE at one row, so it planned that join as a
-- nested loop: each task asked for walked every key holding tasks. A round of 1,013
-- tasks of 1,000 keys with 987 tasks held compared 998,844 pairs and took 73–106 ms;
-- in the `limits` bench part (rounds of ~550) it took 7 ms of each round's 17.
--
-- The function now runs with nested loops off: each of its joins is a hash or merge
-- join over the CTEs, and the same round takes 5–7 ms. Its statements and their
-- answers are unchanged; the indexes it reads (the primary key, `tasks_held_limited`)
-- are scanned as before. tests/blackboard/plans.rs checks the plan at that size.

alter function artex.over_limits(uuid[]) set enable_nestloop = off;

comment on function artex.over_limits(uuid[]) is
    'Of the tasks a planner is about to assign, those that would exceed their kind''s limits, counted under the kinds'' row locks (migrations/V18__tags_and_limits.sql); run with nested loops off, so that no join of its CTEs compares every pair of rows (V49).';

-- V32: the hot functions' statements are planned once per session, not six times after
-- every invalidation (issue 39). Expand: the same functions, calls and results.
--
-- PostgreSQL plans a cached statement with its parameters' values for its first five
-- executions, then settles on a generic plan if that costs no more (V16). The hot path
-- meets that warm-up often: each pooled connection meets it once per function, and
-- every analyze of `tasks` (its autovacuum analyzes at 2% of the table) invalidates the
-- plans, which start the five custom plans again. A profile of W1 from idle
-- (pg_stat_statements with planning tracked) counted 116 plans in 217 executions of the
-- four functions' statements, ~140 ms of planning in a run of ~2 s of PostgreSQL time.
-- The plans these statements settle on do not depend on the values (ids, workers and
-- counts in arrays); `force_generic_plan` makes the first plan the one that is kept.
alter function artex.dispatch_round(float8, int8, int4, int4[], text[])
    set plan_cache_mode = force_generic_plan;
alter function artex.assign_round(text, uuid[], text[], float8, uuid[])
    set plan_cache_mode = force_generic_plan;
alter function artex.wake_round(text[], uuid[])
    set plan_cache_mode = force_generic_plan;
alter function artex.read_assigned(text, int8, int8, bool)
    set plan_cache_mode = force_generic_plan;
alter function artex.record_attempts(text, uuid[], int8[], text[], jsonb[], text[], bool[], float8[], float8[])
    set plan_cache_mode = force_generic_plan;

-- V31: what PostgreSQL evaluates for every row version of a task calls no SQL function
-- it cannot inline (issue 39). Expand: the same rules, the same results, the same calls.
--
-- A profile of the hot path (perf on the backend that runs the bench's plain-SQL cycle
-- of `assign_round` and `record_attempts`) showed two per-row costs with no purpose:
--
-- - The CHECK constraint `tasks_tags_valid` called `artex.tags_valid(tags)` on every
--   row version, tags or not. PostgreSQL cannot inline that function (its body has a
--   subquery), so each call started an executor: ~10% of the backend's CPU in that
--   cycle. The constraint now says `tags is null or …`: a task without tags never calls
--   it. Same rule: `tags_valid(null)` is true. Validating it reads `tasks` once under
--   the migration's lock (every row already satisfies it).
-- - `artex.attempt_status` was declared IMMUTABLE, but its text → enum cast is STABLE,
--   so PostgreSQL would not inline it into `record_attempts`: one SQL function call per
--   outcome. STABLE is what its body is, and lets it be inlined.
alter table artex.tasks
    drop constraint tasks_tags_valid,
    add constraint tasks_tags_valid check (tags is null or artex.tags_valid(tags)) not valid;
alter table artex.tasks validate constraint tasks_tags_valid;

alter function artex.attempt_status(text, boolean, integer, integer, text) stable;

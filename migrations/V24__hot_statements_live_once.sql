-- V24: the hot path's statements live once, as the bodies of their functions (issue 34).
-- Expand: comments only.
--
-- Since V16 each plan-cached function ran the text of a Rust constant, and a test
-- compared the two. The constants are gone: the function is the statement, artex sends
-- only the call, and tests EXPLAIN the statement from the function's own source
-- (`pg_proc.prosrc`). Read the statements in migrations/schema.sql.
comment on function artex.dispatch_round is
    'The planner round''s read: the roster and the claim. Called by planner/dispatch.rs (DISPATCH_CALL); the statement lives only here.';
comment on function artex.assign_round is
    'The planner round''s write: the assignments, each worker''s slots under its row lock, within the kinds'' limits. Called by planner/dispatch.rs (ASSIGN_CALL); the statement lives only here.';
comment on function artex.wake_round is
    'The chosen workers'' wake-ups with the tasks they carry. Called by planner/dispatch.rs (WAKE_CALL); the statement lives only here.';
comment on function artex.read_assigned is
    'A worker''s read of the tasks assigned to it and not started. Called by worker/attempts.rs (FETCH_CALL); the statement lives only here.';
comment on function artex.record_attempts is
    'A worker''s batch of starts and outcomes. Called by worker/attempts.rs (RECORD_CALL); the statement lives only here.';

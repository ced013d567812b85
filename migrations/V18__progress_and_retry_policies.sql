-- V18: a running task's progress (issue 24, feature 6). Expand: nullable columns older
-- builds never write nor read.
--
-- A handler calls `ctx.progress(fraction, message)` as often as it likes; its worker
-- keeps the latest value and writes the values of all its tasks in one statement at most
-- once a second (and a task's last value just before its outcome). The columns are in no
-- index and no status changes, so that write is a HOT update (V15) and writes no history
-- row (the history triggers record status changes and handovers only: V10). It NOTIFYs
-- `artex_progress` with each task's new value: `/events` passes them on as `progress`
-- events, which are not durable (the history is the feed; progress is only the latest
-- value, kept in the row).
--
-- The checks scan the table once when added (the new columns are NULL in every row: no
-- rewrite).

alter table artex.tasks
    add column progress real check (progress >= 0 and progress <= 1),
    add column progress_message text check (char_length(progress_message) <= 200),
    add column progress_at timestamptz;

comment on column artex.tasks.progress is
    'How far the running handler says it is, 0 to 1 (ctx.progress): the latest value its worker wrote, at most once a second. In no index, so its updates stay HOT (migrations/V18).';
comment on column artex.tasks.progress_message is
    'What the handler said with its latest progress, at most 200 characters.';
comment on column artex.tasks.progress_at is
    'When the latest progress was written.';

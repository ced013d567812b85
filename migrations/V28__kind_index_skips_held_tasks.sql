-- V28: the kind index holds the tasks that are not held (issue 39). Expand: the same
-- name and columns, as a partial index; builds that predate it list a kind as before
-- (their kind-only listing walks the primary key instead).
--
-- `(kind, id)` (V8) took an entry for every row version, so each assignment (never a HOT
-- update: the holder is indexed) added one to it: ~75 B of WAL per task of W1. It now
-- indexes the rows whose `listed` is set, every status but `assigned` and `running`.
-- A listing of a kind without a status reads its held tasks through the holder index
-- (`tasks_holder`: the held set is the size of the fleet's work in flight) and merges
-- them with the others by id: operator/tasks.rs, `TaskFilter::newest_first`.
--
-- Built inside the migration's transaction, so not `concurrently`: on a large live
-- table the build holds off writes to `artex.tasks` while it runs (see V8). To build it
-- beforehand, `create index concurrently tasks_kind_listed on artex.tasks (kind, id)
-- where listed is not null`: then this drops the old index and renames that one.
do $$
begin
    if to_regclass('artex.tasks_kind_listed') is null then
        create index tasks_kind_listed on artex.tasks (kind, id) where listed is not null;
    end if;
end
$$;
drop index if exists artex.tasks_kind_id;
alter index artex.tasks_kind_listed rename to tasks_kind_id;

comment on index artex.tasks_kind_id is
    'Tasks by kind, newest first, except the held ones (V28): a kind''s held tasks are found through tasks_holder.';

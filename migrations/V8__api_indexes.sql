-- The HTTP API's reads (`artex serve`, src/http/api/): every listing walks an index,
-- whatever the table holds. Expand: indexes and a nullable column only; builds that
-- predate it run on unchanged.
--
-- Listings are keyset-paginated newest first by id (`where … and id < $after order by id
-- desc limit N`): ids artex creates are time-ordered (UUIDv7). Without a filter the
-- primary key serves; by status, kind or flow the indexes below; by worker the partial
-- index `tasks_held` (a worker holds only assigned and running tasks).
--
-- The cost: `tasks_status_id` and `tasks_kind_id` take an entry for every row version of
-- a task (a status change is never HOT), two more per transition on the hot path;
-- `tasks_flow_id` only for flow tasks; `tasks_finished` one per finished task.
--
-- Built inside the migration's transaction (the runner's), so not `concurrently`: on a
-- large live table each build holds off writes to `artex.tasks` while it runs. Apply it
-- at a quiet moment, or create the indexes by hand with `create index concurrently`
-- under these names first (then `if not exists` makes this a no-op).
create index if not exists tasks_status_id on artex.tasks (status, id);
create index if not exists tasks_kind_id on artex.tasks (kind, id);
create index if not exists tasks_flow_id on artex.tasks (flow_id, id) where flow_id is not null;

-- `/api/v1/stats` reads the most recent finished tasks (throughput, latency): a bounded
-- walk down this index. `finished_at` is set once, when a task ends.
create index if not exists tasks_finished on artex.tasks (finished_at)
    where finished_at is not null;

-- `/api/v1/workers` shows which binary each worker runs: written by the worker once it
-- has hashed its executable (after registering; NULL until then, and for workers of
-- older builds).
alter table artex.workers
    add column if not exists binary_sha256 text
        check (binary_sha256 ~ '^[0-9a-f]{64}$');

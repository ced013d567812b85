-- V9: uploads (issue 15). Expand: a new table and a nullable column; builds that predate
-- it run on unchanged (they never write `tasks.host`, and a NULL host binds nothing).
--
-- A file uploaded to a worker in chunks becomes one row here, written in the same
-- transaction as the task that names it, once the whole file is on the worker's disk
-- and its sha256 checked. `path` is where it lies on `host`; with storage shared by the
-- fleet (`--upload-shared`) the task carries no host and any worker can run it.

create table artex.uploads (
    id          uuid primary key,
    host        text not null check (host <> ''),
    path        text not null check (path <> ''),
    size        bigint not null check (size >= 0),
    sha256      text not null check (sha256 ~ '^[0-9a-f]{64}$'),
    chunks      integer not null check (chunks >= 0),
    name        text check (length(name) <= 255),
    shared      boolean not null default false,
    -- `complete`: the file is whole on disk; `deleted`: its task ended and the worker
    -- removed it.
    state       text not null default 'complete' check (state in ('complete', 'deleted')),
    task_id     uuid not null,
    created_at  timestamptz not null default now(),
    completed_at timestamptz not null default now(),
    deleted_at  timestamptz
);
create index uploads_live_by_host on artex.uploads (host) where state = 'complete';

-- Host affinity: only workers on this host are given the task (NULL: any worker).
alter table artex.tasks add column host text check (host <> '');

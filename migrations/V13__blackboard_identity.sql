-- V13: the blackboard's identity (issue 25). Expand: one new table, which builds that
-- predate it never read.
--
-- Two deployments on one host (a test run and a real one, two teams' blackboards) used
-- to share the default upload folder, `$TMPDIR/artex-uploads-<uid>`: a worker of one
-- found the other's uploads there, recorded them into its own database, ran their tasks
-- and swept their files. A path or a port names no blackboard (both move, both repeat
-- across hosts); this id does. Workers key their default upload folder by it and stamp
-- it into every upload's `meta.json`, and touch no upload that names another.
--
-- One row, made here: every migrated database has exactly one id. `made_in` is the oid
-- of the database the id was made in: a database copied from another (`create database
-- … template`, a dump restored next to its source) carries its source's id, and the
-- first worker to start on the copy sees `made_in` differ from its own database and
-- gives the copy an id of its own (`WorkerBoard::blackboard_id`).

create table artex.blackboard (
    only_row boolean primary key default true check (only_row),
    id uuid not null default gen_random_uuid(),
    made_in oid not null,
    created_at timestamptz not null default now()
);

comment on table artex.blackboard is
    'This blackboard''s identity (one row): upload folders and uploads are keyed by it.';
comment on column artex.blackboard.made_in is
    'The oid of the database the id was made in; differs in a copy, which then gets its own id.';

insert into artex.blackboard (made_in)
select oid from pg_database where datname = current_database();

-- Issue 39's prototype, in a database `artex migrate` made (V45) and used for nothing
-- else: two registered workers that run `noop`, and `artex.done`, the archive a
-- finished task would move to (every column of artex.tasks, the assignment's time and
-- worker, and the feed's order: a history id and the writing transaction).
-- Drops tasks_before_delete, which refuses deleting a held task: a prototype only.
insert into artex.workers (id, host, pid, version, channel, kinds, capacity, last_seen)
select 'w' || n, 'bench', 1, 'bench', 'bench_w' || n, '{noop}', 2000000000,
       now() + interval '10 days'
from generate_series(0, 1) n;
create table artex.done (like artex.tasks excluding constraints excluding indexes excluding generated);
alter table artex.done drop column listed;
alter table artex.done
    add column assigned_at timestamptz,
    add column worker text,
    add column hid bigint not null default nextval('artex.history_id_seq'),
    add column xid xid8 not null default pg_current_xact_id();
create index done_id on artex.done (id);
create index done_feed on artex.done (xid, hid);
drop trigger tasks_before_delete on artex.tasks;

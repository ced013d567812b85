-- V10: one history (issue 13). A contraction (compatible_from 10): it drops the outbox
-- `artex.task_events` that builds up to V9 read (the feed) and prune (their Reapers), and
-- it replaces `artex.task_transitions` by a partitioned table of the same name and
-- columns.
--
-- Until V9 a finished single-attempt task wrote 4 audit rows (`task_transitions`) and 3
-- outbox rows (`task_events`): the same facts twice. From here one append-only table is
-- both the audit trail and the change feed:
--
--   * Each row is one transition a task really went through: who (actor), why (reason),
--     on which worker, under which fencing token, when; plus what the feed shows (the
--     task's flow and kind) and its feed position `(xid, id)` (see V2: readers deliver
--     only rows whose transaction is older than every transaction in flight, in (xid, id)
--     order, so the delivered prefix is final).
--   * An assignment followed by a start writes no row of its own: the start row names the
--     worker, the epoch, and when the task was assigned (`assigned_at`). An assignment
--     that ends without a start (reclaimed, handed back, canceled, failed, handed over
--     to another worker) gets its row when it ends, dated when it was made, before the
--     row that ends it. So a finished
--     single-attempt task writes 3 rows: created, started, outcome.
--   * The feed shows what the outbox showed: real status changes, not assignments and
--     not handovers (those are audit-only rows). Rows that cannot have been in the feed
--     (history from before V10 whose outbox row was pruned or never existed) sit at
--     `xid = 1`, below every feed position, and readers skip them.
--   * Partitioned by range on `at`, one partition per slice of time (a day at the default
--     retention), created ahead by the planner's Maintenance actor and dropped whole once
--     past the retention (`artex.event_retention.keep`, `--history-retention`): history
--     leaves without a DELETE, and an append-only partition gives vacuum nothing to do
--     (insert-triggered vacuums are off for it). A default partition catches rows when no
--     partition was made in time (no planner running for a while); the Maintenance
--     actor moves them out when it makes the partition they belong to.
--
-- Existing positions stay valid: every outbox row still there (read by its consumers or
-- not) becomes the history row it duplicated and keeps its position `(xid, id)` exactly,
-- so durable cursors, `Last-Event-ID`s and `--after` positions resume where they were.
-- An outbox row without its audit row becomes a history row of its own. Audit rows keep
-- their data; those without an outbox row get `xid = 1`. New rows draw ids above every
-- id of both old tables, in transactions newer than all of them. Within history from
-- before V10 the ids of the two old tables mix: order a task's trail by `at, id`.
--
-- Why a contraction in one step (not expand, deploy, contract): the outbox and the new
-- history cannot both be written by the same triggers without writing everything twice,
-- which is what this removes. Run `artex migrate` with this build, then roll the fleet:
-- older planners' sweeps fail at their pruning step and older feed readers fail until
-- they are replaced; older workers' writes go on (the triggers are in the database).

create sequence artex.history_id_seq as bigint;

create table artex.task_history (
    id           bigint not null default nextval('artex.history_id_seq'),
    task_id      uuid not null,
    from_status  artex.task_status,           -- NULL for the row that created the task
    to_status    artex.task_status not null,
    reason       text,
    actor        text not null,
    worker       text,
    lease_epoch  bigint not null,
    at           timestamptz not null default now(),
    -- The feed position is (xid, id): the writing transaction, then the row's id.
    xid          xid8 not null default pg_current_xact_id(),
    flow_id      uuid,
    kind         text,
    -- Start rows only: when the assignment it started was made (the assignment's own row
    -- is not written when a start follows).
    assigned_at  timestamptz
) partition by range (at);

comment on table artex.task_history is
    'Renamed artex.task_transitions below: the audit trail and the change feed, one row per transition.';

-- Every partition (the default one aside), so the Maintenance actor knows what it made
-- without parsing partition bounds.
create table artex.history_partitions (
    name        text primary key,
    lo          timestamptz not null,
    hi          timestamptz not null unique check (hi > lo),
    created_at  timestamptz not null default now()
);

create table artex.task_history_default partition of artex.task_history default
    with (autovacuum_vacuum_insert_threshold = -1);

-- History from before V10 in one partition ending now: it leaves whole once the
-- retention has passed since the upgrade (or later, for a live consumer that needs it).
create function artex.v10_legacy_partition() returns void language plpgsql as $$
begin
    execute format('create table artex.task_transitions_before_v10 partition of artex.task_history
        for values from (%L) to (%L) with (autovacuum_vacuum_insert_threshold = -1)',
        '-infinity', now());
    insert into artex.history_partitions (name, lo, hi)
    values ('task_transitions_before_v10', '-infinity', now());
end
$$;
select artex.v10_legacy_partition();
drop function artex.v10_legacy_partition();

-- The feed reads by position; the audit trail by task.
create index task_history_feed on artex.task_history (xid, id);
create index task_history_task on artex.task_history (task_id);

-- Move the history. Audit rows and outbox rows that carry the same fact pair up: both
-- were written by one statement of one transaction (same task, same change, same `at`);
-- row_number pairs repeated facts in order.
with audit as (
    select t.*, row_number() over (partition by task_id, from_status, to_status, at
                                   order by id) as rn
    from artex.task_transitions t
    where from_status is distinct from to_status and to_status <> 'assigned'
),
outbox as (
    select e.*, row_number() over (partition by task_id, from_status, to_status, at
                                   order by xid, id) as rn
    from artex.task_events e
),
paired as (
    select a.id as audit_id, o.id as event_id, o.xid as event_xid,
           coalesce(a.task_id, o.task_id) as task_id,
           coalesce(a.from_status, o.from_status) as from_status,
           coalesce(a.to_status, o.to_status) as to_status,
           case when a.id is not null then a.reason else o.reason end as reason,
           coalesce(a.actor, 'unknown (before V10)') as actor, a.worker,
           coalesce(a.lease_epoch, 0) as lease_epoch, coalesce(a.at, o.at) as at,
           o.flow_id, o.kind
    from audit a
    full join outbox o
      on o.task_id = a.task_id and o.from_status is not distinct from a.from_status
     and o.to_status = a.to_status and o.at = a.at and o.rn = a.rn
)
insert into artex.task_history
    (id, task_id, from_status, to_status, reason, actor, worker, lease_epoch, at, xid,
     flow_id, kind)
select coalesce(p.event_id, p.audit_id), p.task_id, p.from_status, p.to_status, p.reason,
       p.actor, p.worker, p.lease_epoch, p.at, coalesce(p.event_xid, '1'),
       coalesce(p.flow_id, t.flow_id), coalesce(p.kind, t.kind)
from paired p left join artex.tasks t on t.id = p.task_id;

-- Assignments and handovers: audit only.
insert into artex.task_history
    (id, task_id, from_status, to_status, reason, actor, worker, lease_epoch, at, xid,
     flow_id, kind)
select a.id, a.task_id, a.from_status, a.to_status, a.reason, a.actor, a.worker,
       a.lease_epoch, a.at, '1', t.flow_id, t.kind
from artex.task_transitions a left join artex.tasks t on t.id = a.task_id
where a.from_status is not distinct from a.to_status or a.to_status = 'assigned';

select setval('artex.history_id_seq',
              greatest((select max(id) from artex.task_transitions),
                       (select max(id) from artex.task_events), 0) + 1, false);

drop trigger task_events_after_insert on artex.task_events;
drop function artex.task_events_after_insert();
drop table artex.task_events;
drop table artex.task_transitions;
alter table artex.task_history rename to task_transitions;
alter index artex.task_history_feed rename to task_transitions_feed;
alter index artex.task_history_task rename to task_transitions_task;
alter table artex.task_history_default rename to task_transitions_default;
alter sequence artex.history_id_seq owned by artex.task_transitions.id;
comment on table artex.task_transitions is
    'The audit trail and the change feed: one row per transition a task went through (V10).';

-- History is kept two weeks by default (the outbox kept a week); a value someone set
-- stays.
alter table artex.event_retention alter column keep set default interval '14 days';
update artex.event_retention set keep = interval '14 days' where keep = interval '7 days';

-- A partition's time slice: an eighth of the retention, between a minute and a day (a
-- day at the default: 14 to 15 partitions kept; a short retention still drops history
-- in small steps).
create function artex.history_partition_width(keep interval) returns interval
language sql immutable as $$
    select least(interval '1 day',
                 greatest(interval '1 minute',
                          make_interval(secs => floor(extract(epoch from keep) / 8))))
$$;

-- Makes the partitions from the newest one (or from `p_now`, after a long gap) up to
-- `p_now + p_ahead` (NULL: three slices ahead), contiguous. Rows the default partition caught in a new partition's
-- range are moved into it first (they are there only when partitions were missing).
-- One maintainer at a time (an advisory lock); returns the partitions made.
create function artex.make_history_partitions(p_now timestamptz, p_ahead interval)
returns setof text language plpgsql set lock_timeout = '5s' as $$
declare
    width interval := artex.history_partition_width((select keep from artex.event_retention));
    lo    timestamptz;
    hi    timestamptz;
    part  text;
    made  integer := 0;
    ahead record;
    busy  boolean;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    -- After the retention was shortened: the empty partitions ahead that are wider than a
    -- slice is now are made again at the new width (the newest first, so what stays is
    -- contiguous), and shorter history leaves in smaller steps from then on.
    for ahead in select p.name, p.lo, p.hi from artex.history_partitions p
                 where p.lo > p_now order by p.lo desc loop
        exit when ahead.hi - ahead.lo <= width;
        execute format('select exists (select 1 from artex.%I)', ahead.name) into busy;
        exit when busy;
        execute format('drop table artex.%I', ahead.name);
        delete from artex.history_partitions p where p.name = ahead.name;
    end loop;
    select max(p.hi) into lo from artex.history_partitions p;
    if lo is null or lo < p_now - width then
        lo := date_bin(width, p_now, timestamptz '2000-01-01 00:00:00+00');
    end if;
    while lo < p_now + coalesce(p_ahead, width * 3) and made < 100 loop
        -- Slices end on multiples of the width (the first one may be shorter).
        hi := date_bin(width, lo, timestamptz '2000-01-01 00:00:00+00') + width;
        part := 'task_transitions_' || to_char(lo at time zone 'UTC', 'YYYYMMDD"_"HH24MISS');
        if exists (select 1 from artex.task_transitions_default d
                   where d.at >= lo and d.at < hi) then
            execute format('create table artex.%I (like artex.task_transitions)
                            with (autovacuum_vacuum_insert_threshold = -1)', part);
            execute format('with moved as (delete from artex.task_transitions_default d
                                            where d.at >= $1 and d.at < $2 returning d.*)
                            insert into artex.%I select * from moved', part) using lo, hi;
            execute format('alter table artex.task_transitions attach partition artex.%I
                            for values from (%L) to (%L)', part, lo, hi);
        else
            execute format('create table artex.%I partition of artex.task_transitions
                            for values from (%L) to (%L)
                            with (autovacuum_vacuum_insert_threshold = -1)', part, lo, hi);
        end if;
        insert into artex.history_partitions (name, lo, hi) values (part, lo, hi);
        made := made + 1;
        return next part;
        lo := hi;
    end loop;
end
$$;

-- Drops, oldest first, the partitions whose slice ended more than the retention before
-- `p_now`. A live consumer (heard from within the retention) that has not read all of
-- a partition's feed rows holds it back, and everything newer, for up to one more
-- retention; after that retention wins and the consumer is told it missed events (410).
-- Each drop raises `pruned_*` to the partition's last position: a reader below it
-- missed events and is told so instead of skipping them silently. Returns the
-- partitions dropped.
create function artex.drop_history_partitions(p_now timestamptz)
returns setof text language plpgsql set lock_timeout = '5s' as $$
declare
    keep    interval := (select r.keep from artex.event_retention r);
    cutoff  timestamptz := p_now - keep;
    slow_x  xid8;
    slow_i  bigint;
    part    record;
    needed  boolean;
    last_x  xid8;
    last_i  bigint;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    select c.last_xid, c.last_event into slow_x, slow_i
    from artex.event_cursors c where c.updated_at >= cutoff
    order by c.last_xid, c.last_event limit 1;
    for part in select p.name, p.hi from artex.history_partitions p
                where p.hi <= cutoff order by p.hi loop
        if slow_x is not null and part.hi > cutoff - keep then
            execute format('select exists (select 1 from artex.%I e
                                           where (e.xid, e.id) > ($1, $2) and e.xid > ''1''
                                             and e.to_status <> ''assigned''
                                             and e.from_status is distinct from e.to_status)',
                           part.name)
                into needed using slow_x, slow_i;
            exit when needed;
        end if;
        last_x := null;
        execute format('select e.xid, e.id from artex.%I e where e.xid > ''1''
                        order by e.xid desc, e.id desc limit 1', part.name)
            into last_x, last_i;
        execute format('drop table if exists artex.%I', part.name);
        delete from artex.history_partitions p where p.name = part.name;
        update artex.event_retention r
        set pruned_xid = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                              then last_x else r.pruned_xid end,
            pruned_id = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                             then last_i else r.pruned_id end,
            pruned_at = now();
        return next part.name;
    end loop;
end
$$;

-- The triggers, writing the one history.
create or replace function artex.tasks_after_insert() returns trigger language plpgsql as $$
begin
    insert into artex.task_transitions
        (task_id, from_status, to_status, reason, actor, lease_epoch, flow_id, kind)
    select n.id, null, n.status, coalesce(artex.current_reason(), 'submitted'),
           artex.current_actor(), 0, n.flow_id, n.kind
    from new_rows n;
    if not artex.wakeups_deferred() then
        perform pg_notify('artex_events', '');
    end if;
    if exists (select 1 from new_rows where status = 'pending') then
        perform pg_notify('artex_tasks', '');
    end if;
    return null;
end
$$;

-- V3's function writing one row per transition a task went through (see the header):
-- none for an assignment, two for an assignment that ends unstarted (the assignment,
-- dated when it was made — `updated_at` of the assigned row, which only renewals
-- move — then its end), two for a task that ran in one write (its start at `started_at`,
-- then its outcome).
create or replace function artex.tasks_after_update() returns trigger language plpgsql
set enable_nestloop = off set jit = off as $$
declare
    wake   boolean;
    events boolean;
begin
    with pairs as materialized (
        select n.id, n.flow_id, n.kind, n.error, n.lease_epoch, n.started_at,
               o.status as old_status, n.status as new_status, o.lease_epoch as old_epoch,
               o.updated_at as old_at, o.assigned_to as old_worker,
               coalesce(n.assigned_to, o.assigned_to) as worker,
               o.status = 'assigned' and n.status not in ('assigned', 'running', 'canceled')
                   and n.started_at is distinct from o.started_at as ran
        from new_rows n join old_rows o using (id)
        where (n.status <> o.status and n.status <> 'assigned')
           -- A handover (hot upgrade) moves a held task to another worker without a
           -- status change; it is recorded all the same (not in the feed).
           or (n.status = o.status and n.assigned_to is distinct from o.assigned_to
               and n.assigned_to is not null)
    ),
    changed as materialized (
        -- An assignment that ends without a start (given back, reclaimed, canceled,
        -- ended, or handed over to another worker before it started).
        select p.id, p.flow_id, p.kind, 0 as step, 'pending'::artex.task_status as from_status,
               'assigned'::artex.task_status as to_status, p.old_worker as worker,
               p.old_epoch as lease_epoch, 'assigned'::text as reason, p.old_at as at,
               null::timestamptz as assigned_at
        from pairs p
        where p.old_status = 'assigned' and p.new_status <> 'running' and not p.ran
        union all
        select p.id, p.flow_id, p.kind, 1, p.old_status,
               case when p.ran then 'running'::artex.task_status else p.new_status end,
               p.worker, p.lease_epoch,
               case when p.old_status = p.new_status
                    then coalesce(artex.current_reason(), 'handed over')
                    when p.ran then 'started'
                    when p.old_status = 'assigned' and p.new_status = 'running'
                    then coalesce(artex.current_reason(), 'started')
                    else coalesce(artex.current_reason(),
                                  case when p.new_status in ('failed', 'pending')
                                        and p.old_status = 'running' then p.error end)
               end,
               case when p.ran then p.started_at else now() end,
               case when p.old_status = 'assigned'
                         and (p.ran or p.new_status = 'running') then p.old_at end
        from pairs p
        union all
        select p.id, p.flow_id, p.kind, 2, 'running', p.new_status, p.worker, p.lease_epoch,
               coalesce(artex.current_reason(),
                        case when p.new_status in ('failed', 'pending') then p.error end),
               now(), null
        from pairs p
        where p.ran
    ),
    history as (
        insert into artex.task_transitions
            (task_id, from_status, to_status, reason, actor, worker, lease_epoch, at,
             flow_id, kind, assigned_at)
        select id, from_status, to_status, reason, artex.current_actor(), worker,
               lease_epoch, at, flow_id, kind, assigned_at
        from changed order by id, step
    )
    -- Wake the planners, once per statement: new runnable work, or freed capacity (a
    -- task left a worker), both mean another assignment round may place more.
    select exists (select 1 from changed
                   where from_status <> to_status and to_status <> 'assigned'
                     and (to_status = 'pending'
                          or (from_status in ('assigned', 'running')
                              and to_status not in ('assigned', 'running')))),
           exists (select 1 from changed
                   where from_status <> to_status and to_status <> 'assigned')
    into wake, events;
    if not artex.wakeups_deferred() then
        if wake then
            perform pg_notify('artex_tasks', '');
        end if;
        -- Feed readers: a hint only, they poll as a safety net.
        if events then
            perform pg_notify('artex_events', '');
        end if;
    end if;
    return null;
end
$$;

-- Finished tasks past the retention leave too (and flows left empty), at most `p_batch`
-- per call, oldest first along `tasks_finished`. A task of a flow that still has an
-- unfinished task stays: the flow may need it (its outcome, its downstream edges).
create function artex.prune_finished_tasks(p_now timestamptz, p_batch integer)
returns bigint language plpgsql as $$
declare
    cutoff timestamptz := p_now - (select r.keep from artex.event_retention r);
    n      bigint;
begin
    with doomed as (
        select t.id from artex.tasks t
        where t.finished_at < cutoff
          and (t.flow_id is null
               or not exists (select 1 from artex.tasks u
                              where u.flow_id = t.flow_id and u.finished_at is null))
        order by t.finished_at
        limit p_batch
    )
    delete from artex.tasks t using doomed where t.id = doomed.id;
    get diagnostics n = row_count;
    delete from artex.flows f
    where f.created_at < cutoff
      and not exists (select 1 from artex.tasks t where t.flow_id = f.id);
    return n;
end
$$;

-- The partitions of the next two days, so that history has somewhere to go before the
-- first planner starts (its Maintenance actor keeps them ahead from then on).
select count(*) from artex.make_history_partitions(now(), interval '2 days');

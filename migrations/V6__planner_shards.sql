-- Planner shards with owners (issue 12). `--shard I/N` is fixed: when the planner of
-- shard I dies, shard I waits for a person. With `--shards auto` each of N planner
-- shards is owned through a lease kept here, the live planners spread the shards among
-- themselves, and a dead planner's shards move to the others once its leases lapse.
-- Tasks keep their `shard` (0..1023, from `shard_key`): planner shard s serves the tasks
-- with `shard % N = s`, so one business key still lands on one planner.

-- One row per planner shard; the row count is the shard count N, agreed by every auto
-- planner (one started with another N is refused while others are live).
create table artex.planner_shards (
    shard       integer primary key check (shard >= 0 and shard < 1024),
    -- The planner that serves the shard; NULL when nobody does.
    owner       text check (owner <> '' and length(owner) < 256),
    -- The owner serves the shard until then; past it anyone may take the shard.
    lease_until timestamptz,
    -- Bumped by every take: renewals and hand-backs name the epoch they hold, so a
    -- planner that lost the shard (and maybe took it back since) changes nothing stale.
    epoch       bigint not null default 0,
    check ((owner is null) = (lease_until is null))
);

comment on table artex.planner_shards is
    'Planner shards of --shards auto: owner, lease and fencing epoch of each; N = row count.';

-- The planners that keep shards, and until when each counts as live: the live ones
-- share the shards evenly, so a planner owning nothing (one just started or back from a
-- partition) is still counted and gets its share handed back.
create table artex.planners (
    id          text primary key check (id <> '' and length(id) < 256),
    shard_count integer not null check (shard_count between 1 and 1024),
    last_seen   timestamptz not null,
    live_until  timestamptz not null
);

comment on table artex.planners is
    'Planners with --shards auto and their liveness; rows gone for an hour are pruned.';

-- Who serves what, for people: `select * from artex.planner_shard_owners`.
create view artex.planner_shard_owners as
    select s.owner, count(*) as shards, array_agg(s.shard order by s.shard) as shard_list,
           min(s.lease_until) as first_lease_end
    from artex.planner_shards s
    group by s.owner
    order by s.owner nulls last;

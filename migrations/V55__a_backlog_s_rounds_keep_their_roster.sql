-- V55: the rounds right behind a cut round claim without reading the roster again
-- (issue 39, W6). Expand.
--
-- `artex.dispatch_round` reads every online worker at every round: 2,000 workers cost
-- the round's read ~2 ms more than 10 (the scan and join, the kinds unnested, 2,000
-- rows sent), and ~3.5 ms in W6's own rounds, of ~40 ms. In a backlog's drain the
-- rounds follow each other within milliseconds, and what changed in the roster
-- between them is mostly the planner's own assignments. A round cut at its batch now
-- keeps its roster (planner/dispatch.rs, `KeptRoster`): the rounds within 250 ms after
-- it claim by this function, with the kinds and the free slots the planner counts from
-- the roster it keeps, and read the roster again after that, or when this function
-- finds no task.
--
-- Only the claim of the round's fast path (V34) is here: when a kind is limited or a
-- task of a limited kind waits, it returns one row of nulls instead, and the planner
-- reads the whole round (`dispatch_round`) in the same transaction. The round's write
-- (`assign_and_wake`) checks each chosen worker's state and free slots under its row
-- lock as before, so a roster kept a moment too long gives a worker gone since then
-- nothing, and a fuller worker no more than it has room for.

create function artex.claim_head(p_kinds text[], p_n bigint, p_shard_count int4,
                                 p_shards int4[])
returns table (task uuid, task_kind text, task_host text)
language plpgsql
set plan_cache_mode = force_generic_plan
as $fn$
#variable_conflict use_column
begin
    if exists (select 1 from artex.kind_limits) or artex.limited_waiting() then
        return query select null::uuid, null::text, null::text;
        return;
    end if;
    return query
    select h.id, h.kind, h.host from artex.runnable_head(
        array(select unnest($1::text[]) except select p.kind from artex.kind_pauses p),
        null, $3::int4, $4::int4[], $2::int8)
        with ordinality as h(id, kind, host, priority, run_at, nth)
    order by h.nth;
end
$fn$;

comment on function artex.claim_head(text[], bigint, int4, int4[]) is
    'A planner round''s claim by a roster it kept (V55): the head of the queue, at most p_n tasks of p_kinds but the paused ones, in the shards given, locked for update (skip locked), in claim order; one row of nulls instead when a kind is limited or a task of a limited kind waits (the planner then reads the whole round by dispatch_round). Called by planner/dispatch.rs (CLAIM_KEPT_CALL); the statement lives only here.';

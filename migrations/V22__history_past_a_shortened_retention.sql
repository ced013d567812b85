-- V22: a shortened retention prunes within about one retention (found by the hour-long
-- soak of issue 25). Expand: one new function, which only this build's Maintenance calls.
--
-- History leaves by whole partitions (V10), each a slice of an eighth of the retention
-- made three slices ahead. When the retention is shortened, the empty partitions ahead
-- are made again at the new width, but the partition that holds now keeps the width it
-- was made with: a day at the default retention. It is dropped only once its slice has
-- ended and the new retention has passed, so `--history-retention 10m` on a fresh
-- blackboard kept every row for up to a day (the soak's hour: nothing pruned, history
-- growing linearly).
--
-- In a partition wider than a slice now is, whose slice has not yet passed the retention,
-- rows past the retention are deleted by row, in bounded batches, oldest first; the
-- partition itself still goes whole once its slice has passed the retention (and one a
-- live consumer holds back past that stays whole, as V10 keeps it). That is a one-off catch-up after a retention change, at most
-- one old slice's worth: partitions made at the current width are never touched by row
-- (deleting the oldest slice row by row every run is what the partitions avoid).
--
-- History from before V10 (`task_transitions_before_v10`, from -infinity) is not such a
-- partition: it leaves whole once the retention has passed since that upgrade, as V10
-- says.
--
-- A live consumer holds rows back as it holds partitions back (V10): rows past the
-- retention it has not read stay for up to one more retention. Each batch raises
-- `pruned_*` to the last position deleted, so a reader below it is told it missed events.
create function artex.prune_history_rows(p_now timestamptz, p_batch integer)
returns bigint language plpgsql set lock_timeout = '5s' as $$
declare
    keep    interval := (select r.keep from artex.event_retention r);
    cutoff  timestamptz := p_now - keep;
    width   interval := artex.history_partition_width(keep);
    slow_x  xid8;
    slow_i  bigint;
    part    record;
    n       bigint;
    total   bigint := 0;
    last_x  xid8;
    last_i  bigint;
begin
    perform pg_advisory_xact_lock(hashtext('artex.history_partitions'));
    select c.last_xid, c.last_event into slow_x, slow_i
    from artex.event_cursors c where c.updated_at >= cutoff
    order by c.last_xid, c.last_event limit 1;
    for part in select p.name from artex.history_partitions p
                where isfinite(p.lo) and p.lo < cutoff and p.hi > cutoff
                  and p.hi - p.lo > width
                order by p.lo loop
        exit when total >= p_batch;
        execute format('with doomed as (
                            select e.ctid from artex.%I e
                            where e.at < $1
                              and ($3::xid8 is null or e.at < $1 - $5
                                   or (e.xid, e.id) <= ($3, $4))
                            order by e.at limit $2),
                        gone as (
                            delete from artex.%I e using doomed where e.ctid = doomed.ctid
                            returning e.xid, e.id),
                        top as (
                            select g.xid, g.id from gone g where g.xid > ''1''
                            order by g.xid desc, g.id desc limit 1)
                        select (select count(*) from gone), top.xid, top.id
                        from (select 1) one left join top on true',
                       part.name, part.name)
            into n, last_x, last_i
            using cutoff, p_batch - total, slow_x, slow_i, keep;
        total := total + n;
        if last_x is not null then
            update artex.event_retention r
            set pruned_xid = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                                  then last_x else r.pruned_xid end,
                pruned_id = case when (last_x, last_i) > (r.pruned_xid, r.pruned_id)
                                 then last_i else r.pruned_id end,
                pruned_at = now();
        end if;
    end loop;
    return total;
end
$$;

comment on function artex.prune_history_rows(timestamptz, integer) is
    'Deletes up to p_batch history rows past the retention from partitions wider than a '
    'slice is now (made before the retention was shortened); returns how many (V22).';

-- The worker's claim as in claim.sql, and the end as a finished task leaving
-- artex.tasks: one statement deletes the rows (fenced by worker and token) and writes
-- each as one row of artex.done (its record: every column, assigned, started and
-- finished at, by whom), with the holder's released count.
insert into artex.tasks (kind, payload) select 'noop', '{}' from generate_series(1, 500);
begin;
select set_config('artex.hot', 'on', true), artex.set_context('w' || :client_id, 'assigned');
with c as (
    select id from artex.tasks
    where listed = 'pending' and not limited and run_at <= now() and kind = any('{noop}')
    order by priority desc, run_at, id limit 500 for update skip locked
),
a as (
    update artex.tasks t
    set status = 'assigned', assigned_to = 'w' || :client_id,
        lease_until = now() + interval '30 s', lease_epoch = t.lease_epoch + 1, updated_at = now()
    from c where t.id = c.id
    returning t.id, t.kind, t.payload, t.lease_epoch, t.retries, t.max_retries, t.timeout_ms,
              t.checkpoint, t.flow_id
),
u as (update artex.workers w set taken = w.taken + (select count(*) from a)
      where w.id = 'w' || :client_id)
select quote_literal(array_agg(id)::text) as hids, quote_literal(array_agg(lease_epoch)::text) as eps
from a \gset
commit;
begin;
select set_config('artex.hot', 'on', true);
with v as (select * from unnest(:hids::uuid[], :eps::int8[]) as v(id, epoch)),
d as (
    delete from artex.tasks t using v
    where t.id = v.id and t.lease_epoch = v.epoch and t.assigned_to = 'w' || :client_id
    returning t.*
),
archived as (
    insert into artex.done (id, kind, status, payload, result, error, lease_epoch, retries,
        max_retries, priority, run_at, timeout_ms, shard_key, shard, flow_id, flow_task,
        checkpoint, created_at, updated_at, started_at, finished_at, payload_bytes, host,
        unique_key, tags, limit_key, limited, progress, progress_message, progress_at,
        traceparent, assigned_at, worker)
    select d.id, d.kind, 'succeeded', d.payload, null, null, d.lease_epoch, d.retries,
        d.max_retries, d.priority, d.run_at, d.timeout_ms, d.shard_key, d.shard, d.flow_id,
        d.flow_task, d.checkpoint, d.created_at, now(), now() - interval '1 ms', now(),
        d.payload_bytes, d.host, d.unique_key, d.tags, d.limit_key, d.limited, d.progress,
        d.progress_message, d.progress_at, d.traceparent, d.updated_at, d.assigned_to
    from d
),
released as (
    insert into artex.worker_released as r (worker, released)
    select 'w' || :client_id, count(*) from d having count(*) > 0
    on conflict (worker) do update set released = r.released + excluded.released
)
select count(*) from d;
commit;

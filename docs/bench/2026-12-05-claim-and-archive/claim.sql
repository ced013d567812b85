-- The worker claims in one write (no planner read, no hand-off): 500 tasks inserted;
-- one statement locks up to 500 runnable tasks, assigns them to the worker with the
-- next fencing token and counts them in its holdings; their outcomes by record_attempts.
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
select count(*) from artex.record_attempts('w' || :client_id, :hids::uuid[], :eps::int8[],
    array_fill('succeeded'::text, array[500]), array_fill(null::jsonb, array[500]),
    array_fill(null::text, array[500]), array_fill(false, array[500]),
    array_fill(0::float8, array[500]), array_fill(1::float8, array[500]));

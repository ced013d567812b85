-- Today's path (V45), as the bench's `cycle` part runs it plus the planner's read:
-- 500 tasks inserted; a round (dispatch_round, assign_and_wake, commit); the worker's
-- read of what it holds; their outcomes by record_attempts. pgbench; worker w<client>.
insert into artex.tasks (kind, payload) select 'noop', '{}' from generate_series(1, 500);
begin;
select quote_literal(array_agg(task)::text) as ids,
       quote_literal(array_agg(('w' || :client_id)::text)::text) as ws
from artex.dispatch_round(30, 500, 1, '{}', '{}', true) where task is not null \gset
select count(*) from artex.assign_and_wake('p', :ids::uuid[], :ws::text[], 30, '{}');
commit;
select quote_literal(array_agg(id)::text) as hids, quote_literal(array_agg(lease_epoch)::text) as eps
from artex.tasks where assigned_to = 'w' || :client_id and status = 'assigned' \gset
select count(*) from artex.record_attempts('w' || :client_id, :hids::uuid[], :eps::int8[],
    array_fill('succeeded'::text, array[500]), array_fill(null::jsonb, array[500]),
    array_fill(null::text, array[500]), array_fill(false, array[500]),
    array_fill(0::float8, array[500]), array_fill(1::float8, array[500]));

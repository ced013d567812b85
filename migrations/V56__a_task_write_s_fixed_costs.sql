-- V56: fixed costs every statement that writes a task paid, cut (issue 39, W2). Expand.
--
-- W2's tasks come one at a time, so each statement that writes a task writes one row
-- and pays its fixed costs alone. Two of them showed in a profile of a single
-- task's insert and claim (pgbench on a scratch database, 2026-12-06). The insert took
-- 0.32 ms in PostgreSQL; a one-row insert into a plain table took 0.11 ms, round trip
-- included.
--
-- - SQL functions with a query in them are neither inlined nor cached. Each call from
--   PL/pgSQL parsed, analyzed and planned its statement again: the first call in each
--   transaction, so once for every insert (`max_payload_bytes`, from the insert's input
--   check) and once for every submission with a unique key, every `artex.submit` that
--   left out its retries, and every batch of outcomes with a retry. In PL/pgSQL each
--   statement is planned once per session and the plan is kept, as V54 did for the
--   round's probe. The same statements and the same answers. The insert's time fell
--   from 0.32 to 0.24 ms.
-- - PostgreSQL reads a table's CHECK constraints back from their stored form at every
--   statement that writes it (PostgreSQL 15: `stringToNode` in `ExecRelCheck`). `tasks`
--   has 21 of them, 15.6 KB stored. The trace context's check alone was 3.1 KB: its
--   regular expression and three comparisons. It now calls a PL/pgSQL function, as the
--   tags' check does (V36), only for a task that has a trace context. Same name, same
--   rule, a sixth of the stored size. Dropping the old check took 0.02 ms more off a
--   one-row insert; every statement that writes a task (the worker's claim, the
--   rounds' writes, the outcomes) reads the checks back the same way.

create or replace function artex.max_payload_bytes()
returns integer
language plpgsql stable
as $fn$
begin
    return coalesce((select l.max_payload_bytes from artex.limits l where l.only_row),
                    1048576);
end
$fn$;

create or replace function artex.default_max_retries(kind text)
returns integer
language plpgsql stable
as $fn$
begin
    return coalesce((select k.retry_max_attempts - 1 from artex.kinds k
                     where k.kind = default_max_retries.kind), 3);
end
$fn$;

create or replace function artex.task_with_unique_key(key text, window_ interval)
returns uuid
language plpgsql stable
as $fn$
begin
    return (select t.id from artex.tasks t
            where t.unique_key = task_with_unique_key.key
              and (t.finished_at is null
                   -- (`least` skips NULLs: without a window, finished tasks do not count.)
                   or (task_with_unique_key.window_ is not null
                       and t.finished_at > now() - least(task_with_unique_key.window_,
                                                         interval '100 years')))
            order by t.id desc limit 1);
end
$fn$;

create or replace function artex.kind_retry_delay(kind text, retries integer,
                                                  base_ms double precision,
                                                  cap_ms double precision)
returns interval
language plpgsql
as $fn$
begin
    return coalesce(
        (select make_interval(secs => artex.policy_delay_ms(k.retry_backoff, k.retry_base_ms,
                                                            k.retry_cap_ms,
                                                            kind_retry_delay.retries) / 1000.0)
         from artex.kinds k
         where k.kind = kind_retry_delay.kind and k.retry_backoff is not null),
        artex.retry_delay(kind_retry_delay.retries, kind_retry_delay.base_ms,
                          kind_retry_delay.cap_ms));
end
$fn$;

create function artex.traceparent_valid(traceparent text)
returns boolean
language plpgsql immutable
as $fn$
begin
    return traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       and left(traceparent, 2) <> 'ff'
       and substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
       and substr(traceparent, 37, 16) <> '0000000000000000';
end
$fn$;

comment on function artex.traceparent_valid(text) is
    'A W3C traceparent: version-traceid-spanid-flags in lowercase hex, version not ff, ids not all zero (V45). What tasks_traceparent_check asks of a task''s trace context (V56).';

-- NOT VALID, as V45's: the rows already there met the same rule, and a check that
-- scanned the table would hold its lock for the scan.
alter table artex.tasks
    drop constraint tasks_traceparent_check,
    add constraint tasks_traceparent_check
        check (traceparent is null or artex.traceparent_valid(traceparent)) not valid;

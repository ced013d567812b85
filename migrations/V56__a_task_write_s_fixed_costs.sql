-- V56: a fixed cost every insert paid, cut (issue 39, W2). Expand.
--
-- W2's tasks come one at a time, so each statement that writes a task writes one row
-- and pays its fixed costs alone. A profile of a single task's insert and claim
-- (pgbench on a scratch database, 2026-12-06) showed one that was not PostgreSQL's
-- own. The insert took 0.32 ms in PostgreSQL; a one-row insert into a plain table took
-- 0.11 ms, round trip included.
--
-- SQL functions with a query in them are neither inlined nor cached. Each call from
-- PL/pgSQL parsed, analyzed and planned its statement again: the first call in each
-- transaction, so once for every insert (`max_payload_bytes`, from the insert's input
-- check) and once for every submission with a unique key, every `artex.submit` that
-- left out its retries, and every batch of outcomes with a retry. In PL/pgSQL each
-- statement is planned once per session and the plan is kept, as V54 did for the
-- round's probe. The same statements and the same answers. The insert's time fell
-- from 0.32 to 0.24 ms.
--
-- Measured and not kept: the trace context's CHECK (3.1 KB of the 15.6 KB of checks
-- PostgreSQL reads back at every statement that writes `tasks`) calling a PL/pgSQL
-- function instead. A one-row insert took 0.02 ms less, but a traced task's every
-- write paid the call: 20,000 traced rows updated in 285–321 ms against 259–279.

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

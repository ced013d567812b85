-- Time-ordered ids for every insert (issue 13). An expansion: a function and two column
-- defaults; builds that predate it insert and read as before.
--
-- artex's own submits make UUIDv7 ids (a millisecond timestamp first), so new tasks land
-- on the right edge of the primary key and neighbouring tasks share pages, which the
-- assigner and the planner's batches are laid out for. A task inserted with plain SQL
-- took the column default, `gen_random_uuid()`: a random v4 id that lands on a random
-- leaf of the index, so bulk inserts touched (and, after a checkpoint, wrote whole into
-- the WAL) a page per row. PostgreSQL 15 has no UUIDv7 function, hence this one.

-- RFC 9562 UUIDv7: 48 bits of Unix time in milliseconds, the version (7), 12 bits of
-- sub-millisecond time (the RFC's "method 3", as PostgreSQL 18's uuidv7() does, so that
-- ids made one after another in a session increase even within a millisecond), the
-- variant, and 62 random bits (those of a v4 id, whose variant bits are already right).
-- clock_timestamp(), not now(): rows inserted by one long transaction still get the
-- time they were made. PL/pgSQL because the time is used twice: as plain SQL the
-- function is inlined only if it calls clock_timestamp() twice (two readings that may
-- straddle a millisecond), else it runs through the slower SQL-function executor; this
-- costs ~1.5 us more per id than gen_random_uuid() here.
create function artex.uuid_v7() returns uuid
language plpgsql volatile parallel safe as $$
declare
    -- Microseconds since 1970, read once: the millisecond and its fraction must agree.
    us bigint := (extract(epoch from clock_timestamp()) * 1000000)::bigint;
begin
    return encode(
        substring(int8send(us / 1000) from 3)                       -- 48-bit unix ms
        || int2send((28672 + (us % 1000) * 4096 / 1000)::int2)      -- 0x7000 | sub-ms
        || substring(uuid_send(gen_random_uuid()) from 9),          -- variant, random
        'hex')::uuid;
end
$$;

comment on function artex.uuid_v7() is
    'A time-ordered UUID (version 7, RFC 9562): the default id of tasks and flows.';

alter table artex.tasks alter column id set default artex.uuid_v7();
alter table artex.flows alter column id set default artex.uuid_v7();

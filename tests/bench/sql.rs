//! Every SQL statement the bench sends, in one place (STYLE.md: SQL lives in
//! actors/src/blackboard or the bench's own SQL module). The parts name these constants
//! and pass values as parameters; `statements_prepare` (main.rs) prepares each of them
//! against a freshly migrated blackboard, so a schema change that breaks the bench fails
//! the plain suite instead of the next person who runs `scripts/bench.sh`.

// ---- The cluster and its databases -------------------------------------------------------

/// `drop database if exists`, then a fresh copy of the migrated `artex` database.
pub fn new_db(db: &str) -> [String; 2] {
    [
        format!("drop database if exists {db}"),
        format!("create database {db} template artex"),
    ]
}

/// `drop database`.
pub fn drop_db(db: &str) -> String {
    format!("drop database {db}")
}

/// `alter system set name = 'value'` (ARTEX_BENCH_PG_SETTINGS).
pub fn alter_system(name: &str, value: &str) -> String {
    format!("alter system set {name} = '{}'", value.replace('\'', "''"))
}

/// Drops one of artex's indexes (ARTEX_BENCH_DROP_INDEXES).
pub fn drop_index(index: &str) -> String {
    format!("drop index artex.{index}")
}

/// Drops one of the triggers on `artex.tasks` (ARTEX_BENCH_DROP_TRIGGERS): an experiment
/// on what a trigger costs the hot path (whose writes it may leave undone elsewhere).
pub fn drop_trigger(trigger: &str) -> String {
    format!("drop trigger {trigger} on artex.tasks")
}

/// The bench's helpers in the `artex` database (and so in every clone of it): task ids
/// made as artex makes them (UUIDv7, time-ordered), so bulk inserts stay on the right edge.
pub const BENCH_SCHEMA: &str = "
create schema bench;
create function bench.uuid7() returns uuid language sql volatile as $$
    select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing
        substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
        from 1 for 6), 52, 1), 53, 1), 'hex')::uuid
$$;";

/// A round trip (pgbouncer answering).
pub const PING: &str = "select 1";
pub const VERSION: &str = "select split_part(version(), ',', 1)";
pub const CHECKPOINT: &str = "checkpoint";
/// This session's table counts handed to the shared statistics at this statement's end
/// (PostgreSQL 15 sends them at a transaction's end only if a second has passed since
/// the session last did, else at a later transaction or after 10 s of idling).
pub const STATS_FLUSH: &str = "select pg_stat_force_next_flush()";
pub const VACUUM_ANALYZE: &str = "vacuum analyze";

/// Sessions connected to database $1.
pub const SESSIONS: &str = "select count(*) from pg_stat_activity where datname = $1";

/// Transactions committed in database $1, WAL bytes written and WAL flushes so far (read
/// from another database, so that reading them adds nothing to $1).
pub const COUNTERS: &str = "select xact_commit, (pg_current_wal_lsn() - '0/0')::int8,
        (select wal_sync from pg_stat_wal)
    from pg_stat_database where datname = $1";

// ---- Tasks in, tasks done ---------------------------------------------------------------

/// $1 no-op tasks with time-ordered ids (W1's bulk insert, ≤ 100,000 at a time).
pub const INSERT_NOOPS: &str =
    "insert into artex.tasks (id, kind) select bench.uuid7(), 'noop' from generate_series(1, $1::int4)";

/// $1 no-op tasks by plain SQL (the column default id), runnable $2 seconds from now.
pub const INSERT_NOOPS_AT: &str = "insert into artex.tasks (kind, run_at)
    select 'noop', now() + make_interval(secs => $2::float8) from generate_series(1, $1::int4)";

/// As INSERT_NOOPS_AT, each task with a trace context of its own (trace): its
/// planner and worker spans are made when tracing is on.
pub const INSERT_TRACED_NOOPS_AT: &str = "insert into artex.tasks (kind, run_at, traceparent)
    select 'noop', now() + make_interval(secs => $2::float8),
           '00-' || md5(g::text || clock_timestamp()::text) || '-' || left(md5('s' || g::text), 16)
           || '-01'
    from generate_series(1, $1::int4) g";

/// One `stamp` task (W2), inserted and committed on its own.
pub const INSERT_STAMP: &str = "insert into artex.tasks (id, kind, payload)
    values (bench.uuid7(), 'stamp', jsonb_build_object('warmup', $1::bool))";

/// timers: a `stamp` task due in an hour; its id.
pub const INSERT_STAMP_IN_AN_HOUR: &str = "insert into artex.tasks (id, kind, payload, run_at)
    values (bench.uuid7(), 'stamp', '{}', now() + interval '1 hour') returning id";

/// timers: task $1 due $2 ms from now, moved by plain SQL.
pub const MOVE_RUN_AT: &str =
    "update artex.tasks set run_at = now() + $2::float8 * interval '1 ms' where id = $1";

/// timers: every flow's wait has ended.
pub const WAITS_ENDED: &str =
    "select not exists (select 1 from artex.flow_waits where ended_at is null)";

/// timers: the waits of flow $1 ended, and the median and the latest of their ends
/// after their due times, ms.
pub const TIMERS_LATE: &str = "select count(*),
        coalesce(percentile_cont(0.5) within group (order by ms), 0)::float8,
        coalesce(max(ms), 0)::float8
    from (select extract(epoch from ended_at - due_at)::float8 * 1000 as ms
          from artex.flow_waits where flow_id = $1 and ended_at is not null) x";

/// timers: the `stamp` tasks started, and the median and the latest of their starts
/// (`running`) after their `run_at`, ms.
pub const MOVED_LATE: &str = "select count(*),
        coalesce(percentile_cont(0.5) within group (order by ms), 0)::float8,
        coalesce(max(ms), 0)::float8
    from (select extract(epoch from r.at - t.run_at)::float8 * 1000 as ms
          from artex.tasks t
          join artex.task_transitions r on r.task_id = t.id and r.to_status = 'running'
          where t.kind = 'stamp') x";

/// Nothing runnable and nothing held, through the indexes (the runnable and the held set):
/// the wait's polls cost the run nothing.
pub const UNFINISHED_NONE: &str = "select
    not exists (select 1 from artex.tasks where listed = 'pending')
    and not exists (select 1 from artex.tasks where assigned_to is not null)";

/// Nothing left runnable (W6: the simulated workers never start what they are given).
pub const PENDING_NONE: &str =
    "select not exists (select 1 from artex.tasks where listed = 'pending')";

/// Exactly $1 workers online.
pub const ONLINE: &str =
    "select (select count(*) from artex.workers where state = 'online') = $1::int8";

/// Tasks finished so far (the progress line): a walk of the whole table since V69 dropped
/// the finish-time index, hence counted only every 10 s.
pub const FINISHED: &str = "select count(*) from artex.tasks where finished_at is not null";

/// Every one of $1 tasks succeeded, with exactly its three history rows: new → pending,
/// assigned → running (the assignment has no row of its own when a start follows),
/// running → succeeded.
pub const ALL_SUCCEEDED: &str = "select
    (select count(*) from artex.tasks) = $1::int8
    and (select count(*) from artex.tasks where status = 'succeeded') = $1::int8
    and (select count(*) from (select task_id from artex.task_transitions group by 1
         having string_agg(coalesce(from_status::text, 'new') || '>' || to_status, ','
                           order by id)
                = 'new>pending,assigned>running,running>succeeded') t) = $1::int8";

/// Tasks by status, for a failure's message.
pub const BY_STATUS: &str = "select coalesce(string_agg(status || ' ' || n, ', '), 'none')
    from (select status, count(*) n from artex.tasks group by 1) s";

/// Seconds from the first start to the last finish.
pub const FIRST_START_TO_LAST_FINISH_S: &str =
    "select extract(epoch from max(finished_at) - min(started_at))::float8 from artex.tasks";

/// The first and last finish, as Unix seconds.
pub const FINISH_SPAN: &str = "select extract(epoch from min(finished_at))::float8,
    extract(epoch from max(finished_at))::float8 from artex.tasks";

// ---- Limit: the minimal queue cycle (pgbench) -------------------------------------------

/// A minimal jobs table of $1 pending jobs in database `bench_limit`.
pub const LIMIT_TABLE: [&str; 3] = [
    "drop table if exists jobs",
    "create table jobs (id bigint generated always as identity primary key,
        status smallint not null default 0, payload jsonb not null default '{}',
        done_at timestamptz)",
    "create index jobs_pending on jobs (id) where status = 0",
];
pub const LIMIT_FILL: &str =
    "insert into jobs (payload) select '{}' from generate_series(1, $1::int4)";
pub const LIMIT_VACUUM: &str = "vacuum analyze jobs";

/// pgbench's script: claim `jobs` jobs and mark them done, in one transaction.
pub fn limit_claim_script(jobs: u32) -> String {
    format!(
        "begin;
with c as (select id from jobs where status = 0 order by id limit {jobs} for update skip locked)
update jobs j set status = 1, done_at = now() from c where j.id = c.id;
commit;
"
    )
}

// ---- W1 from idle -----------------------------------------------------------------------

/// Whether the insert finished inside its lead (nothing runnable yet, nothing started),
/// and the seconds from now until the burst's tasks are due (0 if they are).
pub const W1IDLE_WITHIN_LEAD: &str = "select max(run_at) > now() and min(started_at) is null,
        greatest(extract(epoch from min(run_at) - clock_timestamp()), 0)::float8
    from artex.tasks";
pub const CAPACITIES: &str = "select coalesce(string_agg(capacity::text, ' '), '')
    from artex.workers where state = 'online'";
/// The HTTP addresses of the online workers (their `/metrics`).
pub const ONLINE_HTTP: &str =
    "select http_addr from artex.workers where state = 'online' and http_addr is not null";
/// Ids the column default made that are not UUIDv7.
pub const NOT_UUID7: &str = "select count(*) from artex.tasks where substr(id::text, 15, 1) <> '7'";
pub const FIRST_START_AFTER_RUN_AT_MS: &str = "select
    round((extract(epoch from min(started_at) - min(run_at)) * 1000)::numeric)::float8
    from artex.tasks";
/// Every assignment as a row of `at` and `worker`: a task's start row's `assigned_at`,
/// or its own row when it ended unstarted (both its assigning transaction's start).
macro_rules! assignments {
    () => {
        "(select coalesce(assigned_at, at) at, worker from artex.task_transitions
          where assigned_at is not null or to_status = 'assigned')"
    };
}
/// Assignment rounds (the assignments of one instant): count, mean, min and max size,
/// span in ms.
pub const ROUNDS: &str = concat!(
    "with r as (select at, count(*) n from ",
    assignments!(),
    " x group by 1)
    select count(*), round(avg(n))::int8, min(n), max(n),
        round((extract(epoch from max(at) - min(at)) * 1000)::numeric)::int8
    from r"
);
/// The first 12 rounds as `tasks@ms after run_at` and the worker they went to (`w1`,
/// `w2`, … in the order of the workers' ids).
pub const FIRST_ROUNDS: &str = concat!(
    "with r as (select at, worker, count(*) n from ",
    assignments!(),
    " x group by 1, 2)
    select string_agg(n::text || '@' || round((extract(epoch from at
            - (select min(run_at) from artex.tasks)) * 1000)::numeric) || w, ' ' order by at)
    from (select r.*, 'w' || dense_rank() over (order by worker) w from r
          order by at limit 12) f"
);
/// 10%, 50% and all finished, ms after run_at.
pub const FINISHED_AFTER_RUN_AT_MS: &str = "select
    round((extract(epoch from percentile_disc(0.1) within group (order by finished_at) - min(run_at)) * 1000)::numeric)::int8,
    round((extract(epoch from percentile_disc(0.5) within group (order by finished_at) - min(run_at)) * 1000)::numeric)::int8,
    round((extract(epoch from max(finished_at) - min(run_at)) * 1000)::numeric)::int8
    from artex.tasks";

/// Tasks assigned and tasks finished in each 50 ms after run_at, space-separated.
pub const PER_50_MS_AFTER_RUN_AT: &str = concat!(
    "with z as (select min(run_at) z from artex.tasks),
    a as (select floor(extract(epoch from at - z) * 20)::int b, count(*) n
        from ",
    assignments!(),
    " x, z group by 1),
    f as (select floor(extract(epoch from finished_at - z) * 20)::int b, count(*) n
        from artex.tasks, z where finished_at is not null group by 1),
    s as (select generate_series(0, greatest((select max(b) from a), (select max(b) from f))) b)
    select string_agg(coalesce(a.n, 0)::text, ' ' order by s.b),
        string_agg(coalesce(f.n, 0)::text, ' ' order by s.b)
    from s left join a using (b) left join f using (b)"
);

// ---- W2 ---------------------------------------------------------------------------------

pub const ANY_ONLINE: &str = "select exists (select 1 from artex.workers where state = 'online')";
/// Enqueue → handler start p50, p95, p99, and enqueue → `running` p50, p99 (ms).
pub const W2_PERCENTILES: &str = "select
        round(percentile_cont(0.5) within group (order by handler)::numeric, 2)::float8,
        round(percentile_cont(0.95) within group (order by handler)::numeric, 2)::float8,
        round(percentile_cont(0.99) within group (order by handler)::numeric, 2)::float8,
        round(percentile_cont(0.5) within group (order by db)::numeric, 2)::float8,
        round(percentile_cont(0.99) within group (order by db)::numeric, 2)::float8
    from (select (result->>'t_us')::float8 / 1000 - extract(epoch from created_at) * 1000 handler,
                 extract(epoch from started_at - created_at) * 1000 db
          from artex.tasks where payload->>'warmup' = 'false') t";
/// Where W2's median goes: each step from the start of one transaction to the start of
/// the next (audit rows carry their transaction's start time).
pub const W2_STEPS: &str =
    "select round(percentile_cont(0.5) within group (order by a)::numeric, 2)::float8,
        round(percentile_cont(0.5) within group (order by r)::numeric, 2)::float8,
        round(percentile_cont(0.5) within group (order by h)::numeric, 2)::float8
    from (select extract(epoch from asg.at - t.created_at) * 1000 a,
                 extract(epoch from run.at - asg.at) * 1000 r,
                 (t.result->>'t_us')::float8 / 1000 - extract(epoch from run.at) * 1000 h
          from artex.tasks t
          join artex.task_transitions run on run.task_id = t.id and run.to_status = 'running'
          cross join lateral (select run.assigned_at as at) asg
          where t.payload->>'warmup' = 'false') s";
/// W2's floor (examples/latency-floor.rs makes the table): one job, committed on its own.
pub const FLOOR_INSERT: &str = "insert into floor_jobs (warmup) values ($1::bool)";
pub const FLOOR_PERCENTILES: &str = "select
        round(percentile_cont(0.5) within group (order by ms)::numeric, 2)::float8,
        round(percentile_cont(0.95) within group (order by ms)::numeric, 2)::float8,
        round(percentile_cont(0.99) within group (order by ms)::numeric, 2)::float8
    from (select started_us / 1000.0 - extract(epoch from created_at) * 1000 ms
          from floor_jobs where not warmup) t";

// ---- W1 ---------------------------------------------------------------------------------

/// Seconds from $1 (Unix seconds) to the first and to the last finish.
pub const FINISHES_SINCE_S: &str = "select
    (extract(epoch from min(finished_at)) - $1::float8)::float8,
    (extract(epoch from max(finished_at)) - $1::float8)::float8
    from artex.tasks";

/// Every statement above that takes no identifier, for `statements_prepare`. (The
/// `floor_jobs` ones need examples/latency-floor.rs's table and are left to W2's runs.)
pub const PREPARED: &[&str] = &[
    PING,
    VERSION,
    STATS_FLUSH,
    SESSIONS,
    COUNTERS,
    INSERT_NOOPS,
    INSERT_NOOPS_AT,
    INSERT_TRACED_NOOPS_AT,
    INSERT_STAMP,
    INSERT_STAMP_IN_AN_HOUR,
    MOVE_RUN_AT,
    TIMERS_LATE,
    MOVED_LATE,
    WAITS_ENDED,
    UNFINISHED_NONE,
    PENDING_NONE,
    ONLINE,
    FINISHED,
    ALL_SUCCEEDED,
    BY_STATUS,
    FIRST_START_TO_LAST_FINISH_S,
    FINISH_SPAN,
    W1IDLE_WITHIN_LEAD,
    CAPACITIES,
    ONLINE_HTTP,
    NOT_UUID7,
    FIRST_START_AFTER_RUN_AT_MS,
    ROUNDS,
    FIRST_ROUNDS,
    FINISHED_AFTER_RUN_AT_MS,
    PER_50_MS_AFTER_RUN_AT,
    ANY_ONLINE,
    W2_PERCENTILES,
    W2_STEPS,
    FINISHES_SINCE_S,
    DISPATCH_BODY,
    SIM_WORKERS,
    W6_RATE,
    OVER_CAPACITY,
    LIMITS_INSERT_KEYED,
    LIMITS_INSERT_TAGGED,
    LIMITS_INSERT_UNIQUE,
    LIMITS_SET,
    LIMITS_CLEAR,
    FAIR_SET,
    FAIR_BACKLOG,
    FAIR_ONE,
    FAIR_SMALL_WAIT,
    FAIR_SMALL_WAIT_PARTS,
    FAIR_STARTED_BETWEEN,
    SUCCEEDED,
    DELETE_TASKS,
    TASKS,
    W3_SIM_WORKER,
    W3_FINISHED,
    LAST_TRANSITION,
    W3_DRAINED,
    ENDED_BADLY,
    W3_DRAIN_RATE,
    W4_RETENTION,
    W4_PARTITIONS_REMADE,
    NOT_SUCCEEDED,
    HISTORY_ROWS,
    W4_RETAINED,
    W4_TENTHS,
    W4_SIZES,
    WAL_LSN,
    CYCLE_WORKER,
    CYCLE_ASSIGN,
    CYCLE_HELD,
    CYCLE_RECORD,
    CYCLE_CLAIM,
    INSERT_PROGRAM_TASKS,
    RUNNING_AT_LEAST,
    RELMAP,
    API_SIM_WORKER,
    BUSY_HOUR,
    BUSY_HOUR_HISTORY,
    STATUSES,
    PAUSE_PENDING,
    REPLAYED,
    IN_RECOVERY,
    REPLICA_W1_RATE,
    WORKER_HTTP,
    CLIENT_BACKENDS,
    PROCESSES,
    ACTIVITY_SAMPLE,
];

// ---- W6 (and W3): the planner round's read ----------------------------------------------

/// The planner round's read (its roster and claim in one statement), which lives once, in
/// `artex.dispatch_round`: its first `return query`, the one a round runs when no task of
/// a limited kind is pending (V34), as in W3's and W6's databases.
pub const DISPATCH_BODY: &str = "select substring(prosrc from 'return query (.*?);[ \t]*\n')
    from pg_proc where proname = 'dispatch_round' and pronamespace = 'artex'::regnamespace";

/// That statement prepared as `dispatch`, as the runtime sends it.
pub fn prepare_dispatch(body: &str) -> String {
    format!("prepare dispatch as {body}")
}

/// One timed run of `dispatch` for `limit` tasks (roster of workers seen within 600 s,
/// shard 1 of none).
pub fn explain_dispatch(limit: u32) -> String {
    format!("explain (analyze) execute dispatch(600, {limit}, 1, '{{}}', '{{}}')")
}

/// A prepared statement outlives the transaction's rollback: gone before the next timing.
pub const DEALLOCATE_DISPATCH: &str = "deallocate dispatch";
pub const BEGIN: &str = "begin";
pub const ROLLBACK: &str = "rollback";

/// $1 simulated workers of $2 slots: no session (the roster's liveness check is for real
/// ones), seen now, suspect only after the run.
pub const SIM_WORKERS: &str =
    "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
    select 'sim-' || g, 'sim', 1, 'bench', 'artex_w_sim' || g, array['noop'], $2::int4
    from generate_series(1, $1::int4) g";
pub const ANALYZE_WORKERS: &str = "analyze artex.workers";

/// Assignments per second and rounds: an assignment writes no history row until it ends
/// (the workers are simulated and never start anything), so the assigned rows'
/// updated_at is the assigning round's time.
pub const W6_RATE: &str = "select
        round(count(*) / greatest(extract(epoch from max(updated_at) - min(updated_at)), 0.001))::float8,
        count(distinct updated_at)
    from artex.tasks where status = 'assigned'";
pub const OVER_CAPACITY: &str = "select count(*) from artex.workers where held > capacity";

// ---- W5: bursts after idle gaps ---------------------------------------------------------

pub const W5_BURSTS_TABLE: &str =
    "create table bench.bursts (burst int primary key, committed_at timestamptz not null)";
/// Burst $1: $2 no-op tasks by plain SQL, the burst's number in the payload…
pub const W5_INSERT: &str = "insert into artex.tasks (kind, payload)
    select 'noop', jsonb_build_object('burst', $1::int4) from generate_series(1, $2::int4)";
/// …and, in the same transaction, the time at the end of its insert: the tasks become
/// runnable at its commit, a moment (one WAL flush) later.
pub const W5_MARK: &str = "insert into bench.bursts values ($1::int4, clock_timestamp())";
/// Per burst of $1 tasks: its number, tasks/s from its first start to its last finish,
/// its first start after its insert's end (ms, 1 decimal).
pub const W5_RATES: &str = "select b.burst,
        round($1::int4 / extract(epoch from max(t.finished_at) - min(t.started_at)))::float8,
        round((extract(epoch from min(t.started_at) - b.committed_at) * 1000)::numeric, 1)::float8
    from artex.tasks t join bench.bursts b on b.burst = (t.payload->>'burst')::int
    group by b.burst, b.committed_at order by 1";
/// How each burst went, from its insert's end (ms): first start, half and 99% finished, last.
pub const W5_TIMELINE: &str = "select b.burst,
        round((extract(epoch from min(t.started_at) - b.committed_at) * 1000)::numeric)::int8,
        round((extract(epoch from percentile_disc(0.5) within group (order by t.finished_at) - b.committed_at) * 1000)::numeric)::int8,
        round((extract(epoch from percentile_disc(0.99) within group (order by t.finished_at) - b.committed_at) * 1000)::numeric)::int8,
        round((extract(epoch from max(t.finished_at) - b.committed_at) * 1000)::numeric)::int8
    from artex.tasks t join bench.bursts b on b.burst = (t.payload->>'burst')::int
    group by b.burst, b.committed_at order by 1";

// ---- limits and tags --------------------------------------------------------------------

/// $1 no-op tasks runnable $2 s from now, each with a limit key of 1,000.
pub const LIMITS_INSERT_KEYED: &str = "insert into artex.tasks (kind, run_at, limit_key)
    select 'noop', now() + make_interval(secs => $2::float8), 'k' || (g % 1000)
    from generate_series(1, $1::int4) g";
/// The same with two tags each and no limit key.
pub const LIMITS_INSERT_TAGGED: &str = "insert into artex.tasks (kind, run_at, tags)
    select 'noop', now() + make_interval(secs => $2::float8), array['nightly', 'k' || (g % 1000)]
    from generate_series(1, $1::int4) g";
/// The same with a distinct unique key each and no limit key.
pub const LIMITS_INSERT_UNIQUE: &str = "insert into artex.tasks (kind, run_at, unique_key)
    select 'noop', now() + make_interval(secs => $2::float8), 'u' || g
    from generate_series(1, $1::int4) g";
/// The kind limited per key (5) and overall (10,000): room enough not to bind.
pub const LIMITS_SET: &str =
    "insert into artex.kind_limits (kind, concurrency, key_concurrency, updated_by)
    values ('noop', 10000, 5, 'bench')";
pub const LIMITS_CLEAR: &str = "delete from artex.kind_limits";
pub const SUCCEEDED: &str = "select count(*) from artex.tasks where status = 'succeeded'";
pub const DELETE_TASKS: &str = "delete from artex.tasks";

// ---- unique: what a unique key costs a submission -----------------------------------------

/// `batches` batches of 100 tasks, one transaction a batch, looped in the server (as the
/// bash bench did, so that no client round trip counts): without keys, one insert a batch.
pub fn unique_no_key(batches: u32) -> String {
    unique_loop(
        batches,
        "insert into artex.tasks (kind) select 'noop' from generate_series(1, 100)",
    )
}

/// The same with a distinct key each (`b-g`), each task through `artex.submit` (the SQL
/// path: the key's lock and lookup, then the insert); run twice, the second time every
/// one is a duplicate.
pub fn unique_keyed(batches: u32) -> String {
    unique_loop(
        batches,
        "perform count(*) from generate_series(1, 100) g cross join lateral
            artex.submit('noop', unique_key => b || '-' || g, allow_unregistered_kind => true)",
    )
}

fn unique_loop(batches: u32, batch: &str) -> String {
    format!(
        "do $$ declare b int; begin for b in 1..{batches} loop {batch}; commit; end loop; end $$"
    )
}

pub const TASKS: &str = "select count(*) from artex.tasks";

// ---- ARTEX_BENCH_PROFILE=1: pg_stat_statements -------------------------------------------

pub const PROFILE_PRELOAD: &str =
    "alter system set shared_preload_libraries = 'pg_stat_statements'";
/// (alter system runs outside a transaction block: its own statement.)
pub const PROFILE_TRACK_ALL: &str = "alter system set pg_stat_statements.track = 'all'";
/// Plans counted apart from calls: a statement planned at most calls is re-planned.
pub const PROFILE_TRACK_PLANNING: &str = "alter system set pg_stat_statements.track_planning = on";
pub const RELOAD_CONF: &str = "select pg_reload_conf()";
pub const PROFILE_EXTENSION: &str = "create extension pg_stat_statements";
pub const PROFILE_RESET: &str = "select pg_stat_statements_reset()";
/// The 15 statements that cost the most time in this database since the last reset, per
/// $1 tasks (nested = run by a trigger): calls, per task, total ms, mean ms, plans and
/// their total ms, WAL bytes per task, the statement's first 70 characters.
pub const PROFILE_TOP: &str = "select calls::text || ' | ' || round(calls::numeric / $1::int4, 3)
        || ' | ' || round(total_exec_time::numeric) || ' | ' || round(mean_exec_time::numeric, 3)
        || ' | ' || plans || ' | ' || round(total_plan_time::numeric)
        || ' | ' || round(wal_bytes::numeric / $1::int4)
        || ' | ' || round(rows::numeric / $1::int4, 2) || ' | '
        || case when toplevel then '' else 'nested ' end
        || left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
    from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())
      and query not like '%pg_sleep%' and query not like 'do %'
    order by total_exec_time desc limit 15";

/// ARTEX_BENCH_PROFILE=1: the cluster's processes, each with what it is (its backend
/// type; a client's database and application name).
pub const PROCESSES: &str = "select pid, case when backend_type = 'client backend'
        then 'client ' || coalesce(datname, '-') || ' '
             || coalesce(nullif(application_name, ''), '(unnamed)')
        else backend_type end
    from pg_stat_activity";

/// ARTEX_BENCH_PROFILE=1: what database `$1`'s client backends (artex's, by application
/// name) are doing now: per active statement, `cpu` (not waiting) or `Type:event`, and
/// the artex function it runs (`in claim_and_read`); none when nothing runs.
pub const ACTIVITY_SAMPLE: &str =
    "select coalesce(array_agg(coalesce(wait_event_type || ':' || wait_event, 'cpu')
            || coalesce(' in ' || substring(query from 'artex\\.([a-z_]+)\\('), '')),
        '{}')
    from pg_stat_activity
    where datname = $1 and backend_type = 'client backend' and state = 'active'
      and application_name = 'artex' and pid <> pg_backend_pid()";

// ---- W3: claim cost against the backlog ---------------------------------------------------

/// One simulated worker of ample capacity on the roster (in the timed transaction).
pub const W3_SIM_WORKER: &str =
    "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
    values ('bench-sim', 'sim', 1, 'bench', 'artex_w_bench_sim', array['noop'], 100000)";
/// Finished tasks as the runtime leaves them, written directly with the triggers off
/// (`REPLICA_ROLE` first, hence no audit rows): only the hot table's contents matter.
pub const REPLICA_ROLE: &str = "set session_replication_role = replica";
pub const REPLICA_ROLE_RESET: &str = "reset session_replication_role";
pub const W3_FINISHED: &str = "insert into artex.tasks
        (id, kind, status, lease_epoch, result, created_at, updated_at, started_at, finished_at)
    select bench.uuid7(), 'noop', 'succeeded', 1, 'null', now(), now(), now(), now()
    from generate_series(1, $1::int4)";
pub const LAST_TRANSITION: &str = "select coalesce(max(id), 0)::int8 from artex.task_transitions";
/// At least $2 + 1 successes after transition $1.
pub const W3_DRAINED: &str = "select exists (select 1 from artex.task_transitions
    where id > $1::int8 and to_status = 'succeeded' offset $2::int8)";
pub const ENDED_BADLY: &str =
    "select count(*) from artex.tasks where status in ('failed', 'timeout', 'canceled')";
/// Of the first $2 successes after transition $1: those after the first batch over the
/// time since it (a batch shares one timestamp); 0 when a single batch did it all.
pub const W3_DRAIN_RATE: &str = "select coalesce(round(count(*) filter (where at > first)
        / nullif(extract(epoch from max(at) - min(first)), 0)), 0)::float8
    from (select at, min(at) over () as first from (
        select at from artex.task_transitions where id > $1::int8 and to_status = 'succeeded'
        order by id limit $2::int8) e) t";

// ---- W4: the soak -------------------------------------------------------------------------

/// ARTEX_BENCH_W4_RETENTION: history and finished tasks kept $1 (an interval's text)…
pub const W4_RETENTION: &str = "update artex.event_retention set keep = $1::text::interval";
/// …and a fresh database's partitions (made at the default's day-wide slices) made again
/// at the short retention's slices, as they would be had it been set from the start.
pub const W4_PARTITIONS_REMADE: &str = "do $$ declare p record; begin
        for p in select name from artex.history_partitions loop
            execute format('drop table artex.%I', p.name);
        end loop;
        delete from artex.history_partitions;
        perform count(*) from artex.make_history_partitions(now(), null);
    end $$";
pub const NOT_SUCCEEDED: &str = "select count(*) from artex.tasks where status <> 'succeeded'";
/// Stored history rows (since V25 a start written with its end is one row holding both
/// transitions; `artex.task_transitions` shows them as two).
pub const HISTORY_ROWS: &str = "select count(*) from artex.task_history";
/// With a retention: the history's partitions, and how far the feed was pruned.
pub const W4_RETAINED: &str = "select
        (select coalesce(string_agg(name, ' ' order by lo), '') from artex.history_partitions),
        (select pruned_xid || '-' || pruned_id || ' at ' || coalesce(pruned_at::text, 'never')
         from artex.event_retention)";
/// Tasks/s in each tenth of the run (by completion order).
pub const W4_TENTHS: &str = "select tenth,
        round(count(*) / greatest(extract(epoch from max(finished_at) - min(finished_at)), 0.001))::float8
    from (select finished_at, ntile(10) over (order by finished_at) tenth from artex.tasks) t
    group by 1 order by 1";
/// The task table's heap and total size, live and dead tuples; the history's size and
/// partitions.
pub const W4_SIZES: &str = "select pg_relation_size('artex.tasks'),
        pg_total_relation_size('artex.tasks'), n_live_tup, n_dead_tup,
        (select coalesce(sum(pg_total_relation_size(inhrelid)), 0)::int8 from pg_inherits
         where inhparent = 'artex.task_history'::regclass),
        (select count(*) from pg_inherits where inhparent = 'artex.task_history'::regclass)
    from pg_stat_user_tables where relid = 'artex.tasks'::regclass";

// ---- history: rows and WAL per finished task, by table -------------------------------------

pub const WAL_KEEP: &str = "alter system set wal_keep_size = '4GB'";
pub const WAL_KEEP_RESET: &str = "alter system reset wal_keep_size";
/// cycle: the worker its tasks are assigned to, of $1 slots, registered and never seen to
/// go.
pub const CYCLE_WORKER: &str =
    "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
    values ('bench-cycle', 'bench', 1, 'bench', 'bench_cycle', '{noop}', $1::int4)";
/// cycle: a round's assignment (and its wake-up) of the $1 first pending tasks to that worker.
pub const CYCLE_ASSIGN: &str = "with picked as (
        select id from artex.tasks where listed = 'pending' order by id limit $1
    )
    select count(task) from artex.assign_and_wake('bench', array(select id from picked),
        array_fill('bench-cycle'::text, array[(select count(*)::int from picked)]), 30, '{}')";
/// cycle: the tasks the worker holds, with their epochs (at most $1).
pub const CYCLE_HELD: &str = "select id, lease_epoch from artex.tasks
    where assigned_to = 'bench-cycle' and status = 'assigned' order by id limit $1";
/// cycle: tasks $1 at epochs $2 started 1 ms ago and succeeded, in one write.
pub const CYCLE_RECORD: &str = "select * from artex.record_attempts('bench-cycle', $1, $2,
    array_fill('succeeded'::text, array[cardinality($1::uuid[])]),
    array_fill(null::jsonb, array[cardinality($1::uuid[])]),
    array_fill(null::text, array[cardinality($1::uuid[])]),
    array_fill(false, array[cardinality($1::uuid[])]),
    array_fill(0::float8, array[cardinality($1::uuid[])]),
    array_fill(1::float8, array[cardinality($1::uuid[])]))";
/// cycle, the worker's path: its claim and read, up to $1 tasks of at most $2 bytes,
/// leaving out the tasks $3 at epochs $4 it holds (the worker's own statement).
pub const CYCLE_CLAIM: &str =
    "select id, lease_epoch, n from artex.claim_and_read_unknown('bench-cycle', $1, $2, false, $3, $4)";
/// programs: $2 tasks of kind $1, by plain SQL.
pub const INSERT_PROGRAM_TASKS: &str =
    "insert into artex.tasks (kind) select $1::text from generate_series(1, $2::int4)";
/// programs: at least $1 tasks running.
pub const RUNNING_AT_LEAST: &str =
    "select count(*) >= $1::int8 from artex.tasks where status = 'running'";
/// The WAL position, as text (for pg_waldump) and as bytes.
pub const WAL_LSN: &str = "select pg_current_wal_lsn()::text, (pg_current_wal_lsn() - '0/0')::int8";
/// Each relfilenode of artex's schema and the table it counts for: a partition as its
/// parent, an index as `<table>_indexes`, the stored history `task_history` under its
/// pre-V25 name `task_transitions` (so that figures compare).
pub const RELMAP: &str = "select c.relfilenode::int8,
        replace(coalesce(pp.relname, t.relname), 'task_history', 'task_transitions')
        || case when c.relkind = 'i' then '_indexes' else '' end
    from pg_class c
    left join pg_index i on i.indexrelid = c.oid
    left join pg_class t on t.oid = coalesce(i.indrelid, c.oid)
    left join pg_inherits h on h.inhrelid = t.oid
    left join pg_class pp on pp.oid = h.inhparent
    where c.relfilenode <> 0 and c.relnamespace = 'artex'::regnamespace";

// ---- api: submission through `artex serve` against plain SQL --------------------------------

/// A simulated worker row declaring the kind, as the API checks (no runtime runs).
pub const API_SIM_WORKER: &str =
    "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
    values ('sim-api', 'sim', 1, 'bench', 'artex_w_sim_api', array['noop'], 1)";

/// pgbench's script: `tasks` no-op tasks in one insert.
pub fn api_insert_script(tasks: u32) -> String {
    format!(
        "insert into artex.tasks (kind, payload) select 'noop', '{{}}' from generate_series(1, {tasks});\n"
    )
}

// ---- dash and replica: a busy hour's table --------------------------------------------------

/// $1 tasks as a busy hour leaves them: 90% succeeded, finished over the last hour, 5%
/// failed, 5% pending (with `REPLICA_ROLE`: the rows, not their lives).
pub const BUSY_HOUR: &str = "insert into artex.tasks (id, kind, status, created_at, updated_at,
        started_at, finished_at, error)
    select bench.uuid7(), (array['echo', 'resize', 'etl'])[1 + g % 3], s::artex.task_status,
        t - interval '2 s', t, case when s = 'pending' then null else t - interval '1 s' end,
        case when s = 'pending' then null else t end,
        case when s = 'failed' then 'bench failure' end
    from generate_series(1, $1::int4) g,
        lateral (select now() - interval '60 min' * (1 - g::float8 / $1::int4) as t,
                        case when g % 20 = 0 then 'failed' when g % 20 = 1 then 'pending'
                             else 'succeeded' end as s) x";
/// The busy hour's ends in the history, one row each (a start and an end, as a worker
/// writes them), dated as the tasks: what the overview's recent figures read (V69).
pub const BUSY_HOUR_HISTORY: &str = "insert into artex.task_history
        (task_id, from_status, to_status, reason, actor, worker, lease_epoch, at, kind,
         started_at, end_id)
    select id, 'assigned', status, error, 'bench', 'bench', 1, finished_at, kind,
        started_at, nextval('artex.history_id_seq')
    from artex.tasks where finished_at is not null order by id";
/// The tasks and their history as autovacuum would leave them (unanalyzed history makes
/// PostgreSQL guess a lookup of a task's rows at thousands of them, and compile a page's
/// statement with JIT: half a second).
pub const VACUUM_ANALYZE_TASKS: &str = "vacuum analyze artex.tasks, artex.task_history";
/// Tasks by status, in status order (the dash part's context line).
pub const STATUSES: &str = "select string_agg(status || ' ' || n, ', ')
    from (select status, count(*) n from artex.tasks group by 1 order by 1) c";
/// The busy hour's pending tasks held (with `REPLICA_ROLE`), so that W1's workers run only
/// W1's tasks.
pub const PAUSE_PENDING: &str = "update artex.tasks set status = 'paused' where status = 'pending'";
/// The standby has replayed up to $1 (the primary's `WAL_LSN`).
pub const REPLAYED: &str = "select pg_last_wal_replay_lsn() >= $1::text::pg_lsn";
pub const IN_RECOVERY: &str = "select pg_is_in_recovery()::text";
/// Tasks/s of a W1 of $1 tasks started at $2 (Unix seconds): its own no-op tasks only.
pub const REPLICA_W1_RATE: &str = "select
        ($1::int4 / (extract(epoch from max(finished_at)) - $2::float8))::float8
    from artex.tasks
    where kind = 'noop' and status = 'succeeded' and finished_at > to_timestamp($2::float8)";

// ---- upload and upgrade: a worker's address ---------------------------------------------

/// The HTTP address of process $1's worker, once it is online.
pub const WORKER_HTTP: &str =
    "select http_addr from artex.workers where pid = $1::int4 and state = 'online'";

// ---- fleet ---------------------------------------------------------------------------------

/// The cluster's client backends but the one asking.
pub const CLIENT_BACKENDS: &str = "select count(*) from pg_stat_activity
    where backend_type = 'client backend' and pid <> pg_backend_pid()";

// ---- fair: fair dispatch between tenants ---------------------------------------------------

/// `sleep` the fleet's fair kind: round-robin across its limit keys (V43).
pub const FAIR_SET: &str = "insert into artex.kind_limits (kind, fair, updated_by)
    values ('sleep', true, 'bench')";
/// $1 `sleep` tasks with the limit key $3, each of $2 ms give or take up to $4 ms
/// (uniformly, whole ms; $4 = 0: all of $2 ms).
pub const FAIR_BACKLOG: &str = "insert into artex.tasks (kind, payload, limit_key)
    select 'sleep',
           jsonb_build_object('ms', $2::int4 - $4::int4
                                    + floor(random() * (2 * $4::int4 + 1))::int4),
           $3::text
    from generate_series(1, $1::int4)";
/// One `sleep` task of $1 ms of the key `small`.
pub const FAIR_ONE: &str = "insert into artex.tasks (kind, payload, limit_key)
    values ('sleep', jsonb_build_object('ms', $1::int4), 'small')";
/// The `small` key's tasks: how many have started, and their waits' median (creation to
/// first start), ms.
pub const FAIR_SMALL_WAIT: &str = "select count(started_at),
        (percentile_cont(0.5) within group (order by
            extract(epoch from started_at - created_at) * 1000))::float8
    from artex.tasks where limit_key = 'small'";
/// The small key's wait in two parts, medians in ms: creation to assignment (the round's
/// transaction start, as its history row records it) and assignment to start.
pub const FAIR_SMALL_WAIT_PARTS: &str = "select
        (percentile_cont(0.5) within group (order by
            extract(epoch from h.assigned_at - t.created_at) * 1000))::float8,
        (percentile_cont(0.5) within group (order by
            extract(epoch from t.started_at - h.assigned_at) * 1000))::float8
    from artex.tasks t join artex.task_history h on h.task_id = t.id
    where t.limit_key = 'small' and h.assigned_at is not null";
/// Tasks started between $1 and $2 (Unix seconds).
pub const FAIR_STARTED_BETWEEN: &str = "select count(*) from artex.tasks
    where started_at >= to_timestamp($1::float8) and started_at < to_timestamp($2::float8)";

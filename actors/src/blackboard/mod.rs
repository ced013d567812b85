//! The blackboard: the one shared, transactional state. ALL of artex's SQL lives in this
//! module tree, sent unnamed through `sql.rs` (so that a transaction pooler carries it);
//! nothing else in the runtime writes SQL.
//!
//! # Role handles
//! [`Blackboard`] is the connection (pools, and what opens LISTEN sessions); what may be
//! run on it is reached through the handle of one role, each exposing only that role's
//! statements, each statement in its role's file:
//!
//! | handle | who holds it | its statements |
//! |---|---|---|
//! | [`PlannerBoard`] ([`Blackboard::planner`]) | Scanner, Assigner, Reaper, ShardKeeper | `planner/`: dispatch rounds, reaper sweeps, shard leases |
//! | [`WorkerBoard`] ([`Blackboard::worker`]) | a worker process: its actor, handlers, uploads, hot upgrade | `worker/`: registration, heartbeats, intake, outcomes, leases, checkpoints, task transfer, uploads |
//! | [`OperatorBoard`] ([`Blackboard::operator`]) | the CLI, the HTTP API, the dashboard | `operator/`: submit, read, list, control, retry, roster, statistics, input limits |
//! | [`ReadBoard`] ([`OperatorBoard::reads`], [`Replica::reads`]) | the same, for reads a streaming replica may serve | `operator/replica.rs`: the operator's reads only, the replica's lag |
//! | [`FeedBoard`] ([`Blackboard::feed`]) | `/events`, `events tail`, followers | `feed/`: history after a position, cursors, the head, logical decoding |
//! | [`MaintenanceBoard`] ([`Blackboard::maintenance`]) | the planner's Maintenance, `artex migrate`, start-up checks | `maintenance.rs` (history partitions, pruning, retention) and `migrate.rs` (the schema) |
//!
//! Each role's module says which of its statements need a session (a LISTEN, a
//! replication slot, a migration's advisory lock) and which are one transaction: the line
//! along which a transaction pooler can carry them.
//!
//! Shared types live beside the roles: `tasks.rs` (a task and its history as read),
//! `flows/` (a flow as submitted and as read), `inputs.rs` (the limit and the kinds a submission is checked against),
//! `carried.rs` (what a wake-up carries), `schedules.rs` (a schedule as read), `listen.rs` (LISTEN sessions), `admin.rs`
//! (databases made and dropped, for the embedded cluster and tests).
//!
//! Correctness comes from row locks, `skip locked` and compare-and-set updates fenced by
//! the lease epoch, at PostgreSQL's default READ COMMITTED isolation; see docs/design.md,
//! section 6 ("Where the seeds are folklore — do better, and prove it").

pub mod admin;
pub mod carried;
pub mod feed;
mod flows;
mod inputs;
mod listen;
pub mod maintenance;
mod migrate;
mod migrations;
pub mod operator;
pub mod planner;
pub(crate) mod primary;
mod schedules;
mod sql;
mod tasks;
pub mod worker;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub(crate) use sql::{Conn, Tx};

pub use feed::{
    parse_change, ConsumerCursor, DecodedTransaction, EventBatch, EventFeed, EventPosition,
    FeedBoard, FeedStart, Retention, RowChange, TaskEvent, EVENTS_CHANNEL,
};
pub use flows::{
    Control, ControlReport, ControlTarget, FlowSpec, FlowState, FlowTaskSpec, FlowTaskView,
    FlowView, WaitSpec, WaitView,
};
pub use inputs::{KnownKind, Limits, DEFAULT_MAX_PAYLOAD_BYTES};
pub use listen::{ListenEvent, ListenSession, Listener, Notification};
pub use maintenance::MaintenanceBoard;
pub use migrate::{
    check_range, fingerprint, needed, Applied, Change, Migration, MigrationReport, Needed,
    SchemaMismatch, SchemaStatus, MIGRATIONS,
};
pub use operator::submit_in;
pub use operator::{check_token_name, LiveToken, TokenInfo, TokenScope, MAX_TOKEN_NAME_CHARS};
pub use operator::{
    parse_rate, rate_text, BulkAction, BulkReport, KindChange, KindLimit, KindPause, LimitSpec,
    BULK_BATCH, MAX_PAUSE_REASON_CHARS, MAX_RATE_PER_SEC,
};
pub use operator::{
    FleetSample, FlowSummary, MinuteCount, OperatorBoard, Percentiles, ReadBoard, RecentStats,
    Replica, ReplicaLag, Stats, Submitted, TaskFilter, WalPosition, WorkerView,
    DEFAULT_READ_MAX_LAG, RECENT_SAMPLE, SCHEDULES_LISTED, STATUS_COUNT_CAP,
};
pub use operator::{SignalOutcome, SignalReport};

/// The hot path's plan-cached functions (migrations/V16__plan_cached_hot_path.sql) and
/// the calls artex sends them: (function in schema `artex`, call). Each statement is
/// written once, as the function's body (migrations/schema.sql); tests read it from
/// `pg_proc` to EXPLAIN it.
pub fn hot_calls() -> Vec<(&'static str, &'static str)> {
    planner::HOT_CALLS
        .iter()
        .chain(worker::HOT_CALLS.iter())
        .copied()
        .collect()
}
pub use planner::{
    agree_count, AssignReport, Assignment, Claimed, CountAgreement, FiredSlot, KeptRoster,
    PlannerBoard, Push, ReapParams, ReapReport, RosterEntry, Round, ScheduleTurn, ShardBoard,
    ShardRow, StrandedTask, TakenShard, WaitEnded, DEFAULT_SHARD_COUNT, ROSTER_KEPT, WALK_EVERY,
};
pub use primary::{is_loopback_name, is_remote, mask_password};
pub use schedules::ScheduleRow;
pub use tasks::{CutValue, TaskPreview, TaskRow, TaskStatus, TransitionRow};
// What a submission is, and its rules, live in `crate::submission`; named here too, where
// the library's users have always found them.
pub use crate::submission::{
    check_kind, check_payload, payload_text_len, NewTask, KIND_CHARSET, MAX_KIND_BYTES,
};
pub use worker::{
    AssignedRead, AssignedTask, AttemptRecord, Beat, KindPolicies, NewUpload, Outcome,
    ProgressEvent, ProgressNote, Recorded, Registration, Renewal, Step, UploadRow, WorkerBoard,
    WorkerState, MAX_PROGRESS_MESSAGE_CHARS, PROGRESS_CHANNEL,
};

use crate::error::{Error, Result};

/// The NOTIFY channel on which new runnable tasks are announced (by the table's trigger).
pub const TASKS_CHANNEL: &str = "artex_tasks";
/// The payload of a [`TASKS_CHANNEL`] notification sent by an insert of runnable tasks
/// (migrations/V52); freed capacity and tasks back to `pending` send an empty one.
pub const NEW_TASKS: &str = "new";
/// The payload of a [`TASKS_CHANNEL`] notification sent by an insert of runnable tasks
/// of which one is of a limited kind (migrations/V63): no worker claims it, so the
/// planners run a round at once instead of waking a worker to claim first.
pub const NEW_LIMITED_TASKS: &str = "new limited";

/// The prefix of a [`TASKS_CHANNEL`] payload saying when pending tasks not yet runnable
/// fall due (migrations/V57: an insert's, a worker's retries and snoozes): [`DUE_AT`]
/// and that time, in milliseconds since the Unix epoch ([`due_at`]).
pub const DUE_AT: &str = "at:";

/// The [`DUE_AT`] payload for `at`.
pub fn due_at(at: std::time::SystemTime) -> String {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{DUE_AT}{ms}")
}

/// The time a [`DUE_AT`] payload names; `None` for any other payload.
pub fn parse_due_at(payload: &str) -> Option<std::time::SystemTime> {
    time_after(payload, DUE_AT)
}

/// The time in milliseconds since the Unix epoch that follows `prefix` in `payload`.
fn time_after(payload: &str, prefix: &str) -> Option<std::time::SystemTime> {
    let ms: u64 = payload.strip_prefix(prefix)?.parse().ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms))
}

/// The prefix of a [`TASKS_CHANNEL`] payload that says when a flow's wait just reached
/// falls due (migrations/V61): `wait-at:` and the time, in milliseconds since the Unix
/// epoch. For the planners' Scheduler, which ends due waits.
pub const WAIT_AT: &str = "wait-at:";

/// The time a [`WAIT_AT`] payload names; `None` for any other payload.
pub fn parse_wait_at(payload: &str) -> Option<std::time::SystemTime> {
    time_after(payload, WAIT_AT)
}

/// The prefix of the payload on `artex_wake` that says tasks were born assigned to a
/// worker woken over HTTP (migrations/V62): `given:` and the JSON array [worker id, the
/// push's payload] (the tasks carried, or empty for a plain wake-up).
pub const GIVEN: &str = "given:";

/// The worker and the push's payload a [`GIVEN`] payload names; `None` for any other
/// payload, or one that is not that JSON.
pub fn parse_given(payload: &str) -> Option<(String, String)> {
    serde_json::from_str(payload.strip_prefix(GIVEN)?).ok()
}

/// The payload of the notification a worker gets on its channel when a task it holds is
/// canceled (by the flow trigger): stop that task's handler now.
pub const CANCEL_PAYLOAD: &str = "cancel";

/// Deadlines and sizes toward PostgreSQL: whatever the server or the network does, no
/// call of artex waits for ever, and no process opens more connections than its budget.
#[derive(Debug, Clone, Copy)]
pub struct DbLimits {
    /// Connections in the durable pool (the relaxed pool has two more).
    pub pool_size: usize,
    /// How long to reach the server and log in: TCP connect plus the start-up exchange.
    pub connect_timeout: Duration,
    /// How long a caller waits for a free connection of the pool.
    pub pool_wait: Duration,
    /// A statement of artex that runs longer is cancelled (by a cancel request: see
    /// `sql.rs`; migrations lift it for their own transaction).
    pub statement_timeout: Duration,
}

impl Default for DbLimits {
    fn default() -> Self {
        DbLimits {
            pool_size: 4,
            connect_timeout: Duration::from_secs(5),
            pool_wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        }
    }
}

/// A dead peer (a host gone, a cable cut) shows as silence, not as an error: the kernel
/// probes an idle connection after this long…
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// …every this long, this many times, and gives up on data left unacknowledged this long.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle on the blackboard: two small pools (durable writes; relaxed writes for
/// heartbeats, lease renewals and wake-ups) and what is needed to open LISTEN sessions.
/// The pools keep no session state (see `sql.rs`): they work through a transaction
/// pooler as well as directly.
#[derive(Clone)]
pub struct Blackboard {
    pool: Pool,
    relaxed: Pool,
    /// Where LISTEN sessions connect: the pools' URL, or [`Blackboard::listening_at`]'s.
    listen_config: tokio_postgres::Config,
    limits: DbLimits,
    /// What a LISTEN session sets right after logging in (see [`session_settings`]).
    settings: String,
    /// When the server last answered a statement of these pools.
    heard: Arc<sql::Heard>,
    /// The pools' hosts, as `primary` keys the server they last reached.
    hosts: String,
    /// Every server the URL names is on another host (see [`is_remote`]).
    remote: bool,
}

impl std::fmt::Debug for Blackboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blackboard")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl Blackboard {
    /// Prepares pools for `url` (no connection is made until first use) with the default
    /// [`DbLimits`] and `pool_size` connections in the durable pool.
    pub fn connect(url: &str, pool_size: usize) -> Result<Self> {
        Blackboard::connect_with(
            url,
            DbLimits {
                pool_size,
                ..DbLimits::default()
            },
        )
    }

    /// Prepares pools for `url` within `limits` (no connection is made until first use).
    pub fn connect_with(url: &str, limits: DbLimits) -> Result<Self> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| Error::Url(format!("{e} (in {})", mask_password(url))))?;
        if config.get_application_name().is_none() {
            config.application_name("artex");
        }
        keep_alive(&mut config, &limits);
        primary::share_deadlines(&mut config, &limits);
        let pool = build_pool(config.clone(), limits.pool_size, &limits)?;
        // Heartbeats, lease renewals and wake-ups have two connections of their own, so
        // that a busy durable pool never delays the proof that a worker is alive.
        let relaxed = build_pool(config.clone(), 2, &limits)?;
        let hosts = primary::host_list(&config);
        let remote = primary::config_is_remote(&config);
        Ok(Blackboard {
            pool,
            relaxed,
            listen_config: config,
            settings: session_settings(&limits),
            limits,
            heard: sql::Heard::new(),
            hosts,
            remote,
        })
    }

    /// The same blackboard, opening its LISTEN sessions through `url` (one whose
    /// connections keep their session) while its pools use the first URL: a transaction
    /// pooler carries every statement but cannot carry a LISTEN.
    pub fn listening_at(mut self, url: &str) -> Result<Self> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| Error::Url(format!("{e} (in {})", mask_password(url))))?;
        if config.get_application_name().is_none() {
            config.application_name("artex");
        }
        keep_alive(&mut config, &self.limits);
        self.listen_config = config;
        Ok(self)
    }

    /// Whether every server the URL names is on another host: a worker whose wake-up
    /// address is loopback is then out of the planners' reach.
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result {
        self.client().await?.batch("select 1").await
    }

    /// The planner's handle: dispatch rounds, reaper sweeps, shard leases.
    pub fn planner(&self) -> PlannerBoard {
        PlannerBoard { bb: self.clone() }
    }

    /// A worker process's handle: its registration, intake, outcomes, leases, task
    /// transfer and uploads.
    pub fn worker(&self) -> WorkerBoard {
        WorkerBoard { bb: self.clone() }
    }

    /// An operator's handle (CLI, HTTP API, dashboard): submit, read, list, control.
    pub fn operator(&self) -> OperatorBoard {
        OperatorBoard { bb: self.clone() }
    }

    /// The change feed's handle: the history in final order, cursors, LISTEN sessions.
    pub fn feed(&self) -> FeedBoard {
        FeedBoard { bb: self.clone() }
    }

    /// Maintenance's handle: the schema and the history's bounds.
    pub fn maintenance(&self) -> MaintenanceBoard {
        MaintenanceBoard { bb: self.clone() }
    }

    /// How long ago PostgreSQL last answered a statement of this blackboard's pools (its
    /// clones' included), if it ever did.
    pub fn last_answer(&self) -> Option<Duration> {
        self.heard.ago()
    }

    /// The server (`host:port`) the pools' newest connection reached: the primary this
    /// process writes to, as of its last log-in (`None` before the first).
    pub fn last_server(&self) -> Option<String> {
        primary::last_server(&self.hosts)
    }

    /// A connection of the durable pool.
    pub(crate) async fn client(&self) -> Result<Conn> {
        Ok(Conn::new(
            self.pool.get().await?,
            self.limits.statement_timeout,
            self.heard.clone(),
        ))
    }

    /// A connection of the relaxed pool: run its statements with [`Conn::relaxed`].
    pub(crate) async fn relaxed_client(&self) -> Result<Conn> {
        Ok(Conn::new(
            self.relaxed.get().await?,
            self.limits.statement_timeout,
            self.heard.clone(),
        ))
    }
}

/// The settings a LISTEN session runs with, as one batch of `set`s sent right after
/// logging in (before its `listen`). A LISTEN session is a session by nature — its own
/// connection to the server, never a transaction pooler's — so it may `set`; the pools
/// do not (see `sql.rs`). They are not sent as the `options` startup parameter, which
/// PostgreSQL takes but poolers do not: pgbouncer closes the connection ("unsupported
/// startup parameter: options").
///
/// The server probes its side of TCP too: a backend whose client vanished without a word
/// (a host cut off) ends, and with it what the client held.
fn session_settings(limits: &DbLimits) -> String {
    format!(
        "set statement_timeout = {}; set idle_in_transaction_session_timeout = {}; \
         set tcp_keepalives_idle = {}; set tcp_keepalives_interval = {}; \
         set tcp_keepalives_count = {}",
        limits.statement_timeout.as_millis(),
        sql::IDLE_IN_TRANSACTION_TIMEOUT.as_millis(),
        KEEPALIVE_IDLE.as_secs(),
        KEEPALIVE_INTERVAL.as_secs(),
        KEEPALIVE_RETRIES
    )
}

/// Deadlines toward the server on `config`'s connections: the connect timeout, and TCP
/// keepalives, so that a dead peer shows as an error, not as silence.
fn keep_alive(config: &mut tokio_postgres::Config, limits: &DbLimits) {
    config
        .connect_timeout(limits.connect_timeout)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
}

fn build_pool(config: tokio_postgres::Config, size: usize, limits: &DbLimits) -> Result<Pool> {
    let note_server = primary::note_server(&config, limits.connect_timeout);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(limits.pool_wait))
        // Creating covers the whole log-in, which the connect timeout does not.
        .create_timeout(Some(limits.connect_timeout))
        .recycle_timeout(Some(limits.connect_timeout))
        .post_create(note_server)
        .pre_recycle(primary::drop_condemned())
        .build()
        .map_err(|e| Error::Url(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::{due_at, parse_due_at, parse_given, parse_wait_at};

    #[test]
    fn a_due_time_survives_its_payload_to_the_millisecond_and_nothing_else_parses() {
        let at = UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        assert_eq!(due_at(at), "at:1765000000123");
        assert_eq!(parse_due_at(&due_at(at)), Some(at));
        // What V57's trigger sends: floor(epoch * 1000), the same form.
        let rounded = at + Duration::from_micros(900);
        assert_eq!(parse_due_at(&due_at(rounded)), Some(at));
        for other in [
            "",
            "new",
            "at:",
            "at:-5",
            "at:1.5",
            "at: 12",
            "cancel:w1",
            "12",
            "wait-at:12",
        ] {
            assert_eq!(parse_due_at(other), None, "{other:?}");
        }
        // V61's wait payload: the same time after its own prefix, and only that.
        assert_eq!(parse_wait_at("wait-at:1765000000123"), Some(at));
        for other in ["at:1765000000123", "wait-at:", "wait-at:x", "new", ""] {
            assert_eq!(parse_wait_at(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_given_payload_names_its_worker_whatever_its_id_and_nothing_else_parses() {
        let given = |w: &str, p: &str| Some((w.to_string(), p.to_string()));
        assert_eq!(parse_given(r#"given:["h:1:a", ""]"#), given("h:1:a", ""));
        // A worker id may hold any character; the payload is the carried tasks' JSON.
        assert_eq!(
            parse_given(r#"given:["a\"]:b\n", "[[\"x\"]]"]"#),
            given("a\"]:b\n", r#"[["x"]]"#)
        );
        for other in [
            "given:",
            "given:w1",
            r#"given:["w1"]"#,
            "cancel:w1",
            r#"["w", ""]"#,
        ] {
            assert_eq!(parse_given(other), None, "{other:?}");
        }
    }
}

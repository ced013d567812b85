//! The blackboard: the one shared, transactional state. ALL of artex's SQL lives in this
//! module tree, prepared through deadpool's statement cache; nothing else in the runtime
//! writes SQL.
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
//! | [`FeedBoard`] ([`Blackboard::feed`]) | `/events`, `events tail`, followers | `feed/`: history after a position, cursors, the head, logical decoding |
//! | [`MaintenanceBoard`] ([`Blackboard::maintenance`]) | the planner's Maintenance, `artex migrate`, start-up checks | `maintenance.rs` (history partitions, pruning, retention) and `migrate.rs` (the schema) |
//!
//! Each role's module says which of its statements need a session (a LISTEN, a
//! replication slot, a migration's advisory lock) and which are one transaction: the line
//! along which a transaction pooler can carry them.
//!
//! Shared types live beside the roles: `tasks.rs` (a task and its history as read),
//! `flows/` (a flow as submitted and as read), `inputs.rs` (the limit and the kinds a submission is checked against),
//! `carried.rs` (what a wake-up carries), `listen.rs` (LISTEN sessions), `admin.rs`
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
pub mod operator;
pub mod planner;
pub(crate) mod primary;
mod tasks;
pub mod worker;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{
    ClientWrapper, Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod,
};
use tokio_postgres::NoTls;

pub use feed::{
    parse_change, ConsumerCursor, DecodedTransaction, EventBatch, EventFeed, EventPosition,
    FeedBoard, FeedStart, Retention, RowChange, TaskEvent, EVENTS_CHANNEL,
};
pub use flows::{
    Control, ControlReport, ControlTarget, FlowSpec, FlowState, FlowTaskSpec, FlowTaskView,
    FlowView,
};
pub use inputs::{KnownKind, Limits, DEFAULT_MAX_PAYLOAD_BYTES};
pub use listen::{ListenEvent, ListenSession, Listener, Notification};
pub use maintenance::MaintenanceBoard;
pub use migrate::{
    check_range, fingerprint, needed, Applied, Change, Migration, MigrationReport, Needed,
    SchemaMismatch, SchemaStatus, MIGRATIONS,
};
pub use operator::{
    FlowSummary, MinuteCount, OperatorBoard, Percentiles, RecentStats, Stats, TaskFilter,
    WorkerView, RECENT_SAMPLE, STATUS_COUNT_CAP,
};
pub use planner::DISPATCH as DISPATCH_SQL;
pub use planner::{
    agree_count, AssignReport, Assignment, Claimed, CountAgreement, PlannerBoard, ReapParams,
    ReapReport, RosterEntry, ShardBoard, ShardRow, StrandedTask, TakenShard, DEFAULT_SHARD_COUNT,
};
pub use primary::mask_password;
pub use tasks::{CutValue, TaskPreview, TaskRow, TaskStatus, TransitionRow};
// What a submission is, and its rules, live in `crate::submission`; named here too, where
// the library's users have always found them.
pub use crate::submission::{
    check_kind, check_payload, payload_text_len, NewTask, KIND_CHARSET, MAX_KIND_BYTES,
};
pub use worker::{
    AssignedRead, AssignedTask, AttemptRecord, NewUpload, Outcome, Registration, Step, UploadRow,
    WorkerBoard, WorkerState,
};

use crate::error::{Error, Result};

/// The NOTIFY channel on which new runnable tasks are announced (by the table's trigger).
pub const TASKS_CHANNEL: &str = "artex_tasks";

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
    /// The server cancels any statement of artex that runs longer (`statement_timeout`;
    /// migrations lift it for their own transaction).
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
/// A session left idle inside a transaction (a bug, a hung process) is ended by the
/// server after this long, so its row locks do not stall the fleet.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// A handle on the blackboard: two small pools (durable writes; relaxed writes for
/// heartbeats and lease renewals) and what is needed to open LISTEN sessions.
#[derive(Clone)]
pub struct Blackboard {
    pool: Pool,
    relaxed: Pool,
    config: tokio_postgres::Config,
    limits: DbLimits,
    /// What every session sets right after logging in (see [`session_settings`]).
    settings: String,
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
        config
            .connect_timeout(limits.connect_timeout)
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES)
            .tcp_user_timeout(TCP_USER_TIMEOUT);
        primary::share_deadlines(&mut config, &limits);
        let settings = session_settings(&limits);
        let pool = build_pool(config.clone(), limits.pool_size, &limits, settings.clone())?;
        // Heartbeats and lease renewals are rewritten every few seconds; losing the last
        // one in a crash costs nothing, so they do not wait for the WAL flush. Task
        // results never go through this pool.
        let relaxed = build_pool(
            config.clone(),
            2,
            &limits,
            format!("{settings}; set synchronous_commit = off"),
        )?;
        Ok(Blackboard {
            pool,
            relaxed,
            config,
            limits,
            settings,
        })
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result {
        let client = self.pool.get().await?;
        client.simple_query("select 1").await?;
        Ok(())
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

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.pool.get().await?)
    }

    pub(crate) async fn relaxed_client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.relaxed.get().await?)
    }
}

/// The settings every session of artex runs with, as one batch of `set`s sent right after
/// logging in (by the pools' `post_create` hook, and by a LISTEN session before its
/// `listen`). They used to go as the `options` startup parameter, which PostgreSQL takes
/// but poolers do not: pgbouncer closes the connection ("unsupported startup parameter:
/// options"), so artex could not be run through one at all. A `set` costs one round trip
/// per new connection, and holds through a direct connection and pgbouncer's session
/// mode alike (pgbouncer's `DISCARD ALL` at a client's end resets them, and the next
/// client sets its own).
///
/// The server probes its side of TCP too: a backend whose client vanished without a word
/// (a host cut off) ends, and with it what the client held (a worker's LISTEN session, by
/// which planners see it is there).
fn session_settings(limits: &DbLimits) -> String {
    format!(
        "set statement_timeout = {}; set idle_in_transaction_session_timeout = {}; \
         set tcp_keepalives_idle = {}; set tcp_keepalives_interval = {}; \
         set tcp_keepalives_count = {}",
        limits.statement_timeout.as_millis(),
        IDLE_IN_TRANSACTION_TIMEOUT.as_millis(),
        KEEPALIVE_IDLE.as_secs(),
        KEEPALIVE_INTERVAL.as_secs(),
        KEEPALIVE_RETRIES
    )
}

fn build_pool(
    config: tokio_postgres::Config,
    size: usize,
    limits: &DbLimits,
    settings: String,
) -> Result<Pool> {
    let deadline = limits.connect_timeout;
    let note_server = primary::note_server(&config, deadline);
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
        // Part of making a connection, so bounded like the log-in (which the pool's
        // create timeout covers, and its hooks not).
        .post_create(Hook::async_fn(move |client: &mut ClientWrapper, _| {
            let settings = settings.clone();
            Box::pin(async move {
                match tokio::time::timeout(deadline, client.batch_execute(&settings)).await {
                    Ok(set) => set.map_err(HookError::Backend),
                    Err(_) => Err(HookError::message(format!(
                        "database: PostgreSQL did not answer the session settings within \
                         the connect timeout ({deadline:?})"
                    ))),
                }
            })
        }))
        .post_create(note_server)
        .pre_recycle(primary::drop_condemned())
        .build()
        .map_err(|e| Error::Url(e.to_string()))
}

/// A pooled connection inside a transaction begun by hand (a pipelined `begin`). Unless
/// [`InTransaction::ended`] is called after the commit or rollback, dropping it — an
/// error path, a panic in a caller's closure, a future dropped mid-way — closes the
/// connection instead of handing it back to the pool inside the transaction (the server
/// then rolls the transaction back and frees its locks).
pub(crate) struct InTransaction(Option<deadpool_postgres::Client>);

impl InTransaction {
    /// `client`, about to begin a transaction.
    pub(crate) fn new(client: deadpool_postgres::Client) -> Self {
        InTransaction(Some(client))
    }

    /// The transaction ended: the connection may go back to the pool.
    pub(crate) fn ended(mut self) {
        self.0.take();
    }
}

impl std::ops::Deref for InTransaction {
    type Target = deadpool_postgres::Client;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("only `ended` takes the client, and it consumes self")
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            tracing::warn!("a transaction was abandoned; closing its connection");
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

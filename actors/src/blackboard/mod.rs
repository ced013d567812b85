//! The blackboard: the one shared, transactional state. ALL of artex's SQL lives in this
//! module tree (one file per party: tasks, planner, worker; flows, the events feed and
//! its logical decoding variant; LISTEN/NOTIFY), prepared through deadpool's statement
//! cache; nothing else in the runtime writes SQL.
//!
//! Correctness comes from row locks, `skip locked` and compare-and-set updates fenced by
//! the lease epoch, at PostgreSQL's default READ COMMITTED isolation; see docs/design.md,
//! section 6 ("Where the seeds are folklore — do better, and prove it").

pub mod admin;
mod events;
mod flows;
mod listen;
mod logical;
mod migrate;
mod planner;
mod tasks;
mod worker;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use events::{
    ConsumerCursor, EventBatch, EventFeed, EventPosition, FeedStart, Retention, TaskEvent,
    EVENTS_CHANNEL,
};
pub use flows::{
    Control, ControlReport, ControlTarget, FlowSpec, FlowState, FlowTaskSpec, FlowTaskView,
    FlowView,
};
pub use listen::{ListenEvent, ListenSession, Listener, Notification};
pub use logical::{parse_change, DecodedTransaction, RowChange};
pub use migrate::{fingerprint, Migration, MigrationReport, MIGRATIONS};
pub use planner::CLAIM as CLAIM_SQL;
pub use planner::{AssignReport, Assignment, Claimed, ReapParams, ReapReport, RosterEntry};
pub use tasks::{NewTask, TaskRow, TaskStatus, TransitionRow};
pub use worker::{AssignedTask, AttemptRecord, Outcome, Registration, Step, WorkerState};

use crate::error::{Error, Result};

/// The NOTIFY channel on which new runnable tasks are announced (by the table's trigger).
pub const TASKS_CHANNEL: &str = "artex_tasks";

/// The payload of the notification a worker gets on its channel when a task it holds is
/// canceled (by the flow trigger): stop that task's handler now.
pub const CANCEL_PAYLOAD: &str = "cancel";

/// A handle on the blackboard: two small pools (durable writes; relaxed writes for
/// heartbeats and lease renewals) and what is needed to open LISTEN sessions.
#[derive(Clone)]
pub struct Blackboard {
    pool: Pool,
    relaxed: Pool,
    config: tokio_postgres::Config,
}

impl std::fmt::Debug for Blackboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blackboard")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl Blackboard {
    /// Prepares pools for `url` (no connection is made until first use). `pool_size` is
    /// the durable pool's size; the relaxed pool has two connections.
    pub fn connect(url: &str, pool_size: usize) -> Result<Self> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| Error::Url(format!("{e} (in {})", mask_password(url))))?;
        if config.get_application_name().is_none() {
            config.application_name("artex");
        }
        config.connect_timeout(Duration::from_secs(10));
        let pool = build_pool(config.clone(), pool_size)?;
        let mut relaxed_cfg = config.clone();
        // Heartbeats and lease renewals are rewritten every few seconds; losing the last
        // one in a crash costs nothing, so they do not wait for the WAL flush. Task
        // results never go through this pool.
        relaxed_cfg.options("-c synchronous_commit=off");
        let relaxed = build_pool(relaxed_cfg, 2)?;
        Ok(Blackboard {
            pool,
            relaxed,
            config,
        })
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result {
        let client = self.pool.get().await?;
        client.simple_query("select 1").await?;
        Ok(())
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.pool.get().await?)
    }

    pub(crate) async fn relaxed_client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.relaxed.get().await?)
    }
}

fn build_pool(config: tokio_postgres::Config, size: usize) -> Result<Pool> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .build()
        .map_err(|e| Error::Url(e.to_string()))
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn mask_password(url: &str) -> String {
    // postgresql://user:secret@host/db → postgresql://user:***@host/db
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.find('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &rest[at..]
                );
            }
        }
    }
    let mut out = Vec::new();
    for part in url.split(['&', '?', ' ']) {
        if let Some(v) = part.strip_prefix("password=") {
            out.push((v, "***"));
        }
    }
    let mut masked = url.to_string();
    for (v, m) in out {
        masked = masked.replace(&format!("password={v}"), &format!("password={m}"));
    }
    masked
}

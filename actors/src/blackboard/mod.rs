//! The blackboard: the one shared, transactional state. ALL of artex's SQL lives in this
//! module tree (one file per party: tasks, planner, worker; flows, the events feed and
//! its logical decoding variant; inputs, what submitters may send), prepared through
//! deadpool's statement cache; nothing else in the runtime writes SQL.
//!
//! Correctness comes from row locks, `skip locked` and compare-and-set updates fenced by
//! the lease epoch, at PostgreSQL's default READ COMMITTED isolation; see SPEC.md §6.

pub mod admin;
mod events;
mod flows;
mod inputs;
mod logical;
mod migrate;
mod planner;
mod tasks;
mod worker;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

pub use events::{
    ConsumerCursor, EventBatch, EventFeed, EventPosition, FeedStart, Retention, TaskEvent,
    EVENTS_CHANNEL,
};
pub use flows::{
    Control, ControlReport, ControlTarget, FlowSpec, FlowState, FlowTaskSpec, FlowTaskView,
    FlowView,
};
pub use inputs::{
    check_kind, check_payload, payload_text_len, KnownKind, Limits, DEFAULT_MAX_PAYLOAD_BYTES,
    KIND_CHARSET, MAX_KIND_BYTES,
};
pub use logical::{parse_change, DecodedTransaction, RowChange};
pub use migrate::{fingerprint, Migration, MigrationReport, MIGRATIONS};
pub use planner::CLAIM as CLAIM_SQL;
pub use planner::{AssignReport, Assignment, Claimed, ReapParams, ReapReport, RosterEntry};
pub use tasks::{CutValue, NewTask, TaskPreview, TaskRow, TaskStatus, TransitionRow};
pub use worker::{Completion, Outcome, Registration, StartedTask};

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

    /// Opens a dedicated session that LISTENs on `channels`. LISTEN needs a session of its
    /// own (so pgbouncer must run in session mode for it); notifications are wake-up hints,
    /// never the record: when the session drops, `Listener::recv` returns `None` and the
    /// owner reconnects and rescans the tables.
    pub async fn listen(&self, channels: &[String]) -> Result<Listener> {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let saw_cancel = cancel.clone();
        let driver = tokio::spawn(async move {
            let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = stream.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if n.payload() == CANCEL_PAYLOAD {
                            // Set before the wake-up is sent, so its receiver sees it.
                            saw_cancel.store(true, Ordering::Release);
                        }
                        if tx.send(n.channel().to_string()).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "listening session ended");
                        break;
                    }
                }
            }
        });
        let mut sql = String::new();
        for c in channels {
            sql.push_str(&format!("listen \"{}\";", c.replace('"', "\"\"")));
        }
        client.batch_execute(&sql).await?;
        Ok(Listener {
            _client: client,
            rx,
            driver,
            cancel,
        })
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.pool.get().await?)
    }

    pub(crate) async fn relaxed_client(&self) -> Result<deadpool_postgres::Client> {
        Ok(self.relaxed.get().await?)
    }

    /// Sends the wake-ups of a hot-path write right after its commit (see
    /// migrations/V3__batched_hot_path.sql), in a transaction that does not wait for
    /// the WAL flush, on a task of its own: the writer goes on without waiting. A wake-up
    /// is a hint and its readers poll as well, so a failure is logged, not returned: the
    /// write it follows has committed.
    pub(crate) fn wake(&self, channels: &[&str]) {
        if channels.is_empty() {
            return;
        }
        let channels: Vec<String> = channels.iter().map(|c| c.to_string()).collect();
        let bb = self.clone();
        tokio::spawn(async move {
            let sent = async {
                let client = bb.relaxed_client().await?;
                let stmt = client
                    .prepare_cached("select count(pg_notify(c, '')) from unnest($1::text[]) c")
                    .await?;
                client.execute(&stmt, &[&channels]).await?;
                Ok::<_, Error>(())
            };
            if let Err(e) = sent.await {
                tracing::warn!(error = %e, ?channels, "cannot send wake-ups; readers will find the change at their next poll");
            }
        });
    }
}

/// A LISTEN session; see [`Blackboard::listen`].
pub struct Listener {
    _client: tokio_postgres::Client,
    rx: mpsc::UnboundedReceiver<String>,
    driver: tokio::task::JoinHandle<()>,
    cancel: Arc<AtomicBool>,
}

impl Listener {
    /// The next notification's channel, or `None` once the session is gone.
    pub async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await
    }

    /// Drops every notification already received (they all mean "look again").
    pub fn drain_pending(&mut self) -> usize {
        let mut n = 0;
        while self.rx.try_recv().is_ok() {
            n += 1;
        }
        n
    }

    /// Whether a notification with the payload `cancel` arrived since the last call (a
    /// task the listening worker holds was canceled; see migrations/V2__flows.sql).
    pub fn take_cancel(&self) -> bool {
        self.cancel.swap(false, Ordering::AcqRel)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.abort();
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

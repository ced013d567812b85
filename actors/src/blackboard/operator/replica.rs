//! Operators' reads from a streaming replica (a hot standby of the primary): lists, pages
//! and statistics can be served there, off the primary that the fleet writes to. A
//! [`Replica`] is a connection that only reads: it hands out a [`ReadBoard`] (the
//! operator's reads, and nothing that writes) and says how far behind the primary it
//! is; it never gives out the write handles, so no write can reach it by mistake.
//!
//! Read-your-writes rests on WAL positions: after an operator's write the primary's
//! position is read ([`OperatorBoard::written_position`]), and a read that must see it
//! asks the replica whether it has replayed that far ([`Replica::replayed`]). Every
//! statement here is one short transaction on a pooled connection.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::PgLsn;
use uuid::Uuid;

use super::{FlowSummary, OperatorBoard, Stats, TaskFilter, WorkerView};
use crate::blackboard::{
    Blackboard, DbLimits, FlowView, ScheduleRow, TaskPreview, TaskRow, TransitionRow,
};
use crate::error::{Error, Result};

/// Where the primary inserts its next WAL record: every transaction committed before
/// this statement ran has its commit record before it, whether or not the commit waited
/// for the flush (`synchronous_commit = off` acknowledges first), which the written
/// position above does not promise. NULL from a server in recovery, where the function
/// fails ("recovery is in progress": the fleet soak met it on the primary's connection
/// during a failover, and the API answered 500).
const INSERT_POSITION: &str =
    "select case when not pg_is_in_recovery() then pg_current_wal_insert_lsn() end";

/// The WAL's page size and page headers (PostgreSQL's defaults: `XLOG_BLCKSZ`,
/// `SizeOfXLogShortPHD`, `SizeOfXLogLongPHD` at a segment's first page).
const WAL_PAGE: u64 = 8192;
const SHORT_PAGE_HEADER: u64 = 24;
const LONG_PAGE_HEADER: u64 = 40;

/// Where the replica is: whether it is a standby at all, what it has replayed, and the
/// commit time of the last transaction replayed; with the replica's clock.
const REPLAY: &str = "select pg_is_in_recovery(), pg_last_wal_replay_lsn(),
        pg_last_xact_replay_timestamp(), now()";

/// Whether the replica has replayed the WAL up to `$1`.
const REPLAYED: &str = "select coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)";

/// A PostgreSQL WAL position (`pg_lsn`), as `16/B374D848`.
pub type WalPosition = PgLsn;

/// How far a replica is behind the primary, read from both.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaLag {
    /// Whether the replica is a standby replaying the primary's WAL (false: it is a
    /// primary itself, and the figures below are absent).
    pub in_recovery: bool,
    /// The primary's WAL position when asked (where its next record goes).
    #[serde(serialize_with = "text")]
    pub primary_lsn: WalPosition,
    /// What the replica has replayed.
    #[serde(serialize_with = "optional_text")]
    pub replay_lsn: Option<WalPosition>,
    /// WAL bytes the replica has still to replay (0 when it has caught up).
    pub lag_bytes: Option<u64>,
    /// How old what it shows is, ms: 0 when it has replayed everything the primary had
    /// written; otherwise the time since the commit of the last transaction it replayed
    /// (by the replica's clock), which is how long a write of the primary may be
    /// missing from its reads at most.
    pub lag_ms: Option<f64>,
    /// When the last transaction it replayed was committed on the primary.
    pub last_replayed_commit_at: Option<DateTime<Utc>>,
    /// When this was read (the replica's clock).
    pub at: DateTime<Utc>,
}

/// The insert position `insert` as the end of the record before it, which is how a
/// replica reports what it replayed. They differ at a page's start: there the insert
/// position points past the page's header, while the record before it ended at the page
/// boundary, so a replica that replayed everything would never reach it. Moving back by
/// a header is safe anywhere: no record ends in the bytes moved over except the last one
/// (a record is longer than a header).
fn record_end(insert: WalPosition) -> WalPosition {
    let at = u64::from(insert);
    match at % WAL_PAGE {
        SHORT_PAGE_HEADER => WalPosition::from(at - SHORT_PAGE_HEADER),
        LONG_PAGE_HEADER => WalPosition::from(at - LONG_PAGE_HEADER),
        _ => insert,
    }
}

fn text<S: serde::Serializer>(lsn: &WalPosition, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(lsn)
}

fn optional_text<S: serde::Serializer>(
    lsn: &Option<WalPosition>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match lsn {
        Some(lsn) => s.collect_str(lsn),
        None => s.serialize_none(),
    }
}

/// A blackboard on a streaming replica of the primary, for operators' reads only: it
/// gives out a [`ReadBoard`], never a handle that writes.
#[derive(Debug, Clone)]
pub struct Replica {
    bb: Blackboard,
    /// How far behind the primary it may be and still serve reads (`--read-max-lag`).
    max_lag: std::time::Duration,
}

/// The default of [`Replica::max_lag`] (`--read-max-lag`).
pub const DEFAULT_READ_MAX_LAG: std::time::Duration = std::time::Duration::from_secs(5);

impl Replica {
    /// Prepares pools for the replica at `url` within `limits` (no connection is made
    /// until first use). The relaxed pool of a [`Blackboard`] is never used here.
    pub fn connect_with(url: &str, limits: DbLimits) -> Result<Self> {
        Ok(Replica {
            bb: Blackboard::connect_with(url, limits)?,
            max_lag: DEFAULT_READ_MAX_LAG,
        })
    }

    /// The same replica, to serve reads only while it is at most `max_lag` behind the
    /// primary.
    pub fn with_max_lag(mut self, max_lag: std::time::Duration) -> Self {
        self.max_lag = max_lag;
        self
    }

    /// How far behind the primary it may be and still serve reads.
    pub fn max_lag(&self) -> std::time::Duration {
        self.max_lag
    }

    /// Checks the replica answers.
    pub async fn ping(&self) -> Result {
        self.bb.ping().await
    }

    /// Checks that this build runs against the schema the replica has replayed (the
    /// primary's): see [`crate::blackboard::MaintenanceBoard::check_schema`]. Reads only.
    pub async fn check_schema(&self) -> Result<crate::blackboard::SchemaStatus> {
        self.bb.maintenance().check_schema().await
    }

    /// The operator's reads, served by the replica.
    pub fn reads(&self) -> ReadBoard {
        ReadBoard {
            board: OperatorBoard {
                bb: self.bb.clone(),
            },
        }
    }

    /// Whether the replica has replayed the primary's WAL up to `lsn` (a position from
    /// [`OperatorBoard::written_position`]): its reads then show every write committed
    /// before it. False on a server that is no standby.
    pub async fn replayed(&self, lsn: WalPosition) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(client.query_one(REPLAYED, &[&lsn]).await?.try_get(0)?)
    }

    /// How far the replica is behind `primary` now.
    pub async fn lag(&self, primary: &OperatorBoard) -> Result<ReplicaLag> {
        // The primary first: a replica read after it is at least as far along as when
        // the primary was read, so the lag is never understated by the reads' order.
        // The insert position, not the written one: a commit acknowledged before its
        // record was written (`synchronous_commit = off`) is missing from the replica
        // as much as any other.
        let primary_lsn = primary.written_position().await?;
        self.lag_behind(primary_lsn).await
    }

    /// How far the replica is behind `primary_lsn`, a position of the primary read
    /// before this call ([`OperatorBoard::written_position`]): an error here is the
    /// replica's.
    pub async fn lag_behind(&self, primary_lsn: WalPosition) -> Result<ReplicaLag> {
        let client = self.bb.client().await?;
        let r = client.query_one(REPLAY, &[]).await?;
        let in_recovery: bool = r.try_get(0)?;
        let replay_lsn: Option<WalPosition> = r.try_get(1)?;
        let last_replayed_commit_at: Option<DateTime<Utc>> = r.try_get(2)?;
        let at: DateTime<Utc> = r.try_get(3)?;
        let lag_bytes =
            replay_lsn.map(|replayed| u64::from(primary_lsn).saturating_sub(u64::from(replayed)));
        let lag_ms = match (lag_bytes, last_replayed_commit_at) {
            (Some(0), _) => Some(0.0),
            (Some(_), Some(commit)) => Some(
                ((at - commit).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0).max(0.0),
            ),
            _ => None,
        };
        Ok(ReplicaLag {
            in_recovery,
            primary_lsn,
            replay_lsn,
            lag_bytes,
            lag_ms,
            last_replayed_commit_at,
            at,
        })
    }
}

impl OperatorBoard {
    /// A WAL position that a replica has replayed only once it shows every write
    /// committed before this call: to be read after an operator's write, and handed to
    /// [`Replica::replayed`] by the read that must show it.
    /// A server in recovery is no primary: [`Error::NotPrimary`], which counts as the
    /// database unreachable (the API's 503), and the pool's idle connections made until
    /// then are dropped, as after a demoted primary's refusal.
    pub async fn written_position(&self) -> Result<WalPosition> {
        let client = self.bb.client().await?;
        let insert: Option<WalPosition> =
            client.query_one(INSERT_POSITION, &[]).await?.try_get(0)?;
        let Some(insert) = insert else {
            let why = "the primary's connection reached a server in recovery (a standby, or \
                       one restarting): no WAL position to read there";
            // As for a demoted primary's refusal: its idle siblings lead there too.
            crate::blackboard::primary::lost(why);
            return Err(Error::NotPrimary(why.into()));
        };
        Ok(record_end(insert))
    }

    /// This handle's reads only, as a [`ReadBoard`] (the primary's, where no replica is
    /// configured).
    pub fn reads(&self) -> ReadBoard {
        ReadBoard {
            board: self.clone(),
        }
    }
}

/// An operator's reads and nothing else: lists, pages, one task or flow, the schedules,
/// the roster, statistics. Made by [`Replica::reads`] (served by a replica) or
/// [`OperatorBoard::reads`] (by the primary); it has no method that writes.
#[derive(Debug, Clone)]
pub struct ReadBoard {
    board: OperatorBoard,
}

impl ReadBoard {
    /// See [`OperatorBoard::task`].
    pub async fn task(&self, id: Uuid) -> Result<TaskRow> {
        self.board.task(id).await
    }

    /// See [`OperatorBoard::task_preview`].
    pub async fn task_preview(&self, id: Uuid, cut: i32) -> Result<TaskPreview> {
        self.board.task_preview(id, cut).await
    }

    /// See [`OperatorBoard::transitions`].
    pub async fn transitions(&self, id: Uuid) -> Result<Vec<TransitionRow>> {
        self.board.transitions(id).await
    }

    /// See [`OperatorBoard::tasks_page`].
    pub async fn tasks_page(&self, filter: &TaskFilter, cut: i32) -> Result<Vec<TaskPreview>> {
        self.board.tasks_page(filter, cut).await
    }

    /// See [`OperatorBoard::flows_page`].
    pub async fn flows_page(&self, after: Option<Uuid>, limit: i64) -> Result<Vec<FlowSummary>> {
        self.board.flows_page(after, limit).await
    }

    /// See [`OperatorBoard::flow`].
    pub async fn flow(&self, id: Uuid) -> Result<FlowView> {
        self.board.flow(id).await
    }

    /// See [`OperatorBoard::schedules`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        self.board.schedules().await
    }

    /// See [`OperatorBoard::schedule`].
    pub async fn schedule(&self, name: &str) -> Result<ScheduleRow> {
        self.board.schedule(name).await
    }

    /// See [`OperatorBoard::workers`].
    pub async fn workers(&self, limit: i64) -> Result<Vec<WorkerView>> {
        self.board.workers(limit).await
    }

    /// See [`OperatorBoard::stats`].
    pub async fn stats(&self, window_minutes: u32, now: Option<DateTime<Utc>>) -> Result<Stats> {
        self.board.stats(window_minutes, now).await
    }

    /// See [`OperatorBoard::stats_sampled`].
    pub async fn stats_sampled(
        &self,
        window_minutes: u32,
        now: Option<DateTime<Utc>>,
        sample: i64,
    ) -> Result<Stats> {
        self.board.stats_sampled(window_minutes, now, sample).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(lsn: &str) -> WalPosition {
        lsn.parse().expect("a WAL position")
    }

    #[test]
    fn an_insert_position_past_a_page_header_is_the_page_boundary() {
        // 0x2018 = a page of 8192 plus a short header; 0x4000000 starts a 16 MiB segment,
        // whose first page has the long header.
        assert_eq!(record_end(at("0/3002018")), at("0/3002000"));
        assert_eq!(record_end(at("0/4000028")), at("0/4000000"));
        assert_eq!(record_end(at("0/3000C88")), at("0/3000C88"));
    }
}

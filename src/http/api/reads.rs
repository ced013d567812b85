//! Where the API's reads go: the primary, or, with `--read-database-url`, a streaming
//! replica (lists, pages, one task or flow, the roster, statistics). Writes and the feed
//! always go to the primary.
//!
//! Read-your-writes across the replica: a write's answer carries the primary's WAL
//! position after it ([`WRITTEN_LSN`]); a read that sends it back ([`AFTER_LSN`]) is
//! served by the replica once the replica has replayed that far, which is waited for at
//! most [`READ_YOUR_WRITES_WAIT`], and by the primary otherwise. Every read's answer says
//! which served it ([`READ_FROM`]). See docs/design.md, "Operators read from a replica".
//!
//! Reads degrade, never fail, for the replica's sake: one that is unreachable, lagging
//! past `--read-max-lag` or no longer a standby serves nothing
//! ([`super::replica_health`]), and a read it fails for want of a connection, or
//! cancels to replay conflicting WAL, is made again on the primary.
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponseBuilder};
use artex_actors::blackboard::{OperatorBoard, ReadBoard, Replica, ReplicaLag, WalPosition};

use super::replica_health::{Fallback, Health, ReplicaHealth};
use super::ApiError;

/// PostgreSQL's codes for a statement a standby cancelled to replay WAL that
/// conflicted with it ("canceling statement due to conflict with recovery"):
/// `serialization_failure` (a snapshot, a lock, a tablespace) and `deadlock_detected` (a
/// buffer pin). The API's reads run at read committed, where neither comes otherwise.
const RECOVERY_CONFLICT: [&str; 2] = ["40001", "40P01"];

/// The header of a write's answer: the primary's WAL position once the write committed
/// (only with a replica configured).
pub const WRITTEN_LSN: &str = "Artex-Lsn";
/// The header of a read that must show every write up to this WAL position (a value of
/// [`WRITTEN_LSN`]).
pub const AFTER_LSN: &str = "Artex-After-Lsn";
/// The header of a read's answer: `replica` or `primary`, whichever served it.
pub const READ_FROM: &str = "Artex-Read-From";

/// How long a read that must show a write waits for the replica to replay it before the
/// primary serves it instead: long enough for a replica that keeps up (it replays within
/// milliseconds), short enough that an operator does not notice one that lags.
pub const READ_YOUR_WRITES_WAIT: Duration = Duration::from_millis(300);

/// How often the replica is asked whether it has replayed far enough, while waiting.
const REPLAY_POLL: Duration = Duration::from_millis(10);

/// Which server answered a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The primary: no replica configured, or it had not replayed a write asked for.
    Primary,
    /// The streaming replica.
    Replica,
}

impl ReadFrom {
    /// The [`READ_FROM`] header saying so.
    pub fn header(self) -> (&'static str, &'static str) {
        (
            READ_FROM,
            match self {
                ReadFrom::Primary => "primary",
                ReadFrom::Replica => "replica",
            },
        )
    }
}

/// The API's reads: the primary's, and a replica's when one is configured.
#[derive(Clone, Debug)]
pub struct Reads {
    primary: OperatorBoard,
    replica: Option<(Replica, Arc<Health>)>,
}

impl Reads {
    /// Reads served by `primary`, or by `replica` when there is one and it is well
    /// (checked in the background from now on: call within the runtime).
    pub fn new(primary: &OperatorBoard, replica: Option<Replica>) -> Self {
        let replica = replica.map(|replica| {
            let health = Arc::new(Health::new(replica.max_lag()));
            Health::watch(&health, primary.clone(), replica.clone());
            (replica, health)
        });
        Reads {
            primary: primary.clone(),
            replica,
        }
    }

    /// Runs `read` on the board [`Reads::board`] picks for `req`, and again on the
    /// primary if the replica fails it for want of a connection or cancels it for a
    /// conflict with its replay: says which board's answer it is.
    pub async fn read<T, F, Fut>(
        &self,
        req: &HttpRequest,
        read: F,
    ) -> Result<(T, ReadFrom), ApiError>
    where
        F: Fn(ReadBoard) -> Fut,
        Fut: Future<Output = artex_actors::Result<T>>,
    {
        let (board, from) = self.board(req).await?;
        let e = match read(board).await {
            Ok(v) => return Ok((v, from)),
            Err(e) => e,
        };
        let Some((_, health)) = self.replica.as_ref().filter(|_| from == ReadFrom::Replica) else {
            return Err(e.into());
        };
        let why = if e.is_connection() {
            health.lost(&e.to_string());
            Fallback::Unreachable
        } else if is_recovery_conflict(&e) {
            Fallback::Conflict
        } else {
            return Err(e.into());
        };
        health.fell_back(why);
        tracing::info!(error = %e, reason = why.label(), "a read failed on the replica; reading the primary");
        Ok((read(self.primary.reads()).await?, ReadFrom::Primary))
    }

    /// Where the read `req` goes: the replica if there is one and it is well, unless
    /// `req` asks for a WAL position ([`AFTER_LSN`]) the replica has not replayed within
    /// [`READ_YOUR_WRITES_WAIT`]. Prefer [`Reads::read`], which also falls back when the
    /// read itself fails on the replica.
    pub async fn board(&self, req: &HttpRequest) -> Result<(ReadBoard, ReadFrom), ApiError> {
        // Read with a replica or without: a malformed header is refused either way, so
        // a client learns of it before a replica is added.
        let after = after_lsn(req)?;
        let Some((replica, health)) = &self.replica else {
            return Ok((self.primary.reads(), ReadFrom::Primary));
        };
        if let Some(why) = health.unusable() {
            health.fell_back(why);
            return Ok((self.primary.reads(), ReadFrom::Primary));
        }
        let Some(after) = after else {
            return Ok((replica.reads(), ReadFrom::Replica));
        };
        let deadline = Instant::now() + READ_YOUR_WRITES_WAIT;
        loop {
            match replica.replayed(after).await {
                Ok(true) => return Ok((replica.reads(), ReadFrom::Replica)),
                Ok(false) => {}
                Err(e) if e.is_connection() => {
                    health.lost(&e.to_string());
                    health.fell_back(Fallback::Unreachable);
                    return Ok((self.primary.reads(), ReadFrom::Primary));
                }
                Err(e) => return Err(e.into()),
            }
            if Instant::now() + REPLAY_POLL > deadline {
                tracing::debug!(%after, "the replica has not replayed a write in time; reading the primary");
                return Ok((self.primary.reads(), ReadFrom::Primary));
            }
            tokio::time::sleep(REPLAY_POLL).await;
        }
    }

    /// Adds the [`WRITTEN_LSN`] header to the answer of a write that has committed (with
    /// a replica configured; without one every read sees every write). The write stands
    /// whatever happens here: a position that cannot be read is logged, and the answer
    /// goes without it.
    pub async fn written(&self, answer: &mut HttpResponseBuilder) {
        if self.replica.is_none() {
            return;
        }
        match self.primary.written_position().await {
            Ok(lsn) => {
                answer.insert_header((WRITTEN_LSN, lsn.to_string()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the primary's WAL position after a write")
            }
        }
    }

    /// How far the replica is behind the primary now; `None` without a replica, or
    /// when the replica does not answer (its [`Reads::health`] says why).
    pub async fn lag(&self) -> Result<Option<ReplicaLag>, ApiError> {
        let Some((replica, health)) = &self.replica else {
            return Ok(None);
        };
        // The primary's failure is the answer's; the replica's only makes it unknown.
        let primary_lsn = self.primary.written_position().await?;
        match replica.lag_behind(primary_lsn).await {
            Ok(lag) => Ok(Some(lag)),
            Err(e) if e.is_connection() => {
                health.lost(&e.to_string());
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The replica's state, its lag at the last check and the reads sent to the
    /// primary instead; `None` without a replica.
    pub fn health(&self) -> Option<ReplicaHealth> {
        self.replica.as_ref().map(|(_, health)| health.view())
    }
}

/// Whether `e` is a standby's cancel of a statement for a conflict with its replay.
fn is_recovery_conflict(e: &artex_actors::Error) -> bool {
    match e {
        artex_actors::Error::Db(db) => db
            .as_db_error()
            .is_some_and(|d| RECOVERY_CONFLICT.contains(&d.code().code())),
        _ => false,
    }
}

/// The WAL position the read `req` must show, if it names one (an empty header names
/// none).
fn after_lsn(req: &HttpRequest) -> Result<Option<WalPosition>, ApiError> {
    let Some(value) = req.headers().get(AFTER_LSN) else {
        return Ok(None);
    };
    if value.as_bytes().trim_ascii().is_empty() {
        return Ok(None);
    }
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<WalPosition>().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad(
                AFTER_LSN,
                format!(
                    "{AFTER_LSN}: {:?} is not a WAL position; expected the {WRITTEN_LSN} \
                     header of a write's answer, like 0/16B3748",
                    String::from_utf8_lossy(value.as_bytes())
                ),
            )
        })
}

//! Where the API's reads go: the primary, or, with `--read-database-url`, a streaming
//! replica (lists, pages, one task or flow, the roster, statistics). Writes and the feed
//! always go to the primary.
//!
//! Read-your-writes across the replica: a write's answer carries the primary's WAL
//! position after it ([`WRITTEN_LSN`]); a read that sends it back ([`AFTER_LSN`]) is
//! served by the replica once the replica has replayed that far, which is waited for at
//! most [`READ_YOUR_WRITES_WAIT`], and by the primary otherwise. Every read's answer says
//! which served it ([`READ_FROM`]). See docs/design.md, "Operators read from a replica".

use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponseBuilder};
use artex_actors::blackboard::{OperatorBoard, ReadBoard, Replica, ReplicaLag, WalPosition};

use super::ApiError;

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
    replica: Option<Replica>,
}

impl Reads {
    /// Reads served by `primary`, or by `replica` when there is one.
    pub fn new(primary: &OperatorBoard, replica: Option<Replica>) -> Self {
        Reads {
            primary: primary.clone(),
            replica,
        }
    }

    /// Where the read `req` goes: the replica if there is one, unless `req` asks for a
    /// WAL position ([`AFTER_LSN`]) the replica has not replayed within
    /// [`READ_YOUR_WRITES_WAIT`].
    pub async fn board(&self, req: &HttpRequest) -> Result<(ReadBoard, ReadFrom), ApiError> {
        // Read with a replica or without: a malformed header is refused either way, so
        // a client learns of it before a replica is added.
        let after = after_lsn(req)?;
        let Some(replica) = &self.replica else {
            return Ok((self.primary.reads(), ReadFrom::Primary));
        };
        let Some(after) = after else {
            return Ok((replica.reads(), ReadFrom::Replica));
        };
        let deadline = Instant::now() + READ_YOUR_WRITES_WAIT;
        loop {
            if replica.replayed(after).await? {
                return Ok((replica.reads(), ReadFrom::Replica));
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

    /// How far the replica is behind the primary; `None` without a replica.
    pub async fn lag(&self) -> Result<Option<ReplicaLag>, ApiError> {
        match &self.replica {
            None => Ok(None),
            Some(replica) => Ok(Some(replica.lag(&self.primary).await?)),
        }
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

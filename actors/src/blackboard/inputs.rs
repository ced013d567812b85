//! What the blackboard accepts from submitters (migrations/V4__input_limits.sql): the
//! payload size limit (`artex.limits`) and every kind a worker has declared
//! (`artex.kinds`, with its retry policy: migrations/V18), read here by every submitter (the operator's statements, and a worker's for an upload's
//! task) and set by the operator's (`operator/inputs.rs`).
//! The rules that use them are `crate::submission`'s.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Blackboard;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::submission::{Facts, Submission};

/// The payload size limit a fresh blackboard starts with: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: i32 = 1 << 20;

/// What the blackboard accepts (the row of `artex.limits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// The largest payload, in bytes of its JSON text.
    pub max_payload_bytes: i32,
    /// When the limits were last changed.
    pub updated_at: DateTime<Utc>,
}

/// A kind some worker has declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnownKind {
    /// The kind.
    pub kind: String,
    /// When a worker first registered with it.
    pub first_seen: DateTime<Utc>,
    /// When a worker last registered with it.
    pub last_seen: DateTime<Utc>,
    /// Its retry policy (`artex kind retry`); `None`: the fleet's default backoff.
    pub retry: Option<RetryPolicy>,
}

/// The limits; a row deleted by hand reads as the defaults (as `artex.max_payload_bytes()`).
const LIMITS: &str = "select artex.max_payload_bytes(),
        coalesce((select updated_at from artex.limits where only_row), now())";

/// The columns of a kind as [`kind_from_row`] reads them.
pub(crate) const KIND_COLUMNS: &str =
    "kind, first_seen, last_seen, retry_backoff, retry_base_ms, retry_cap_ms, retry_max_attempts";

/// Every kind a worker has declared, by name (a few hundred rows at most).
const KNOWN_KINDS: &str = "select kind, first_seen, last_seen, retry_backoff, retry_base_ms,
        retry_cap_ms, retry_max_attempts
    from artex.kinds order by kind";

/// A kind's row, its columns as [`KIND_COLUMNS`] names them.
pub(crate) fn kind_from_row(r: &tokio_postgres::Row) -> Result<KnownKind> {
    Ok(KnownKind {
        kind: r.try_get(0)?,
        first_seen: r.try_get(1)?,
        last_seen: r.try_get(2)?,
        retry: policy_from_row(r, 3)?,
    })
}

/// The retry policy in columns `at..at + 4` (backoff, base, cap, attempts) of `r`.
pub(crate) fn policy_from_row(r: &tokio_postgres::Row, at: usize) -> Result<Option<RetryPolicy>> {
    let Some(backoff) = r.try_get::<_, Option<String>>(at)? else {
        return Ok(None);
    };
    Ok(Some(RetryPolicy {
        backoff: backoff
            .parse()
            .map_err(|e| Error::Invalid(format!("artex.kinds.retry_backoff: {e}")))?,
        base_ms: r.try_get(at + 1)?,
        cap_ms: r.try_get(at + 2)?,
        max_attempts: r.try_get(at + 3)?,
    }))
}

impl Blackboard {
    /// The limits in force.
    pub(crate) async fn limits(&self) -> Result<Limits> {
        let client = self.client().await?;
        let row = client.query_one(LIMITS, &[]).await?;
        Ok(Limits {
            max_payload_bytes: row.try_get(0)?,
            updated_at: row.try_get(1)?,
        })
    }

    /// Every kind a worker has ever declared (recorded by the database at each
    /// registration), in name order.
    pub(crate) async fn known_kinds(&self) -> Result<Vec<KnownKind>> {
        let client = self.client().await?;
        let rows = client.query(KNOWN_KINDS, &[]).await?;
        rows.iter().map(kind_from_row).collect()
    }

    /// The facts checking `submission` needs (the known kinds only if some task needs
    /// them: every task allowed to be unregistered costs one query less). Reached through
    /// the boards of the roles that submit: [`OperatorBoard::submission_facts`], and
    /// [`WorkerBoard::submission_facts`] for an upload's task.
    ///
    /// [`OperatorBoard::submission_facts`]: super::OperatorBoard::submission_facts
    /// [`WorkerBoard::submission_facts`]: super::WorkerBoard::submission_facts
    pub(crate) async fn submission_facts(&self, submission: &Submission<'_>) -> Result<Facts> {
        let max_payload_bytes = self.limits().await?.max_payload_bytes;
        let known_kinds = if submission.needs_known_kinds() {
            self.known_kinds()
                .await?
                .into_iter()
                .map(|k| k.kind)
                .collect()
        } else {
            Vec::new()
        };
        Ok(Facts {
            max_payload_bytes,
            known_kinds,
        })
    }
}

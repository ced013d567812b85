//! What an operator reads and sets about inputs: the payload limit, the kinds some
//! worker declared (a submission of another kind is refused) and their retry policies;
//! the reads are shared with every submitter (`blackboard/inputs.rs`).

use super::OperatorBoard;
use crate::blackboard::inputs::{kind_from_row, KnownKind, Limits, KIND_COLUMNS};
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::submission::{Facts, Submission};

/// Changes the payload limit; the upsert puts back a row deleted by hand.
const SET_MAX_PAYLOAD_BYTES: &str = "insert into artex.limits (only_row, max_payload_bytes)
    values (true, $1)
    on conflict (only_row) do update set max_payload_bytes = excluded.max_payload_bytes,
        updated_at = now()";

// Sets or clears (all NULL) a kind's retry policy; the table's checks hold it whole and
// in range whoever writes it. A kind no worker declared has no row: nothing is written.
const SET_RETRY_POLICY: &str = "update artex.kinds
    set retry_backoff = $2, retry_base_ms = $3, retry_cap_ms = $4, retry_max_attempts = $5
    where kind = $1
    returning {KIND_COLUMNS}";

impl OperatorBoard {
    /// Sets `kind`'s retry policy (`None` clears it: the fleet's default applies again);
    /// returns the kind as it is now, or `None` when no worker has declared `kind`.
    /// Workers apply it within [`POLICY_REFRESH`](crate::worker::POLICY_REFRESH); the
    /// reaper at its next sweep. Refuses a policy out of range (`Error::Invalid`, naming
    /// the field).
    pub async fn set_retry_policy(
        &self,
        kind: &str,
        policy: Option<&RetryPolicy>,
    ) -> Result<Option<KnownKind>> {
        if let Some(p) = policy {
            p.check().map_err(|r| Error::Invalid(r.to_string()))?;
        }
        let client = self.bb.client().await?;
        let sql = SET_RETRY_POLICY.replace("{KIND_COLUMNS}", KIND_COLUMNS);
        let row = client
            .query_opt(
                &sql,
                &[
                    &kind,
                    &policy.map(|p| p.backoff.as_str()),
                    &policy.map(|p| p.base_ms),
                    &policy.map(|p| p.cap_ms),
                    &policy.and_then(|p| p.max_attempts),
                ],
            )
            .await?;
        row.as_ref().map(kind_from_row).transpose()
    }

    /// The limits in force.
    pub async fn limits(&self) -> Result<Limits> {
        self.bb.limits().await
    }

    /// Every kind a worker has ever declared (recorded by the database at each
    /// registration), in name order.
    pub async fn known_kinds(&self) -> Result<Vec<KnownKind>> {
        self.bb.known_kinds().await
    }

    /// What checking `submission` needs: see [`Facts`].
    pub async fn submission_facts(&self, submission: &Submission<'_>) -> Result<Facts> {
        self.bb.submission_facts(submission).await
    }

    /// Sets the payload limit (bytes of JSON text; the database refuses 0 or less).
    /// Applies to tasks inserted from now on; stored tasks are not rechecked.
    pub async fn set_max_payload_bytes(&self, bytes: i32) -> Result<Limits> {
        let client = self.bb.client().await?;
        client.execute(SET_MAX_PAYLOAD_BYTES, &[&bytes]).await?;
        drop(client);
        self.bb.limits().await
    }
}

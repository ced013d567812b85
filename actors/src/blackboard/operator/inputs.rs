//! What an operator reads and sets about inputs: the payload limit, and the kinds some
//! worker declared (a submission of another kind is refused); the reads are shared with
//! every submitter (`blackboard/inputs.rs`).

use super::OperatorBoard;
use crate::blackboard::inputs::{KnownKind, Limits};
use crate::error::Result;
use crate::submission::{Facts, Submission};

/// Changes the payload limit; the upsert puts back a row deleted by hand.
const SET_MAX_PAYLOAD_BYTES: &str = "insert into artex.limits (only_row, max_payload_bytes)
    values (true, $1)
    on conflict (only_row) do update set max_payload_bytes = excluded.max_payload_bytes,
        updated_at = now()";

impl OperatorBoard {
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

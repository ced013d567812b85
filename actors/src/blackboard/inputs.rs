//! What the blackboard accepts from submitters (migrations/V4__input_limits.sql): the
//! payload size limit (`artex.limits`) and every kind a worker has declared
//! (`artex.kinds`), read and set. The rules that use them are `crate::submission`'s.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Blackboard;
use crate::error::Result;

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
}

/// The limits; a row deleted by hand reads as the defaults (as `artex.max_payload_bytes()`).
const LIMITS: &str = "select artex.max_payload_bytes(),
        coalesce((select updated_at from artex.limits where only_row), now())";

/// Changes the payload limit; the upsert puts back a row deleted by hand.
const SET_MAX_PAYLOAD_BYTES: &str = "insert into artex.limits (only_row, max_payload_bytes)
    values (true, $1)
    on conflict (only_row) do update set max_payload_bytes = excluded.max_payload_bytes,
        updated_at = now()";

/// Every kind a worker has declared, by name (a few hundred rows at most).
const KNOWN_KINDS: &str = "select kind, first_seen, last_seen from artex.kinds order by kind";

impl Blackboard {
    /// The limits in force.
    pub async fn limits(&self) -> Result<Limits> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(LIMITS).await?;
        let row = client.query_one(&stmt, &[]).await?;
        Ok(Limits {
            max_payload_bytes: row.try_get(0)?,
            updated_at: row.try_get(1)?,
        })
    }

    /// Sets the payload limit (bytes of JSON text; the database refuses 0 or less).
    /// Applies to tasks inserted from now on; stored tasks are not rechecked.
    pub async fn set_max_payload_bytes(&self, bytes: i32) -> Result<Limits> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SET_MAX_PAYLOAD_BYTES).await?;
        client.execute(&stmt, &[&bytes]).await?;
        drop(client);
        self.limits().await
    }

    /// Every kind a worker has ever declared (recorded by the database at each
    /// registration), in name order.
    pub async fn known_kinds(&self) -> Result<Vec<KnownKind>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(KNOWN_KINDS).await?;
        let rows = client.query(&stmt, &[]).await?;
        rows.iter()
            .map(|r| {
                Ok(KnownKind {
                    kind: r.try_get(0)?,
                    first_seen: r.try_get(1)?,
                    last_seen: r.try_get(2)?,
                })
            })
            .collect()
    }
}

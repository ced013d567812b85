//! Paused task kinds (`artex kind pause|resume`, `/api/v1/kinds/{kind}/pause|resume`):
//! a paused kind's tasks stay pending — submissions are accepted, schedules fire, tasks
//! already handed out finish — until it is resumed. Planners leave the paused kinds out
//! of every round's claim (migrations/V38__kinds_paused.sql); each pause and resume is
//! audited with its reason in `artex.kind_changes`. The SQL is the database's own
//! (`artex.pause_kind`, `artex.resume_kind`), so plain SQL does the same.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OperatorBoard;
use crate::error::{Error, Result};
use crate::submission::check_kind;

/// The most characters a pause's or resume's reason may have (the column's check).
pub const MAX_PAUSE_REASON_CHARS: usize = 10_000;

const PAUSE: &str = "select artex.pause_kind($1, $2, $3)";
const RESUME: &str = "select artex.resume_kind($1, $2, $3)";
const PAUSED: &str = "select kind, reason, paused_by, paused_at from artex.kind_pauses
    where $1::text is null or kind = $1 order by kind";
const CHANGES: &str = "select change, reason, actor, at from artex.kind_changes
    where kind = $1 order by id desc limit $2";

/// A paused kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindPause {
    /// The kind.
    pub kind: String,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// Who paused it.
    pub paused_by: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
}

/// One pause or resume of a kind, from its audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindChange {
    /// `paused` or `resumed`.
    pub change: String,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// Who.
    pub actor: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// Why `kind` and `reason` cannot be written, naming the field.
fn check(kind: &str, reason: Option<&str>) -> Result {
    check_kind(kind).map_err(|e| Error::Invalid(format!("kind: {e}")))?;
    if reason.is_some_and(|r| r.contains('\0')) {
        return Err(Error::Invalid(
            "reason: contains the character \\u0000, which PostgreSQL cannot store".into(),
        ));
    }
    if let Some(n) = reason
        .map(|r| r.chars().count())
        .filter(|&n| n > MAX_PAUSE_REASON_CHARS)
    {
        return Err(Error::Invalid(format!(
            "reason: {n} characters; at most {MAX_PAUSE_REASON_CHARS}"
        )));
    }
    Ok(())
}

impl OperatorBoard {
    /// Pauses `kind` as `actor`: true if it was not paused already (a paused kind keeps
    /// its first pause and reason). A planner round in flight at the commit may still
    /// hand out what it had claimed.
    pub async fn pause_kind(&self, kind: &str, reason: Option<&str>, actor: &str) -> Result<bool> {
        check(kind, reason)?;
        let client = self.bb.client().await?;
        Ok(client
            .query_one(PAUSE, &[&kind, &reason, &actor])
            .await?
            .try_get(0)?)
    }

    /// Resumes `kind` as `actor` and wakes the planners: true if it was paused.
    pub async fn resume_kind(&self, kind: &str, reason: Option<&str>, actor: &str) -> Result<bool> {
        check(kind, reason)?;
        let client = self.bb.client().await?;
        Ok(client
            .query_one(RESUME, &[&kind, &reason, &actor])
            .await?
            .try_get(0)?)
    }

    /// The paused kinds by name (only `kind`'s, if given).
    pub async fn paused_kinds(&self, kind: Option<&str>) -> Result<Vec<KindPause>> {
        let client = self.bb.client().await?;
        client
            .query(PAUSED, &[&kind])
            .await?
            .iter()
            .map(|r| {
                Ok(KindPause {
                    kind: r.try_get(0)?,
                    reason: r.try_get(1)?,
                    paused_by: r.try_get(2)?,
                    paused_at: r.try_get(3)?,
                })
            })
            .collect()
    }

    /// `kind`'s last `limit` pauses and resumes, newest first.
    pub async fn kind_changes(&self, kind: &str, limit: i64) -> Result<Vec<KindChange>> {
        let client = self.bb.client().await?;
        client
            .query(CHANGES, &[&kind, &limit])
            .await?
            .iter()
            .map(|r| {
                Ok(KindChange {
                    change: r.try_get(0)?,
                    reason: r.try_get(1)?,
                    actor: r.try_get(2)?,
                    at: r.try_get(3)?,
                })
            })
            .collect()
    }
}

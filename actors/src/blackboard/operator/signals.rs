//! Signals to flows (`artex flow signal`, `POST /api/v1/flows/{id}/signals/{name}`): the
//! database's own `artex.signal_flow` (migrations/V40) completes the flow's reached wait
//! for the name in the same transaction, or keeps the signal until the wait is reached;
//! plain SQL does the same. This file maps its refusals to this crate's errors.

use serde::Serialize;
use serde_json::Value;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use super::OperatorBoard;
use crate::error::{Error, Result};
use crate::submission::check_kind;

const SIGNAL: &str = "select outcome, task_id, task_name from artex.signal_flow($1, $2, $3, $4)";

/// What a signal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalOutcome {
    /// The wait was reached: it succeeded now, with the payload as its result.
    Completed,
    /// The wait is not reached yet (its upstream tasks run, or it is paused): the signal
    /// is kept and completes it when it is.
    Stored,
}

/// A signal's answer: what it did, and to which wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignalReport {
    /// The flow.
    pub flow: Uuid,
    /// The signal's name.
    pub signal: String,
    /// Completed or stored.
    pub outcome: SignalOutcome,
    /// The wait's task id.
    pub task: Uuid,
    /// The wait's name in the flow.
    pub task_name: String,
}

impl OperatorBoard {
    /// Sends signal `name` to flow `flow` as `actor`, with `payload` (the wait's result;
    /// none by default). `FlowNotFound` for an unknown flow; `Invalid` for a name that
    /// is no name; `NoSuchWait` for a name no wait of the flow has (the message lists the
    /// ones it has); `Refused` for a second signal of the name or a wait that has ended.
    pub async fn signal_flow(
        &self,
        flow: Uuid,
        name: &str,
        payload: Option<&Value>,
        actor: &str,
    ) -> Result<SignalReport> {
        check_kind(name).map_err(|e| Error::Invalid(format!("signal name: {e}")))?;
        if let Some(p) = payload {
            crate::submission::check_payload(p)
                .map_err(|e| Error::Invalid(format!("payload: {e}")))?;
        }
        let client = self.bb.client().await?;
        let row = client
            .query_one(SIGNAL, &[&flow, &name, &payload, &actor])
            .await
            .map_err(|e| {
                let message = match &e {
                    Error::Db(d) => d
                        .as_db_error()
                        .map(|d| d.message().trim_start_matches("artex: ").to_string()),
                    _ => None,
                };
                match (e.code(), message) {
                    (Some(c), Some(_)) if *c == SqlState::NO_DATA_FOUND => {
                        Error::FlowNotFound(flow)
                    }
                    (Some(c), Some(m)) if *c == SqlState::UNDEFINED_OBJECT => {
                        Error::NoSuchWait { flow, message: m }
                    }
                    (Some(c), Some(m)) if *c == SqlState::INVALID_PARAMETER_VALUE => {
                        Error::Invalid(m)
                    }
                    (Some(c), Some(m)) if *c == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
                        Error::Refused(m)
                    }
                    _ => e,
                }
            })?;
        let outcome = match row.try_get::<_, &str>(0)? {
            "completed" => SignalOutcome::Completed,
            _ => SignalOutcome::Stored,
        };
        Ok(SignalReport {
            flow,
            signal: name.to_string(),
            outcome,
            task: row.try_get(1)?,
            task_name: row.try_get(2)?,
        })
    }
}

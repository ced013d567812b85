//! Flows and operator controls. A flow is a DAG of named tasks submitted at once:
//! validated (names, references, cycles), inserted in one transaction, and driven by
//! the database itself (migrations/V2__flows.sql): a task is promoted from `blocked` to
//! `pending` in the transaction that finishes its last upstream task, and canceled with
//! the upstream task named when one ends failed, timed out or canceled. Operators pause,
//! resume and cancel a task or a whole flow; every control is audited with actor and
//! reason like any other transition.
//!
//! This file holds the views, the controls and the SQL that runs them; what is submitted
//! and its rules are `crate::submission`'s, a flow's state flows/spec.rs's.

mod spec;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::TaskStatus;

pub use crate::submission::{FlowSpec, FlowTaskSpec, WaitSpec};
pub use spec::FlowState;

/// One task of a flow as stored.
#[derive(Debug, Clone, Serialize)]
pub struct FlowTaskView {
    /// Its name in the flow.
    pub name: String,
    /// Its task id.
    pub id: Uuid,
    /// Its kind.
    pub kind: String,
    /// Its status.
    pub status: TaskStatus,
    /// The names of its upstream tasks.
    pub depends_on: Vec<String>,
    /// Failed attempts so far.
    pub retries: i32,
    /// Last started.
    pub started_at: Option<DateTime<Utc>>,
    /// Ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// The last error.
    pub error: Option<String>,
    /// For a wait: what it waits for and where it stands (absent for other tasks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitView>,
}

/// A wait of a flow as stored (migrations/V40): what it waits for, and where it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitView {
    /// The wait as submitted: `{"signal": "approved", "timeout": "24h"}`, `{"until": …}`
    /// or `{"for": "1h"}`.
    pub spec: serde_json::Value,
    /// When its upstream tasks had all succeeded (its timer started); null before.
    pub reached_at: Option<DateTime<Utc>>,
    /// When it is due once reached: the timer's time, or the signal's timeout.
    pub due_at: Option<DateTime<Utc>>,
    /// When its signal came (it completes the wait once reached).
    pub signal_received_at: Option<DateTime<Utc>>,
    /// Who sent the signal.
    pub signal_from: Option<String>,
}

/// A flow with its tasks.
#[derive(Debug, Clone, Serialize)]
pub struct FlowView {
    /// Flow id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Submitted.
    pub created_at: DateTime<Utc>,
    /// Overall state.
    pub state: FlowState,
    /// How many tasks are in each status.
    pub counts: BTreeMap<String, usize>,
    /// Its tasks, in submission order.
    pub tasks: Vec<FlowTaskView>,
}

/// An operator control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Control {
    /// Hold pending and blocked tasks (running ones finish).
    Pause,
    /// Release paused tasks: pending, or blocked while an upstream task is unfinished.
    Resume,
    /// End tasks that have not ended, running ones included (their worker stops them).
    Cancel,
}

impl Control {
    /// The verb.
    pub fn as_str(self) -> &'static str {
        match self {
            Control::Pause => "pause",
            Control::Resume => "resume",
            Control::Cancel => "cancel",
        }
    }

    pub(crate) fn applies_to(self) -> &'static str {
        match self {
            Control::Pause => {
                "pending or blocked tasks (a running task runs to its end; cancel stops it)"
            }
            Control::Resume => "paused tasks",
            Control::Cancel => "tasks that have not ended",
        }
    }
}

/// What a control was applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "id", rename_all = "lowercase")]
pub enum ControlTarget {
    /// One task.
    Task(Uuid),
    /// Every task of a flow.
    Flow(Uuid),
}

/// What a control changed.
#[derive(Debug, Clone, Serialize)]
pub struct ControlReport {
    /// The control.
    pub control: Control,
    /// Its target.
    pub target: ControlTarget,
    /// Each task changed, with its new status.
    pub changed: Vec<(Uuid, TaskStatus)>,
}

//! The [`FlowState`] a flow is in given its tasks' statuses. Pure, so it is unit-tested
//! here. A flow as submitted, and its rules, are `crate::submission`'s.

use serde::Serialize;

use crate::blackboard::TaskStatus;

/// A flow's overall state, derived from its tasks' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowState {
    /// Some task has not ended and not all of those are paused.
    Running,
    /// Every task that has not ended is paused.
    Paused,
    /// Every task succeeded.
    Succeeded,
    /// Every task ended, and at least one failed or timed out.
    Failed,
    /// Every task ended, none failed, at least one was canceled.
    Canceled,
}

impl FlowState {
    /// The state of a flow whose tasks have these statuses.
    pub fn of(statuses: impl IntoIterator<Item = TaskStatus>) -> FlowState {
        let (mut open, mut paused, mut failed, mut canceled) = (0, 0, 0, 0);
        for s in statuses {
            match s {
                TaskStatus::Succeeded => {}
                TaskStatus::Failed | TaskStatus::Timeout => failed += 1,
                TaskStatus::Canceled => canceled += 1,
                TaskStatus::Paused => {
                    open += 1;
                    paused += 1;
                }
                _ => open += 1,
            }
        }
        if open > 0 {
            if paused == open {
                FlowState::Paused
            } else {
                FlowState::Running
            }
        } else if failed > 0 {
            FlowState::Failed
        } else if canceled > 0 {
            FlowState::Canceled
        } else {
            FlowState::Succeeded
        }
    }

    /// The name shown to people.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::Running => "running",
            FlowState::Paused => "paused",
            FlowState::Succeeded => "succeeded",
            FlowState::Failed => "failed",
            FlowState::Canceled => "canceled",
        }
    }
}

impl std::fmt::Display for FlowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flow_state_follows_its_tasks() {
        use TaskStatus::*;
        assert_eq!(FlowState::of([Succeeded, Succeeded]), FlowState::Succeeded);
        assert_eq!(
            FlowState::of([Succeeded, Running, Paused]),
            FlowState::Running
        );
        assert_eq!(FlowState::of([Succeeded, Paused]), FlowState::Paused);
        assert_eq!(FlowState::of([Failed, Canceled]), FlowState::Failed);
        assert_eq!(FlowState::of([Succeeded, Canceled]), FlowState::Canceled);
    }
}

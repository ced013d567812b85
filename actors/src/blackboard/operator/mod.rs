//! An operator's statements, for the CLI, the HTTP API and the dashboard: submit tasks
//! and flows (`submit.rs`, `flows.rs`), read and list them (`tasks.rs`, `flow_list.rs`),
//! control them (pause, resume, cancel, retry; in bulk: `bulk.rs`), the roster and
//! statistics (`overview.rs`), the fleet's `/metrics` (`fleet.rs`), the input limits and
//! known kinds (`inputs.rs`), schedules (`schedules.rs`: add, list, pause, resume,
//! remove), signals to flows' waits (`signals.rs`), the named API tokens
//! (`api_tokens.rs`), and the reads a streaming
//! replica serves (`replica.rs`: a read-only handle, the replica's lag, WAL positions).
//!
//! Every statement here is one transaction on a pooled connection; none needs a session.

mod api_tokens;
mod bulk;
mod fleet;
mod flow_list;
mod flows;
mod inputs;
mod kind_limits;
mod kind_pauses;
mod overview;
mod replica;
mod schedules;
mod signals;
mod submit;
mod tasks;

pub use api_tokens::{check_token_name, LiveToken, TokenInfo, TokenScope, MAX_TOKEN_NAME_CHARS};
pub use bulk::{BulkAction, BulkReport, BULK_BATCH};
pub use fleet::{FleetSample, FLEET_COUNT_CAP, FOLD_BATCH};
pub use flow_list::FlowSummary;
pub use kind_limits::{parse_rate, rate_text, KindLimit, LimitSpec, MAX_RATE_PER_SEC};
pub use kind_pauses::{KindChange, KindPause, MAX_PAUSE_REASON_CHARS};
pub use overview::{
    MinuteCount, Percentiles, RecentStats, Stats, WorkerView, RECENT_SAMPLE, STATUS_COUNT_CAP,
};
pub use replica::{ReadBoard, Replica, ReplicaLag, WalPosition, DEFAULT_READ_MAX_LAG};
pub use schedules::SCHEDULES_LISTED;
pub use signals::{SignalOutcome, SignalReport};
pub use submit::{submit_in, Submitted, LOCK_KEYS, SUBMIT_KEYED};
pub use tasks::TaskFilter;

use super::Blackboard;

/// An operator's handle on the blackboard: only the statements of the CLI, the HTTP API
/// and the dashboard. Made by [`Blackboard::operator`].
#[derive(Debug, Clone)]
pub struct OperatorBoard {
    pub(super) bb: Blackboard,
}

//! The planner's statements: a dispatch round (the roster of workers with spare capacity
//! and the claim of runnable tasks in one read, the assignment and the chosen workers'
//! wake-ups in one write: `dispatch.rs`), the Reaper's sweeps (`reap.rs`), planner
//! shards owned through leases (`shards.rs`), the Scheduler's firing of due schedules
//! (`schedules.rs`) and of flows' due waits (`waits.rs`), and what pushing wake-ups over
//! HTTP needs (`wake.rs`).
//!
//! Every statement here is one transaction on a pooled connection (a dispatch round's
//! read and write share theirs, begun by hand); no session state outlives it. The one
//! session a planner holds is the Scanner's LISTEN ([`PlannerBoard::listen_session`]).

mod dispatch;
mod reap;
mod schedules;
mod shards;
mod waits;
mod wake;

pub(crate) use dispatch::HOT_CALLS;
pub use dispatch::{
    AssignReport, Assignment, Claimed, KeptRoster, RosterEntry, Round, ROSTER_KEPT, WALK_EVERY,
};
pub use reap::{ReapParams, ReapReport, StrandedTask};
pub use schedules::{FiredSlot, ScheduleTurn};
pub use shards::{
    agree_count, CountAgreement, ShardBoard, ShardRow, TakenShard, DEFAULT_SHARD_COUNT,
};
pub use waits::WaitEnded;
pub use wake::Push;

use super::{Blackboard, ListenSession};

/// The planner's handle on the blackboard (Scanner, Assigner, Reaper, ShardKeeper): only
/// the statements of a planner. Made by [`Blackboard::planner`].
#[derive(Debug, Clone)]
pub struct PlannerBoard {
    pub(super) bb: Blackboard,
}

impl PlannerBoard {
    /// A LISTEN session on `channels` that reconnects by itself (see
    /// [`ListenSession`]): the Scanner's wake-ups. A session: it needs a connection of
    /// its own, not one of a transaction pooler.
    pub fn listen_session<S: AsRef<str>>(
        &self,
        owner: impl Into<String>,
        channels: &[S],
    ) -> ListenSession {
        self.bb.listen_session(owner, channels)
    }
}

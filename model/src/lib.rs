//! artex's distributed protocol — planner rounds, a worker's start, renewals and end,
//! the fence, the reaper's rescue, a hot upgrade's task transfer and drain — as a model
//! that `stateright` checks exhaustively within a bound, with crashes, partitions and
//! clock skew within the lease's margin. What it proves and what it does not:
//! docs/model.md.
//!
//! The state is what the blackboard holds (each task's status, holder, fencing epoch,
//! lease and checkpoint; each worker's state) and what each process holds in memory.
//! Each step is one transaction of the real protocol and names the SQL it stands for,
//! with that SQL's hash beside it (`actions.rs`): a test fails when the SQL changes
//! until the step is reviewed.
//!
//! # Layout
//! - `state`: the blackboard's rows, the processes, the upgrade's step, the ghosts.
//! - `actions`: the steps, each with the SQL it stands for and its hash.
//! - `model`: the bound, the guards, which steps are enabled where.
//! - `steps`: what each step does.
//! - `properties`: what is checked, and the recovery check's continuation.
//! - `symmetry`: the representative of states that differ by names only.
//! - `statements`: finding and hashing the SQL in the repository.
//! - `trace`: a counterexample printed step by step.

#![forbid(unsafe_code)]

pub mod actions;
pub mod model;
pub mod properties;
pub mod state;
pub mod statements;
mod steps;
pub mod symmetry;
pub mod trace;

pub use actions::Action;
pub use model::{Bound, Guards, Protocol, Recall};
pub use state::State;

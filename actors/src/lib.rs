//! artex-actors: the planner (Scanner, Assigner, Reaper), the worker runtime, and the
//! PostgreSQL blackboard that is their only shared state.
//!
//! # Layout
//! - [`blackboard`]: every SQL statement of artex, the migrations runner, LISTEN sessions.
//! - [`scanner`], [`assigner`], [`reaper`]: the planner's actors.
//! - [`worker`]: the worker runtime: handler registry, execution, leases, completions.
//! - [`supervisor`]: panic-catching runs, restart and error counters.
//! - [`error`]: this crate's error type.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assigner;
pub mod blackboard;
pub mod error;
pub mod reaper;
pub mod scanner;
pub mod supervisor;
pub mod worker;

pub use blackboard::Blackboard;
pub use error::{Error, Result};

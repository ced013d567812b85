//! The everyday features of issue 24 end to end, with real planner and worker processes
//! and the real CLI on real PostgreSQL: fleet-wide limits per kind and per key under
//! several planners, tags and search, bulk actions, paused kinds.
//!
//! # Layout
//! - `limits`: concurrency, per-key concurrency and rate, with three planners.
//! - `search`: tags, search and bulk actions from the CLI.
//! - `pauses`: a paused kind waits while the others run, under two planners.

#[path = "../common/mod.rs"]
mod common;

mod fair;
mod limits;
mod pauses;
mod search;

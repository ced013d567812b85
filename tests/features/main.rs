//! The everyday features of issue 24 end to end, with real planner and worker processes
//! and the real CLI on real PostgreSQL: fleet-wide limits per kind and per key under
//! several planners, tags and search, bulk actions, paused kinds, fair dispatch.
//!
//! # Layout
//! - `limits`: concurrency, per-key concurrency and rate, with three planners.
//! - `search`: tags, search and bulk actions from the CLI.
//! - `pauses`: a paused kind waits while the others run, under two planners.
//! - `claims`: a worker claims its own tasks (V46), only what the Assigner would give it.
//! - `fair`: a fair kind's keys take turns, in one round and under three planners.

#[path = "../common/mod.rs"]
mod common;

mod claims;
mod fair;
mod limits;
mod pauses;
mod search;

use artex_actors::assigner::AssignerConfig;

/// A planner round's settings for tests that run the Assigner's rounds themselves: 100
/// tasks, all shards.
fn round_config() -> AssignerConfig {
    AssignerConfig {
        actor: "test-planner".into(),
        batch: 100,
        lease_secs: 30.0,
        suspect_after_secs: 10.0,
        shards: (1, Vec::new()),
    }
}

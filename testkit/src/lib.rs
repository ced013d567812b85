//! artex's shared test harnesses, a dev-dependency of every crate of the workspace and of
//! the integration tests, so that no library crate compiles a file of `tests/`. It
//! depends on none of artex's crates: harnesses that need their types stay in
//! `tests/common/`.
//!
//! # Layout
//! - [`fuzz`]: bounded randomized testing without a framework: seeded cases, shrinking,
//!   replay by seed and case.
//! - [`props`] (feature `props`): the proptest targets' case count and seed, and a runner
//!   that names how to replay a failure.
#![forbid(unsafe_code)]

pub mod fuzz;
#[cfg(feature = "props")]
pub mod props;

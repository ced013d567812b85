//! artex's shared test harnesses, a dev-dependency of every crate of the workspace and of
//! the integration tests, so that no library crate compiles a file of `tests/`. It
//! depends on none of artex's crates: harnesses that need their types stay in
//! `tests/common/`.
//!
//! # Layout
//! - [`disk`]: a small tmpfs for tests that fill a disk.
//! - [`fuzz`]: bounded randomized testing without a framework: seeded cases, shrinking,
//!   replay by seed and case.
//! - [`http`]: the tests' one HTTP/1.1 client, over `std::net`.
//! - [`props`] (feature `props`): the proptest targets' case count and seed, and a runner
//!   that names how to replay a failure.
//! - [`proxy`]: a loopback TCP proxy that counts, cuts and refuses connections.
#![forbid(unsafe_code)]

pub mod disk;
pub mod fuzz;
pub mod http;
#[cfg(feature = "props")]
pub mod props;
pub mod proxy;

//! artex: an actor-model task runtime with PostgreSQL as the blackboard. This crate is the
//! app shell (CLI, configuration, HTTP, hot upgrade, embedded PostgreSQL) and the library
//! API users build their own worker binaries on:
//!
//! ```no_run
//! use artex::{Registry, TaskContext};
//! use serde_json::json;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut handlers = Registry::new();
//!     handlers.register("resize", |ctx: TaskContext| async move {
//!         let width = ctx.payload()["width"].as_u64().unwrap_or(100);
//!         Ok(json!({ "resized_to": width }))
//!     });
//!     // The same CLI as the stock binary (`worker`, `up`, `submit`, …), with these kinds.
//!     artex::cli::main_with(handlers)
//! }
//! ```
//!
//! # Layout
//! Arrows point down only: a module uses (names in a `crate::` path, doc links included)
//! only those below it in this list, never one above. Inside `cli/` the command groups
//! are siblings.
//! - [`cli`]: the `artex` command line, one file per command group.
//! - [`runtime`]: `run_planner` and `run_worker`, each run until a shutdown future
//!   resolves (testable in-process), and the connection to the blackboard.
//! - [`http`]: the worker's HTTP routes and the API of `artex serve` (no SQL); its
//!   `/upgrade` route only passes the request to [`hot_upgrade`]; serve's fleet-wide
//!   `/metrics` (read at most once per interval) and a planner's `--metrics` server.
//! - [`master`]: `artex master`, the stable parent for supervisord and runit.
//! - [`hot_upgrade`]: the app side of a hot upgrade, every step from one module root
//!   (docs/hot-upgrade.md walks them): the bundle received and checked, the upgrade
//!   channel's old and new side (listener pass, task transfer), rollback, and the drain
//!   of the old process.
//! - [`uploads`]: chunked, resumable uploads kept in the worker's private upload folder.
//! - [`handlers`]: the stock binary's task kinds.
//! - [`programs`]: executables as task kinds (`--tasks-dir`), run under protocol 1.
//! - [`process`]: host name, worker id, the binary's digest, stop signals, the service
//!   manager.
//! - [`dev_db`]: the embedded PostgreSQL cluster (also the tests' and benchmark's).
//! - [`config`]: flags and `ARTEX_*` variables, with defaults.
//! - [`tokens`]: bearer tokens: from files, from headers, compared in constant time.
//! - [`error`]: the app's error type and exit codes; it names no module of the app
//!   (a module's own error converts into it where that module is defined).
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod dev_db;
pub mod error;
pub mod handlers;
pub mod hot_upgrade;
pub mod http;
pub mod master;
pub mod process;
pub mod programs;
pub mod runtime;
pub mod tokens;
pub mod uploads;

pub use artex_actors::worker::{Registry, TaskContext, TaskError, UploadFile};
pub use artex_actors::Blackboard;
pub use error::{Error, Result};
pub use runtime::{run_planner, run_worker};

/// The Rust examples of docs/handlers.md, compiled by `cargo test --doc` so that the
/// guide's worker binary stays one that builds.
#[cfg(doctest)]
#[doc = include_str!("../docs/handlers.md")]
pub struct HandlersGuide;

/// This build's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

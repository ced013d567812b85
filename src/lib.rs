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
//! Arrows point down only: a module uses those below it, never one above.
//! - [`cli`]: the `artex` command line, one file per command group.
//! - [`runtime`]: `run_planner` and `run_worker`, each run until a shutdown future
//!   resolves (testable in-process), and the connection to the blackboard.
//! - [`http`]: the worker's HTTP routes and the API of `artex serve` (no SQL).
//! - [`uploads`]: chunked, resumable uploads kept in the worker's private upload folder.
//! - [`master`]: `artex master`, the stable parent for supervisord and runit.
//! - [`hot_upgrade`]: the app side of a hot upgrade: old side, new side, their protocol,
//!   and the schema a bundle's build needs, checked before it is spawned.
//! - [`process`]: host name, worker id, the binary's digest, stop signals, the service
//!   manager, generation folders.
//! - [`config`]: flags and `ARTEX_*` variables, with defaults.
//! - [`tokens`]: bearer tokens: from files, from headers, compared in constant time.
//! - [`dev_db`]: the embedded PostgreSQL cluster (also the tests' and benchmark's).
//! - [`handlers`]: the stock binary's task kinds.
//! - [`error`]: the app's error type and exit codes; the one module that names those
//!   above it, as it wraps their error types (`#[from]`).
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
pub mod runtime;
pub mod tokens;
pub mod uploads;

pub use artex_actors::worker::{Registry, TaskContext, TaskError, UploadFile};
pub use artex_actors::Blackboard;
pub use error::{Error, Result};
pub use runtime::{run_planner, run_worker};

/// This build's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

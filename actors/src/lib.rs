//! artex-actors: the planner (Scanner, Assigner, Reaper), the worker runtime, and the
//! PostgreSQL blackboard that is their only shared state.
//!
//! # Layout
//! - [`blackboard`]: every SQL statement of artex, reached through one handle per role
//!   ([`blackboard::PlannerBoard`], [`blackboard::WorkerBoard`],
//!   [`blackboard::OperatorBoard`], [`blackboard::FeedBoard`],
//!   [`blackboard::MaintenanceBoard`]), the migrations runner, LISTEN sessions that
//!   reconnect by themselves ([`blackboard::ListenSession`]), and `blackboard/primary.rs`,
//!   which follows the primary of a multi-host URL across a failover.
//! - [`scanner`], [`assigner`], [`reaper`], [`maintenance`], [`scheduler`]: the planner's
//!   actors.
//! - [`schedule`]: what a cron schedule is and its rules (pure): its slots in its time
//!   zone, and the catch-up rules for slots missed while no planner ran.
//! - [`worker`]: the worker runtime. `worker/mod.rs` is the actor, its run loop and
//!   what runs a handler, composing its parts, each owning its state: `worker/held.rs`
//!   what it holds; `worker/intake.rs` its reads, the poll's pace, and the tasks a
//!   wake-up carries, started without a read; `worker/outcomes.rs` starts and outcomes
//!   written in batches; `worker/policies.rs` its kinds' retry policies;
//!   `worker/liveness.rs` lease renewals and heartbeats;
//!   `worker/fence.rs` self-fencing (a task whose lease could not be renewed in time is
//!   stopped before it can expire); [`worker::handlers`] the handler registry and what a
//!   handler sees; `worker/ledger.rs` the pure, unit-tested rule that no task is taken
//!   twice; [`worker::depth`] the pure sizing of its local queue from its completion
//!   rate; [`worker::progress`] handlers' progress, kept until it is written (at most
//!   once a second); [`worker::status`] the `/status` snapshot; [`worker::metrics`] what its
//!   `/metrics` counts; [`worker::drain`] graceful stop;
//!   [`worker::transfer`] the worker's side of a hot upgrade's task transfer.
//! - [`submission`]: what a new task, a batch or a flow is and every rule on it (pure);
//!   the CLI, the HTTP API and uploads build a [`submission::Submission`] and check it.
//! - [`shard_keeper`]: planner shards owned through leases (`--shards auto`), and the
//!   view of them the Assigner serves.
//! - [`waker`]: the planner's pushes of wake-ups to workers over HTTP, and which workers
//!   it could not reach.
//! - [`retry`]: per-kind retry policies (pure): the backoff after a failed attempt, and
//!   the attempts a task of the kind gets by default.
//! - [`trace`]: OpenTelemetry traces: the W3C context a task carries
//!   ([`trace::TraceParent`]), the exporter, and the spans of each process.
//! - [`supervisor`]: panic-catching runs, restart and error counters.
//! - [`metrics`]: Prometheus' text format and the lock-free instruments behind every
//!   process's `/metrics`.
//! - `flight.rs`: "one call in flight, coalesce the repeats", the loop shape every
//!   actor's call to the blackboard takes.
//! - [`upload_guard`]: fails tasks whose uploaded file's host is gone for good (called
//!   by the Reaper).
//! - [`error`]: this crate's error type (a leaf but for one call: every PostgreSQL error
//!   it converts is shown to `blackboard::primary`, which drops the connections that
//!   lead to a lost primary).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assigner;
pub mod blackboard;
pub mod error;
mod flight;
pub mod maintenance;
pub mod metrics;
pub mod reaper;
pub mod retry;
pub mod scanner;
pub mod schedule;
pub mod scheduler;
pub mod shard_keeper;
pub mod submission;
pub mod supervisor;
pub mod trace;
pub mod upload_guard;
pub mod waker;
pub mod worker;

pub use blackboard::Blackboard;
pub use error::{Error, Result};

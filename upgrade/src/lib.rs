//! Hot upgrade for artex: the pieces a running worker needs to hand its place to a newer
//! binary without refusing a request or losing a task. A leaf crate: it knows nothing of
//! actors, HTTP or the blackboard.
//!
//! The flow these pieces serve: [`bundle::unpack`] verifies an uploaded bundle,
//! [`spawn::spawn`] starts its binary, [`handover::HandoverListener`] hands it the
//! listening socket and task state, [`notify`] tells systemd who the main process now
//! is, and the old process drains on SIGUSR2 ([`drain`]).
//!
//! # Layout
//! - [`bundle`]: signed upgrade bundles: keygen, create, and a hostile-input `unpack`.
//! - [`drain`]: SIGTERM / SIGINT / SIGUSR2 as a stream of stop requests.
//! - [`error`]: the crate's one [`Error`] type and [`Result`] alias.
//! - [`handover`]: the Unix socket protocol (JSON frames, SCM_RIGHTS) between generations.
//! - [`notify`]: systemd's `sd_notify` (`READY=1`, `MAINPID=`) without libsystemd.
//! - [`private_dir`]: folders only this user can enter (upgrade folder, handover sockets).
//! - [`spawn`]: starting the next generation in a process group of its own; killing it
//!   and everything it started on rollback; joining the old group once it took over.
//! - [`subreaper`]: a stable parent's tools: child subreaper, reaping any descendant,
//!   signalling a process group.

pub mod bundle;
pub mod drain;
pub mod error;
pub mod handover;
pub mod notify;
pub mod private_dir;
pub mod spawn;
pub mod subreaper;

pub use bundle::{Limits, Manifest, Schema, SchemaMigration, VerifiedBundle};
pub use drain::{StopSignal, StopSignals};
/// Key types used by [`bundle`], re-exported so callers need no ed25519 dependency.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use error::{Error, Result};
pub use handover::{Channel, HandoverListener, PROTOCOL_VERSION};
pub use spawn::HANDOVER_ENV;

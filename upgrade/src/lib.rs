//! Hot upgrade for artex: the pieces a running worker needs to give its place to a newer
//! binary without refusing a request or losing a task. A leaf crate: it knows nothing of
//! actors, HTTP or the blackboard.
//!
//! The flow these pieces serve: [`bundle::unpack`] verifies an uploaded bundle,
//! [`spawn::spawn`] starts its binary, the upgrade channel ([`channel::ChannelListener`],
//! [`channel::connect`]) carries the listener pass and the task transfer, [`notify`]
//! tells systemd who the main process now is (the main-PID pass), and the old process
//! drains on SIGUSR2 ([`signals`]).
//!
//! # Layout
//! - [`bundle`]: signed upgrade bundles: keygen, create, and a hostile-input `unpack`.
//! - [`channel`]: the upgrade channel: a Unix socket between generations and its framed
//!   protocol (JSON frames, file descriptors by SCM_RIGHTS).
//! - [`clone_spawn`]: starting a program without copying our address space
//!   (`CLONE_VM | CLONE_VFORK`), for [`task_process`].
//! - [`error`]: the crate's one [`Error`] type and [`Result`] alias.
//! - [`malloc`]: the allocator's arenas and large-block threshold set at start (process
//!   tunables, like the subreaper's; here because this crate is where artex's few system
//!   calls live).
//! - [`notify`]: systemd's `sd_notify` (`READY=1`, `MAINPID=`) without libsystemd.
//! - [`private_dir`]: folders only this user can enter (upgrade folder, upgrade channel
//!   sockets).
//! - [`signals`]: SIGTERM / SIGINT / SIGUSR2 (drain) as a stream of stop requests.
//! - [`spawn`]: starting the next generation in a process group of its own; killing it
//!   and everything it started on rollback; joining the old group once it took over.
//! - [`subreaper`]: a stable parent's tools: child subreaper, reaping any descendant,
//!   signalling a process group.
//! - [`task_process`]: a task's program (docs/programs.md) in a session of its own, with
//!   the protocol's descriptor 3; ended whole, reaped with everything it started.

pub mod bundle;
pub mod channel;
pub mod clone_spawn;
pub mod error;
pub mod malloc;
pub mod notify;
pub mod private_dir;
pub mod signals;
pub mod spawn;
pub mod subreaper;
pub mod task_process;

pub use bundle::{Limits, Manifest, Schema, SchemaMigration, VerifiedBundle};
pub use channel::{Channel, ChannelListener, PROTOCOL_VERSION};
/// Key types used by [`bundle`], re-exported so callers need no ed25519 dependency.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use error::{Error, Result};
pub use signals::{StopSignal, StopSignals};
pub use spawn::CHANNEL_ENV;

//! Hot upgrade, the app's side: an upgrade read in one place. The steps, in order, and
//! where each lives:
//! 1. `PUT /upgrade` receives the bundle (`crate::http::upgrade`);
//! 2. [`Upgrader`] authenticates the caller, verifies and unpacks the bundle
//!    (`artex_upgrade::bundle`), refuses a new build the database's schema cannot run
//!    ([`schema`]: 409, nothing spawned) and spawns the new binary in a process group of
//!    its own (`artex_upgrade::spawn`);
//! 3. over the handover socket (`artex_upgrade::handover`, SCM_RIGHTS) the two processes
//!    exchange the [`Msg`]s of [`protocol`]: the old side in [`OldSide`], the new side in
//!    [`Successor`] (called by [`crate::runtime::run_worker`]); the listening socket goes
//!    over only once the new process is registered, so a child that never gets ready
//!    never accepts a connection;
//! 4. the old worker suspends its resumable tasks and moves its unstarted ones
//!    (`artex_actors::worker::handover`), the new one resumes them and moves into the old
//!    one's process group;
//! 5. any failure before `TakenOver` rolls back ([`Upgrader`]), killing the new process's
//!    group; after it, the old process drains on SIGUSR2 (`crate::runtime::run_worker`).

mod new_side;
mod old_side;
pub mod protocol;
pub mod schema;
mod upgrader;

pub use new_side::Successor;
pub use old_side::OldSide;
pub use protocol::{HandoverError, Msg};
pub use upgrader::{
    Timings, UpgradeError, UpgradeReport, UpgradeSettings, Upgrader, UPGRADE_FOLDER,
};

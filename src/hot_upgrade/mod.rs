//! Hot upgrade, the app's side, read in one place. An operator sends a signed bundle to a
//! running worker (`curl -T bundle.zip http://host:port/upgrade`); the worker gives its
//! place to the bundle's binary and nothing stops. The words: the **upgrade channel** is
//! the Unix socket between the old and the new process and its framed protocol; over it
//! go the **listener pass** (the HTTP listening socket, so the port never stops
//! accepting) and the **task transfer** (running tasks that can checkpoint move to the
//! new process, the blackboard following, fenced); then the old process's **drain**.
//!
//! The sequence, step by step, and what does each step:
//! 1. **authenticate**: the HTTP layer's route (`PUT|POST /upgrade`, thin) passes the
//!    request to [`Upgrader::run`], which checks the bearer token
//!    ([`Upgrader::authorize`]: 403 unconfigured, 401 wrong token) and refuses a second
//!    upgrade while one runs (409);
//! 2. **unpack & verify the bundle**: [`receive::receive`] streams the body to a fresh
//!    private folder (size, pace and deadline bounded; a raw ZIP or a multipart form);
//!    `Upgrader::unpack` verifies its signature and digest and unpacks it
//!    (`artex_upgrade::bundle::unpack`, hostile input: 400); [`schema::check_new_build`]
//!    refuses a build the database's schema cannot run (409, nothing spawned); a bundle
//!    of the binary already running answers `unchanged`;
//! 3. **spawn**: [`Upgrader::upgrade`] binds the upgrade channel
//!    (`artex_upgrade::channel::ChannelListener`) and starts the new binary in a process
//!    group of its own (`artex_upgrade::spawn`), told where the channel is
//!    (`ARTEX_HANDOVER_SOCKET`, [`artex_upgrade::CHANNEL_ENV`]);
//! 4. **upgrade channel: listener pass**: the two processes exchange the [`Msg`]s of
//!    [`channel`]: the old side in [`OldSide`] (driven by `Upgrader::pass_listener`), the
//!    new side in [`NewSide`] (called by the worker's run between its own steps). The new
//!    process registers first (`Ready`), and only then receives the listening socket
//!    ([`OldSide::pass_listener`] → [`NewSide::receive_listener`]), so a child that never
//!    gets ready never accepts a connection;
//! 5. **health deadline or rollback**: each exchange with the new process is bounded by
//!    its exit and by one deadline (`--upgrade-ready-ms`); any failure before `TakenOver`
//!    rolls back (`Upgrader::roll_back`): the new process's group is killed, the tasks
//!    that reached it come back, suspended ones resume here, the old worker takes work
//!    again, and the caller gets a 500 saying why;
//! 6. **task transfer**: the old worker suspends its resumable tasks at a checkpoint and
//!    the blackboard moves its unstarted ones (`Upgrader::transfer_tasks`,
//!    `artex_actors::worker::transfer`); [`NewSide::take_tasks`] resumes them in the new
//!    process (fenced by their lease epochs), which moves into the old one's process group
//!    and says `TakenOver`;
//! 7. **drain of the old process**: [`Upgrader::run`] raises SIGUSR2 on its own process,
//!    as an operator would; the worker's run then stops serving HTTP
//!    ([`drain::stop_serving`]: stop accepting, a grace, stop), drains its worker (tasks
//!    that could not checkpoint run to their end) and exits; its generation folder goes
//!    with it ([`generation::remove_own_generation`]);
//! 8. **the supervisor keeps supervising**: under systemd the new process tells it that
//!    it is the main process now (the main-PID pass, `MAINPID=`, in
//!    [`NewSide::take_tasks`]); under supervisord or runit, `artex master` is the stable
//!    parent whose PID never changes, and starts each generation with an [`OldSide`] of
//!    its own (a listener pass, no task transfer).
//!
//! # Layout
//! Arrows point down only: `upgrader` (the old side's engine, [`Upgrader`]) uses
//! `old_side`, `receive`, `schema` and `generation`; those and `new_side` use `channel`
//! (the messages, [`ChannelError`]) or `error` ([`UpgradeError`]), which use nothing
//! here; `drain` stands alone.

pub mod channel;
pub mod drain;
mod error;
pub mod generation;
mod new_side;
mod old_side;
pub mod receive;
pub mod schema;
mod upgrader;

pub use channel::{ChannelError, Msg};
pub use error::UpgradeError;
pub use new_side::{spawned_by_upgrade, NewSide};
pub use old_side::OldSide;
pub use upgrader::{
    Timings, UpgradeReport, UpgradeRequest, UpgradeSettings, Upgrader, UPGRADE_FOLDER,
};

//! Hot upgrade, the app's side: an operator sends a signed bundle to a running worker
//! (`curl -T bundle.zip http://host:port/upgrade`) and the worker gives its place to the
//! bundle's binary. Its words (upgrade channel, listener pass, task transfer, drain) and
//! each step with the code that does it are told once, in docs/hot-upgrade.md. The old
//! side starts at [`Upgrader::run`]; the new side is [`NewSide`].
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
pub mod programs;
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

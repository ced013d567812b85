//! The change feed's statements: the history read in final order after a position
//! (`events.rs`), durable consumer cursors, where the feed ends now (`head.rs`), readers
//! that follow it ([`EventFeed`], `follow.rs`), and its logical-decoding variant
//! (`logical.rs`).
//!
//! Reads and cursor writes are one transaction each. Two things need a session of their
//! own, never a transaction pooler's connection: a LISTEN for wake-ups
//! ([`FeedBoard::listen`], [`FeedBoard::listen_session`]) and a replication slot.

mod events;
mod follow;
mod head;
mod logical;

pub use events::{ConsumerCursor, EventBatch, EventPosition, Retention, TaskEvent, EVENTS_CHANNEL};
pub use follow::{EventFeed, FeedStart};
pub(crate) use head::FEED_HEAD;
pub use logical::{parse_change, DecodedTransaction, RowChange};

use super::{Blackboard, ListenSession, Listener};
use crate::error::Result;

/// The feed's handle on the blackboard: only the statements of feed readers (the
/// `/events` stream, `events tail`, followers of a task or flow). Made by
/// [`Blackboard::feed`].
#[derive(Debug, Clone)]
pub struct FeedBoard {
    pub(super) bb: Blackboard,
}

impl FeedBoard {
    /// Opens a LISTEN session (a connection of its own) on `channels`.
    pub async fn listen(&self, channels: &[String]) -> Result<Listener> {
        self.bb.listen(channels).await
    }

    /// A LISTEN session on `channels` that reconnects by itself (see [`ListenSession`]):
    /// one for the whole process, shared by its readers.
    pub fn listen_session<S: AsRef<str>>(
        &self,
        owner: impl Into<String>,
        channels: &[S],
    ) -> ListenSession {
        self.bb.listen_session(owner, channels)
    }
}

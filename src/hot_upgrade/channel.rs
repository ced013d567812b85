//! The messages the old and the new process exchange over the upgrade channel, in the
//! order they are sent, and what can go wrong between them. The messages are the wire
//! format between two builds (the old one may be older or newer than the new one):
//! their names and fields do not change; a new field must be optional on both sides.

use artex_actors::worker::ResumeReport;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One message on the upgrade channel (both directions).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    /// Child → parent, first: who it is.
    Hello {
        /// Child pid.
        pid: u32,
        /// Child build version.
        version: String,
        /// Upgrade channel protocol it speaks.
        protocol: u32,
    },
    /// Parent → child: where it will serve, and whose tasks it will take.
    Welcome {
        /// The HTTP address of the listening socket it will receive.
        http_addr: String,
        /// The old worker's id.
        old_worker: String,
    },
    /// Child → parent: connected to the blackboard and registered.
    Ready {
        /// The new worker's id.
        worker_id: String,
    },
    /// Parent → child: the listener pass, the listening socket attached as a file
    /// descriptor.
    Listener,
    /// Child → parent: accepting on the socket.
    Serving,
    /// Parent → child: the task transfer, these running tasks (held by `from` at these
    /// epochs) to take over.
    Transfer {
        /// Old worker id.
        from: String,
        /// (task, epoch).
        tasks: Vec<(Uuid, i64)>,
        /// The process group to move into before saying `TakenOver`: the parent's, when
        /// it spawned the child in a group of its own for the rollback window. Absent
        /// from older parents (and from `artex master`, whose generations lead a group).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        join_group: Option<u32>,
    },
    /// Child → parent: what it took over.
    TakenOver {
        /// What the task transfer resumed, and its conflicts.
        report: ResumeReport,
    },
}

/// Why the exchange on the upgrade channel failed, on either side. On the old side every
/// one of them rolls the upgrade back; on the new side the process exits with a failure
/// (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The new process ended before the task transfer was done.
    #[error("the new process exited {step} ({status})")]
    ChildExited {
        /// Where the upgrade was: "before connecting", "before the listener pass",
        /// "during the listener pass", "during the task transfer".
        step: &'static str,
        /// Its exit status, as the OS reports it.
        status: String,
    },
    /// The new process did not reach the next step before the deadline.
    #[error("the new process did not {step} in time")]
    Timeout {
        /// What it did not do: "connect", "get ready".
        step: &'static str,
    },
    /// The peer sent a message out of order: a bug or a different protocol.
    #[error("upgrade channel: expected {expected}, got {got}")]
    Unexpected {
        /// The message the protocol calls for.
        expected: String,
        /// What came instead.
        got: String,
    },
    /// The socket failed (connect, send, receive, peer check).
    #[error("upgrade channel: {0}")]
    Channel(#[from] artex_upgrade::Error),
    /// The new process broke the channel without exiting.
    #[error("the new process broke the upgrade channel: {0}")]
    Broken(artex_upgrade::Error),
    /// The new process could not move into its predecessor's process group.
    #[error("{0}")]
    ProcessGroup(artex_upgrade::Error),
    /// The local worker actor could not be reached.
    #[error("{step}: worker actor: {source}")]
    Actor {
        /// What was being done.
        step: &'static str,
        /// The mailbox error.
        source: actix::MailboxError,
    },
    /// The blackboard refused or failed a step.
    #[error("{step}: {source}")]
    Blackboard {
        /// What was being done.
        step: &'static str,
        /// The blackboard's error.
        source: artex_actors::Error,
    },
}

impl ChannelError {
    /// `expected` came as something else.
    pub(super) fn unexpected(expected: impl Into<String>, got: &Msg) -> Self {
        ChannelError::Unexpected {
            expected: expected.into(),
            got: format!("{got:?}"),
        }
    }
}

/// How a process ended, for a message.
pub(crate) fn describe_exit(st: std::io::Result<std::process::ExitStatus>) -> String {
    match st {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}

/// On the new side a failed exchange ends the process (exit code 1) through the app's
/// error. The conversion lives here, not in `error.rs`, so that arrows point down only:
/// `crate::error` names no module of the app.
impl From<ChannelError> for crate::Error {
    fn from(e: ChannelError) -> Self {
        crate::Error::UpgradeChannel(Box::new(e))
    }
}

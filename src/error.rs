//! The app's error type: what the CLI and the HTTP layer report, each with the exit code
//! or status that fits (bad input is exit 2 / HTTP 400, and says what was wrong).

/// Everything the artex app can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the planner, the workers or the blackboard.
    #[error(transparent)]
    Actors(#[from] artex_actors::Error),
    /// From the hot-upgrade machinery.
    #[error(transparent)]
    Upgrade(#[from] artex_upgrade::Error),
    /// The embedded PostgreSQL cluster could not be created, started or stopped.
    #[error("embedded PostgreSQL: {0}")]
    Cluster(String),
    /// The PostgreSQL server binaries are not installed.
    #[error("{0}")]
    PostgresMissing(String),
    /// A hot upgrade failed on this (the new) side of the upgrade channel (listener pass
    /// or task transfer): a failure, not bad input. Boxed, so that this module names no
    /// module above it; `hot_upgrade` converts its `ChannelError` into it.
    #[error(transparent)]
    UpgradeChannel(Box<dyn std::error::Error + Send + Sync>),
    /// `artex master` could not bring its worker generation up.
    #[error("artex master: {0}")]
    Master(String),
    /// `artex db status`: the cluster is stopped or absent (exit 3, as `pg_ctl status`
    /// and LSB init scripts say "not running").
    #[error("{0}")]
    NotRunning(String),
    /// `submit --wait`, `flow show --follow`: the task or flow ended failed or timed out
    /// (exit 4: the command worked, what it waited for did not).
    #[error("{0}")]
    EndedFailed(String),
    /// `submit --wait`, `flow show --follow`: the task or flow ended canceled (exit 5).
    #[error("{0}")]
    EndedCanceled(String),
    /// Standard output was closed before the result was all written: the reader of a
    /// pipe went away (`artex tasks | head -1`). Exit 141, as a program killed by
    /// SIGPIPE, and no message: nothing went wrong that a person needs told.
    #[error("standard output closed")]
    OutputClosed,
    /// Input that cannot be accepted; the message names what and where.
    #[error("{0}")]
    Invalid(String),
    /// A file or socket operation failed; the message names it.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, to what.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// `Result` with this crate's error.
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process exit code for this error (docs/command-line.md, "Exit codes"): 2 for
    /// bad input (the message names the option or value), 3 for a cluster not running
    /// (`db status`), 4 and 5 for a task or flow waited for that failed (or timed out) or
    /// was canceled, 141 when standard output was closed before everything was written
    /// (128 + SIGPIPE, what a shell reports for a program a closed pipe ended), 1 for
    /// every failure (database, network, upgrade channel, files). 0 is success.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Invalid(_) => 2,
            Error::NotRunning(_) => 3,
            Error::EndedFailed(_) => 4,
            Error::EndedCanceled(_) => 5,
            Error::OutputClosed => 141,
            Error::Actors(artex_actors::Error::Invalid(_)) => 2,
            Error::Actors(artex_actors::Error::TaskNotFound(_)) => 2,
            Error::Actors(artex_actors::Error::FlowNotFound(_)) => 2,
            Error::Actors(artex_actors::Error::NoSuchWait { .. }) => 2,
            Error::Actors(artex_actors::Error::ScheduleNotFound(_)) => 2,
            Error::Actors(artex_actors::Error::Refused(_)) => 2,
            _ => 1,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

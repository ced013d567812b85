//! The one error type of the actors crate: what went wrong talking to the blackboard or
//! between actors, said so that a user can act on it.

use uuid::Uuid;

/// Everything that can go wrong in the planner, the workers and the blackboard.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL refused or failed a statement; the database's own message is kept.
    #[error("{}", db_message(.0))]
    Db(tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("{}", pool_message(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// PostgreSQL did not answer in time.
    #[error("{what}: PostgreSQL did not answer within {after:?}")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// A statement ran past the statement timeout and was cancelled (see
    /// `blackboard/sql.rs`).
    #[error("canceling statement due to statement timeout: it ran past {after:?} (artex's --db-statement-timeout-ms)")]
    StatementTimeout {
        /// The timeout.
        after: std::time::Duration,
    },
    /// The server that should be the primary answered as a standby (in recovery): a
    /// failover or a restart is under way, or the URL names a replica.
    #[error("{0}")]
    NotPrimary(String),
    /// The database URL could not be used.
    #[error("database URL: {0}")]
    Url(String),
    /// A migration could not be applied, or an applied one was edited afterwards.
    #[error("migration V{version}__{name}: {why}")]
    Migration {
        /// Its number.
        version: i32,
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The database's schema is outside what this build supports: missing a migration it
    /// needs, or contracted beyond it (the message says which, and what to run).
    #[error("{0}")]
    Schema(#[from] SchemaMismatch),
    /// No task has this id.
    #[error("no task with id {0}")]
    TaskNotFound(Uuid),
    /// No flow has this id.
    #[error("no flow with id {0}")]
    FlowNotFound(Uuid),
    /// The flow has no wait for this signal (the message lists the signals it waits for).
    #[error("{message}")]
    NoSuchWait {
        /// The flow.
        flow: Uuid,
        /// What is wrong, naming the signals the flow waits for.
        message: String,
    },
    /// No schedule has this name.
    #[error("no schedule named {0:?} (see `artex schedule list`)")]
    ScheduleNotFound(String),
    /// Input that cannot be accepted: the message names what and where.
    #[error("{0}")]
    Invalid(String),
    /// A control that the task's state does not allow (e.g. resume a succeeded task).
    #[error("{0}")]
    Refused(String),
    /// A LISTEN session's connection closed without an error from the server.
    #[error("the LISTEN session's connection closed")]
    ListenClosed,
    /// An actor is gone (stopped or restarting) and did not take the message.
    #[error("actor unavailable: {0}")]
    Mailbox(#[from] actix::MailboxError),
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        // A lost primary (closed, cut off, demoted) is seen here first; the pools then
        // drop the connections that lead to it (blackboard::primary).
        crate::blackboard::primary::noticed(&e);
        Error::Db(e)
    }
}

/// `Result` with this crate's error.
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

impl Error {
    /// The SQLSTATE PostgreSQL answered with, for an error of a statement.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            Error::Db(e) => e.code(),
            _ => None,
        }
    }

    /// Whether retrying on a fresh connection may succeed (the server restarted, the
    /// connection dropped).
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Db(e) => {
                e.is_closed() || e.as_db_error().is_none_or(|d| connection_lost(d.code()))
            }
            Error::Pool(_) | Error::Timeout { .. } | Error::NotPrimary(_) => true,
            _ => false,
        }
    }
}

/// Runs `op` again while it fails for want of the database (every 250 ms), until
/// `within` has passed; with `None`, once.
pub async fn retry_unreachable<T, Fut>(
    within: Option<std::time::Duration>,
    what: &str,
    mut op: impl FnMut() -> Fut,
) -> Result<T>
where
    Fut: std::future::Future<Output = Result<T>>,
{
    let end = within.map(|d| tokio::time::Instant::now() + d);
    loop {
        match op().await {
            Err(e)
                if e.is_connection()
                    && end.is_some_and(|end| tokio::time::Instant::now() < end) =>
            {
                tracing::warn!(error = %e, "{what}: the database is unreachable; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// Whether the server said, in answer to a statement, that this connection is over: it
/// is shutting down or restarting (class 57P: found by the soak, where a read during a
/// PostgreSQL stop answered 500 instead of 503), the connection failed (class 08), or
/// it refuses writes as a demoted primary does (25006: the pool drops such a connection,
/// `primary::is_lost_primary`, and the next write goes to the new primary).
/// A statement cancelled by its timeout (57014) is not one.
fn connection_lost(code: &tokio_postgres::error::SqlState) -> bool {
    use tokio_postgres::error::SqlState;
    [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::READ_ONLY_SQL_TRANSACTION,
    ]
    .contains(code)
        || code.code().starts_with("08")
}

fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = db.message().to_string();
            if let Some(detail) = db.detail() {
                s.push_str(&format!(" ({detail})"));
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(src) => format!("database: {e}: {src}"),
            None => format!("database: {e}"),
        },
    }
}

fn pool_message(e: &deadpool_postgres::PoolError) -> String {
    use deadpool_postgres::{PoolError, TimeoutType};
    match e {
        PoolError::Timeout(TimeoutType::Wait) => {
            "database: no free connection in this process's pool within the pool wait \
             timeout (every connection is busy)"
                .into()
        }
        PoolError::Timeout(TimeoutType::Create) => {
            "database: PostgreSQL did not answer within the connect timeout (is the \
             server up and reachable, and the URL's host and port right?)"
                .into()
        }
        PoolError::Timeout(TimeoutType::Recycle) => {
            "database: a pooled connection did not answer within the connect timeout".into()
        }
        PoolError::Backend(e) => db_message(e),
        e => format!("database connection pool: {e}"),
    }
}

/// Why a build cannot run against a database's schema. [`SchemaMismatch::describe`]
/// says it for any build; `Display` says it for this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaMismatch {
    /// The database has no `artex.schema_migrations`: never migrated.
    NoSchema,
    /// A migration the build needs is not applied (`V<n>__<name>`).
    Missing {
        /// The first one missing.
        migration: String,
    },
    /// The database applied another text under a number the build knows.
    Differs {
        /// The build's migration (`V<n>__<name>`).
        migration: String,
        /// What the database has instead.
        why: String,
    },
    /// A contraction the build predates.
    Contracted {
        /// The migration that raised the floor (`V<n>__<name>`).
        migration: String,
        /// Builds must know at least this one.
        compatible_from: i32,
        /// The newest migration the build knows.
        knows: i32,
    },
}

impl SchemaMismatch {
    /// The one-line explanation, with `build` ("this build", "the new build") as the
    /// subject, and what to do.
    pub fn describe(&self, build: &str) -> String {
        match self {
            SchemaMismatch::NoSchema => "the database has no artex schema \
                (no artex.schema_migrations): run `artex migrate` first"
                .to_string(),
            SchemaMismatch::Missing { migration } => format!(
                "{build} needs migration {migration}, which the database does not have: run \
                 `artex migrate` with {build} first"
            ),
            SchemaMismatch::Differs { migration, why } => format!(
                "migration {migration} of {build} is not the one the database applied ({why}); \
                 released migrations are append-only"
            ),
            SchemaMismatch::Contracted {
                migration,
                compatible_from,
                knows,
            } => format!(
                "the database has migration {migration}, which only builds that know \
                 V{compatible_from} or newer run against; {build} knows up to V{knows}: run a \
                 newer build"
            ),
        }
    }
}

impl std::fmt::Display for SchemaMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe("this build"))
    }
}

impl std::error::Error for SchemaMismatch {}

#[cfg(test)]
mod tests {
    use super::connection_lost;
    use tokio_postgres::error::SqlState;

    #[test]
    fn a_server_shutting_down_is_a_lost_connection_and_a_timeout_is_not() {
        for lost in [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ] {
            assert!(connection_lost(&lost), "{lost:?}");
        }
        for kept in [
            SqlState::QUERY_CANCELED,
            SqlState::CHECK_VIOLATION,
            SqlState::T_R_DEADLOCK_DETECTED,
        ] {
            assert!(!connection_lost(&kept), "{kept:?}");
        }
    }
}

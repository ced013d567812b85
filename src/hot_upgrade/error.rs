//! Why an upgrade did not happen, for its caller: one type for every step of the old
//! side, each variant with the HTTP status the route answers with. Below every other
//! file of `hot_upgrade`, so that each of them can fail with it.

/// Why an upgrade did not happen, with the HTTP status that says so.
#[derive(Debug)]
pub enum UpgradeError {
    /// 403: no key or token configured.
    NotConfigured(String),
    /// 401: missing or wrong token.
    Unauthorized,
    /// 409: another upgrade is running.
    InProgress,
    /// 409: the new build cannot run against the database's schema (the message names
    /// the migration and what to run); nothing was spawned.
    Schema(String),
    /// 413: bundle larger than allowed.
    TooLarge(u64),
    /// 408: the upload stalled or took too long (what and how far is said).
    Timeout(String),
    /// 400: the bundle was refused (what was wrong is said).
    BadBundle(String),
    /// 500: the new process failed; everything was rolled back.
    RolledBack {
        /// What went wrong.
        why: String,
        /// The child's pid, if it was spawned.
        child_pid: Option<u32>,
        /// Milliseconds from upload received to rollback complete.
        elapsed_ms: u64,
    },
    /// 503: the database could not be read (the new build's schema is checked against
    /// it before anything is spawned); nothing changed, try again when it is back.
    Unavailable(String),
    /// 500: something on this side failed before anything changed.
    Internal(String),
}

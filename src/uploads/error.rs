//! Why an upload request is refused or failed.

/// Why an upload request is refused or failed; the HTTP layer maps it to a status.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Bad input (400): the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// No such upload (404).
    #[error("no upload {0} on this worker")]
    NotFound(String),
    /// The state forbids it (409).
    #[error("{0}")]
    Conflict(String),
    /// More bytes than declared (413).
    #[error("{0}")]
    TooLarge(String),
    /// Well-formed but refused (422): `field` names what (e.g. `task.flow`).
    #[error("{message}")]
    Unprocessable {
        /// The field refused.
        field: &'static str,
        /// Why, and what is expected.
        message: String,
    },
    /// The content does not match its sha256 (422); nothing was kept.
    #[error("{0}")]
    Mismatch(String),
    /// Over the disk quota (507); nothing was written.
    #[error("{0}")]
    Quota(String),
    /// The body stalled (408).
    #[error("{0}")]
    Timeout(String),
    /// The disk or the database failed (500).
    #[error("{0}")]
    Internal(String),
}

pub(super) type Result<T = (), E = UploadError> = std::result::Result<T, E>;

pub(super) fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> UploadError {
    move |e| match e.kind() {
        // A full disk (or the user's quota on it) is the client's to wait out or take
        // elsewhere, as a full `--upload-max-bytes` is: 507, not a server failure.
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
            UploadError::Quota(format!("the upload folder's disk is full: {what}: {e}"))
        }
        _ => UploadError::Internal(format!("{what}: {e}")),
    }
}

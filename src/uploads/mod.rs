//! Uploads on a worker's disk: a large file sent in chunks (`/api/v1/uploads`), each
//! chunk acknowledged only once it is on disk and fsynced, resumable after a dropped
//! connection, a hot upgrade or a crash because all of an upload's state is files in the
//! private upload folder, never only memory:
//!
//! ```text
//! <upload-dir>/<id>/meta.json   what was declared (size, sha256, chunking, the task)
//! <upload-dir>/<id>/<n>.part    chunk n, checked against its sha256 (renamed in whole)
//! <upload-dir>/<id>/file        the whole file, once every chunk is there and its
//!                               sha256 matches; then the upload's row and its task
//!                               are written (once: see `Blackboard::record_upload`)
//! ```
//!
//! Names only ever come from the upload's id (a UUID this worker made) and chunk
//! numbers: nothing a client sends becomes a path component. Two processes (the old and
//! the new one of a hot upgrade) may serve one upload at once: every file is written
//! aside under a unique name and renamed into place, so they never see half a file.
//!
//! # Layout
//! - `settings`: limits and the worker's upload flags;
//! - `declaration`: what a client declares (`POST /api/v1/uploads`), checked;
//! - `state`: starting an upload and reading where it stands, from its folder;
//! - `chunks`: receiving one chunk (streamed off the HTTP thread, hashed, fsynced);
//! - `finish`: joining the chunks and recording the upload with its task, once;
//! - `sweep`: expiring abandoned uploads, deleting files whose task ended;
//! - `disk`: durable writes and the small file helpers the others share;
//! - `error`: why a request is refused, mapped to a status by the HTTP layer.

mod chunks;
mod declaration;
mod disk;
mod error;
mod finish;
mod settings;
mod state;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;

use artex_actors::Blackboard;
use uuid::Uuid;

pub use declaration::{CreateRequest, Meta, TaskSpec};
pub use error::UploadError;
pub use settings::{UploadSettings, DEFAULT_CHUNK, MAX_CHUNK, MAX_CHUNKS, MAX_NAME, MIN_CHUNK};
pub use state::Progress;
pub use sweep::SweepReport;

/// The uploads of this worker.
pub struct Uploads {
    settings: UploadSettings,
    bb: Blackboard,
    host: String,
    actor: String,
    /// One finishing at a time in this process (another process may finish the same
    /// upload meanwhile: the database writes the task once).
    finishing: tokio::sync::Mutex<()>,
}

impl Uploads {
    /// Opens (creating, private) the upload folder.
    pub fn open(
        settings: UploadSettings,
        bb: Blackboard,
        host: String,
        actor: String,
    ) -> crate::error::Result<Arc<Uploads>> {
        artex_upgrade::private_dir::ensure_private_dir(&settings.dir, "upload folder")?;
        let dir = settings.dir.canonicalize().map_err(|e| {
            crate::error::Error::io(
                format!("resolving the upload folder {}", settings.dir.display()),
                e,
            )
        })?;
        Ok(Arc::new(Uploads {
            settings: UploadSettings { dir, ..settings },
            bb,
            host,
            actor,
            finishing: tokio::sync::Mutex::new(()),
        }))
    }

    /// The settings.
    pub fn settings(&self) -> &UploadSettings {
        &self.settings
    }

    fn folder(&self, id: Uuid) -> PathBuf {
        self.settings.dir.join(id.to_string())
    }
}

//! Uploads on a worker's disk: a large file sent in chunks (`/api/v1/uploads`), each
//! chunk acknowledged only once it is on disk and fsynced, resumable after a dropped
//! connection, a hot upgrade or a crash because all of an upload's state is files in the
//! private upload folder, never only memory:
//!
//! ```text
//! <upload-dir>/<id>/meta.json   what was declared (size, sha256, chunking, the task,
//!                               the layout: 2)
//! <upload-dir>/<id>/data        the file being received: each chunk written in place at
//!                               its offset (its byte range locked meanwhile), checked
//!                               against its sha256 and synced
//! <upload-dir>/<id>/<n>.part    empty: chunk n is durable in `data` (made only after
//!                               the sync; a chunk marked is never written again)
//! <upload-dir>/<id>/file        `data` renamed, once every chunk is there and the whole
//!                               sha256 matches (hashed ahead: `prefix`); then the row
//!                               and its task are written (once: see
//!                               `WorkerBoard::record_upload`)
//! ```
//!
//! An upload started by an earlier build (layout 1: a file per chunk, joined at the end)
//! is refused with 409 saying so, never read as this layout.
//!
//! # One blackboard's uploads only
//! Several deployments may run on one host as one user (a test run and a real one, two
//! teams' blackboards). The default folder is `$TMPDIR/artex-uploads-<uid>-<blackboard
//! id>` (the id made when the database was migrated: `WorkerBoard::blackboard_id`), and
//! every `meta.json` names its blackboard: an upload naming another one is never
//! finished, resumed, recorded or swept here (a request for it is answered 404, as for an
//! unknown upload: to this deployment it is one). `meta.json` of an earlier build names
//! none: in an explicit `--upload-dir` such an upload is taken as this blackboard's, once
//! (its `meta.json` stamped under its lock); in the default folder, which no earlier
//! build wrote, it is another's.
//!
//! Workers of one blackboard on one host share its folder: whoever finishes, takes or
//! sweeps an upload holds its `lock` file (an open-file-description lock, so one owner
//! across processes and requests), and finds it gone once it gets the lock if the owner
//! removed it.
//!
//! Names only ever come from the upload's id (a UUID this worker made) and chunk
//! numbers: nothing a client sends becomes a path component. Two processes (the old and
//! the new one of a hot upgrade) may serve one upload at once: a chunk is written only
//! under its range lock and only while unmarked, `meta.json` is written aside and
//! renamed, and `data` becomes `file` by a rename, so they never see half of anything.
//!
//! # Layout
//! - `settings`: limits and the worker's upload flags;
//! - `declaration`: what a client declares (`POST /api/v1/uploads`), checked;
//! - `state`: starting an upload and reading where it stands, from its folder;
//! - `chunks`: receiving one chunk (streamed off the HTTP thread, hashed, fsynced);
//! - `data`: the data file, chunk range locks and markers;
//! - `prefix`: the whole file's sha256 hashed ahead, chunk by chunk as they are marked;
//! - `finish`: checking the whole file and recording the upload with its task, once;
//! - `sweep`: expiring abandoned uploads, deleting files whose task ended;
//! - `owner`: whose an upload is (its blackboard), and its lock;
//! - `disk`: durable writes and the small file helpers the others share;
//! - `error`: why a request is refused, mapped to a status by the HTTP layer.

mod chunks;
mod data;
mod declaration;
mod disk;
mod error;
mod finish;
mod owner;
mod prefix;
mod settings;
mod state;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;

use artex_actors::blackboard::WorkerBoard;
use uuid::Uuid;

pub use declaration::{check_sha256, CreateRequest, Meta, TaskSpec};
pub use error::UploadError;
pub use settings::{UploadSettings, DEFAULT_CHUNK, MAX_CHUNK, MAX_CHUNKS, MAX_NAME, MIN_CHUNK};
pub use state::Progress;
pub use sweep::SweepReport;

/// The uploads of this worker.
pub struct Uploads {
    settings: UploadSettings,
    bb: WorkerBoard,
    host: String,
    actor: String,
    /// This blackboard's id: uploads naming another are not this worker's.
    blackboard: Uuid,
    /// With the default folder: the one earlier builds shared
    /// (`$TMPDIR/artex-uploads-<uid>`), where files this blackboard recorded are still
    /// deleted once their task ended (its row in this database says they are its own).
    legacy: Option<PathBuf>,
    /// Uploads of other blackboards already logged as left alone (one line each).
    foreign: std::sync::Mutex<std::collections::HashSet<Uuid>>,
    /// One start at a time in this process: the room left under `--upload-max-bytes` is
    /// read, then taken by the new upload's `meta.json`; two starts at once would both
    /// find the same room. Taken on the disk task itself, which runs on whether or not
    /// its request waits for it.
    starting: std::sync::Mutex<()>,
    /// One finishing at a time in this process (another process may finish the same
    /// upload meanwhile: the database writes the task once).
    finishing: tokio::sync::Mutex<()>,
    /// The whole file's sha256 of uploads being received, hashed ahead.
    prefixes: prefix::Prefixes,
    /// Bytes of chunks received and checked (`/metrics`).
    received: artex_actors::metrics::Counter,
}

impl Uploads {
    /// Opens (creating, private) the upload folder of blackboard `blackboard`: the
    /// explicit one, or the default stem ended with `-<blackboard>`.
    pub fn open(
        settings: UploadSettings,
        bb: WorkerBoard,
        host: String,
        actor: String,
        blackboard: Uuid,
    ) -> crate::error::Result<Arc<Uploads>> {
        // As earlier builds resolved it (they recorded canonical paths); none if absent.
        let legacy = (!settings.explicit)
            .then(|| settings.dir.canonicalize().ok())
            .flatten();
        let settings = UploadSettings {
            dir: settings::folder_of(&settings, blackboard),
            ..settings
        };
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
            blackboard,
            legacy,
            foreign: Default::default(),
            starting: std::sync::Mutex::new(()),
            finishing: tokio::sync::Mutex::new(()),
            prefixes: prefix::Prefixes::default(),
            received: Default::default(),
        }))
    }

    /// Bytes of chunks this process received and checked.
    pub fn received_bytes(&self) -> u64 {
        self.received.get()
    }

    /// The settings.
    pub fn settings(&self) -> &UploadSettings {
        &self.settings
    }

    fn folder(&self, id: Uuid) -> PathBuf {
        self.settings.dir.join(id.to_string())
    }
}

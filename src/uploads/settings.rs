//! Upload limits, and the settings a worker's `--upload-*` flags ask for.

use std::path::PathBuf;
use std::time::Duration;

/// Chunk size when the client names none: 10 MiB.
pub const DEFAULT_CHUNK: u64 = 10 * 1024 * 1024;
/// Smallest chunk size accepted.
pub const MIN_CHUNK: u64 = 1024;
/// Largest chunk size accepted: 64 MiB (memory stays bounded whatever it is; this bounds
/// what one failed request wastes).
pub const MAX_CHUNK: u64 = 64 * 1024 * 1024;
/// Most chunks an upload may have.
pub const MAX_CHUNKS: u64 = 100_000;
/// Longest client-given name kept (it is only ever shown, never a path).
pub const MAX_NAME: usize = 255;

/// Where and how uploads are kept (from `UploadArgs`).
#[derive(Debug, Clone)]
pub struct UploadSettings {
    /// The private upload folder: `--upload-dir`, or by default the stem
    /// `$TMPDIR/artex-uploads-<uid>`, which [`Uploads::open`](super::Uploads::open) ends
    /// with `-<blackboard id>`.
    pub dir: PathBuf,
    /// `dir` was given (`--upload-dir`): used as it is. An upload there whose `meta.json`
    /// names no blackboard (an earlier build's) is taken as this blackboard's, once.
    pub explicit: bool,
    /// On storage the whole fleet sees: tasks are bound to no host.
    pub shared: bool,
    /// Bytes all uploads on this folder may take (declared sizes, reserved on creation).
    pub max_bytes: u64,
    /// An unfinished upload untouched this long is removed.
    pub expire: Duration,
    /// A file is kept this long after its task ended.
    pub keep: Duration,
    /// A chunk whose body sends nothing this long is cut.
    pub body_timeout: Duration,
}

impl UploadSettings {
    /// The settings a worker's upload flags ask for.
    pub fn from_args(args: &crate::config::UploadArgs) -> Self {
        let dir = args.upload_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("artex-uploads-{}", nix::unistd::geteuid()))
        });
        let ms = crate::config::ms;
        UploadSettings {
            dir,
            explicit: args.upload_dir.is_some(),
            shared: args.upload_shared,
            max_bytes: args.upload_max_bytes,
            expire: ms(args.upload_expire_ms),
            keep: ms(args.upload_keep_ms),
            body_timeout: ms(args.upload_body_timeout_ms),
        }
    }
}

/// The folder `settings` name for blackboard `blackboard`: `--upload-dir` as given, or
/// the default stem ended with `-<blackboard>` — a sibling of the folder earlier builds
/// shared (`$TMPDIR/artex-uploads-<uid>`), not inside it, where their sweepers would
/// take it for an abandoned upload.
pub(super) fn folder_of(settings: &UploadSettings, blackboard: uuid::Uuid) -> PathBuf {
    if settings.explicit {
        return settings.dir.clone();
    }
    let mut name = settings.dir.as_os_str().to_owned();
    name.push(format!("-{blackboard}"));
    PathBuf::from(name)
}

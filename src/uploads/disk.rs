//! Small file helpers: private files created new, durable writes (aside, fsync, rename,
//! fsync the folder), folder listings, and running disk work off the async threads.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use uuid::Uuid;

use super::error::{io, Result, UploadError};

pub(super) fn create_private(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("creating {}", path.display())))
}

/// Writes `name` in `dir` aside, fsyncs it and renames it into place.
pub(super) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result {
    let aside = dir.join(format!("{name}.{}", Uuid::new_v4().simple()));
    let mut f = create_private(&aside)?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", aside.display())))?;
    fs::rename(&aside, dir.join(name)).map_err(io(format!("placing {name}")))?;
    sync_dir(dir)
}

pub(super) fn sync_dir(dir: &Path) -> Result {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

/// The upload ids in `dir` (entries not named like one are skipped, as `None`).
pub(super) fn read_dir(dir: &Path) -> Result<Vec<Option<Uuid>>> {
    let entries = fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    Ok(entries
        .flatten()
        .map(|e| e.file_name().to_str().and_then(|s| Uuid::parse_str(s).ok()))
        .collect())
}

/// When anything in `dir` last changed.
pub(super) fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let own = fs::metadata(dir).and_then(|m| m.modified()).ok();
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
        .chain(own)
        .max()
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| UploadError::Internal(format!("a disk task failed: {e}")))?
}

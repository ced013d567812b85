//! The data file of an upload: chunks written in place at their offsets, each chunk's
//! byte range locked while it is written (an open-file-description lock, so two
//! requests for one chunk, in this process or the other one of a hot upgrade, never
//! write it at once), and a marker per chunk made only once its bytes are durable.
//!
//! A chunk already marked is never written again: a re-sent copy (corrupted or not) is
//! only read and checked, against its own hash and then against the bytes stored (other
//! bytes are refused, 409, rather than acknowledged unwritten). A refused chunk leaves its range unmarked (its bytes count for
//! nothing), and the data file itself goes when nothing else is in it.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::{io, Result, UploadError};

/// The file being received, chunks in place (sparse until every one is there).
pub(super) const DATA: &str = "data";
/// `DATA` renamed once whole and its sha256 checked.
pub(super) const WHOLE: &str = "file";

/// Chunk `n`'s marker: it exists only once the chunk's bytes in `DATA` are durable.
pub(super) fn marker(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n}.part"))
}

/// Where a chunk's body goes.
pub(super) enum Target {
    /// Into the data file, whose range for the chunk this request holds locked.
    Write(File),
    /// Nowhere: the chunk is durable already (marked, or the file is whole); the body is
    /// only checked against its hash.
    Done,
}

/// Opens the data file for chunk `n` (`offset`, `len`) with its range locked; waits
/// while another request writes the same chunk. `Done` when the chunk needs no writing.
pub(super) fn lock_chunk(dir: &Path, n: u64, offset: u64, len: u64) -> Result<Target> {
    let data = dir.join(DATA);
    // The data file may be removed (a refused first chunk) or renamed (the upload
    // finished) between opening and locking it: then it is opened again.
    for _ in 0..100 {
        if dir.join(WHOLE).exists() || marker(dir, n).exists() {
            return Ok(Target::Done);
        }
        let file = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&data)
        {
            Ok(f) => f,
            // The folder is gone: finished and swept, or discarded.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(UploadError::NotFound(id_of(dir)))
            }
            Err(e) => return Err(io(format!("opening {}", data.display()))(e)),
        };
        range_lock(&file, offset, len, true)
            .map_err(io(format!("locking chunk {n} of {}", data.display())))?;
        let same = match fs::metadata(&data) {
            Ok(now) => {
                let mine = file
                    .metadata()
                    .map_err(io(format!("reading {}", data.display())))?;
                (now.dev(), now.ino()) == (mine.dev(), mine.ino())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(format!("reading {}", data.display()))(e)),
        };
        if !same {
            continue;
        }
        // Sealed meanwhile (its markers are removed then): this `data` is a stray one
        // this open made, empty; the chunk is in `file`.
        if dir.join(WHOLE).exists() {
            let _ = fs::remove_file(&data);
            return Ok(Target::Done);
        }
        if marker(dir, n).exists() {
            return Ok(Target::Done);
        }
        return Ok(Target::Write(file));
    }
    Err(UploadError::Internal(format!(
        "{}: replaced 100 times while chunk {n} waited for it",
        data.display()
    )))
}

/// Chunk `n` is durable in the data file (synced by the caller): its marker, made
/// durable in its turn. Called with the chunk's range still locked.
pub(super) fn mark(dir: &Path, n: u64) -> Result {
    let path = marker(dir, n);
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io(format!("creating {}", path.display())))?;
    super::disk::sync_dir(dir)
}

/// The sha256 of the `len` bytes at `offset` as the upload stores them: a durable chunk's
/// (in the data file, or in the whole file once the upload finished).
pub(super) fn stored_sha256(dir: &Path, offset: u64, len: u64) -> Result<String> {
    use sha2::{Digest, Sha256};
    let open = |name: &str| {
        let path = dir.join(name);
        File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => UploadError::NotFound(id_of(dir)),
            _ => io(format!("opening {}", path.display()))(e),
        })
    };
    // The data file is renamed whole once the upload finishes, maybe meanwhile.
    let file = match open(DATA) {
        Err(UploadError::NotFound(_)) => open(WHOLE)?,
        other => other?,
    };
    let mut hash = Sha256::new();
    hash_range(&file, &mut hash, offset, len, &mut vec![0u8; 64 * 1024])
        .map_err(io(format!("reading the stored bytes in {}", dir.display())))?;
    Ok(hex::encode(hash.finalize()))
}

/// Feeds the `len` bytes of `file` at `offset` into `hash`, a `buf` at a time (the
/// hash ahead's chunks, a re-sent chunk's stored bytes).
pub(super) fn hash_range(
    file: &File,
    hash: &mut sha2::Sha256,
    offset: u64,
    len: u64,
    buf: &mut [u8],
) -> std::io::Result<()> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    let mut at = 0;
    while at < len {
        let n = buf
            .len()
            .min(usize::try_from(len - at).unwrap_or(usize::MAX));
        file.read_exact_at(&mut buf[..n], offset + at)?;
        hash.update(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// After a refused chunk (its range still locked by `file`): removes the data file if
/// no chunk is in it and no other request is writing one, so that a refused first
/// chunk leaves nothing behind. Best effort: a data file left is harmless.
pub(super) fn discard_if_alone(dir: &Path, file: &File) {
    // Taking the whole file succeeds only when no other request holds a range (our own
    // range is converted). Writers check, once locked, that the file is still `DATA`.
    if range_lock(file, 0, 0, false).is_err() || dir.join(WHOLE).exists() {
        return;
    }
    let any_marker = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_str().is_some_and(|s| s.ends_with(".part")));
    if !any_marker {
        let _ = fs::remove_file(dir.join(DATA));
    }
}

/// Locks `len` bytes from `offset` (0: to the end) of `file` for writing; waits for a
/// conflicting lock when `wait`. Released when `file` is closed.
pub(super) fn range_lock(file: &File, offset: u64, len: u64, wait: bool) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let too_far = || std::io::Error::other("offset out of range");
    let lock = nix::libc::flock {
        l_type: nix::libc::F_WRLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: i64::try_from(offset).map_err(|_| too_far())?,
        l_len: i64::try_from(len).map_err(|_| too_far())?,
        // Must be 0 for open-file-description locks.
        l_pid: 0,
    };
    loop {
        let arg = if wait {
            FcntlArg::F_OFD_SETLKW(&lock)
        } else {
            FcntlArg::F_OFD_SETLK(&lock)
        };
        match fcntl(file, arg) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The upload id an upload's folder is named after (as an error names it).
pub(super) fn id_of(dir: &Path) -> String {
    dir.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> File {
        fs::OpenOptions::new()
            .write(true)
            .open(dir.join(DATA))
            .unwrap()
    }

    #[test]
    fn a_chunk_is_written_by_one_request_at_a_time_and_never_after_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        let Target::Write(first) = lock_chunk(dir.path(), 0, 0, 100).unwrap() else {
            panic!("a fresh chunk must be written");
        };
        // Another open of the file (another request, or the other process of a hot
        // upgrade) cannot take the same range, but can take another chunk's.
        let other = open(dir.path());
        assert!(range_lock(&other, 50, 100, false).is_err());
        assert!(range_lock(&other, 100, 100, false).is_ok());
        mark(dir.path(), 0).unwrap();
        drop(first);
        assert!(matches!(
            lock_chunk(dir.path(), 0, 0, 100).unwrap(),
            Target::Done
        ));
    }

    #[test]
    fn a_refused_chunk_removes_the_data_file_only_when_nothing_else_is_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let Target::Write(f) = lock_chunk(dir.path(), 1, 100, 100).unwrap() else {
            panic!("a fresh chunk must be written");
        };
        // Another request holds chunk 0: the file stays.
        let other = open(dir.path());
        range_lock(&other, 0, 100, false).unwrap();
        discard_if_alone(dir.path(), &f);
        assert!(dir.path().join(DATA).exists());
        drop(other);
        // A chunk received: the file stays.
        mark(dir.path(), 0).unwrap();
        discard_if_alone(dir.path(), &f);
        assert!(dir.path().join(DATA).exists());
        // Alone and empty: it goes, and the next request makes a new one.
        fs::remove_file(marker(dir.path(), 0)).unwrap();
        discard_if_alone(dir.path(), &f);
        assert!(!dir.path().join(DATA).exists());
        drop(f);
        assert!(matches!(
            lock_chunk(dir.path(), 1, 100, 100).unwrap(),
            Target::Write(_)
        ));
        assert!(dir.path().join(DATA).exists());
    }
}

//! Unpacking a bundle as hostile input: the destination checked, the archive bounded and
//! its directory checked (`directory`) before a byte is decompressed, the signature and
//! manifest verified, and the binary streamed out with nothing left behind on failure.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};
use zip::ZipArchive;

use crate::channel::PROTOCOL_VERSION;
use crate::error::{Error, Result};

use super::directory::{check_entries, cross_check, read_central_directory, CentralEntry};
use super::{
    task_entry, Limits, Manifest, VerifiedBundle, BINARY_NAME, COPY_BUFFER, MANIFEST_NAME,
    MAX_SIGNATURE_BYTES, SIGNATURE_NAME, TARGET, TASKS_DIR, TASK_ENTRY_PREFIX,
};

/// Verifies the bundle at `zip_path` and writes its binary to `dest_dir/artex`, and its
/// task files, if it carries any, to `dest_dir/tasks/`.
///
/// `dest_dir` must be an empty directory owned by this user and private to it (no group
/// or other permission bits): the caller creates it fresh for this bundle. No path is
/// ever taken from the archive; on any failure whatever was written is removed and
/// `dest_dir` is left empty. Every reason to refuse is its own [`Error`] variant.
pub fn unpack(
    zip_path: &Path,
    public: &VerifyingKey,
    limits: &Limits,
    dest_dir: &Path,
) -> Result<VerifiedBundle> {
    check_dest_dir(dest_dir)?;
    let mut file =
        File::open(zip_path).map_err(|source| Error::io("opening bundle", zip_path, source))?;
    let size = file
        .metadata()
        .map_err(|source| Error::io("reading bundle metadata", zip_path, source))?
        .len();
    // Deflate's worst-case expansion of incompressible data is well under 1/256, so a
    // larger archive cannot hold entries within the limits.
    let max_archive = limits
        .max_binary_bytes
        .saturating_add(limits.max_tasks_bytes)
        .saturating_add(
            limits
                .max_binary_bytes
                .saturating_add(limits.max_tasks_bytes)
                / 256,
        )
        .saturating_add(limits.max_manifest_bytes)
        .saturating_add(MAX_SIGNATURE_BYTES)
        .saturating_add(1024 * 1024);
    if size > max_archive {
        return Err(Error::ArchiveTooLarge {
            path: zip_path.to_owned(),
            size,
            limit: max_archive,
        });
    }

    let entries = read_central_directory(&mut file, size, zip_path, limits)?;
    check_entries(&entries, limits)?;

    file.seek(SeekFrom::Start(0))
        .map_err(|source| Error::io("reading bundle", zip_path, source))?;
    let mut archive = ZipArchive::new(file).map_err(|source| Error::ZipRead {
        path: zip_path.to_owned(),
        source,
    })?;
    cross_check(&mut archive, &entries, zip_path)?;

    let entry = |name: &str| {
        entries
            .iter()
            .position(|e| e.name == name.as_bytes())
            .map(|i| (i, &entries[i]))
            .ok_or_else(|| Error::ArchiveAmbiguous {
                path: zip_path.to_owned(),
                reason: format!("entry {name} vanished between checks"),
            })
    };

    let (sig_index, sig_entry) = entry(SIGNATURE_NAME)?;
    let signature_bytes = read_to_vec(&mut archive, sig_index, sig_entry, zip_path)?;
    let (manifest_index, manifest_entry) = entry(MANIFEST_NAME)?;
    let manifest_bytes = read_to_vec(&mut archive, manifest_index, manifest_entry, zip_path)?;
    verify_signature(public, &manifest_bytes, &signature_bytes)?;

    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|source| Error::ManifestInvalid { source })?;
    if manifest.channel_protocol != PROTOCOL_VERSION {
        return Err(Error::ProtocolMismatch {
            expected: PROTOCOL_VERSION,
            found: manifest.channel_protocol,
        });
    }
    if manifest.target != TARGET {
        return Err(Error::TargetMismatch {
            expected: TARGET,
            found: manifest.target,
        });
    }

    check_task_files(&manifest, &entries)?;

    let (binary_index, binary_entry) = entry(BINARY_NAME)?;
    let binary = dest_dir.join(BINARY_NAME);
    let written = RemoveOnDrop::new(binary.clone());
    let digest = write_file(
        &mut archive,
        binary_index,
        binary_entry,
        zip_path,
        &binary,
        0o700,
    )?;
    if !digest.eq_ignore_ascii_case(&manifest.binary_sha256) {
        return Err(Error::DigestMismatch {
            expected: manifest.binary_sha256,
            found: digest,
        });
    }
    let tasks = if manifest.tasks.is_empty() {
        None
    } else {
        let dir = dest_dir.join(TASKS_DIR);
        let made = RemoveOnDrop::new_dir(dir.clone());
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&dir)
            .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)))
            .map_err(|source| Error::io("creating the tasks folder", &dir, source))?;
        for file in &manifest.tasks {
            let (index, e) = entry(&task_entry(&file.name))?;
            let path = dir.join(&file.name);
            let mode = if file.executable { 0o755 } else { 0o644 };
            let digest = write_file(&mut archive, index, e, zip_path, &path, mode)?;
            if !digest.eq_ignore_ascii_case(&file.sha256) {
                return Err(Error::TaskDigestMismatch {
                    name: file.name.clone(),
                    expected: file.sha256.clone(),
                    found: digest,
                });
            }
        }
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| Error::io("syncing directory", &dir, source))?;
        Some((dir, made))
    };
    // Make the new directory entry durable too: the binary is about to be exec'd, and a
    // crash now must not leave a supervisor pointing at a name that never hit the disk.
    File::open(dest_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| Error::io("syncing directory", dest_dir, source))?;
    written.keep();
    let tasks = tasks.map(|(dir, made)| {
        made.keep();
        dir
    });
    Ok(VerifiedBundle {
        manifest,
        binary,
        tasks,
    })
}

/// The task files in the archive must be exactly those the signed manifest names, each
/// name one a task file may have: an extra file could not be checked against a digest,
/// and a missing one would run the new build without a program it was signed with.
/// (Every archived name passed `check_name` already, so a manifest name found among them
/// is one a task file may have.)
fn check_task_files(manifest: &Manifest, entries: &[CentralEntry]) -> Result {
    let archived: Vec<&[u8]> = entries
        .iter()
        .filter_map(|e| e.name.strip_prefix(TASK_ENTRY_PREFIX.as_bytes()))
        .collect();
    for file in &manifest.tasks {
        if !archived.contains(&file.name.as_bytes()) {
            return Err(Error::TaskFileUnsigned {
                name: file.name.clone(),
                reason: "is named in the signed manifest but not in the archive",
            });
        }
    }
    for name in archived {
        if !manifest.tasks.iter().any(|f| f.name.as_bytes() == name) {
            return Err(Error::TaskFileUnsigned {
                name: String::from_utf8_lossy(name).into_owned(),
                reason: "is in the archive but not in the signed manifest",
            });
        }
    }
    Ok(())
}

fn check_dest_dir(dest_dir: &Path) -> Result {
    let invalid = |reason: String| Error::DestInvalid {
        path: dest_dir.to_owned(),
        reason,
    };
    let meta = dest_dir
        .symlink_metadata()
        .map_err(|source| Error::io("inspecting destination", dest_dir, source))?;
    if !meta.is_dir() {
        return Err(invalid("not a directory (symlinks are refused)".to_owned()));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(invalid(format!(
            "owned by uid {}, expected {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(invalid(format!(
            "mode {:o} gives group or others access; expected 0700",
            meta.mode() & 0o777
        )));
    }
    let mut listing = fs::read_dir(dest_dir)
        .map_err(|source| Error::io("listing destination", dest_dir, source))?;
    if let Some(first) = listing.next() {
        let name = first
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .unwrap_or_default();
        return Err(invalid(format!("not empty (holds {name:?})")));
    }
    Ok(())
}

/// Streams one entry to `sink`, trusting no header: exactly the declared size must come
/// out, and reading stops one byte past it.
fn copy_entry(
    archive: &mut ZipArchive<File>,
    index: usize,
    entry: &CentralEntry,
    path: &Path,
    mut sink: impl FnMut(&[u8]) -> Result,
) -> Result {
    let name = entry.shown_name();
    let reader = archive.by_index(index).map_err(|source| Error::ZipRead {
        path: path.to_owned(),
        source,
    })?;
    let mut reader = reader.take(entry.uncompressed.saturating_add(1));
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(Error::EntryRead { name, source }),
        };
        total += n as u64;
        if total > entry.uncompressed {
            return Err(Error::EntryOverrun {
                name,
                declared: entry.uncompressed,
            });
        }
        sink(&buf[..n])?;
    }
    if total != entry.uncompressed {
        return Err(Error::EntryTruncated {
            name,
            declared: entry.uncompressed,
            found: total,
        });
    }
    Ok(())
}

fn read_to_vec(
    archive: &mut ZipArchive<File>,
    index: usize,
    entry: &CentralEntry,
    path: &Path,
) -> Result<Vec<u8>> {
    // The declared size was checked against its limit, so this allocation is bounded.
    let mut out = Vec::with_capacity(entry.uncompressed as usize);
    copy_entry(archive, index, entry, path, |chunk| {
        out.extend_from_slice(chunk);
        Ok(())
    })?;
    Ok(out)
}

fn verify_signature(public: &VerifyingKey, manifest: &[u8], signature_hex: &[u8]) -> Result {
    let bad = |reason: String| Error::BadSignature { reason };
    let text = signature_hex.trim_ascii();
    let mut bytes = [0u8; 64];
    if text.len() != 128 {
        return Err(bad(format!(
            "{SIGNATURE_NAME} holds {} characters, expected 128 hex digits",
            text.len()
        )));
    }
    hex::decode_to_slice(text, &mut bytes)
        .map_err(|e| bad(format!("{SIGNATURE_NAME} is not hex: {e}")))?;
    // verify_strict also refuses weak keys and malleable signatures.
    public
        .verify_strict(manifest, &Signature::from_bytes(&bytes))
        .map_err(|_| {
            bad(format!(
                "{SIGNATURE_NAME} does not match {MANIFEST_NAME} under the configured public key {}",
                hex::encode(public.to_bytes())
            ))
        })
}

/// Streams one entry to a new file at `dest` (never one already there) with `mode`,
/// fsynced; its SHA-256.
fn write_file(
    archive: &mut ZipArchive<File>,
    index: usize,
    entry: &CentralEntry,
    path: &Path,
    dest: &Path,
    mode: u32,
) -> Result<String> {
    let write_err = |source| Error::io("writing", dest, source);
    // create_new: never follow or reuse something already at that name.
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dest)
        .map_err(|source| Error::io("creating", dest, source))?;
    let mut hasher = Sha256::new();
    copy_entry(archive, index, entry, path, |chunk| {
        hasher.update(chunk);
        out.write_all(chunk).map_err(write_err)
    })?;
    // The umask may have narrowed the mode at creation.
    out.set_permissions(fs::Permissions::from_mode(mode))
        .and_then(|()| out.sync_all())
        .map_err(write_err)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Removes a file (or a folder and what it holds) when dropped, unless
/// [`RemoveOnDrop::keep`] was called: the cleanup for every early return after the binary
/// or the tasks folder was created.
struct RemoveOnDrop {
    path: Option<PathBuf>,
    folder: bool,
}

impl RemoveOnDrop {
    fn new(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            folder: false,
        }
    }

    fn new_dir(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            folder: true,
        }
    }

    fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let removed = if self.folder {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if let Err(e) = removed {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove what a refused bundle wrote");
                }
            }
        }
    }
}

//! The archive's central directory, read by hand: the zip crate keys entries by name and
//! would merge duplicates. Every declared entry is parsed and checked (name, type, sizes,
//! ratio) before anything is decompressed, then compared with what the zip crate reads.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use zip::ZipArchive;

use crate::error::{Error, Result};

use super::{
    check_task_name, task_entry, Limits, BINARY_NAME, MANIFEST_NAME, MAX_SIGNATURE_BYTES,
    SIGNATURE_NAME, TASK_ENTRY_PREFIX,
};

const EXPECTED_NAMES: [&str; 3] = [BINARY_NAME, MANIFEST_NAME, SIGNATURE_NAME];

/// What an entry is, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EntryName {
    /// `artex`, `manifest.json` or `manifest.sig`.
    Fixed(&'static str),
    /// `tasks/NAME`: the file `NAME` of the tasks folder.
    Task(String),
}

impl EntryName {
    fn shown(&self) -> String {
        match self {
            EntryName::Fixed(n) => (*n).to_string(),
            EntryName::Task(n) => task_entry(n),
        }
    }
}

/// One central-directory record, as the archive declares it.
#[derive(Debug)]
pub(super) struct CentralEntry {
    pub(super) name: Vec<u8>,
    pub(super) made_by: u16,
    pub(super) flags: u16,
    pub(super) method: u16,
    pub(super) compressed: u64,
    pub(super) uncompressed: u64,
    pub(super) external_attrs: u32,
}

impl CentralEntry {
    pub(super) fn shown_name(&self) -> String {
        show_name(&self.name)
    }
}

fn show_name(raw: &[u8]) -> String {
    // Debug-escaped so NUL, newlines and escape codes cannot forge log lines.
    format!("{:?}", String::from_utf8_lossy(raw))
}

pub(super) const EOCD_SIGNATURE: [u8; 4] = *b"PK\x05\x06";
pub(super) const EOCD_LEN: usize = 22;
pub(super) const CENTRAL_SIGNATURE: [u8; 4] = *b"PK\x01\x02";
pub(super) const CENTRAL_LEN: usize = 46;
const MAX_COMMENT: usize = 0xFFFF;

pub(super) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the end record and the central directory by hand, because the zip crate keys
/// entries by name and so silently merges duplicates, and parses every declared entry
/// before anyone can bound their number.
pub(super) fn read_central_directory(
    file: &mut File,
    size: u64,
    path: &Path,
    limits: &Limits,
) -> Result<Vec<CentralEntry>> {
    let corrupt = |reason: String| Error::ZipCorrupt {
        path: path.to_owned(),
        reason,
    };
    let unsupported = |reason: &str| Error::UnsupportedArchive {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if size < EOCD_LEN as u64 {
        return Err(corrupt(format!(
            "{size} bytes is too short for an end-of-central-directory record"
        )));
    }
    // The bound guarantees the cast fits.
    let tail_len = size.min((EOCD_LEN + MAX_COMMENT) as u64) as usize;
    let tail_start = size - tail_len as u64;
    let mut tail = vec![0u8; tail_len];
    file.seek(SeekFrom::Start(tail_start))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(|source| Error::io("reading bundle", path, source))?;
    // The end record must sit exactly at the end, its comment running to the last byte:
    // anything else is an archive some reader might interpret differently.
    let eocd = (0..=tail_len - EOCD_LEN)
        .rev()
        .find(|&i| {
            tail[i..i + 4] == EOCD_SIGNATURE
                && i + EOCD_LEN + usize::from(u16_at(&tail, i + 20)) == tail_len
        })
        .ok_or_else(|| {
            corrupt("no end-of-central-directory record (truncated, or not a ZIP)".to_owned())
        })?;
    let rec = &tail[eocd..eocd + EOCD_LEN];
    let (disk, cd_disk) = (u16_at(rec, 4), u16_at(rec, 6));
    let (on_disk, total) = (u16_at(rec, 8), u16_at(rec, 10));
    let (cd_size, cd_offset) = (u32_at(rec, 12), u32_at(rec, 16));
    if total == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF {
        return Err(unsupported(
            "ZIP64 archives are not accepted (a bundle is far below 4 GiB)",
        ));
    }
    if disk != 0 || cd_disk != 0 || on_disk != total {
        return Err(unsupported("multi-disk archives are not accepted"));
    }
    if usize::from(total) > limits.max_entries {
        return Err(Error::TooManyEntries {
            path: path.to_owned(),
            found: usize::from(total),
            limit: limits.max_entries,
        });
    }
    let eocd_offset = tail_start + eocd as u64;
    if u64::from(cd_offset) + u64::from(cd_size) != eocd_offset {
        return Err(corrupt(format!(
            "central directory at offset {cd_offset} with size {cd_size} does not end at the \
             end record (offset {eocd_offset})"
        )));
    }
    // Bounded by the entry count just checked, so a lying size cannot make us allocate.
    let max_cd = usize::from(total) * (CENTRAL_LEN + 3 * 0xFFFF);
    let cd_len = cd_size as usize;
    if cd_len > max_cd {
        return Err(corrupt(format!(
            "central directory of {cd_len} bytes is too big for {total} entries"
        )));
    }
    let mut cd = vec![0u8; cd_len];
    file.seek(SeekFrom::Start(u64::from(cd_offset)))
        .and_then(|_| file.read_exact(&mut cd))
        .map_err(|source| Error::io("reading bundle", path, source))?;

    let mut entries = Vec::with_capacity(usize::from(total));
    let mut at = 0usize;
    for index in 0..total {
        if cd.len() - at < CENTRAL_LEN || cd[at..at + 4] != CENTRAL_SIGNATURE {
            return Err(corrupt(format!(
                "central directory record {index} at offset {} is missing or damaged",
                u64::from(cd_offset) + at as u64
            )));
        }
        let h = &cd[at..at + CENTRAL_LEN];
        let name_len = usize::from(u16_at(h, 28));
        let var_len = name_len + usize::from(u16_at(h, 30)) + usize::from(u16_at(h, 32));
        if cd.len() - at - CENTRAL_LEN < var_len {
            return Err(corrupt(format!(
                "central directory record {index} runs past the directory's end"
            )));
        }
        let (compressed, uncompressed) = (u32_at(h, 20), u32_at(h, 24));
        if compressed == 0xFFFF_FFFF || uncompressed == 0xFFFF_FFFF {
            return Err(unsupported(
                "ZIP64 entries are not accepted (a bundle is far below 4 GiB)",
            ));
        }
        entries.push(CentralEntry {
            name: cd[at + CENTRAL_LEN..at + CENTRAL_LEN + name_len].to_vec(),
            made_by: u16_at(h, 4),
            flags: u16_at(h, 8),
            method: u16_at(h, 10),
            compressed: u64::from(compressed),
            uncompressed: u64::from(uncompressed),
            external_attrs: u32_at(h, 38),
        });
        at += CENTRAL_LEN + var_len;
    }
    if at != cd.len() {
        return Err(corrupt(format!(
            "{} unexplained bytes after the last central directory record",
            cd.len() - at
        )));
    }
    Ok(entries)
}

/// Checks an entry name without ever turning it into a path: the three expected names
/// are flat, and a task file is one flat name under `tasks/`; anything else resembling a
/// path is refused outright.
pub(super) fn check_name(raw: &[u8]) -> Result<EntryName> {
    let unsafe_name = |reason| Error::UnsafeEntryName {
        name: show_name(raw),
        reason,
    };
    if raw.is_empty() {
        return Err(unsafe_name("empty name"));
    }
    if raw.contains(&0) {
        return Err(unsafe_name("contains NUL"));
    }
    if raw[0] == b'/' {
        return Err(unsafe_name("absolute path"));
    }
    if raw.contains(&b'\\') {
        return Err(unsafe_name("contains a backslash"));
    }
    if raw.len() >= 2 && raw[1] == b':' {
        return Err(unsafe_name("starts with a drive letter"));
    }
    if raw.split(|&b| b == b'/').any(|part| part == b"..") {
        return Err(unsafe_name("contains a `..` component"));
    }
    if let Some(file) = raw.strip_prefix(TASK_ENTRY_PREFIX.as_bytes()) {
        if file.contains(&b'/') {
            return Err(unsafe_name(
                "nested below tasks/ (a bundle's tasks folder is flat)",
            ));
        }
        check_task_name(file).map_err(unsafe_name)?;
        // Only ASCII passed the check.
        return Ok(EntryName::Task(String::from_utf8_lossy(file).into_owned()));
    }
    if raw.contains(&b'/') {
        return Err(unsafe_name(
            "contains a path separator (bundle entries are flat, but for tasks/NAME)",
        ));
    }
    EXPECTED_NAMES
        .into_iter()
        .find(|expected| expected.as_bytes() == raw)
        .map(EntryName::Fixed)
        .ok_or_else(|| Error::UnexpectedEntry {
            name: show_name(raw),
        })
}

pub(super) const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const DOS_DIRECTORY: u32 = 0x10;

pub(super) fn check_entries(entries: &[CentralEntry], limits: &Limits) -> Result {
    let mut seen: Vec<EntryName> = Vec::with_capacity(entries.len());
    let mut tasks_bytes = 0u64;
    for entry in entries {
        let kind = check_name(&entry.name)?;
        let name = kind.shown();
        if seen.contains(&kind) {
            return Err(Error::DuplicateEntry { name });
        }

        // Unix tools put st_mode in the high half of the external attributes; the file
        // type bits there are the only way a ZIP marks symlinks and devices.
        let mode = entry.external_attrs >> 16;
        let not_regular = if mode != 0 {
            mode & S_IFMT != S_IFREG
        } else {
            entry.external_attrs & DOS_DIRECTORY != 0
        };
        if not_regular {
            return Err(Error::NotRegularFile {
                name,
                mode,
                made_by: entry.made_by >> 8,
            });
        }
        if entry.flags & 1 != 0 {
            return Err(Error::UnsupportedEntry {
                name,
                reason: "encrypted".to_owned(),
            });
        }
        if entry.method != 0 && entry.method != 8 {
            return Err(Error::UnsupportedEntry {
                name,
                reason: format!(
                    "compression method {} (only stored and deflate are accepted)",
                    entry.method
                ),
            });
        }

        let limit = match &kind {
            EntryName::Fixed(BINARY_NAME) => limits.max_binary_bytes,
            EntryName::Fixed(MANIFEST_NAME) => limits.max_manifest_bytes,
            EntryName::Fixed(_) => MAX_SIGNATURE_BYTES,
            EntryName::Task(_) => limits.max_tasks_bytes,
        };
        if entry.uncompressed > limit {
            return Err(Error::EntryTooLarge {
                name,
                declared: entry.uncompressed,
                limit,
            });
        }
        if entry.uncompressed > entry.compressed.saturating_mul(limits.max_ratio) {
            return Err(Error::CompressionRatio {
                name,
                uncompressed: entry.uncompressed,
                compressed: entry.compressed,
                limit: limits.max_ratio,
            });
        }
        if matches!(kind, EntryName::Task(_)) {
            tasks_bytes = tasks_bytes.saturating_add(entry.uncompressed);
            if tasks_bytes > limits.max_tasks_bytes {
                return Err(Error::TasksTooLarge {
                    declared: tasks_bytes,
                    limit: limits.max_tasks_bytes,
                });
            }
        }
        seen.push(kind);
    }
    for expected in EXPECTED_NAMES {
        if !seen.contains(&EntryName::Fixed(expected)) {
            return Err(Error::MissingEntry { name: expected });
        }
    }
    Ok(())
}

/// Refuses the archive unless the zip crate, which does the decompressing, reads the same
/// entries in the same order as our own scan did.
pub(super) fn cross_check(
    archive: &mut ZipArchive<File>,
    entries: &[CentralEntry],
    path: &Path,
) -> Result {
    let ambiguous = |reason: String| Error::ArchiveAmbiguous {
        path: path.to_owned(),
        reason,
    };
    if archive.len() != entries.len() {
        return Err(ambiguous(format!(
            "zip reader sees {} entries, the central directory declares {}",
            archive.len(),
            entries.len()
        )));
    }
    for (i, entry) in entries.iter().enumerate() {
        let theirs = archive.name_for_index(i).unwrap_or_default();
        if theirs.as_bytes() != entry.name.as_slice() {
            return Err(ambiguous(format!(
                "entry {i} is {} to the zip reader but {} in the central directory",
                show_name(theirs.as_bytes()),
                entry.shown_name()
            )));
        }
    }
    // Overlapping entries are the trick behind non-recursive zip bombs.
    let overlapping = archive
        .has_overlapping_files()
        .map_err(|source| Error::ZipRead {
            path: path.to_owned(),
            source,
        })?;
    if overlapping {
        return Err(ambiguous("entries share bytes of the archive".to_owned()));
    }
    Ok(())
}

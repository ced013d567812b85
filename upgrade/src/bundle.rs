//! Upgrade bundles: a signed ZIP that carries the next `artex` binary.
//!
//! A bundle holds exactly three flat entries: `artex`, `manifest.json`, and
//! `manifest.sig` (ed25519 over the manifest's exact bytes). [`unpack`] treats the archive
//! as hostile: it reads the central directory itself and checks every entry against the
//! expected names and [`Limits`] before decompressing a byte, then streams through
//! counting readers and writes only `artex`, only into the caller's private directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

use crate::channel::PROTOCOL_VERSION;
use crate::error::{Error, Result};

/// Entry name of the signed manifest.
pub const MANIFEST_NAME: &str = "manifest.json";
/// Entry name of the hex-encoded ed25519 signature over `manifest.json`'s bytes.
pub const SIGNATURE_NAME: &str = "manifest.sig";
/// Entry name of the binary, and the file name [`unpack`] writes it under.
pub const BINARY_NAME: &str = "artex";
/// The target triple this crate was built for; [`create`] records it and [`unpack`]
/// refuses bundles built for another.
pub const TARGET: &str = env!("ARTEX_UPGRADE_TARGET");

const EXPECTED_NAMES: [&str; 3] = [BINARY_NAME, MANIFEST_NAME, SIGNATURE_NAME];
/// 128 hex digits and a newline, with room to spare; anything bigger is not a signature.
const MAX_SIGNATURE_BYTES: u64 = 256;
const KEY_HEX_LEN: usize = 64;
const COPY_BUFFER: usize = 64 * 1024;

/// What a bundle says about the binary it carries. Signed, so every field is trusted once
/// [`unpack`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The version of the bundled artex, as the operator named it.
    pub version: String,
    /// Target triple the binary was built for (see [`TARGET`]).
    pub target: String,
    /// Version of the upgrade channel's protocol the binary speaks; must equal
    /// [`PROTOCOL_VERSION`]. Named `handover_protocol` in the signed JSON, as every bundle
    /// made so far says it: renaming the key would make old and new builds refuse each
    /// other's bundles.
    #[serde(rename = "handover_protocol")]
    pub channel_protocol: u32,
    /// Lowercase hex SHA-256 of the `artex` entry.
    pub binary_sha256: String,
    /// When the bundle was made, RFC 3339 in UTC; informational only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// The database schema the binary needs. Absent from bundles made before it was
    /// recorded (they still verify) and from bundles of binaries that could not say; the
    /// receiving worker then leaves the check to the new binary's own start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Schema>,
}

/// The database schema a binary needs: every migration it knows, oldest first, each of
/// which the database must have applied (artex's `migrations/README.md` says why all of
/// them). What the numbers mean is the caller's business; this crate only carries them,
/// signed with the rest of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// The migrations, oldest first.
    pub needs: Vec<SchemaMigration>,
}

/// One migration in a [`Schema`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaMigration {
    /// The number in `V<n>__`.
    pub version: i32,
    /// The name after `__`.
    pub name: String,
    /// The checksum of its text, as the migrations runner records it.
    pub checksum: String,
}

/// Bounds [`unpack`] enforces before and while decompressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most central-directory entries an archive may declare.
    pub max_entries: usize,
    /// Largest `artex` entry, uncompressed.
    pub max_binary_bytes: u64,
    /// Largest `manifest.json`, uncompressed.
    pub max_manifest_bytes: u64,
    /// Largest uncompressed/compressed ratio of any entry (zip bombs compress ~1000:1;
    /// real binaries about 3:1).
    pub max_ratio: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 8,
            max_binary_bytes: 256 * 1024 * 1024,
            max_manifest_bytes: 64 * 1024,
            max_ratio: 200,
        }
    }
}

/// A bundle that passed every check: its manifest and where its binary now is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedBundle {
    /// The signed manifest.
    pub manifest: Manifest,
    /// `dest_dir/artex`, mode 0700, fsynced, its SHA-256 equal to the manifest's.
    pub binary: PathBuf,
}

/// Generates an ed25519 key pair and writes each key as 64 hex digits: the secret with
/// mode 0600, the public with 0644. Refuses to overwrite either file.
pub fn keygen(secret_out: &Path, public_out: &Path) -> Result {
    for path in [secret_out, public_out] {
        if path.symlink_metadata().is_ok() {
            return Err(Error::KeyExists {
                path: path.to_owned(),
            });
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::Randomness(e.to_string()))?;
    let key = SigningKey::from_bytes(&seed);
    // Best effort: the seed is the secret key; SigningKey zeroizes its own copy on drop.
    seed.fill(0);
    write_key_file(secret_out, &hex::encode(key.to_bytes()), 0o600)?;
    let public_hex = hex::encode(key.verifying_key().to_bytes());
    if let Err(e) = write_key_file(public_out, &public_hex, 0o644) {
        // Half a key pair is worse than none: the next keygen would refuse to overwrite it.
        let _ = fs::remove_file(secret_out);
        return Err(e);
    }
    Ok(())
}

fn write_key_file(path: &Path, hex_key: &str, mode: u32) -> Result {
    // create_new makes the no-overwrite promise hold even against a racing writer, and
    // the mode applies from the first byte, so the secret is never briefly readable.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                Error::KeyExists {
                    path: path.to_owned(),
                }
            } else {
                Error::io("creating key file", path, source)
            }
        })?;
    file.write_all(format!("{hex_key}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::io("writing key file", path, source))
}

/// Reads a secret key written by [`keygen`].
pub fn load_secret_key(path: &Path) -> Result<SigningKey> {
    let mut bytes = read_key_hex(path)?;
    let key = SigningKey::from_bytes(&bytes);
    bytes.fill(0);
    if let Ok(meta) = fs::metadata(path) {
        if meta.mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{:o}", meta.mode() & 0o777),
                "secret key file is readable by group or others"
            );
        }
    }
    Ok(key)
}

/// Reads a public key written by [`keygen`].
pub fn load_public_key(path: &Path) -> Result<VerifyingKey> {
    let bytes = read_key_hex(path)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| Error::KeyInvalid {
        path: path.to_owned(),
    })
}

fn read_key_hex(path: &Path) -> Result<[u8; 32]> {
    let mut raw = fs::read(path).map_err(|source| Error::io("reading key file", path, source))?;
    let text = raw.trim_ascii();
    let mut key = [0u8; 32];
    let result = if text.len() != KEY_HEX_LEN {
        Err(Error::KeyLength {
            path: path.to_owned(),
            expected: KEY_HEX_LEN,
            found: text.len(),
        })
    } else {
        hex::decode_to_slice(text, &mut key).map_err(|source| Error::KeyNotHex {
            path: path.to_owned(),
            source,
        })
    };
    // Best effort: do not leave the secret's hex lying in freed heap memory.
    raw.fill(0);
    result.map(|()| key)
}

/// Packs `binary` into a signed bundle at `out` and returns the manifest it signed, with
/// `schema` as what the binary needs of the database.
///
/// The archive is written next to `out` and renamed into place, so a reader never sees a
/// half-written bundle. The binary is hashed while it is copied, so the manifest describes
/// exactly the bytes in the archive even if the file changes meanwhile.
pub fn create(
    binary: &Path,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    out: &Path,
) -> Result<Manifest> {
    create_with_progress(binary, secret, manifest_version, schema, out, &mut |_| {})
}

/// As [`create`], calling `progress` with the number of bytes of the binary just hashed
/// and compressed after each read (for a progress bar: the binary is the slow part).
pub fn create_with_progress(
    binary: &Path,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Manifest> {
    let meta =
        fs::metadata(binary).map_err(|source| Error::io("reading binary", binary, source))?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: binary.to_owned(),
        });
    }
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle.zip".to_owned());
    let tmp = out.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = write_bundle(binary, secret, manifest_version, schema, &tmp, progress).and_then(
        |manifest| {
            fs::rename(&tmp, out)
                .map(|()| manifest)
                .map_err(|source| Error::io("renaming bundle into place", out, source))
        },
    );
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_bundle(
    binary: &Path,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    tmp: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Manifest> {
    let zip_err = |source| Error::ZipWrite {
        path: tmp.to_owned(),
        source,
    };
    let write_err = |source| Error::io("writing bundle", tmp, source);
    let file = File::create_new(tmp).map_err(|source| Error::io("creating bundle", tmp, source))?;
    let mut zip = ZipWriter::new(BufWriter::new(file));
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);

    zip.start_file(BINARY_NAME, deflated.unix_permissions(0o755))
        .map_err(zip_err)?;
    let mut input =
        File::open(binary).map_err(|source| Error::io("opening binary", binary, source))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(Error::io("reading binary", binary, source)),
        };
        hasher.update(&buf[..n]);
        zip.write_all(&buf[..n]).map_err(write_err)?;
        progress(n as u64);
    }

    let manifest = Manifest {
        version: manifest_version.to_owned(),
        target: TARGET.to_owned(),
        channel_protocol: PROTOCOL_VERSION,
        binary_sha256: hex::encode(hasher.finalize()),
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| rfc3339_utc(d.as_secs())),
        schema,
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest).map_err(Error::ManifestEncode)?;
    let signature = hex::encode(secret.sign(&manifest_bytes).to_bytes());

    let plain = deflated.unix_permissions(0o644);
    zip.start_file(MANIFEST_NAME, plain).map_err(zip_err)?;
    zip.write_all(&manifest_bytes).map_err(write_err)?;
    zip.start_file(SIGNATURE_NAME, plain).map_err(zip_err)?;
    zip.write_all(signature.as_bytes()).map_err(write_err)?;
    let file = zip
        .finish()
        .map_err(zip_err)?
        .into_inner()
        .map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    Ok(manifest)
}

/// Verifies the bundle at `zip_path` and writes its binary to `dest_dir/artex`.
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
        .saturating_add(limits.max_binary_bytes / 256)
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

    let (binary_index, binary_entry) = entry(BINARY_NAME)?;
    let binary = dest_dir.join(BINARY_NAME);
    let written = RemoveOnDrop::new(binary.clone());
    let digest = write_binary(&mut archive, binary_index, binary_entry, zip_path, &binary)?;
    if !digest.eq_ignore_ascii_case(&manifest.binary_sha256) {
        return Err(Error::DigestMismatch {
            expected: manifest.binary_sha256,
            found: digest,
        });
    }
    // Make the new directory entry durable too: the binary is about to be exec'd, and a
    // crash now must not leave a supervisor pointing at a name that never hit the disk.
    File::open(dest_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| Error::io("syncing directory", dest_dir, source))?;
    written.keep();
    Ok(VerifiedBundle { manifest, binary })
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

/// One central-directory record, as the archive declares it.
#[derive(Debug)]
struct CentralEntry {
    name: Vec<u8>,
    made_by: u16,
    flags: u16,
    method: u16,
    compressed: u64,
    uncompressed: u64,
    external_attrs: u32,
}

impl CentralEntry {
    fn shown_name(&self) -> String {
        show_name(&self.name)
    }
}

fn show_name(raw: &[u8]) -> String {
    // Debug-escaped so NUL, newlines and escape codes cannot forge log lines.
    format!("{:?}", String::from_utf8_lossy(raw))
}

const EOCD_SIGNATURE: [u8; 4] = *b"PK\x05\x06";
const EOCD_LEN: usize = 22;
const CENTRAL_SIGNATURE: [u8; 4] = *b"PK\x01\x02";
const CENTRAL_LEN: usize = 46;
const MAX_COMMENT: usize = 0xFFFF;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads the end record and the central directory by hand, because the zip crate keys
/// entries by name and so silently merges duplicates, and parses every declared entry
/// before anyone can bound their number.
fn read_central_directory(
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
/// are flat, so anything resembling a path is refused outright.
fn check_name(raw: &[u8]) -> Result<&'static str> {
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
    if raw.contains(&b'/') {
        return Err(unsafe_name(
            "contains a path separator (bundle entries are flat)",
        ));
    }
    EXPECTED_NAMES
        .into_iter()
        .find(|expected| expected.as_bytes() == raw)
        .ok_or_else(|| Error::UnexpectedEntry {
            name: show_name(raw),
        })
}

const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const DOS_DIRECTORY: u32 = 0x10;

fn check_entries(entries: &[CentralEntry], limits: &Limits) -> Result {
    let mut seen: Vec<&'static str> = Vec::with_capacity(EXPECTED_NAMES.len());
    for entry in entries {
        let name = check_name(&entry.name)?;
        if seen.contains(&name) {
            return Err(Error::DuplicateEntry {
                name: name.to_owned(),
            });
        }
        seen.push(name);

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
                name: name.to_owned(),
                mode,
                made_by: entry.made_by >> 8,
            });
        }
        if entry.flags & 1 != 0 {
            return Err(Error::UnsupportedEntry {
                name: name.to_owned(),
                reason: "encrypted".to_owned(),
            });
        }
        if entry.method != 0 && entry.method != 8 {
            return Err(Error::UnsupportedEntry {
                name: name.to_owned(),
                reason: format!(
                    "compression method {} (only stored and deflate are accepted)",
                    entry.method
                ),
            });
        }

        let limit = match name {
            BINARY_NAME => limits.max_binary_bytes,
            MANIFEST_NAME => limits.max_manifest_bytes,
            _ => MAX_SIGNATURE_BYTES,
        };
        if entry.uncompressed > limit {
            return Err(Error::EntryTooLarge {
                name: name.to_owned(),
                declared: entry.uncompressed,
                limit,
            });
        }
        if entry.uncompressed > entry.compressed.saturating_mul(limits.max_ratio) {
            return Err(Error::CompressionRatio {
                name: name.to_owned(),
                uncompressed: entry.uncompressed,
                compressed: entry.compressed,
                limit: limits.max_ratio,
            });
        }
    }
    for expected in EXPECTED_NAMES {
        if !seen.contains(&expected) {
            return Err(Error::MissingEntry { name: expected });
        }
    }
    Ok(())
}

/// Refuses the archive unless the zip crate, which does the decompressing, reads the same
/// entries in the same order as our own scan did.
fn cross_check(archive: &mut ZipArchive<File>, entries: &[CentralEntry], path: &Path) -> Result {
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

fn write_binary(
    archive: &mut ZipArchive<File>,
    index: usize,
    entry: &CentralEntry,
    path: &Path,
    binary: &Path,
) -> Result<String> {
    let write_err = |source| Error::io("writing binary", binary, source);
    // create_new: never follow or reuse something already at that name.
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(binary)
        .map_err(|source| Error::io("creating binary", binary, source))?;
    let mut hasher = Sha256::new();
    copy_entry(archive, index, entry, path, |chunk| {
        hasher.update(chunk);
        out.write_all(chunk).map_err(write_err)
    })?;
    // The umask may have narrowed the mode at creation; the owner must be able to exec.
    out.set_permissions(fs::Permissions::from_mode(0o700))
        .and_then(|()| out.sync_all())
        .map_err(write_err)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Removes a file when dropped, unless [`RemoveOnDrop::keep`] was called: the cleanup
/// for every early return after the binary was created.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn new(path: PathBuf) -> Self {
        Self(Some(path))
    }

    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove refused binary");
                }
            }
        }
    }
}

/// Formats seconds since the Unix epoch as RFC 3339 in UTC (civil-from-days, after
/// Howard Hinnant), to stamp manifests without a date-time dependency.
fn rfc3339_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;

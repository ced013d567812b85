//! Upgrade bundles: a signed ZIP that carries the next `artex` binary, and perhaps the
//! programs it runs as task kinds.
//!
//! A bundle holds three flat entries: `artex`, `manifest.json`, and `manifest.sig`
//! (ed25519 over the manifest's exact bytes); and one `tasks/NAME` entry per file of a
//! tasks folder, each named with its SHA-256 in the signed manifest. [`unpack`] treats
//! the archive as hostile: it reads the central directory itself and checks every entry
//! against the expected names and [`Limits`] before decompressing a byte, then streams
//! through counting readers and writes only `artex` and the manifest's task files, only
//! into the caller's private directory.
//!
//! # Layout
//! - `keys`: [`keygen`] and the key files it writes ([`load_secret_key`],
//!   [`load_public_key`]).
//! - `create`: [`create`] (and [`create_with_tasks`]): packing and signing a binary (and a
//!   tasks folder).
//! - `unpack`: [`unpack`]: verifying a hostile bundle and writing its binary.
//! - `directory`: the archive's central directory, read by hand and checked entry by
//!   entry before anything is decompressed.

mod create;
mod directory;
mod keys;
mod unpack;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use create::{create, create_with_tasks};
pub use keys::{keygen, load_public_key, load_secret_key};
pub use unpack::unpack;

/// Entry name of the signed manifest.
pub const MANIFEST_NAME: &str = "manifest.json";
/// Entry name of the hex-encoded ed25519 signature over `manifest.json`'s bytes.
pub const SIGNATURE_NAME: &str = "manifest.sig";
/// Entry name of the binary, and the file name [`unpack`] writes it under.
pub const BINARY_NAME: &str = "artex";
/// The folder of the task files' entries (`tasks/NAME`), and the folder [`unpack`]
/// writes them into.
pub const TASKS_DIR: &str = "tasks";
/// Longest task file name.
pub const MAX_TASK_NAME_BYTES: usize = 128;
/// The prefix of a task file's entry name.
const TASK_ENTRY_PREFIX: &str = "tasks/";

/// The entry name of task file `name`.
fn task_entry(name: &str) -> String {
    format!("{TASK_ENTRY_PREFIX}{name}")
}
/// The target triple this crate was built for; [`create`] records it and [`unpack`]
/// refuses bundles built for another.
pub const TARGET: &str = env!("ARTEX_UPGRADE_TARGET");

/// 128 hex digits and a newline, with room to spare; anything bigger is not a signature.
const MAX_SIGNATURE_BYTES: u64 = 256;
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
    /// The files of the tasks folder the bundle carries (`artex bundle create
    /// --tasks-dir`), sorted by name; empty for a bundle that carries none (the worker then
    /// keeps the programs it runs). A worker built before these were carried refuses a
    /// bundle that has them (an unexpected `tasks/…` entry), never runs it without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskFile>,
}

/// One file of a bundle's tasks folder, as its signed manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFile {
    /// Its name in the folder (entry `tasks/NAME`): letters, digits, `.`, `_` and `-`,
    /// not starting with a dot, at most [`MAX_TASK_NAME_BYTES`].
    pub name: String,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
    /// Written with mode 0755 (a program) rather than 0644 (its `NAME.toml`, data).
    pub executable: bool,
}

/// Whether `name` may name a task file (see [`TaskFile::name`]); the reason if not.
pub fn check_task_name(name: &[u8]) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > MAX_TASK_NAME_BYTES {
        return Err("longer than 128 bytes");
    }
    if name[0] == b'.' {
        return Err("starts with a dot");
    }
    if !name
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("not only letters, digits, '.', '_' and '-'");
    }
    Ok(())
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
    /// Most bytes of all the task files together, uncompressed.
    pub max_tasks_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // The binary, the manifest, its signature and up to 256 task files.
            max_entries: 3 + 256,
            max_binary_bytes: 256 * 1024 * 1024,
            max_manifest_bytes: 128 * 1024,
            max_ratio: 200,
            max_tasks_bytes: 64 * 1024 * 1024,
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
    /// `dest_dir/tasks` (mode 0755) when the manifest names task files: each written
    /// there, its SHA-256 equal to the manifest's.
    pub tasks: Option<PathBuf>,
}

#[cfg(test)]
mod tests;

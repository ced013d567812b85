//! The one error type of `artex-upgrade`.
//!
//! Every variant says what was wrong and where (path, entry name, sizes, expected vs
//! found), so an operator reading a refused upgrade knows what to fix.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Shorthand for results of this crate.
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while listening for signals, notifying, unpacking,
/// spawning, or talking on the upgrade channel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A signal listener could not be installed (no tokio runtime, or the OS refused).
    #[error("cannot listen for {signal}: {source}")]
    SignalInstall {
        /// Signal name, e.g. "SIGTERM".
        signal: &'static str,
        /// Underlying OS error.
        source: std::io::Error,
    },

    /// `$NOTIFY_SOCKET` holds something that is neither a path nor an abstract name.
    #[error("NOTIFY_SOCKET={socket:?} is not usable: {reason}")]
    NotifySocketInvalid {
        /// The variable's value.
        socket: OsString,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Sending the notification datagram failed.
    #[error("cannot notify systemd at NOTIFY_SOCKET={socket:?}: {source}")]
    Notify {
        /// The variable's value.
        socket: OsString,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// The kernel accepted only part of the notification datagram.
    #[error("short notification to NOTIFY_SOCKET={socket:?}: sent {sent} of {expected} bytes")]
    NotifyShort {
        /// The variable's value.
        socket: OsString,
        /// Bytes sent.
        sent: usize,
        /// Bytes in the state string.
        expected: usize,
    },

    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "reading key file".
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// `keygen` would overwrite an existing file.
    #[error("{path} already exists; refusing to overwrite a key file")]
    KeyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A key file does not hold the expected number of hex digits.
    #[error("key file {path}: expected {expected} hex digits, found {found} characters")]
    KeyLength {
        /// The key file.
        path: PathBuf,
        /// Hex digits expected (64 for 32 bytes).
        expected: usize,
        /// Characters found, surrounding whitespace excluded.
        found: usize,
    },
    /// A key file has the right length but is not hex.
    #[error("key file {path} is not hex: {source}")]
    KeyNotHex {
        /// The key file.
        path: PathBuf,
        /// What the decoder found.
        source: hex::FromHexError,
    },
    /// The 32 bytes in a public key file are not a point on the curve.
    #[error("key file {path} does not hold a valid ed25519 public key")]
    KeyInvalid {
        /// The key file.
        path: PathBuf,
    },
    /// The OS random number generator failed.
    #[error("cannot get randomness from the OS: {0}")]
    Randomness(String),
    /// A path that must be a regular file is not.
    #[error("{path} is not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The manifest could not be serialized.
    #[error("cannot encode the manifest: {0}")]
    ManifestEncode(serde_json::Error),
    /// Writing the bundle archive failed.
    #[error("cannot write bundle {path}: {source}")]
    ZipWrite {
        /// The bundle being written.
        path: PathBuf,
        /// What the zip writer reported.
        source: zip::result::ZipError,
    },
    /// The directory given to unpack into is not a fresh private directory.
    #[error("cannot unpack into {path}: {reason}")]
    DestInvalid {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The archive is bigger than any bundle within the limits could be.
    #[error("bundle {path} is {size} bytes, more than the {limit} bytes the limits allow")]
    ArchiveTooLarge {
        /// The bundle.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The largest size accepted.
        limit: u64,
    },
    /// The archive's structure is broken (truncated, not a ZIP, inconsistent offsets).
    #[error("bundle {path} is not a well-formed ZIP: {reason}")]
    ZipCorrupt {
        /// The bundle.
        path: PathBuf,
        /// What is broken, and where.
        reason: String,
    },
    /// The archive uses a ZIP feature bundles never need (ZIP64, multiple disks).
    #[error("bundle {path} is not supported: {reason}")]
    UnsupportedArchive {
        /// The bundle.
        path: PathBuf,
        /// Which feature.
        reason: String,
    },
    /// The archive declares more entries than allowed.
    #[error("bundle {path} declares {found} entries, at most {limit} allowed")]
    TooManyEntries {
        /// The bundle.
        path: PathBuf,
        /// Entries declared.
        found: usize,
        /// The limit.
        limit: usize,
    },
    /// An entry name is absolute, climbs out with `..`, or otherwise looks like a path.
    #[error("entry {name} refused: {reason}")]
    UnsafeEntryName {
        /// The name, quoted and escaped.
        name: String,
        /// Why it is unsafe.
        reason: &'static str,
    },
    /// Two entries have the same name (readers disagree on which one counts).
    #[error("entry {name} appears more than once")]
    DuplicateEntry {
        /// The repeated name.
        name: String,
    },
    /// An entry other than artex, manifest.json, manifest.sig and `tasks/NAME`.
    #[error("unexpected entry {name}: a bundle holds only artex, manifest.json, manifest.sig and tasks/NAME files")]
    UnexpectedEntry {
        /// The name, quoted and escaped.
        name: String,
    },
    /// An entry is a symlink, directory or device rather than a regular file.
    #[error("entry {name} is not a regular file (unix mode {mode:o}, made by system {made_by})")]
    NotRegularFile {
        /// The entry.
        name: String,
        /// The unix mode from its external attributes.
        mode: u32,
        /// The "version made by" host system (3 is Unix).
        made_by: u16,
    },
    /// An entry is encrypted or compressed with a method other than stored or deflate.
    #[error("entry {name} is not supported: {reason}")]
    UnsupportedEntry {
        /// The entry.
        name: String,
        /// Why.
        reason: String,
    },
    /// One of the three required entries is absent.
    #[error("bundle has no {name} entry")]
    MissingEntry {
        /// The missing entry.
        name: &'static str,
    },
    /// An entry declares an uncompressed size over its limit.
    #[error("entry {name} declares {declared} bytes, limit is {limit}")]
    EntryTooLarge {
        /// The entry.
        name: String,
        /// Declared uncompressed size.
        declared: u64,
        /// The limit for this entry.
        limit: u64,
    },
    /// An entry compresses suspiciously well: the signature of a zip bomb.
    #[error(
        "entry {name} expands {compressed} bytes to {uncompressed}, over the {limit}:1 ratio limit"
    )]
    CompressionRatio {
        /// The entry.
        name: String,
        /// Declared uncompressed size.
        uncompressed: u64,
        /// Compressed size.
        compressed: u64,
        /// Largest ratio accepted.
        limit: u64,
    },
    /// The zip reader and our own central-directory scan disagree, or entries overlap.
    #[error("bundle {path} is ambiguous: {reason}")]
    ArchiveAmbiguous {
        /// The bundle.
        path: PathBuf,
        /// Where the readings differ.
        reason: String,
    },
    /// The zip reader refused the archive or an entry.
    #[error("cannot read bundle {path}: {source}")]
    ZipRead {
        /// The bundle.
        path: PathBuf,
        /// What the zip reader reported.
        source: zip::result::ZipError,
    },
    /// An entry decompressed to more bytes than its header declared.
    #[error("entry {name} decompresses past its declared {declared} bytes")]
    EntryOverrun {
        /// The entry.
        name: String,
        /// Declared uncompressed size.
        declared: u64,
    },
    /// An entry decompressed to fewer bytes than its header declared.
    #[error("entry {name} decompresses to {found} bytes, {declared} declared")]
    EntryTruncated {
        /// The entry.
        name: String,
        /// Declared uncompressed size.
        declared: u64,
        /// Bytes actually produced.
        found: u64,
    },
    /// Decompressing an entry failed (corrupt data, CRC mismatch).
    #[error("entry {name} is corrupt: {source}")]
    EntryRead {
        /// The entry.
        name: String,
        /// What the decompressor reported.
        source: std::io::Error,
    },
    /// The manifest's signature is malformed or does not verify.
    #[error("bad bundle signature: {reason}")]
    BadSignature {
        /// Why it was refused.
        reason: String,
    },
    /// manifest.json is not a valid manifest.
    #[error("manifest.json is invalid: {source}")]
    ManifestInvalid {
        /// What the JSON parser reported.
        source: serde_json::Error,
    },
    /// The binary's SHA-256 differs from the manifest's.
    #[error("artex binary has SHA-256 {found}, manifest says {expected}")]
    DigestMismatch {
        /// Digest in the manifest.
        expected: String,
        /// Digest of the bytes written.
        found: String,
    },
    /// A task file's SHA-256 differs from the manifest's.
    #[error("task file tasks/{name} has SHA-256 {found}, manifest says {expected}")]
    TaskDigestMismatch {
        /// The file's name.
        name: String,
        /// Digest in the manifest.
        expected: String,
        /// Digest of the bytes written.
        found: String,
    },
    /// The task files in the archive are not exactly those the signed manifest names.
    #[error("task file tasks/{name} {reason}")]
    TaskFileUnsigned {
        /// The file's name.
        name: String,
        /// "is in the archive but not in the signed manifest", or the other way round.
        reason: &'static str,
    },
    /// A tasks folder that cannot be bundled as it is.
    #[error("tasks folder {path}: {reason}")]
    TasksDirInvalid {
        /// The folder, or the file in it.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The task files declare more bytes together than the limit.
    #[error("the task files declare {declared} bytes together, limit is {limit}")]
    TasksTooLarge {
        /// Bytes declared.
        declared: u64,
        /// The limit.
        limit: u64,
    },
    /// The bundle speaks another upgrade channel protocol.
    #[error("bundle speaks upgrade channel protocol {found}, this process speaks {expected}")]
    ProtocolMismatch {
        /// This crate's protocol version.
        expected: u32,
        /// The manifest's.
        found: u32,
    },
    /// A folder that must be private to this user (the upgrade folder, an upgrade
    /// channel directory) cannot be made so, or exists and is not.
    #[error("{what} {path} refused: {reason}")]
    DirInvalid {
        /// Which folder: "upgrade folder", "upgrade channel directory".
        what: &'static str,
        /// The folder.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Something already occupies the upgrade channel socket's path.
    #[error("upgrade channel socket {path} cannot be bound: {reason}")]
    ChannelSocketInUse {
        /// The socket path.
        path: PathBuf,
        /// What is there.
        reason: String,
    },
    /// A connection came from a process other than the spawned child.
    #[error("upgrade channel connection refused: expected pid {expected}, peer is {found:?}")]
    PeerRefused {
        /// The pid that was expected.
        expected: u32,
        /// The peer's pid per SO_PEERCRED, if the kernel knew it.
        found: Option<u32>,
    },
    /// The kernel did not report which process listens on the upgrade channel socket.
    #[error("cannot tell which process listens on upgrade channel socket {path}")]
    PeerUnknown {
        /// The socket path.
        path: PathBuf,
    },
    /// A message could not be serialized into a frame.
    #[error("cannot encode upgrade channel frame: {0}")]
    FrameEncode(serde_json::Error),
    /// A frame body could not be parsed as the expected message type.
    #[error("cannot decode upgrade channel frame of {size} bytes: {source}")]
    FrameDecode {
        /// Frame body size.
        size: usize,
        /// What the JSON parser reported.
        source: serde_json::Error,
    },
    /// A frame is bigger than [`crate::channel::MAX_FRAME_BYTES`].
    #[error("upgrade channel frame of {size} bytes exceeds the {limit}-byte limit")]
    FrameTooLarge {
        /// Frame body size (declared, on receive).
        size: u64,
        /// The limit.
        limit: usize,
    },
    /// A frame carries more descriptors than [`crate::channel::MAX_FDS_PER_FRAME`].
    #[error("upgrade channel frame carries {count} file descriptors, limit is {limit}")]
    TooManyFds {
        /// Descriptors in the frame (so far, on receive).
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The kernel truncated a frame's control data, so some descriptors were lost.
    #[error("upgrade channel frame's control data was truncated; descriptors were lost")]
    ControlTruncated,
    /// Writing to the upgrade channel socket failed.
    #[error("cannot send on the upgrade channel: {0}")]
    ChannelSend(std::io::Error),
    /// Reading from the upgrade channel socket failed.
    #[error("cannot receive on the upgrade channel: {0}")]
    ChannelRecv(std::io::Error),
    /// The peer closed the connection cleanly between frames.
    #[error("upgrade channel peer closed the connection")]
    ChannelClosed,
    /// The peer closed the connection in the middle of a frame.
    #[error("upgrade channel peer closed the connection mid-frame: got {got} of {expected} bytes")]
    ChannelTruncated {
        /// Frame bytes received (header included).
        got: usize,
        /// Frame bytes expected so far (header included).
        expected: usize,
    },
    /// The next generation could not be started.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// Waiting for a child failed.
    #[error("cannot reap child {pid:?}: {source}")]
    Reap {
        /// The child's pid, if it was still known.
        pid: Option<u32>,
        /// Underlying OS error.
        source: std::io::Error,
    },
    /// A process-control call (prctl, waitpid, kill) failed.
    #[error("cannot {action}: {source}")]
    ProcessControl {
        /// What was being done, e.g. "send SIGTERM to process group 4242".
        action: String,
        /// What the kernel said.
        source: nix::errno::Errno,
    },
    /// The bundle's binary was built for another target.
    #[error("bundle is built for {found}, this process runs on {expected}")]
    TargetMismatch {
        /// This build's target triple.
        expected: &'static str,
        /// The manifest's.
        found: String,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

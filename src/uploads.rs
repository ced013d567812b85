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

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use artex_actors::blackboard::{NewTask, NewUpload};
use artex_actors::Blackboard;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

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
    /// The private upload folder.
    pub dir: PathBuf,
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
            shared: args.upload_shared,
            max_bytes: args.upload_max_bytes,
            expire: ms(args.upload_expire_ms),
            keep: ms(args.upload_keep_ms),
            body_timeout: ms(args.upload_body_timeout_ms),
        }
    }
}

/// What the client declared when it started the upload, kept in `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// The upload's id.
    pub id: Uuid,
    /// The whole file's size.
    pub size: u64,
    /// The whole file's sha256, lowercase hex.
    pub sha256: String,
    /// The client's name for the file (shown, never a path).
    pub name: Option<String>,
    /// Bytes per chunk (the last one may be shorter).
    pub chunk_size: u64,
    /// How many chunks.
    pub chunks: u64,
    /// The task to submit once the file is whole.
    pub task: TaskSpec,
}

/// The task an upload submits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Its kind.
    pub kind: String,
    /// Its payload (an object; the upload is added as its `upload` field).
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Its priority.
    #[serde(default)]
    pub priority: Option<i32>,
}

/// Why an upload request is refused or failed; the HTTP layer maps it to a status.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Bad input (400): the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// No such upload (404).
    #[error("no upload {0} on this worker")]
    NotFound(String),
    /// The state forbids it (409).
    #[error("{0}")]
    Conflict(String),
    /// More bytes than declared (413).
    #[error("{0}")]
    TooLarge(String),
    /// The content does not match its sha256 (422); nothing was kept.
    #[error("{0}")]
    Mismatch(String),
    /// Over the disk quota (507); nothing was written.
    #[error("{0}")]
    Quota(String),
    /// The body stalled (408).
    #[error("{0}")]
    Timeout(String),
    /// The disk or the database failed (500).
    #[error("{0}")]
    Internal(String),
}

type Result<T = (), E = UploadError> = std::result::Result<T, E>;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> UploadError {
    move |e| UploadError::Internal(format!("{what}: {e}"))
}

/// Where an upload stands, as `GET /api/v1/uploads/{id}` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Progress {
    /// `receiving`, `complete` (the task is written) or `deleted` (its task ended).
    pub state: &'static str,
    /// Chunks on disk.
    pub received: Vec<u64>,
    /// Chunks still to send.
    pub missing: Vec<u64>,
    /// The task, once written.
    pub task: Option<Uuid>,
    /// Chunk size and count, so a client can resume from this answer alone.
    pub chunk_size: u64,
    /// How many chunks.
    pub chunks: u64,
    /// Declared size.
    pub size: u64,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Unfinished uploads removed for want of activity.
    pub expired: usize,
    /// Files removed because their task ended.
    pub deleted: usize,
    /// Whole files whose row was missing (a crash in between), recorded now.
    pub recorded: usize,
}

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

    /// Starts an upload: checks what is declared, reserves its size against the quota,
    /// writes its `meta.json`. Nothing is written when anything is refused.
    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<Meta> {
        let meta = req.check()?;
        let me = self.clone();
        blocking(move || {
            let used = me.reserved()?;
            if used.saturating_add(meta.size) > me.settings.max_bytes {
                return Err(UploadError::Quota(format!(
                    "not enough room: {} bytes declared, {} of {} bytes (--upload-max-bytes) \
                     already taken by uploads on this worker",
                    meta.size, used, me.settings.max_bytes
                )));
            }
            let dir = me.folder(meta.id);
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(io(format!("creating {}", dir.display())))?;
            let text = serde_json::to_vec_pretty(&meta)
                .map_err(|e| UploadError::Internal(format!("encoding the upload: {e}")))?;
            write_durably(&dir, "meta.json", &text)?;
            sync_dir(&me.settings.dir)?;
            Ok(meta)
        })
        .await
    }

    /// Bytes the uploads in the folder take or will take (declared sizes).
    fn reserved(&self) -> Result<u64> {
        let mut total = 0u64;
        for entry in read_dir(&self.settings.dir)? {
            if let Some(meta) = entry.and_then(|id| self.meta_sync(id).ok()) {
                total = total.saturating_add(meta.size);
            }
        }
        Ok(total)
    }

    fn meta_sync(&self, id: Uuid) -> Result<Meta> {
        let path = self.folder(id).join("meta.json");
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(UploadError::NotFound(id.to_string()))
            }
            Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
        };
        serde_json::from_slice(&text)
            .map_err(|e| UploadError::Internal(format!("{}: {e}", path.display())))
    }

    /// The upload's declaration.
    pub async fn meta(self: &Arc<Self>, id: Uuid) -> Result<Meta> {
        let me = self.clone();
        blocking(move || me.meta_sync(id)).await
    }

    /// Chunks on disk (all of them once the file is whole).
    fn received_sync(&self, meta: &Meta) -> Result<BTreeSet<u64>> {
        let dir = self.folder(meta.id);
        if dir.join("file").exists() {
            return Ok((0..meta.chunks).collect());
        }
        let mut got = BTreeSet::new();
        let entries = fs::read_dir(&dir).map_err(io(format!("reading {}", dir.display())))?;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str().and_then(|s| s.strip_suffix(".part")) else {
                continue;
            };
            if let Ok(n) = n.parse::<u64>() {
                if n < meta.chunks {
                    got.insert(n);
                }
            }
        }
        Ok(got)
    }

    /// Where the upload stands. An id this worker never had (or removed) is `NotFound`;
    /// one recorded in the database whose folder is gone shows as `deleted`.
    pub async fn progress(self: &Arc<Self>, id: Uuid) -> Result<Progress> {
        let me = self.clone();
        let local = blocking(move || {
            let meta = me.meta_sync(id)?;
            let got = me.received_sync(&meta)?;
            Ok((meta, got))
        })
        .await;
        let row = self
            .bb
            .upload(id)
            .await
            .map_err(|e| UploadError::Internal(format!("reading upload {id}: {e}")))?;
        match (local, row) {
            (Ok((meta, got)), row) => {
                let missing = (0..meta.chunks).filter(|n| !got.contains(n)).collect();
                Ok(Progress {
                    state: if row.is_some() {
                        "complete"
                    } else {
                        "receiving"
                    },
                    received: got.into_iter().collect(),
                    missing,
                    task: row.map(|r| r.task),
                    chunk_size: meta.chunk_size,
                    chunks: meta.chunks,
                    size: meta.size,
                })
            }
            (Err(UploadError::NotFound(_)), Some(row)) => Ok(Progress {
                state: if row.state == "deleted" {
                    "deleted"
                } else {
                    "complete"
                },
                received: Vec::new(),
                missing: Vec::new(),
                task: Some(row.task),
                chunk_size: 0,
                chunks: 0,
                size: row.size as u64,
            }),
            (Err(e), _) => Err(e),
        }
    }

    /// The length chunk `n` of `meta` must have.
    pub fn chunk_len(meta: &Meta, n: u64) -> Result<u64> {
        if n >= meta.chunks {
            return Err(UploadError::Invalid(format!(
                "chunk {n}: out of range; this upload has chunks 0 to {}",
                meta.chunks.saturating_sub(1)
            )));
        }
        Ok(meta.chunk_size.min(meta.size - n * meta.chunk_size))
    }

    /// Receives chunk `n` from `body`: written aside by a blocking task while its sha256
    /// is computed, checked against `sha256`, fsynced and renamed into place. Memory: a
    /// few pieces of the body in flight, whatever the chunk size.
    pub async fn put_chunk<S, E>(
        self: &Arc<Self>,
        meta: &Meta,
        n: u64,
        sha256: &str,
        body: S,
    ) -> Result
    where
        S: futures_util::Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let expected = Uploads::chunk_len(meta, n)?;
        let dir = self.folder(meta.id);
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUED_PIECES);
        let want = sha256.to_string();
        let writer = tokio::task::spawn_blocking(move || write_chunk(rx, &dir, n, expected, &want));
        let read = read_body(body, &tx, self.settings.body_timeout, expected).await;
        drop(tx);
        let written = writer
            .await
            .map_err(|e| UploadError::Internal(format!("the chunk writer failed: {e}")))?;
        match read {
            Ok(got) if got < expected => {
                // The writer saw a short body and kept nothing.
                Err(UploadError::Invalid(format!(
                    "chunk {n}: {got} bytes arrived; expected {expected}"
                )))
            }
            Ok(_) => written,
            Err(ReadError::Stalled(got)) => Err(UploadError::Timeout(format!(
                "chunk {n}: nothing arrived for {} ms after {got} bytes",
                self.settings.body_timeout.as_millis()
            ))),
            Err(ReadError::TooLarge) => Err(UploadError::TooLarge(format!(
                "chunk {n}: more than its {expected} bytes"
            ))),
            Err(ReadError::Client(e)) => Err(UploadError::Invalid(format!(
                "chunk {n}: reading the body: {e}"
            ))),
            Err(ReadError::WriterStopped) => Err(match written {
                Err(e) => e,
                Ok(()) => UploadError::Internal("the chunk writer stopped early".into()),
            }),
        }
    }

    /// Once every chunk is on disk: joins them into the file, checks its sha256, and
    /// records the upload and its task (once, however often this is called, here or in
    /// another process). Returns the task, or `None` while chunks are missing.
    pub async fn finish(self: &Arc<Self>, meta: &Meta) -> Result<Option<Uuid>> {
        let _one = self.finishing.lock().await;
        let me = self.clone();
        let m = meta.clone();
        let whole = blocking(move || {
            let got = me.received_sync(&m)?;
            if (got.len() as u64) < m.chunks {
                return Ok(false);
            }
            me.join(&m)?;
            Ok(true)
        })
        .await?;
        if !whole {
            return Ok(None);
        }
        self.record(meta).await.map(Some)
    }

    /// Joins the chunks into `file` (aside, then renamed), checking the sha256.
    fn join(&self, meta: &Meta) -> Result {
        let dir = self.folder(meta.id);
        let file = dir.join("file");
        if file.exists() {
            return Ok(());
        }
        let aside = dir.join(format!("file.{}", Uuid::new_v4().simple()));
        let mut out = create_private(&aside)?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        for n in 0..meta.chunks {
            let part = dir.join(format!("{n}.part"));
            let mut f = File::open(&part).map_err(io(format!("opening {}", part.display())))?;
            loop {
                let k = f
                    .read(&mut buf)
                    .map_err(io(format!("reading {}", part.display())))?;
                if k == 0 {
                    break;
                }
                hash.update(&buf[..k]);
                out.write_all(&buf[..k])
                    .map_err(io(format!("writing {}", aside.display())))?;
            }
        }
        let got = hex::encode(hash.finalize());
        if got != meta.sha256 {
            let _ = fs::remove_file(&aside);
            // Every chunk matched its own hash: the declaration was wrong. Nothing of it
            // can become a task; the upload is discarded.
            let _ = fs::remove_dir_all(&dir);
            return Err(UploadError::Mismatch(format!(
                "the whole file's sha256 is {got}, not the {} declared; the upload is discarded",
                meta.sha256
            )));
        }
        out.sync_all()
            .map_err(io(format!("syncing {}", aside.display())))?;
        fs::rename(&aside, &file).map_err(io(format!("placing {}", file.display())))?;
        sync_dir(&dir)?;
        for n in 0..meta.chunks {
            let _ = fs::remove_file(dir.join(format!("{n}.part")));
        }
        Ok(())
    }

    async fn record(&self, meta: &Meta) -> Result<Uuid> {
        let mut payload = match meta.task.payload.clone() {
            Some(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        payload.insert(
            "upload".into(),
            serde_json::json!({
                "id": meta.id, "size": meta.size, "sha256": meta.sha256, "name": meta.name,
            }),
        );
        let task = NewTask {
            priority: meta.task.priority.unwrap_or(0),
            ..NewTask::new(meta.task.kind.clone(), serde_json::Value::Object(payload))
        };
        let upload = NewUpload {
            id: meta.id,
            host: self.host.clone(),
            path: self
                .folder(meta.id)
                .join("file")
                .to_string_lossy()
                .into_owned(),
            size: meta.size as i64,
            sha256: meta.sha256.clone(),
            chunks: meta.chunks as i32,
            name: meta.name.clone(),
            shared: self.settings.shared,
        };
        let (task, wrote) = self
            .bb
            .record_upload(&upload, &task, &self.actor)
            .await
            .map_err(|e| match e {
                artex_actors::Error::Invalid(m) => UploadError::Invalid(m),
                e => UploadError::Internal(format!("recording upload {}: {e}", meta.id)),
            })?;
        if wrote {
            tracing::info!(upload = %meta.id, task = %task, size = meta.size, "upload complete; task submitted");
        }
        Ok(task)
    }

    /// Removes unfinished uploads untouched for `expire`, and files whose task ended
    /// `keep` ago; records whole files a crash left unrecorded.
    pub async fn sweep(self: &Arc<Self>) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        let me = self.clone();
        let local: Vec<(Uuid, bool, Option<SystemTime>)> = blocking(move || {
            let mut out = Vec::new();
            for id in read_dir(&me.settings.dir)?.into_iter().flatten() {
                let dir = me.folder(id);
                let whole = dir.join("file").exists();
                out.push((id, whole, newest_mtime(&dir)));
            }
            Ok(out)
        })
        .await?;
        let ids: Vec<Uuid> = local.iter().map(|(id, _, _)| *id).collect();
        let known = self
            .bb
            .uploads_known(&ids)
            .await
            .map_err(|e| UploadError::Internal(format!("reading uploads: {e}")))?;
        for (id, whole, touched) in local {
            if known.contains(&id) {
                continue;
            }
            if whole {
                if let Ok(meta) = self.meta(id).await {
                    self.record(&meta).await?;
                    report.recorded += 1;
                }
                continue;
            }
            let idle = touched
                .and_then(|t| t.elapsed().ok())
                .unwrap_or(Duration::MAX);
            if idle >= self.settings.expire {
                let dir = self.folder(id);
                blocking(move || {
                    fs::remove_dir_all(&dir).map_err(io(format!("removing {}", dir.display())))
                })
                .await?;
                tracing::info!(upload = %id, "abandoned upload removed");
                report.expired += 1;
            }
        }
        let ended = self
            .bb
            .uploads_ended(&self.host, self.settings.keep.as_secs_f64())
            .await
            .map_err(|e| UploadError::Internal(format!("reading ended uploads: {e}")))?;
        let mut gone = Vec::new();
        for (id, path) in ended {
            let path = PathBuf::from(path);
            // Only ever a folder of this upload folder, whatever the row says.
            let Some(dir) = path.parent().filter(|d| *d == self.folder(id)) else {
                continue;
            };
            let dir = dir.to_owned();
            let removed = blocking(move || match fs::remove_dir_all(&dir) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
                Err(e) => Err(io(format!("removing {}", dir.display()))(e)),
            })
            .await?;
            if removed {
                gone.push(id);
            }
        }
        if !gone.is_empty() {
            self.bb
                .mark_uploads_deleted(&gone)
                .await
                .map_err(|e| UploadError::Internal(format!("marking uploads deleted: {e}")))?;
            report.deleted = gone.len();
        }
        Ok(report)
    }
}

/// The body of `POST /api/v1/uploads`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The file's size in bytes.
    pub size: u64,
    /// Its sha256, hex.
    pub sha256: String,
    /// A name to show (never a path).
    #[serde(default)]
    pub name: Option<String>,
    /// Bytes per chunk.
    #[serde(default)]
    pub chunk_size: Option<u64>,
    /// The task to submit when the file is whole.
    pub task: TaskSpec,
}

impl CreateRequest {
    /// Checks every field; the message names the one refused.
    pub fn check(self) -> Result<Meta> {
        let bad = |m: String| Err(UploadError::Invalid(m));
        if self.size == 0 {
            return bad("size: 0; expected a file of at least one byte".into());
        }
        let chunk_size = self.chunk_size.unwrap_or(DEFAULT_CHUNK);
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
            return bad(format!(
                "chunk_size: {chunk_size}; expected {MIN_CHUNK} to {MAX_CHUNK} bytes"
            ));
        }
        let chunks = self.size.div_ceil(chunk_size);
        if chunks > MAX_CHUNKS {
            return bad(format!(
                "size: {} bytes in chunks of {chunk_size} makes {chunks} chunks; at most \
                 {MAX_CHUNKS} (send larger chunks)",
                self.size
            ));
        }
        let sha256 = self.sha256.to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return bad(format!(
                "sha256: {:?}; expected 64 hexadecimal digits",
                self.sha256
            ));
        }
        if let Some(name) = &self.name {
            if name.is_empty()
                || name.len() > MAX_NAME
                || name == "."
                || name == ".."
                || name.contains(['/', '\\'])
                || name.chars().any(char::is_control)
            {
                return bad(format!(
                    "name: {name:?}; expected a plain file name of 1 to {MAX_NAME} bytes, \
                     without '/', '\\\\' or control characters"
                ));
            }
        }
        artex_actors::blackboard::check_kind(&self.task.kind)
            .map_err(|e| UploadError::Invalid(format!("task.kind: {e}")))?;
        match &self.task.payload {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(m)) => {
                if m.contains_key("upload") {
                    return bad(
                        "task.payload: has a field 'upload'; that field is the worker's \
                         (it names the file)"
                            .into(),
                    );
                }
                artex_actors::blackboard::check_payload(&serde_json::Value::Object(m.clone()))
                    .map_err(|e| UploadError::Invalid(format!("task.payload: {e}")))?;
            }
            Some(other) => {
                return bad(format!(
                    "task.payload: expected an object (the upload is added as its 'upload' \
                     field), got {other}"
                ))
            }
        }
        Ok(Meta {
            id: Uuid::now_v7(),
            size: self.size,
            sha256,
            name: self.name,
            chunk_size,
            chunks,
            task: self.task,
        })
    }
}

/// Body pieces on their way from the HTTP thread to the writer: actix's pieces are tens
/// of KiB, so this bounds an upload's memory to about a MiB whatever the chunk size.
const QUEUED_PIECES: usize = 16;

/// Why reading a chunk's body stopped short.
#[derive(Debug)]
enum ReadError {
    Stalled(u64),
    TooLarge,
    Client(String),
    WriterStopped,
}

/// Reads `body` into `tx`, each piece within `idle`, at most `cap` bytes.
async fn read_body<S, E>(
    mut body: S,
    tx: &tokio::sync::mpsc::Sender<actix_web::web::Bytes>,
    idle: Duration,
    cap: u64,
) -> std::result::Result<u64, ReadError>
where
    S: futures_util::Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    let mut got = 0u64;
    loop {
        let next = tokio::time::timeout(idle, body.next())
            .await
            .map_err(|_| ReadError::Stalled(got))?;
        let Some(piece) = next else {
            // The end, told to the writer by an empty piece: without it (a body cut or
            // refused) the writer keeps nothing.
            tokio::time::timeout(idle, tx.send(actix_web::web::Bytes::new()))
                .await
                .map_err(|_| ReadError::Stalled(got))?
                .map_err(|_| ReadError::WriterStopped)?;
            return Ok(got);
        };
        let piece = piece.map_err(|e| ReadError::Client(e.to_string()))?;
        if piece.is_empty() {
            continue;
        }
        got += piece.len() as u64;
        if got > cap {
            return Err(ReadError::TooLarge);
        }
        tokio::time::timeout(idle, tx.send(piece))
            .await
            .map_err(|_| ReadError::Stalled(got))?
            .map_err(|_| ReadError::WriterStopped)?;
    }
}

/// The blocking side of a chunk: writes what comes to a file aside, hashing; keeps it
/// (fsynced, renamed to `<n>.part`) only if it is whole and its sha256 is `want`.
fn write_chunk(
    mut rx: tokio::sync::mpsc::Receiver<actix_web::web::Bytes>,
    dir: &Path,
    n: u64,
    expected: u64,
    want: &str,
) -> Result {
    if !dir.join("meta.json").exists() {
        return Err(UploadError::NotFound(
            dir.file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ));
    }
    let aside = dir.join(format!("{n}.part.{}", Uuid::new_v4().simple()));
    struct Aside<'a>(&'a Path, bool);
    impl Drop for Aside<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = fs::remove_file(self.0);
            }
        }
    }
    let mut kept = Aside(&aside, false);
    let mut file = create_private(&aside)?;
    let mut hash = Sha256::new();
    let mut got = 0u64;
    let mut ended = false;
    while let Some(piece) = rx.blocking_recv() {
        if piece.is_empty() {
            ended = true;
            break;
        }
        got += piece.len() as u64;
        hash.update(&piece);
        file.write_all(&piece)
            .map_err(io(format!("writing {}", aside.display())))?;
    }
    if !ended || got != expected {
        return Ok(()); // cut, short or too long: the reader reports it; nothing is kept
    }
    let got_hash = hex::encode(hash.finalize());
    if got_hash != want {
        return Err(UploadError::Mismatch(format!(
            "chunk {n}: its sha256 is {got_hash}, not the {want} of its Chunk-Sha256 header; \
             not stored, send it again"
        )));
    }
    let part = dir.join(format!("{n}.part"));
    if part.exists() || dir.join("file").exists() {
        return Ok(()); // acknowledged before: the copy aside goes
    }
    file.sync_all()
        .map_err(io(format!("syncing {}", aside.display())))?;
    fs::rename(&aside, &part).map_err(io(format!("placing {}", part.display())))?;
    kept.1 = true;
    sync_dir(dir)
}

fn create_private(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("creating {}", path.display())))
}

/// Writes `name` in `dir` aside, fsyncs it and renames it into place.
fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result {
    let aside = dir.join(format!("{name}.{}", Uuid::new_v4().simple()));
    let mut f = create_private(&aside)?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", aside.display())))?;
    fs::rename(&aside, dir.join(name)).map_err(io(format!("placing {name}")))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

/// The upload ids in `dir` (entries not named like one are skipped, as `None`).
fn read_dir(dir: &Path) -> Result<Vec<Option<Uuid>>> {
    let entries = fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    Ok(entries
        .flatten()
        .map(|e| e.file_name().to_str().and_then(|s| Uuid::parse_str(s).ok()))
        .collect())
}

/// When anything in `dir` last changed.
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let own = fs::metadata(dir).and_then(|m| m.modified()).ok();
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
        .chain(own)
        .max()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| UploadError::Internal(format!("a disk task failed: {e}")))?
}

use std::os::unix::fs::DirBuilderExt;

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: serde_json::Value) -> Result<Meta> {
        let r: CreateRequest =
            serde_json::from_value(v).map_err(|e| UploadError::Invalid(e.to_string()))?;
        r.check()
    }

    fn ok() -> serde_json::Value {
        serde_json::json!({"size": 25, "sha256": "a".repeat(64), "chunk_size": 1024,
            "task": {"kind": "echo"}})
    }

    #[test]
    fn a_good_declaration_is_chunked() {
        let mut v = ok();
        v["size"] = 2049.into();
        let m = req(v).unwrap();
        assert_eq!((m.chunks, m.chunk_size), (3, 1024));
        assert_eq!(Uploads::chunk_len(&m, 2).unwrap(), 1);
        assert!(Uploads::chunk_len(&m, 3).is_err());
    }

    #[test]
    fn hostile_declarations_are_refused() {
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("size", serde_json::json!(-1)),
            ("size", serde_json::json!(0)),
            ("size", serde_json::json!(u64::MAX)),
            ("chunk_size", serde_json::json!(1)),
            ("chunk_size", serde_json::json!(1u64 << 40)),
            ("sha256", serde_json::json!("xyz")),
            ("name", serde_json::json!("../../etc/passwd")),
            ("name", serde_json::json!("..")),
            ("name", serde_json::json!("a\nb")),
            ("task", serde_json::json!({"kind": ""})),
            ("task", serde_json::json!({"kind": "echo", "payload": [1]})),
            (
                "task",
                serde_json::json!({"kind": "echo", "payload": {"upload": 1}}),
            ),
            ("extra", serde_json::json!(1)),
        ];
        for (field, value) in cases {
            let mut v = ok();
            v[field] = value.clone();
            assert!(req(v).is_err(), "{field} = {value} accepted");
        }
    }
}

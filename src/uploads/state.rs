//! Starting an upload (its folder and `meta.json`, the quota checked first) and reading
//! where it stands: the chunks on disk, and the row once recorded.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;

use artex_actors::submission::Submission;
use serde::Serialize;
use uuid::Uuid;

use super::data::WHOLE;
use super::declaration::{refusal_text, task_field, CreateRequest, Meta, LAYOUT};
use super::disk::{blocking, read_dir, sync_dir, write_durably};
use super::error::{io, Result, UploadError};
use super::owner::make_lock;
use super::Uploads;

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
    /// The whole file's sha256: declared, or given with `complete`; `None` while the
    /// client is still to give it (then `complete` with it, once nothing is missing).
    pub sha256: Option<String>,
}

impl Uploads {
    /// Starts an upload: checks what is declared, reserves its size against the quota,
    /// writes its `meta.json`. Nothing is written when anything is refused.
    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<Meta> {
        let meta = Meta {
            host: Some(self.host.clone()),
            blackboard: Some(self.blackboard),
            ..req.check()?
        };
        self.check_task(&meta).await?;
        if let Some(flow) = meta.task.flow {
            self.check_flow(flow).await?;
        }
        let me = self.clone();
        blocking(move || {
            let _one = me.starting.lock().unwrap_or_else(|e| e.into_inner());
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
            make_lock(&dir)?;
            let text = serde_json::to_vec_pretty(&meta)
                .map_err(|e| UploadError::Internal(format!("encoding the upload: {e}")))?;
            write_durably(&dir, "meta.json", &text)?;
            sync_dir(&me.settings.dir)?;
            Ok(meta)
        })
        .await
    }

    /// The upload's task against the blackboard, as every submission is: its payload
    /// (with the file named in it) within the limit, its kind one a worker declared
    /// unless the task says its workers come later. Refused with 422 naming the field.
    async fn check_task(&self, meta: &Meta) -> Result {
        let task = meta.task_to_check();
        let submission = Submission::task(&task, meta.task.allow_unregistered_kind);
        let facts = self
            .bb
            .submission_facts(&submission)
            .await
            .map_err(|e| UploadError::Internal(format!("reading the blackboard: {e}")))?;
        submission
            .check(&facts)
            .map_err(|r| UploadError::Unprocessable {
                field: task_field(r.field),
                message: refusal_text(&r),
            })?;
        Ok(())
    }

    /// The flow an upload's task is to join must exist and have a task not ended yet.
    async fn check_flow(&self, flow: Uuid) -> Result {
        let open = self
            .bb
            .flow_open(flow)
            .await
            .map_err(|e| UploadError::Internal(format!("reading flow {flow}: {e}")))?;
        let why = match open {
            Some(true) => return Ok(()),
            Some(false) => "has ended (every task of it finished)",
            None => "does not exist",
        };
        Err(UploadError::Unprocessable {
            field: "task.flow",
            message: format!(
                "task.flow: flow {flow} {why}; an upload's task joins an unfinished flow"
            ),
        })
    }

    /// Bytes the uploads in the folder take or will take (declared sizes).
    fn reserved(&self) -> Result<u64> {
        let mut total = 0u64;
        for entry in read_dir(&self.settings.dir)? {
            if let Some(meta) = entry.and_then(|id| self.meta_any_layout(id).ok()) {
                total = total.saturating_add(meta.size);
            }
        }
        Ok(total)
    }

    /// The upload's declaration, refused (409) when an earlier build's layout wrote it:
    /// its chunks are not where this build looks for them. Another blackboard's upload
    /// is `NotFound` (see `owner`).
    pub(super) fn meta_sync(&self, id: Uuid) -> Result<Meta> {
        let meta = self.own_meta(id)?;
        if meta.layout != LAYOUT {
            return Err(UploadError::Conflict(format!(
                "upload {id} was started by an earlier artex whose files on disk are laid out \
                 differently (layout {}, this build reads {LAYOUT}); it cannot be resumed: \
                 start the upload again",
                meta.layout
            )));
        }
        Ok(meta)
    }

    /// As [`Uploads::meta_sync`], but an earlier layout's upload whose file is whole is
    /// read too: a whole file is one file in every layout.
    fn meta_to_show(&self, id: Uuid) -> Result<Meta> {
        match self.own_meta(id)? {
            m if m.layout == LAYOUT || self.folder(id).join(WHOLE).exists() => Ok(m),
            _ => self.meta_sync(id),
        }
    }

    /// The upload's declaration, whichever layout and whichever blackboard wrote it
    /// (the quota counts every upload in the folder; everything else reads
    /// `own_meta`).
    pub(super) fn meta_any_layout(&self, id: Uuid) -> Result<Meta> {
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
    pub(super) fn received_sync(&self, meta: &Meta) -> Result<BTreeSet<u64>> {
        let dir = self.folder(meta.id);
        if dir.join(WHOLE).exists() {
            return Ok((0..meta.chunks).collect());
        }
        let mut got = BTreeSet::new();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Completed by another request, its task run and its folder swept meanwhile:
            // `progress` answers from the upload's row.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(UploadError::NotFound(meta.id.to_string()))
            }
            Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
        };
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
            let meta = me.meta_to_show(id)?;
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
                    sha256: meta.sha256,
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
                sha256: Some(row.sha256),
            }),
            (Err(e), _) => Err(e),
        }
    }
}

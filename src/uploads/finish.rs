//! Finishing an upload: once every chunk is on disk, the data file's sha256 is checked
//! (what was not hashed ahead is read once) and it is renamed to `file`; then the
//! upload's row and its task are written in one statement (once, however often this
//! runs, in this process or another).

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use artex_actors::blackboard::NewUpload;
use sha2::Digest;
use uuid::Uuid;

use super::data::{marker, DATA, WHOLE};
use super::declaration::Meta;
use super::disk::{blocking, sync_dir, write_durably};
use super::error::{io, Result, UploadError};
use super::owner::lock_upload;
use super::Uploads;

impl Uploads {
    /// Once every chunk is on disk: checks the file's sha256, seals it, and
    /// records the upload and its task (once, however often this is called, here or in
    /// another process). Returns the task, or `None` while chunks are missing.
    pub async fn finish(self: &Arc<Self>, meta: &Meta) -> Result<Option<Uuid>> {
        let _one = self.finishing.lock().await;
        let me = self.clone();
        let m = meta.clone();
        let sealed = blocking(move || {
            // One finisher at a time among the workers sharing the folder (and their
            // requests): the others wait, then find it sealed and its row written.
            let Some(lock) = lock_upload(&me.folder(m.id), true)? else {
                return Err(UploadError::Internal(format!(
                    "upload {}: not locked",
                    m.id
                )));
            };
            // A sha256 left for `complete` may have been given since (by another request
            // or the other process of a hot upgrade): it is in `meta.json` once checked.
            // Read again under the lock in any case: whose it is, as of now.
            let fresh = me.meta_sync(m.id)?;
            let m = match m.sha256 {
                Some(_) => Meta {
                    blackboard: fresh.blackboard,
                    ..m
                },
                None => fresh,
            };
            let got = me.received_sync(&m)?;
            if (got.len() as u64) < m.chunks || m.sha256.is_none() {
                return Ok(None);
            }
            me.seal(&m)?;
            // Sealed here or by another process (which then wrote the sha256 it checked
            // into `meta.json` first): what is recorded is what was checked.
            let sealed = me.meta_sync(m.id)?;
            if sealed.sha256 != m.sha256 {
                return Err(UploadError::Unprocessable {
                    field: "sha256",
                    message: format!(
                        "sha256: {} differs from the {} upload {} was checked against; \
                         nothing changed",
                        m.sha256.unwrap_or_default(),
                        sealed.sha256.unwrap_or_default(),
                        m.id
                    ),
                });
            }
            Ok(Some((sealed, lock)))
        })
        .await;
        let sealed = match sealed {
            // Finished by another request while this one waited for the lock, its task
            // run and its folder swept since: the row says which task it was.
            Err(UploadError::NotFound(_)) => {
                let row = self.bb.upload(meta.id).await.map_err(|e| {
                    UploadError::Internal(format!("reading upload {}: {e}", meta.id))
                })?;
                return match row {
                    Some(row) => Ok(Some(row.task)),
                    None => Err(UploadError::NotFound(meta.id.to_string())),
                };
            }
            other => other?,
        };
        match sealed {
            // The lock is held until the row is written.
            Some((m, _lock)) => self.record(&m).await.map(Some),
            None => Ok(None),
        }
    }

    /// `complete`: every chunk must be there; `given` is the whole file's sha256, which
    /// the upload must be given here if it declared none at the start, and which must be
    /// the one declared if it did. Returns the task (written now, or by the request that
    /// finished it first: then `Conflict`, naming it).
    pub async fn complete(self: &Arc<Self>, id: Uuid, given: Option<String>) -> Result<Uuid> {
        let before = self.progress(id).await?;
        if let Some(task) = before.task {
            return Err(UploadError::Conflict(format!(
                "upload {id} is already complete; its task is {task}"
            )));
        }
        let mut meta = self.meta(id).await?;
        match (&meta.sha256, given) {
            (Some(declared), Some(given)) if *declared != given => {
                return Err(UploadError::Unprocessable {
                    field: "sha256",
                    message: format!(
                        "sha256: {given} differs from the {declared} declared when upload \
                         {id} started; nothing changed"
                    ),
                })
            }
            (None, None) => {
                return Err(UploadError::Unprocessable {
                    field: "sha256",
                    message: format!(
                        "sha256: upload {id} declared none when it started; give the whole \
                         file's here: {{\"sha256\": \"<64 hex digits>\"}}"
                    ),
                })
            }
            (None, Some(given)) => meta.sha256 = Some(given),
            (Some(_), _) => {}
        }
        self.finish(&meta).await?.ok_or_else(|| {
            UploadError::Conflict(format!(
                "upload {id} is missing chunks {:?}",
                before.missing
            ))
        })
    }

    /// Checks the data file whole (its size and sha256: one read pass over what was not
    /// hashed ahead) and renames it to `file`. Its chunks are durable already (each
    /// synced before it was marked). A sha256 given with `complete` is written into
    /// `meta.json` before the rename: a whole `file` always has its checked sha256 there.
    fn seal(&self, meta: &Meta) -> Result {
        let Some(want) = meta.sha256.as_deref() else {
            return Err(UploadError::Internal(format!(
                "upload {}: sealed without a sha256",
                meta.id
            )));
        };
        let dir = self.folder(meta.id);
        let file = dir.join(WHOLE);
        if file.exists() {
            return Ok(());
        }
        let data = dir.join(DATA);
        let mut f = match File::open(&data) {
            Ok(f) => f,
            // The other process of a hot upgrade sealed it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file.exists() => return Ok(()),
            Err(e) => return Err(io(format!("opening {}", data.display()))(e)),
        };
        // What was hashed ahead (in this process) is not read again.
        let ahead = self.prefixes.take(meta.id);
        let (mut hash, mut len) = (ahead.hash, ahead.upto);
        f.seek(SeekFrom::Start(len))
            .map_err(io(format!("reading {}", data.display())))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = f
                .read(&mut buf)
                .map_err(io(format!("reading {}", data.display())))?;
            if k == 0 {
                break;
            }
            len += k as u64;
            hash.update(&buf[..k]);
        }
        let got = hex::encode(hash.finalize());
        if got != want || len != meta.size {
            // Every chunk matched its own hash: the sha256 declared (or given) was wrong,
            // or the file changed while it was sent. Nothing of it can become a task; the
            // upload is discarded (its actual sha256 is not told: a client could
            // otherwise complete whatever arrived).
            let _ = fs::remove_dir_all(&dir);
            self.prefixes.forget(&[meta.id]);
            return Err(UploadError::Mismatch(format!(
                "the whole file ({len} bytes) does not have the sha256 {want} declared for \
                 it ({} bytes); the upload is discarded: send the file again",
                meta.size
            )));
        }
        if self.meta_sync(meta.id)?.sha256.is_none() {
            let text = serde_json::to_vec_pretty(meta)
                .map_err(|e| UploadError::Internal(format!("encoding the upload: {e}")))?;
            write_durably(&dir, "meta.json", &text)?;
        }
        match fs::rename(&data, &file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file.exists() => return Ok(()),
            Err(e) => return Err(io(format!("placing {}", file.display()))(e)),
        }
        sync_dir(&dir)?;
        for n in 0..meta.chunks {
            let _ = fs::remove_file(marker(&dir, n));
        }
        Ok(())
    }

    /// Writes the upload's row and its task (once). `meta` has its sha256: sealed.
    pub(super) async fn record(&self, meta: &Meta) -> Result<Uuid> {
        let Some(sha256) = meta.sha256.clone() else {
            return Err(UploadError::Internal(format!(
                "upload {}: recorded without a sha256",
                meta.id
            )));
        };
        let task = meta.task(&sha256);
        let upload = NewUpload {
            id: meta.id,
            host: meta.host.clone().unwrap_or_else(|| self.host.clone()),
            path: self
                .folder(meta.id)
                .join(WHOLE)
                .to_string_lossy()
                .into_owned(),
            size: meta.size as i64,
            sha256,
            chunks: meta.chunks as i32,
            name: meta.name.clone(),
            shared: self.settings.shared,
            flow: meta.task.flow,
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
}

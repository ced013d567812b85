//! Finishing an upload: once every chunk is on disk, they are joined into the file, its
//! sha256 checked, and the upload's row and its task written in one statement (once,
//! however often this runs, in this process or another).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::sync::Arc;

use artex_actors::blackboard::{NewTask, NewUpload};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::declaration::Meta;
use super::disk::{blocking, create_private, sync_dir};
use super::error::{io, Result, UploadError};
use super::Uploads;

impl Uploads {
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
        .await;
        let whole = match whole {
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
            let mut f = match File::open(&part) {
                Ok(f) => f,
                // The other process of a hot upgrade joined the file first and removed
                // the parts: the file is whole.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && file.exists() => {
                    let _ = fs::remove_file(&aside);
                    return Ok(());
                }
                Err(e) => {
                    let _ = fs::remove_file(&aside);
                    return Err(io(format!("opening {}", part.display()))(e));
                }
            };
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

    pub(super) async fn record(&self, meta: &Meta) -> Result<Uuid> {
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

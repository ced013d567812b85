//! The sweeper's work on this worker's folder: unfinished uploads untouched too long are
//! removed, files whose task ended (and kept long enough) are deleted, and whole files a
//! crash left unrecorded are recorded. Each only for an upload of this blackboard, under
//! its lock (skipped this round when another worker or request holds it).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::disk::{blocking, newest_mtime, read_dir};
use super::error::{io, Result, UploadError};
use super::owner::lock_upload;
use super::Uploads;

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

impl Uploads {
    /// Removes unfinished uploads untouched for `expire`, and files whose task ended
    /// `keep` ago; records whole files a crash left unrecorded.
    pub async fn sweep(self: &Arc<Self>) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        let me = self.clone();
        let local: Vec<(Uuid, bool, Option<SystemTime>)> = blocking(move || {
            let mut out = Vec::new();
            for id in read_dir(&me.settings.dir)?.into_iter().flatten() {
                let dir = me.folder(id);
                let whole = dir.join(super::data::WHOLE).exists();
                out.push((id, whole, newest_mtime(&dir)));
            }
            Ok(out)
        })
        .await?;
        let ids: Vec<Uuid> = local.iter().map(|(id, _, _)| *id).collect();
        // An empty folder has nothing to sweep: no question to the database (a fleet's
        // idle workers would ask every few seconds each).
        let known = if ids.is_empty() {
            Vec::new()
        } else {
            self.bb
                .uploads_known(&ids)
                .await
                .map_err(|e| UploadError::Internal(format!("reading uploads: {e}")))?
        };
        let mut expired = Vec::new();
        for (id, whole, touched) in local {
            if known.contains(&id) {
                continue;
            }
            if whole {
                // A whole file is one file in every layout (an earlier build's too), its
                // sha256 checked before it was named so. Recorded under its lock, and only
                // if it is this blackboard's.
                let me = self.clone();
                let taken = blocking(move || {
                    let Some(lock) = lock_upload(&me.folder(id), false)? else {
                        return Ok(None);
                    };
                    Ok(Some((me.own_meta(id)?, lock)))
                })
                .await;
                if let Ok(Some((meta, _lock))) = taken {
                    self.record(&meta).await?;
                    report.recorded += 1;
                }
                continue;
            }
            let idle = touched
                .and_then(|t| t.elapsed().ok())
                .unwrap_or(Duration::MAX);
            if idle >= self.settings.expire {
                let me = self.clone();
                if blocking(move || me.expire(id)).await? {
                    tracing::info!(upload = %id, "abandoned upload removed");
                    expired.push(id);
                    report.expired += 1;
                }
            }
        }
        let ended = if ids.is_empty() {
            Vec::new()
        } else {
            self.ended_in(&self.settings.dir).await?
        };
        let mut gone = Vec::new();
        for (id, path) in ended {
            let path = PathBuf::from(path);
            // Only ever a folder of this upload folder, whatever the row says.
            if path.parent() != Some(self.folder(id).as_path()) {
                continue;
            }
            let me = self.clone();
            if blocking(move || me.delete_ended(id)).await? {
                gone.push(id);
            }
        }
        gone.extend(self.sweep_legacy().await?);
        self.prefixes.forget(&gone);
        self.prefixes.forget(&expired);
        if !gone.is_empty() {
            self.bb
                .mark_uploads_deleted(&gone)
                .await
                .map_err(|e| UploadError::Internal(format!("marking uploads deleted: {e}")))?;
            report.deleted = gone.len();
        }
        Ok(report)
    }

    /// The uploads of this host recorded in `folder` whose task ended more than
    /// `--upload-keep-ms` ago: (id, path).
    async fn ended_in(&self, folder: &Path) -> Result<Vec<(Uuid, String)>> {
        // The folder's path and a '/', as `record` begins the file's path.
        let folder = folder.join("").to_string_lossy().into_owned();
        self.bb
            .uploads_ended(&self.host, &folder, self.settings.keep.as_secs_f64())
            .await
            .map_err(|e| UploadError::Internal(format!("reading ended uploads: {e}")))
    }

    /// Deletes the files this blackboard recorded in the folder earlier builds shared by
    /// default, once their task ended: the row in this database proves them its own
    /// (nothing else there is touched). Returns the uploads deleted.
    async fn sweep_legacy(&self) -> Result<Vec<Uuid>> {
        let Some(legacy) = &self.legacy else {
            return Ok(Vec::new());
        };
        let folder = legacy.clone();
        let empty = blocking(move || Ok(read_dir(&folder)?.into_iter().flatten().next().is_none()))
            .await
            .unwrap_or(false);
        if empty {
            return Ok(Vec::new());
        }
        let ended = self.ended_in(legacy).await?;
        let mut gone = Vec::new();
        for (id, path) in ended {
            let dir = legacy.join(id.to_string());
            if PathBuf::from(path).parent() != Some(dir.as_path()) {
                continue;
            }
            blocking(move || remove(&dir)).await?;
            gone.push(id);
        }
        Ok(gone)
    }

    /// Removes unfinished upload `id`, idle past `--upload-expire-ms`, if it is this
    /// blackboard's and no other worker holds it; whether it did. A folder without
    /// `meta.json` is no upload (made or removed halfway): it goes.
    fn expire(&self, id: Uuid) -> Result<bool> {
        let dir = self.folder(id);
        let _lock = match lock_upload(&dir, false) {
            Ok(Some(lock)) => lock,
            Ok(None) => return Ok(false),
            Err(UploadError::NotFound(_)) => return remove(&dir).map(|()| true),
            Err(e) => return Err(e),
        };
        match self.own_meta(id) {
            Ok(_) => {}
            Err(UploadError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        // A chunk may have come since the folder was listed.
        let idle = newest_mtime(&dir)
            .and_then(|t| t.elapsed().ok())
            .unwrap_or(Duration::MAX);
        if idle < self.settings.expire {
            return Ok(false);
        }
        remove(&dir).map(|()| true)
    }

    /// Removes the file of upload `id`, whose task ended, if it is this blackboard's and
    /// no other worker holds it; whether it is gone.
    fn delete_ended(&self, id: Uuid) -> Result<bool> {
        let dir = self.folder(id);
        let lock = match lock_upload(&dir, false) {
            Ok(Some(lock)) => Some(lock),
            Ok(None) => return Ok(false),
            // Gone already, or half: what is left goes.
            Err(UploadError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        if lock.is_some() {
            match self.own_meta(id) {
                Ok(_) => {}
                Err(UploadError::NotFound(_)) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        remove(&dir).map(|()| true)
    }
}

/// Removes an upload's folder (held locked by the caller, or no upload any more).
fn remove(dir: &Path) -> Result {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(format!("removing {}", dir.display()))(e)),
    }
}

//! The sweeper's work on this worker's folder: unfinished uploads untouched too long are
//! removed, files whose task ended (and kept long enough) are deleted, and whole files a
//! crash left unrecorded are recorded.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::disk::{blocking, newest_mtime, read_dir};
use super::error::{io, Result, UploadError};
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
        let known = self
            .bb
            .uploads_known(&ids)
            .await
            .map_err(|e| UploadError::Internal(format!("reading uploads: {e}")))?;
        let mut expired = Vec::new();
        for (id, whole, touched) in local {
            if known.contains(&id) {
                continue;
            }
            if whole {
                // A whole file is one file in every layout (an earlier build's too), its
                // sha256 checked before it was named so.
                let me = self.clone();
                if let Ok(meta) = blocking(move || me.meta_any_layout(id)).await {
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
                expired.push(id);
                report.expired += 1;
            }
        }
        // The folder's path and a '/', as `record` begins the file's path.
        let folder = self.settings.dir.join("").to_string_lossy().into_owned();
        let ended = self
            .bb
            .uploads_ended(&self.host, &folder, self.settings.keep.as_secs_f64())
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
            blocking(move || match fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io(format!("removing {}", dir.display()))(e)),
            })
            .await?;
            gone.push(id);
        }
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
}

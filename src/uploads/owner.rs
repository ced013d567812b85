//! Whose an upload is, and who works on it now. An upload belongs to the blackboard its
//! `meta.json` names; one of an earlier build names none, and is taken by the first
//! blackboard to claim it in an explicit `--upload-dir` (an `owner` file made with
//! `link`, which fails if one exists: one claim wins). An upload of another blackboard is
//! never touched. Among the workers of one blackboard, whoever finishes or sweeps an
//! upload holds its `lock` file.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use uuid::Uuid;

use super::data::{id_of, range_lock};
use super::declaration::Meta;
use super::disk::create_private;
use super::error::{io, Result, UploadError};
use super::Uploads;

/// The upload's lock file, made with its `meta.json`.
pub(super) const LOCK: &str = "lock";
/// The blackboard that claimed an upload of an earlier build (its `meta.json` names none).
const OWNER: &str = "owner";

/// Whose an upload is, as this worker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// This blackboard's.
    Mine,
    /// Of an earlier build, in an explicit `--upload-dir`: this blackboard's if it claims
    /// it first.
    Unclaimed,
    /// Another blackboard's (`None`: an earlier build's in the default folder, which is
    /// keyed by the blackboard and which no earlier build wrote).
    Other(Option<Uuid>),
}

/// Whose the upload is whose `meta.json` names `named`, to blackboard `me`; `explicit`:
/// the folder is an explicit `--upload-dir`.
pub(super) fn owner(named: Option<Uuid>, me: Uuid, explicit: bool) -> Owner {
    match named {
        Some(b) if b == me => Owner::Mine,
        Some(b) => Owner::Other(Some(b)),
        None if explicit => Owner::Unclaimed,
        None => Owner::Other(None),
    }
}

/// Takes the lock of the upload in `dir` (waiting for it when `wait`; `None` when busy
/// and not `wait`). `NotFound` when the upload is gone, or went while this waited: it is
/// removed only under this lock.
pub(super) fn lock_upload(dir: &Path, wait: bool) -> Result<Option<File>> {
    let path = dir.join(LOCK);
    let gone = || UploadError::NotFound(id_of(dir));
    let open = |create: bool| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(0o600)
            .open(&path)
    };
    let file = match open(false) {
        Ok(f) => f,
        // An upload begun by an earlier build has no lock file yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !dir.join("meta.json").exists() {
                return Err(gone());
            }
            match open(true) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(gone()),
                Err(e) => return Err(io(format!("creating {}", path.display()))(e)),
            }
        }
        Err(e) => return Err(io(format!("opening {}", path.display()))(e)),
    };
    match range_lock(&file, 0, 0, wait) {
        Ok(()) => {}
        Err(e)
            if !wait
                && matches!(
                    e.raw_os_error(),
                    Some(nix::libc::EAGAIN) | Some(nix::libc::EACCES)
                ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(io(format!("locking {}", path.display()))(e)),
    }
    if !dir.join("meta.json").exists() {
        return Err(gone());
    }
    Ok(Some(file))
}

/// Makes the lock file of a new upload's folder (before its `meta.json`).
pub(super) fn make_lock(dir: &Path) -> Result {
    create_private(&dir.join(LOCK)).map(drop)
}

impl Uploads {
    /// The upload's declaration if it is this blackboard's (claiming an earlier build's
    /// in an explicit folder); another blackboard's is `NotFound`, logged once.
    pub(super) fn own_meta(&self, id: Uuid) -> Result<Meta> {
        let meta = self.meta_any_layout(id)?;
        let claimed = match owner(meta.blackboard, self.blackboard, self.settings.explicit) {
            Owner::Mine => return Ok(meta),
            Owner::Unclaimed => claim(&self.folder(id), self.blackboard)?,
            Owner::Other(other) => other,
        };
        if claimed == Some(self.blackboard) {
            return Ok(Meta {
                blackboard: claimed,
                ..meta
            });
        }
        let first = self
            .foreign
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
        if first {
            let named = claimed.map_or_else(|| "none".to_string(), |b| b.to_string());
            tracing::warn!(upload = %id, upload_blackboard = %named, blackboard = %self.blackboard,
                folder = %self.settings.dir.display(),
                "upload of another blackboard in this folder: left alone (not finished, \
                 resumed, recorded or swept here; requests for it answer 404)");
        }
        Err(UploadError::NotFound(id.to_string()))
    }
}

/// Claims the upload of an earlier build in `dir` for blackboard `me`, unless another
/// claimed it first: returns the blackboard it is now (`None`: an unreadable claim).
fn claim(dir: &Path, me: Uuid) -> Result<Option<Uuid>> {
    let id = id_of(dir);
    let owner = dir.join(OWNER);
    let read = || match fs::read_to_string(&owner) {
        Ok(text) => Ok(Some(Uuid::parse_str(text.trim()).ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(format!("reading {}", owner.display()))(e)),
    };
    if let Some(claimed) = read()? {
        return Ok(claimed);
    }
    // Written whole aside, then linked: `link` fails when a claim is there, so the first
    // one stays, and nobody reads half of one.
    let aside = dir.join(format!("{OWNER}.{}", Uuid::new_v4().simple()));
    let mut f = match create_private(&aside) {
        Ok(f) => f,
        Err(_) if !dir.exists() => return Err(UploadError::NotFound(id)),
        Err(e) => return Err(e),
    };
    f.write_all(me.to_string().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io(format!("writing {}", aside.display())))?;
    let linked = fs::hard_link(&aside, &owner);
    let _ = fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            super::disk::sync_dir(dir)?;
            tracing::info!(upload = %id, blackboard = %me,
                "upload of an earlier build (its meta.json names no blackboard) taken as \
                 this blackboard's");
            Ok(Some(me))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(read()?.flatten()),
        Err(e) => Err(io(format!("placing {}", owner.display()))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_only_ever_its_own_blackboards() {
        let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
        for explicit in [false, true] {
            assert_eq!(owner(Some(me), me, explicit), Owner::Mine);
            assert_eq!(owner(Some(other), me, explicit), Owner::Other(Some(other)));
        }
        // An earlier build's upload: claimable only where earlier builds wrote, an
        // explicit folder; the default folder is keyed by the blackboard already.
        assert_eq!(owner(None, me, true), Owner::Unclaimed);
        assert_eq!(owner(None, me, false), Owner::Other(None));
    }

    #[test]
    fn an_earlier_builds_upload_is_claimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(claim(dir.path(), a).unwrap(), Some(a));
        // The second claimant, another blackboard or the same one again, reads the first.
        assert_eq!(claim(dir.path(), b).unwrap(), Some(a));
        assert_eq!(claim(dir.path(), a).unwrap(), Some(a));
        // Nothing left aside.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn one_upload_has_one_lock_holder_across_opens_and_none_once_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("meta.json"), b"{}").unwrap();
        make_lock(dir.path()).unwrap();
        let held = lock_upload(dir.path(), false).unwrap().expect("free");
        // Another open (another worker of the blackboard, or another request) waits.
        assert!(lock_upload(dir.path(), false).unwrap().is_none());
        drop(held);
        let held = lock_upload(dir.path(), true).unwrap().expect("free again");
        // Removed by its holder: whoever gets the lock next finds it gone.
        std::fs::remove_file(dir.path().join("meta.json")).unwrap();
        drop(held);
        assert!(matches!(
            lock_upload(dir.path(), true),
            Err(UploadError::NotFound(_))
        ));
    }
}

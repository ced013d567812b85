//! Folders only this user can enter: where bundles are received, generations unpacked and
//! upgrade channel sockets bound. In a shared temp folder anyone can create a path first, as a
//! symlink or a folder of their own, so an existing folder is trusted only if it is a real
//! directory, ours, and closed to group and others.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use crate::error::{Error, Result};

/// Creates `dir` (and missing parents) with mode 0700 if missing, then checks it: a
/// directory (a symlink is refused, even to a good directory: whoever made it can point it
/// elsewhere later), owned by our effective uid, no group or other permission bit. `what`
/// names the folder in the error ("upgrade folder", "upgrade channel directory").
///
/// Once it passes, nobody else can change what is inside; whether it can be renamed away
/// depends on its parent, which for the temp folder is sticky (only the owner may).
pub fn ensure_private_dir(dir: &Path, what: &'static str) -> Result {
    let refused = |reason: String| Error::DirInvalid {
        what,
        path: dir.to_owned(),
        reason,
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| refused(format!("cannot create its parent folder: {e}")))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(format!("cannot create it: {e}"))),
    }
    // symlink_metadata: the path itself, never what a symlink there points to.
    let meta = dir
        .symlink_metadata()
        .map_err(|e| refused(format!("cannot inspect it: {e}")))?;
    let euid = nix::unistd::geteuid().as_raw();
    let reason = if meta.file_type().is_symlink() {
        Some("it is a symlink; a real directory is required".to_owned())
    } else if !meta.is_dir() {
        Some("it is not a directory".to_owned())
    } else if meta.uid() != euid {
        Some(format!(
            "it is owned by uid {}, not by this process's uid {euid}",
            meta.uid()
        ))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!(
            "its mode {:04o} gives group or others access; expected 0700 (chmod 700 it)",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(refused(reason)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn reason(dir: &Path) -> String {
        match ensure_private_dir(dir, "test folder") {
            Err(Error::DirInvalid { reason, .. }) => reason,
            other => panic!("{} not refused: {other:?}", dir.display()),
        }
    }

    #[test]
    fn a_missing_folder_is_created_private_with_its_parents() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/upgrades");
        ensure_private_dir(&dir, "test folder").unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // And a second time, as it is now: fine.
        ensure_private_dir(&dir, "test folder").unwrap();
    }

    #[test]
    fn open_folders_symlinks_and_files_are_refused_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(reason(&open).contains("mode 0777"), "{}", reason(&open));

        let good = root.path().join("good");
        ensure_private_dir(&good, "test folder").unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(reason(&link).contains("symlink"), "{}", reason(&link));

        let file = root.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(
            reason(&file).contains("not a directory"),
            "{}",
            reason(&file)
        );

        let err = ensure_private_dir(&open, "upgrade folder").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("upgrade folder") && text.contains(&open.display().to_string()),
            "the error names the folder: {text}"
        );
    }

    #[test]
    fn a_folder_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can make a folder owned by someone else");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let theirs = root.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        assert!(
            reason(&theirs).contains("owned by uid 65534"),
            "{}",
            reason(&theirs)
        );
    }
}

//! The programs a bundle carries (`artex bundle create --tasks-dir`), installed for the
//! new generation: beside the worker's `--tasks-dir` DIR, in a fresh `DIR/.artex-gen-ID`
//! (a hidden folder: not a kind of DIR's), named to the new process by
//! [`UPGRADE_TASKS_ENV`]. Not in the generation folder: that one is private to the
//! worker's user (0700), and a root worker's programs run as `nobody`, who must reach
//! them. A bundle without programs leaves the new generation with the ones this one runs.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Set by an upgrade for the new process it spawns: the folder of the programs it runs,
/// in place of `--tasks-dir` (never set it yourself).
pub const UPGRADE_TASKS_ENV: &str = "ARTEX_UPGRADE_TASKS_DIR";

/// The prefix of an installed generation's programs folder in DIR.
const PREFIX: &str = ".artex-gen-";

/// Copies the verified programs in `from` (a bundle's unpacked `tasks/`) to a new
/// `DIR/.artex-gen-ID`, modes kept (0755 programs, 0644 the rest), synced; its path.
pub fn install(from: &Path, dir: &Path) -> Result<PathBuf, String> {
    let to = dir.join(format!("{PREFIX}{}", uuid::Uuid::new_v4().simple()));
    let fail = |what: &str, path: &Path, e: std::io::Error| {
        format!(
            "installing the bundle's programs: {what} {}: {e}",
            path.display()
        )
    };
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&to)
        .and_then(|()| fs::set_permissions(&to, fs::Permissions::from_mode(0o755)))
        .map_err(|e| fail("creating", &to, e))?;
    let copied = (|| {
        for item in fs::read_dir(from).map_err(|e| fail("listing", from, e))? {
            let item = item.map_err(|e| fail("listing", from, e))?;
            let (src, dest) = (item.path(), to.join(item.file_name()));
            let mode = fs::metadata(&src)
                .map_err(|e| fail("reading", &src, e))?
                .permissions()
                .mode()
                & 0o777;
            fs::copy(&src, &dest).map_err(|e| fail("copying", &src, e))?;
            fs::set_permissions(&dest, fs::Permissions::from_mode(mode))
                .and_then(|()| fs::File::open(&dest)?.sync_all())
                .map_err(|e| fail("writing", &dest, e))?;
        }
        fs::File::open(&to)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail("syncing", &to, e))
    })();
    match copied {
        Ok(()) => Ok(to),
        Err(e) => {
            let _ = fs::remove_dir_all(&to);
            Err(e)
        }
    }
}

/// Removes the installed programs folders of DIR but those in `keep` (the new
/// generation's, and this one's while it drains).
pub fn prune(dir: &Path, keep: &[&Path]) {
    let Ok(listing) = fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten() {
        let path = item.path();
        let ours = item.file_name().to_string_lossy().starts_with(PREFIX);
        if ours && !keep.iter().any(|k| *k == path) {
            if let Err(e) = fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an older generation's programs");
            }
        }
    }
}

/// The programs folder this process runs: the one an upgrade installed for it, else
/// `--tasks-dir`.
pub fn effective_dir(configured: Option<&Path>) -> Option<PathBuf> {
    std::env::var_os(UPGRADE_TASKS_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| configured.map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_installed_beside_the_folder_modes_kept_and_older_ones_pruned() {
        let root = tempfile::tempdir().unwrap();
        let (from, dir) = (root.path().join("from"), root.path().join("dir"));
        fs::create_dir(&from).unwrap();
        fs::create_dir(&dir).unwrap();
        fs::write(from.join("greet.sh"), "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(from.join("greet.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(from.join("greet.toml"), "timeout = \"5s\"\n").unwrap();
        fs::set_permissions(from.join("greet.toml"), fs::Permissions::from_mode(0o644)).unwrap();
        let first = install(&from, &dir).unwrap();
        let second = install(&from, &dir).unwrap();
        assert_ne!(first, second);
        assert!(first
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".artex-gen-"));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&second), 0o755);
        assert_eq!(mode(&second.join("greet.sh")), 0o755);
        assert_eq!(mode(&second.join("greet.toml")), 0o644);
        assert_eq!(
            fs::read_to_string(second.join("greet.sh")).unwrap(),
            "#!/bin/sh\necho hi\n"
        );
        let third = install(&from, &dir).unwrap();
        fs::write(dir.join("keep-me.sh"), "").unwrap();
        prune(&dir, &[&second, &third]);
        assert!(!first.exists() && second.exists() && third.exists());
        assert!(
            dir.join("keep-me.sh").exists(),
            "only installed generations are pruned"
        );
    }

    #[test]
    fn a_source_that_cannot_be_read_leaves_nothing_installed() {
        let root = tempfile::tempdir().unwrap();
        let err = install(&root.path().join("missing"), root.path()).unwrap_err();
        assert!(err.contains("listing"), "{err}");
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }
}

//! A small disk for tests that fill one: a tmpfs of a given size mounted on a folder for
//! the value's life (root only, as CI runs; the test fails saying so otherwise).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a folder (mode 0700); unmounted when dropped.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Creates `dir` if needed and mounts a tmpfs of `size` (e.g. "1m") on it.
    pub fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).expect("the folder to mount a small disk on");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs on {} needs root (CI runs as root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

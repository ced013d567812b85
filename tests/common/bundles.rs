//! Upgrade bundles for tests: a key pair and token made with the real CLI, variants of
//! the artex binary (different bytes appended: a different build as far as sha256 goes),
//! and bundles whose "binary" is a shell script, all signed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bearer token the test workers require.
pub const TOKEN: &str = "s3cret-token-for-tests";

/// A key pair, a token file, and bundles made with them, in a private temp folder.
pub struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    /// `artex bundle keygen` into a fresh folder, and the token file.
    pub fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(super::artex_bin())
            .args(["bundle", "keygen", "--secret"])
            .arg(dir.path().join("secret"))
            .arg("--public")
            .arg(dir.path().join("public"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(dir.path().join("token"), TOKEN).unwrap();
        Keys { dir }
    }

    /// A path in the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Worker flags enabling upgrades, with `upgrade_dir` (in this folder) as the
    /// upgrade folder.
    pub fn flags(&self, upgrade_dir: &str) -> Vec<String> {
        let p = |n: &str| self.path(n).to_string_lossy().into_owned();
        vec![
            "--upgrade-public-key".into(),
            p("public"),
            "--upgrade-token-file".into(),
            p("token"),
            "--upgrade-dir".into(),
            p(upgrade_dir),
        ]
    }

    /// A signed bundle of a copy of the artex binary with `variant` appended: (zip, sha256).
    pub fn variant_bundle(&self, variant: usize) -> (PathBuf, String) {
        let bin = self.variant_binary(variant);
        self.bundle_of_variant(&bin, variant)
    }

    /// A copy of the artex binary with `variant` appended, written and closed.
    fn variant_binary(&self, variant: usize) -> PathBuf {
        let bin = self.path(&format!("artex-v{variant}"));
        std::fs::copy(super::artex_bin(), &bin).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&bin).unwrap();
        writeln!(f, "test build variant {variant}").unwrap();
        // Closed before `bundle create` runs it to ask for its schema: a file open for
        // writing cannot be executed (ETXTBSY).
        drop(f);
        bin
    }

    fn bundle_of_variant(&self, bin: &Path, variant: usize) -> (PathBuf, String) {
        self.bundle_of(
            bin,
            &format!("0.1.0-v{variant}"),
            &format!("v{variant}.zip"),
        )
    }

    /// `n` variant bundles: the binaries written one after the other, then bundled in
    /// parallel. Written in parallel, a copy still open for writing in one thread was
    /// inherited by a process another thread forked (until that one's exec closed it),
    /// and running that copy then failed with "Text file busy" (ETXTBSY).
    pub fn variant_bundles(&self, n: usize) -> Vec<(PathBuf, String)> {
        let bins: Vec<PathBuf> = (1..=n).map(|i| self.variant_binary(i)).collect();
        std::thread::scope(|s| {
            let made: Vec<_> = bins
                .iter()
                .enumerate()
                .map(|(i, bin)| s.spawn(move || self.bundle_of_variant(bin, i + 1)))
                .collect();
            made.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// A signed bundle whose "binary" is this shell script, recording no schema (a
    /// script cannot be asked for one; running it to ask could leave its background
    /// processes behind).
    pub fn script_bundle(&self, name: &str, script: &str) -> PathBuf {
        let bin = self.path(name);
        std::fs::write(&bin, script).unwrap();
        self.bundle_with(&bin, name, &format!("{name}.zip"), &["--no-schema"])
            .0
    }

    /// `artex bundle create` of `bin`: (zip, sha256 of the binary).
    pub fn bundle_of(&self, bin: &Path, version: &str, out: &str) -> (PathBuf, String) {
        self.bundle_with(bin, version, out, &[])
    }

    /// `artex bundle create` of `bin` with `extra` flags: (zip, sha256 of the binary).
    pub fn bundle_with(
        &self,
        bin: &Path,
        version: &str,
        out: &str,
        extra: &[&str],
    ) -> (PathBuf, String) {
        let zip = self.path(out);
        let out = Command::new(super::artex_bin())
            .args(["bundle", "create", "--binary"])
            .arg(bin)
            .arg("--key")
            .arg(self.path("secret"))
            .arg("--out")
            .arg(&zip)
            .args(["--manifest-version", version])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "<zip> (version …, sha256 <hex>)"
        let stdout = String::from_utf8_lossy(&out.stdout);
        let sha = stdout
            .rsplit("sha256 ")
            .next()
            .map(|s| s.trim().trim_end_matches(')').to_string())
            .filter(|s| s.len() == 64)
            .unwrap_or_else(|| panic!("no sha256 in {stdout:?}"));
        (zip, sha)
    }
}

//! Programs as task kinds (docs/programs.md): every executable regular file of
//! `--tasks-dir` (hidden ones and `*.toml` aside) is a kind named by its file name
//! without its last extension, run by
//! [`run::attempt`] under protocol version 1. Found and checked once, at start: a name
//! defined twice, a name that is not a kind name, or a file (or folder) others could
//! change stops the worker, naming the path and the reason.

mod protocol;
mod run;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use artex_actors::blackboard::check_kind;
use artex_actors::worker::{HandlerFuture, Registry, TaskContext, TaskHandler};

use crate::error::{Error, Result};

/// The `PATH` a program gets unless `--tasks-env PATH` passes the worker's own.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// One program, as a task kind's handler.
#[derive(Debug, Clone)]
pub struct Program {
    /// The executable.
    pub path: PathBuf,
    /// What it gets of the worker's environment (names passed through, and `PATH`).
    env: Arc<Vec<(OsString, OsString)>>,
    /// SIGTERM to SIGKILL when it is stopped.
    grace: Duration,
}

impl TaskHandler for Program {
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        Box::pin(run::attempt(self.clone(), ctx))
    }
}

/// Adds the programs of `dir` to `registry`, each under its kind; `pass_env` names the
/// worker's variables they get, `grace` is the time between SIGTERM and SIGKILL when one
/// is stopped. Makes this process a child subreaper, so that what a program leaves
/// behind is reparented here and reaped.
pub fn register(
    registry: &mut Registry,
    dir: &Path,
    pass_env: &[String],
    grace: Duration,
) -> Result<Vec<String>> {
    let found = discover(dir)?;
    let compiled = registry.kinds();
    if let Some((kind, path)) = found.iter().find(|(k, _)| compiled.contains(k)) {
        return Err(Error::Invalid(format!(
            "--tasks-dir: kind '{kind}' is defined twice: by {} and by a handler compiled into this worker",
            path.display()
        )));
    }
    let env = Arc::new(passed_env(pass_env)?);
    artex_upgrade::subreaper::become_subreaper()?;
    for (kind, path) in &found {
        let program = Program {
            path: path.clone(),
            env: env.clone(),
            grace,
        };
        registry.register(kind.clone(), program);
    }
    Ok(found.into_keys().collect())
}

/// The programs of `dir` by kind, checked (see the module's comment).
pub fn discover(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let invalid = |what: String| Error::Invalid(format!("--tasks-dir {}: {what}", dir.display()));
    let meta = std::fs::metadata(dir).map_err(|e| invalid(e.to_string()))?;
    if !meta.is_dir() {
        return Err(invalid("not a folder".into()));
    }
    check_owner_and_mode(dir, &meta)?;
    let entries = std::fs::read_dir(dir).map_err(|e| invalid(e.to_string()))?;
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| invalid(e.to_string()))?;
        let path = entry.path();
        // Followed through symbolic links: what runs is the file they point to.
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::Invalid(format!("--tasks-dir: {}: {e}", path.display())))?;
        let executable = meta.permissions().mode() & 0o111 != 0;
        let bounds = path.extension().is_some_and(|e| e == "toml");
        let hidden = entry.file_name().as_encoded_bytes().starts_with(b".");
        if !meta.is_file() || !executable || bounds || hidden {
            continue;
        }
        check_owner_and_mode(&path, &meta)?;
        let kind = kind_of(&path)?;
        if let Some(first) = found.get(&kind) {
            return Err(Error::Invalid(format!(
                "--tasks-dir: kind '{kind}' is defined twice: by {} and by {}",
                first.display(),
                path.display()
            )));
        }
        found.insert(kind, path);
    }
    Ok(found)
}

/// The kind a program's file stands for: its name without its extension.
fn kind_of(path: &Path) -> Result<String> {
    let stem = path.file_stem().and_then(|s| s.to_str()).ok_or_else(|| {
        Error::Invalid(format!(
            "--tasks-dir: {}: the file name is not UTF-8",
            path.display()
        ))
    })?;
    check_kind(stem).map_err(|why| {
        Error::Invalid(format!(
            "--tasks-dir: {}: its name without extension, {why}",
            path.display()
        ))
    })?;
    Ok(stem.to_string())
}

/// Refuses a file or folder that someone other than root and this user could change: it
/// would let them run their code as this worker.
fn check_owner_and_mode(path: &Path, meta: &std::fs::Metadata) -> Result {
    let refuse = |why: String| {
        Error::Invalid(format!(
            "--tasks-dir: {}: {why}; refused, since whoever can change it runs code as this worker",
            path.display()
        ))
    };
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "writable by its group or by everyone (mode {:o})",
            mode & 0o7777
        )));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(refuse(format!(
            "owned by user {}, neither root nor this worker's user ({me})",
            meta.uid()
        )));
    }
    Ok(())
}

/// The environment every program starts from: `PATH`, then the variables `names` passes
/// through from the worker's (read once, at start).
fn passed_env(names: &[String]) -> Result<Vec<(OsString, OsString)>> {
    let mut env = vec![(OsString::from("PATH"), OsString::from(DEFAULT_PATH))];
    for name in names {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(Error::Invalid(format!(
                "--tasks-env: {name:?} is not a variable name"
            )));
        }
        if let Some(value) = std::env::var_os(name) {
            env.retain(|(k, _)| k != name.as_str());
            env.push((OsString::from(name), value));
        }
    }
    Ok(env)
}

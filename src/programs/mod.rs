//! Programs as task kinds (docs/programs.md): every executable regular file of
//! `--tasks-dir` (hidden ones and `*.toml` aside) is a kind named by its file name
//! without its last extension, run by
//! [`run::attempt`] under protocol version 1. Found and checked once, at start: a name
//! defined twice, a name that is not a kind name, or a file (or folder) others could
//! change stops the worker, naming the path and the reason.

mod bounds;
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
use artex_upgrade::task_process::{Launch, Resource};

pub use bounds::Bounds;

use crate::error::{Error, Result};

/// The `PATH` a program gets unless `--tasks-env PATH` passes the worker's own.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The user a program runs as when the worker runs as root and its bounds name none: a
/// task never runs as root unless its bounds file says `user = "root"`.
const DEFAULT_USER_FOR_ROOT: &str = "nobody";

/// One program, as a task kind's handler.
#[derive(Debug, Clone)]
pub struct Program {
    /// The executable.
    pub path: PathBuf,
    /// What it gets of the worker's environment (names passed through, and `PATH`).
    env: Arc<Vec<(OsString, OsString)>>,
    /// SIGTERM to SIGKILL when it is stopped.
    grace: Duration,
    /// Its bounds (`NAME.toml`), and who it runs as.
    bounds: Bounds,
    launch: Launch,
    /// The user it runs as, when not the worker's.
    runs_as: Option<String>,
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
    let mut programs = Vec::new();
    for (kind, path) in &found {
        let bounds = bounds_of(dir, kind)?;
        let (launch, runs_as) = launch_for(&bounds, path)?;
        let program = Program {
            path: path.clone(),
            env: env.clone(),
            grace,
            bounds,
            launch,
            runs_as,
        };
        programs.push((kind.clone(), program));
    }
    artex_upgrade::subreaper::become_subreaper()?;
    for (kind, program) in programs {
        let resumable = program.bounds.resumable;
        match program.bounds.timeout {
            Some(t) => registry.register_with_timeout(kind.clone(), t, program),
            None => registry.register(kind.clone(), program),
        };
        if resumable {
            // Its checkpoint line, once a hot upgrade asked it to move, ends it (SIGTERM
            // to its group) and the new process starts it again from that checkpoint.
            registry.set_resumable(&kind);
        }
    }
    Ok(found.into_keys().collect())
}

/// The bounds of `kind` from `DIR/KIND.toml`, if there is one.
fn bounds_of(dir: &Path, kind: &str) -> Result<Bounds> {
    let path = dir.join(format!("{kind}.toml"));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Bounds::default()),
        Err(e) => {
            return Err(Error::Invalid(format!(
                "--tasks-dir: {}: {e}",
                path.display()
            )))
        }
    };
    let meta = std::fs::metadata(&path)
        .map_err(|e| Error::Invalid(format!("--tasks-dir: {}: {e}", path.display())))?;
    check_owner_and_mode(&path, &meta)?;
    bounds::parse(&text)
        .map_err(|why| Error::Invalid(format!("--tasks-dir: {}: {why}", path.display())))
}

/// Who `bounds` run `program` as, and its limits. A worker running as root runs it as
/// [`DEFAULT_USER_FOR_ROOT`] unless the bounds name a user; any other worker runs it as
/// itself, and refuses bounds naming someone else. With the launch, the name of the
/// user when it is not the worker's.
fn launch_for(bounds: &Bounds, program: &Path) -> Result<(Launch, Option<String>)> {
    let refuse = |why: String| Error::Invalid(format!("--tasks-dir: {}: {why}", program.display()));
    let root = nix::unistd::geteuid().is_root();
    let name = match (&bounds.user, root) {
        (Some(name), _) => Some(name.as_str()),
        (None, true) => Some(DEFAULT_USER_FOR_ROOT),
        (None, false) => None,
    };
    let user = match name {
        None => None,
        Some(name) => {
            let found = nix::unistd::User::from_name(name)
                .map_err(|e| refuse(format!("looking up user {name:?}: {e}")))?
                .ok_or_else(|| refuse(format!("user {name:?} does not exist on this host")))?;
            let me = nix::unistd::geteuid();
            if !root && found.uid != me {
                return Err(refuse(format!(
                    "user = {name:?}: only a worker running as root runs programs as another user"
                )));
            }
            (found.uid != me).then_some((name, found.uid.as_raw(), found.gid.as_raw()))
        }
    };
    let mut limits = Vec::new();
    if let Some(bytes) = bounds.memory {
        limits.push((Resource::RLIMIT_AS, bytes, bytes));
    }
    if let Some(secs) = bounds.cpu_seconds {
        // SIGXCPU at the bound; SIGKILL a second later for a program that ignores it.
        limits.push((Resource::RLIMIT_CPU, secs, secs + 1));
    }
    if let Some(n) = bounds.open_files {
        limits.push((Resource::RLIMIT_NOFILE, n, n));
    }
    let launch = Launch {
        user: user.map(|(_, uid, gid)| (uid, gid)),
        limits,
    };
    Ok((launch, user.map(|(name, _, _)| name.to_string())))
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

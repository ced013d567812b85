//! `artex bundle keygen|create|info`: signing keys and signed upgrade bundles, made and
//! verified with `artex_upgrade::bundle` (as the worker's side verifies them).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use artex_upgrade::Schema;
use clap::Subcommand;

use super::print_json;
use super::progress::{step, Progress};
use super::stdout::outln;
use crate::error::{Error, Result};

/// How long the packaged binary gets to print its schema.
const SCHEMA_DEADLINE: Duration = Duration::from_secs(10);
/// More than any schema a binary could honestly print.
const MAX_SCHEMA_BYTES: u64 = 1024 * 1024;

/// `artex bundle …`
#[derive(Debug, Subcommand)]
pub(crate) enum BundleCommand {
    /// Make an ed25519 key pair (hex files; the secret one mode 0600).
    Keygen {
        /// Where to write the secret key (refuses to overwrite).
        #[arg(long)]
        secret: std::path::PathBuf,
        /// Where to write the public key (give it to workers: --upgrade-public-key).
        #[arg(long)]
        public: std::path::PathBuf,
        /// Print the two paths as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Package a binary with a signed manifest for `curl -T bundle.zip …/upgrade`.
    ///
    /// Progress goes to standard error: a line per step (asking the binary its schema,
    /// hashing and compressing it, writing the bundle), and between them a bar of the bytes
    /// hashed and compressed when standard error is a terminal.
    Create {
        /// The new artex binary (or a binary built on the artex crate).
        #[arg(long)]
        binary: std::path::PathBuf,
        /// The secret key from `artex bundle keygen`.
        #[arg(long)]
        key: std::path::PathBuf,
        /// Where to write the bundle.
        #[arg(long)]
        out: std::path::PathBuf,
        /// The version recorded in the manifest (default: this build's).
        #[arg(long)]
        manifest_version: Option<String>,
        /// Record this build's schema instead of asking the binary (`BINARY schema
        /// --json`): for a binary that cannot be run here or cannot answer.
        #[arg(long, conflicts_with = "no_schema")]
        schema_of_this_build: bool,
        /// Record no schema: workers then skip the check before spawning, and the new
        /// process's own check at start is all that guards the database.
        #[arg(long)]
        no_schema: bool,
        /// A folder of programs to ship with the binary (a worker's --tasks-dir): each
        /// file goes in the bundle with its SHA-256 in the signed manifest, and the new
        /// generation runs them. Flat; hidden files are left out.
        #[arg(long)]
        tasks_dir: Option<std::path::PathBuf>,
        /// Print the bundle's path, size and signed manifest as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Verify a bundle as a worker would (signature, limits, the binary's digest) and
    /// print its signed manifest: what a rolling upgrade would install.
    Info {
        /// The bundle.
        bundle: std::path::PathBuf,
        /// The public key workers verify with (their --upgrade-public-key).
        #[arg(long)]
        public_key: std::path::PathBuf,
        /// Print `{"path", "bytes", "manifest"}` (as `bundle create --json`).
        #[arg(long)]
        json: bool,
    },
}

/// Runs `artex bundle …`.
pub(crate) fn bundle(command: BundleCommand) -> Result {
    match command {
        BundleCommand::Info {
            bundle,
            public_key,
            json,
        } => info(&bundle, &public_key, json),
        BundleCommand::Keygen {
            secret,
            public,
            json,
        } => {
            artex_upgrade::bundle::keygen(&secret, &public)?;
            if json {
                return print_json(&serde_json::json!({"secret": secret, "public": public}));
            }
            outln!(
                "secret key: {}\npublic key: {}",
                secret.display(),
                public.display()
            )
        }
        BundleCommand::Create {
            binary,
            key,
            out,
            manifest_version,
            schema_of_this_build,
            no_schema,
            tasks_dir,
            json,
        } => {
            let key = artex_upgrade::bundle::load_secret_key(&key)?;
            let version = manifest_version.unwrap_or_else(|| crate::VERSION.to_string());
            let schema = if no_schema {
                None
            } else if schema_of_this_build {
                Some(crate::hot_upgrade::schema::this_build())
            } else {
                step(format!(
                    "bundle: asking {} which schema it needs",
                    binary.display()
                ));
                Some(ask_schema(&binary)?)
            };
            // A binary that is not there is left to `create`, which names it.
            let size = std::fs::metadata(&binary).map(|m| m.len()).unwrap_or(0);
            step(format!(
                "bundle: hashing and compressing {} ({size} bytes)",
                binary.display()
            ));
            let progress = Progress::labelled("hashing and compressing", size);
            let manifest = artex_upgrade::bundle::create_with_tasks(
                &binary,
                tasks_dir.as_deref(),
                &key,
                &version,
                schema,
                &out,
                &mut |n| progress.add(n),
            )?;
            progress.done();
            let bytes = std::fs::metadata(&out)
                .map_err(|e| Error::io(format!("reading {}", out.display()), e))?
                .len();
            step(format!(
                "bundle: signed the manifest and wrote {} ({bytes} bytes) in {:.1} s",
                out.display(),
                progress.secs()
            ));
            if json {
                return print_json(&serde_json::json!({
                    "path": out, "bytes": bytes, "manifest": manifest,
                }));
            }
            let needs = match manifest.schema.as_ref().and_then(|s| s.needs.last()) {
                Some(m) => format!("needs migrations up to V{}__{}", m.version, m.name),
                None => "schema not recorded".to_string(),
            };
            let programs = match manifest.tasks.len() {
                0 => String::new(),
                n => format!(", {n} task files"),
            };
            outln!(
                "{} (version {}, {needs}{programs}, sha256 {})",
                out.display(),
                manifest.version,
                manifest.binary_sha256
            )
        }
    }
}

/// Runs `artex bundle info`: unpacks into a private folder of its own (what `unpack`
/// demands, as a worker's generation folder), removed afterwards, so the check is the
/// worker's own, not a second reading of the zip.
fn info(bundle: &Path, public_key: &Path, json: bool) -> Result {
    use std::os::unix::fs::DirBuilderExt;
    let key = artex_upgrade::bundle::load_public_key(public_key)?;
    let bytes = std::fs::metadata(bundle)
        .map_err(|e| Error::io(format!("reading {}", bundle.display()), e))?
        .len();
    let dir = std::env::temp_dir().join(format!("artex-bundle-info-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let limits = artex_upgrade::bundle::Limits::default();
    let verified = artex_upgrade::bundle::unpack(bundle, &key, &limits, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let manifest = verified?.manifest;
    if json {
        return print_json(&serde_json::json!({
            "path": bundle, "bytes": bytes, "manifest": manifest,
        }));
    }
    outln!(
        "bundle:    {} ({bytes} bytes), signature valid",
        bundle.display()
    )?;
    outln!("version:   {}", manifest.version)?;
    outln!("target:    {}", manifest.target)?;
    outln!("sha256:    {}", manifest.binary_sha256)?;
    outln!("protocol:  {}", manifest.channel_protocol)?;
    if let Some(t) = &manifest.created_at {
        outln!("created:   {t}")?;
    }
    match manifest.schema.as_ref().and_then(|s| s.needs.last()) {
        Some(m) => outln!(
            "schema:    needs migrations up to V{}__{}",
            m.version,
            m.name
        )?,
        None => outln!("schema:    not recorded")?,
    }
    for t in &manifest.tasks {
        let what = if t.executable { "program" } else { "file" };
        outln!("tasks/{}: {what}, sha256 {}", t.name, t.sha256)?;
    }
    Ok(())
}

/// Asks `binary` which schema it needs: `BINARY schema --json`, run with no input, no
/// database URL and a deadline. Asked rather than assumed, because the binary packaged is
/// usually another build than the one running this command (a release's binary, a
/// user's worker binary built on the artex crate), and only it knows its migrations; the
/// manifest signs what it said.
fn ask_schema(binary: &Path) -> Result<Schema> {
    let refuse = |what: String| {
        Error::Invalid(format!(
            "--binary {}: cannot tell which database schema it needs (`schema --json` \
             {what}); a build older than schema checks, or not artex? Give \
             --schema-of-this-build to record this build's, or --no-schema to leave the \
             check to the new process's start",
            binary.display()
        ))
    };
    // A bare name (`artex-next`) is a file here, not a program to look up on PATH.
    let program = std::path::absolute(binary).unwrap_or_else(|_| binary.to_path_buf());
    let mut child = Command::new(&program)
        .args(["schema", "--json"])
        .env_remove("ARTEX_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| refuse(format!("could not run: {e}")))?;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel();
    // The read and the wait block; a thread does them while this one keeps the deadline.
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(out) = stdout.as_mut() {
            let _ = out.take(MAX_SCHEMA_BYTES).read_to_end(&mut text);
        }
        let _ = tx.send((child.wait(), text));
    });
    let (status, text) = match rx.recv_timeout(SCHEMA_DEADLINE) {
        Ok(done) => done,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(refuse(format!(
                "did not answer within {}s",
                SCHEMA_DEADLINE.as_secs()
            )));
        }
    };
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(refuse(format!("failed: {s}"))),
        Err(e) => return Err(refuse(format!("could not be waited for: {e}"))),
    }
    let schema: Schema =
        serde_json::from_slice(&text).map_err(|e| refuse(format!("printed no schema: {e}")))?;
    if schema.needs.is_empty() {
        return Err(refuse("named no migration".into()));
    }
    Ok(schema)
}

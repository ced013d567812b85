//! Packing a binary (and a tasks folder) into a signed bundle: each file hashed while it is
//! copied, so the manifest describes exactly the bytes in the archive, and renamed into
//! place when complete.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signer, SigningKey};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use crate::channel::PROTOCOL_VERSION;
use crate::error::{Error, Result};

use super::{
    check_task_name, task_entry, Limits, Manifest, Schema, TaskFile, BINARY_NAME, COPY_BUFFER,
    MANIFEST_NAME, SIGNATURE_NAME, TARGET,
};

/// Packs `binary` into a signed bundle at `out` and returns the manifest it signed, with
/// `schema` as what the binary needs of the database.
///
/// The archive is written next to `out` and renamed into place, so a reader never sees a
/// half-written bundle. The binary is hashed while it is copied, so the manifest describes
/// exactly the bytes in the archive even if the file changes meanwhile.
pub fn create(
    binary: &Path,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    out: &Path,
) -> Result<Manifest> {
    create_with_tasks(
        binary,
        None,
        secret,
        manifest_version,
        schema,
        out,
        &mut |_| {},
    )
}

/// As [`create`], with every file of `tasks_dir` (when given) as a `tasks/NAME` entry,
/// its SHA-256 and whether it is executable in the signed manifest, calling `progress`
/// with the number of bytes of the binary just hashed and compressed after each read (for
/// a progress bar: the binary is the slow part).
/// The folder must be flat: a subfolder, a symlink or a name a task file cannot have is
/// refused, naming it; hidden files are left out, as a worker's `--tasks-dir` ignores them.
pub fn create_with_tasks(
    binary: &Path,
    tasks_dir: Option<&Path>,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Manifest> {
    let tasks = match tasks_dir {
        Some(dir) => list_tasks(dir)?,
        None => Vec::new(),
    };
    let meta =
        fs::metadata(binary).map_err(|source| Error::io("reading binary", binary, source))?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: binary.to_owned(),
        });
    }
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle.zip".to_owned());
    let tmp = out.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let contents = Contents {
        binary,
        tasks: &tasks,
    };
    let result = write_bundle(&contents, secret, manifest_version, schema, &tmp, progress)
        .and_then(|manifest| {
            fs::rename(&tmp, out)
                .map(|()| manifest)
                .map_err(|source| Error::io("renaming bundle into place", out, source))
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What goes into a bundle: the binary and the task files, (name, path) sorted by name.
struct Contents<'a> {
    binary: &'a Path,
    tasks: &'a [(String, std::path::PathBuf)],
}

/// The files of a tasks folder to bundle, sorted by name; see [`create_with_tasks`].
fn list_tasks(dir: &Path) -> Result<Vec<(String, std::path::PathBuf)>> {
    let invalid = |path: &Path, reason: String| Error::TasksDirInvalid {
        path: path.to_owned(),
        reason,
    };
    let listing =
        fs::read_dir(dir).map_err(|source| Error::io("listing the tasks folder", dir, source))?;
    let mut files = Vec::new();
    let (mut total, limit) = (0u64, Limits::default().max_tasks_bytes);
    for item in listing {
        let item = item.map_err(|source| Error::io("listing the tasks folder", dir, source))?;
        let path = item.path();
        let name = item.file_name();
        let bytes = name.as_encoded_bytes();
        if bytes.first() == Some(&b'.') {
            continue;
        }
        check_task_name(bytes)
            .map_err(|why| invalid(&path, format!("cannot be a task file's name: {why}")))?;
        let meta =
            fs::symlink_metadata(&path).map_err(|source| Error::io("reading", &path, source))?;
        if meta.is_dir() {
            return Err(invalid(
                &path,
                "a folder: a bundle's tasks folder is flat".into(),
            ));
        }
        if !meta.is_file() {
            return Err(invalid(
                &path,
                "not a regular file (a symlink? bundle the file itself)".into(),
            ));
        }
        total = total.saturating_add(meta.len());
        if total > limit {
            return Err(invalid(
                dir,
                format!(
                    "its files hold more than {limit} bytes together, more than a worker accepts"
                ),
            ));
        }
        files.push((String::from_utf8_lossy(bytes).into_owned(), path));
    }
    files.sort();
    Ok(files)
}

/// Copies `path` into the archive's current entry, hashing it; its SHA-256.
fn copy_hashed(
    zip: &mut ZipWriter<BufWriter<File>>,
    path: &Path,
    what: &'static str,
    write_err: &dyn Fn(io::Error) -> Error,
    progress: &mut dyn FnMut(u64),
) -> Result<String> {
    let mut input = File::open(path).map_err(|source| Error::io(what, path, source))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(Error::io(what, path, source)),
        };
        hasher.update(&buf[..n]);
        zip.write_all(&buf[..n]).map_err(write_err)?;
        progress(n as u64);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn write_bundle(
    contents: &Contents<'_>,
    secret: &SigningKey,
    manifest_version: &str,
    schema: Option<Schema>,
    tmp: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Manifest> {
    let zip_err = |source| Error::ZipWrite {
        path: tmp.to_owned(),
        source,
    };
    let write_err = |source| Error::io("writing bundle", tmp, source);
    let file = File::create_new(tmp).map_err(|source| Error::io("creating bundle", tmp, source))?;
    let mut zip = ZipWriter::new(BufWriter::new(file));
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);

    zip.start_file(BINARY_NAME, deflated.unix_permissions(0o755))
        .map_err(zip_err)?;
    let binary = contents.binary;
    let binary_sha256 = copy_hashed(&mut zip, binary, "reading binary", &write_err, progress)?;
    let mut tasks = Vec::with_capacity(contents.tasks.len());
    for (name, path) in contents.tasks {
        let executable = fs::metadata(path)
            .map_err(|source| Error::io("reading", path, source))?
            .permissions()
            .mode()
            & 0o100
            != 0;
        let mode = if executable { 0o755 } else { 0o644 };
        zip.start_file(task_entry(name), deflated.unix_permissions(mode))
            .map_err(zip_err)?;
        let sha256 = copy_hashed(&mut zip, path, "reading task file", &write_err, &mut |_| {})?;
        tasks.push(TaskFile {
            name: name.clone(),
            sha256,
            executable,
        });
    }

    let manifest = Manifest {
        version: manifest_version.to_owned(),
        target: TARGET.to_owned(),
        channel_protocol: PROTOCOL_VERSION,
        binary_sha256,
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| rfc3339_utc(d.as_secs())),
        schema,
        tasks,
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest).map_err(Error::ManifestEncode)?;
    let signature = hex::encode(secret.sign(&manifest_bytes).to_bytes());

    let plain = deflated.unix_permissions(0o644);
    zip.start_file(MANIFEST_NAME, plain).map_err(zip_err)?;
    zip.write_all(&manifest_bytes).map_err(write_err)?;
    zip.start_file(SIGNATURE_NAME, plain).map_err(zip_err)?;
    zip.write_all(signature.as_bytes()).map_err(write_err)?;
    let file = zip
        .finish()
        .map_err(zip_err)?
        .into_inner()
        .map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    Ok(manifest)
}

/// Formats seconds since the Unix epoch as RFC 3339 in UTC (civil-from-days, after
/// Howard Hinnant), to stamp manifests without a date-time dependency.
pub(super) fn rfc3339_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

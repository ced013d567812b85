//! `artex upload FILE --to http://host:port --kind K`: sends a file to a worker in
//! chunks (at most `--parallel` in flight), retrying each with backoff, and resumes an
//! interrupted upload by asking the worker what is missing (the upload's id is kept in a
//! small state file under `~/.cache/artex/uploads`, keyed by file and target). Prints the
//! task's id once the file is whole. It talks HTTP/1.1 itself (Content-Length bodies,
//! one connection per request): the workspace has no HTTP client, and this needs little.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod body;

use clap::Args;
use futures_util::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::progress::{step, Progress};
use super::stdout::outln;
use crate::error::{Error, Result};
use body::{Body, Hashing, Part};

/// The arguments of `artex upload`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// The file to send.
    file: PathBuf,
    /// The worker's HTTP address, e.g. http://10.0.0.5:8080.
    #[arg(long)]
    to: String,
    /// The kind of the task submitted once the file is whole.
    #[arg(long)]
    kind: String,
    /// The task's payload (a JSON object; the worker adds the file as its `upload` field).
    #[arg(long)]
    payload: Option<String>,
    /// The task's priority.
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Submit the task even if no worker has ever declared its kind (e.g. before the
    /// workers start).
    #[arg(long)]
    allow_unregistered_kind: bool,
    /// The flow the task joins (the id of an unfinished flow).
    #[arg(long)]
    flow: Option<uuid::Uuid>,
    /// Bytes per chunk (default: the worker's, 10 MiB).
    #[arg(long)]
    chunk_size: Option<u64>,
    /// Chunks in flight at most.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=10))]
    parallel: u64,
    /// File holding the worker's write-scope bearer token.
    #[arg(long, env = "ARTEX_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Attempts per chunk before giving up (the upload can be resumed later).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    attempts: u32,
    /// Testing aid: wait this long before sending each chunk, milliseconds.
    #[arg(long, hide = true, default_value_t = 0)]
    chunk_delay_ms: u64,
}

/// How long one request may take before it counts as failed (and is retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) async fn upload(args: SendArgs) -> Result {
    let addr = target(&args.to)?;
    let token =
        crate::tokens::from_file(args.token_file.as_deref(), "--token-file")?.ok_or_else(|| {
            Error::Invalid(
                "no token: give --token-file (or ARTEX_TOKEN_FILE) with the worker's write token"
                    .into(),
            )
        })?;
    let payload: Value = match &args.payload {
        None => json!({}),
        Some(p) => serde_json::from_str(p)
            .map_err(|e| Error::Invalid(format!("--payload: not JSON ({e})")))?,
    };
    let meta = std::fs::metadata(&args.file)
        .map_err(|e| Error::io(format!("reading {}", args.file.display()), e))?;
    let size = meta.len();
    let version = Version::of(&meta);
    let want_chunk = args.chunk_size.unwrap_or(crate::uploads::DEFAULT_CHUNK);
    if want_chunk == 0 {
        return Err(Error::Invalid(
            "--chunk-size: 0; expected a positive size".into(),
        ));
    }
    let client = Client { addr, token };
    let state_path = state_file(&args.file, &args.to)?;
    let plan = match resumed(&client, &state_path, &version).await? {
        Some(Start::Done(task)) => {
            let _ = std::fs::remove_file(&state_path);
            return outln!("{task}");
        }
        Some(Start::Send(plan)) => plan,
        None => {
            let mut declaration = json!({
                "size": size, "chunk_size": want_chunk,
                "name": args.file.file_name().and_then(|n| n.to_str()),
                "task": {"kind": args.kind, "payload": payload, "priority": args.priority,
                         "flow": args.flow},
            });
            // Only when asked: a worker of an earlier build refuses a field it does not know.
            if args.allow_unregistered_kind {
                declaration["task"]["allow_unregistered_kind"] = true.into();
            }
            let plan = started(&client, declaration, &args.file, want_chunk).await?;
            write_state(&state_path, &plan.id, &version)?;
            plan
        }
    };
    let Plan {
        id,
        chunk,
        missing,
        declared,
        hashing,
    } = plan;
    if chunk == 0 {
        return Err(Error::Invalid(format!(
            "the worker answered a chunk size of 0 for {id}"
        )));
    }
    let hashing = Arc::new(match hashing {
        Some(h) => h,
        None => Hashing::start(&args.file, chunk)?,
    });
    let progress = Arc::new(Progress::new(
        missing.iter().map(|&n| len_of(n, chunk, size)).sum(),
    ));
    let started = Instant::now();
    let client = Arc::new(client);
    let sent = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(Retries {
        attempts: args.attempts,
        retried: AtomicU64::new(0),
    });
    let mut task: Option<String> = None;
    let results = futures_util::stream::iter(missing.into_iter().map(|n| {
        let (client, file, id, progress, sent, retries, hashing) = (
            client.clone(),
            args.file.clone(),
            id.clone(),
            progress.clone(),
            sent.clone(),
            retries.clone(),
            hashing.clone(),
        );
        let delay = Duration::from_millis(args.chunk_delay_ms);
        async move {
            tokio::time::sleep(delay).await;
            let digest = hashing.chunk(n).await?;
            let part = Part {
                file: &file,
                offset: n * chunk,
                len: len_of(n, chunk, size),
            };
            let r = send_chunk(&client, part, &id, n, &digest, &retries).await;
            if r.is_ok() {
                sent.fetch_add(1, Ordering::Relaxed);
                progress.add(len_of(n, chunk, size));
            }
            r
        }
    }))
    .buffer_unordered(args.parallel as usize);
    futures_util::pin_mut!(results);
    while let Some(r) = results.next().await {
        if let Some(t) = r? {
            task = Some(t);
        }
    }
    progress.done();
    let task = match task {
        Some(t) => t,
        None => {
            let whole = hashing.whole().await?;
            if declared.as_ref().is_some_and(|d| *d != whole) {
                let _ = std::fs::remove_file(&state_path);
                return Err(Error::Invalid(format!(
                    "{} changed while upload {id} was sent (its sha256 is now {whole}); run \
                     the same command again to send it anew",
                    args.file.display()
                )));
            }
            complete(&client, &id, &whole, &state_path).await?
        }
    };
    let secs = started.elapsed().as_secs_f64();
    step(format!(
        "sent {} chunks ({} bytes) in {secs:.1} s, {} sends retried; task {task}",
        sent.load(Ordering::Relaxed),
        progress.total,
        retries.retried.load(Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&state_path);
    outln!("{task}")
}

/// Where sending starts: the upload's id and chunking, the chunks it misses, the sha256
/// it declared (if it did) and the hashing already under way (if any).
struct Plan {
    id: String,
    chunk: u64,
    missing: Vec<u64>,
    declared: Option<String>,
    hashing: Option<Hashing>,
}

/// A saved upload, resumed: what it misses, or its task if it is complete already.
enum Start {
    Send(Plan),
    Done(String),
}

/// The upload this file and target had, if the file is the same version and the worker
/// still has it.
async fn resumed(client: &Client, state_path: &Path, version: &Version) -> Result<Option<Start>> {
    let Some(saved) = read_state(state_path, version) else {
        return Ok(None);
    };
    let (code, body) = client.status(&saved).await?;
    if code != 200 {
        return Ok(None);
    }
    if let Some(task) = body["task"].as_str() {
        return Ok(Some(Start::Done(task.to_string())));
    }
    let missing: Vec<u64> = body["missing"]
        .as_array()
        .map(|m| m.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    step(format!(
        "resuming upload {saved}: {} of {} chunks missing",
        missing.len(),
        body["chunks"]
    ));
    Ok(Some(Start::Send(Plan {
        chunk: body["chunk_size"].as_u64().unwrap_or(0),
        missing,
        declared: body["sha256"].as_str().map(String::from),
        hashing: None,
        id: saved,
    })))
}

/// Starts an upload of `file` as `declaration` says, leaving its sha256 for `complete`
/// so that chunks go out while it is hashed; a worker of an earlier build, which wants
/// it at the start, says so (400 naming the field) and is given it.
async fn started(
    client: &Client,
    mut declaration: Value,
    file: &Path,
    want_chunk: u64,
) -> Result<Plan> {
    let (mut declared, mut hashing) = (None, None);
    let (mut code, mut body) = client.create(&declaration).await?;
    if code == 400 && body["error"].as_str().is_some_and(|e| e.contains("sha256")) {
        let h = Hashing::start(file, want_chunk)?;
        let whole = h.whole().await?;
        declaration["sha256"] = json!(whole);
        (code, body) = client.create(&declaration).await?;
        declared = Some(whole);
        hashing = Some(h);
    }
    if code != 201 {
        return Err(refused(code, &body));
    }
    let chunk = body["chunk_size"].as_u64().unwrap_or(0);
    // Without an id every later request would name no upload (and be refused as such).
    let id = body["id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| Error::Invalid(format!("the worker answered no upload id: {body}")))?;
    Ok(Plan {
        id: id.to_string(),
        chunk,
        missing: (0..body["chunks"].as_u64().unwrap_or(0)).collect(),
        declared,
        // Digests at another chunk size than the worker's are of no use.
        hashing: hashing.filter(|_| chunk == want_chunk),
    })
}

/// Every chunk is there: asks the worker to check the whole file against `whole` and
/// write the task (`complete`), or reads the task another request already wrote.
async fn complete(client: &Client, id: &str, whole: &str, state_path: &Path) -> Result<String> {
    let body = json!({ "sha256": whole }).to_string();
    let (code, answer) = client
        .send(
            "POST",
            &format!("/api/v1/uploads/{id}/complete"),
            &[],
            Body::Bytes(body.as_bytes()),
        )
        .await?;
    if let (200, Some(t)) = (code, answer["task"].as_str()) {
        return Ok(t.to_string());
    }
    if code == 422 && answer["field"].is_null() {
        // The whole file did not match what arrived: the worker discarded the upload.
        let _ = std::fs::remove_file(state_path);
        return Err(Error::Invalid(format!(
            "upload {id}: {}; run the same command again to send the file anew",
            answer["error"]
                .as_str()
                .unwrap_or("the file's sha256 did not match")
        )));
    }
    let (code, body) = client.status(id).await?;
    match body["task"].as_str() {
        Some(t) if code == 200 => Ok(t.to_string()),
        _ => Err(Error::Invalid(format!(
            "upload {id} is not complete (HTTP {code}: {body}); run the same command again \
             to resume"
        ))),
    }
}

fn len_of(n: u64, chunk: u64, size: u64) -> u64 {
    chunk.min(size.saturating_sub(n * chunk))
}

/// Attempts per chunk, and the retries made so far (reported at the end).
struct Retries {
    attempts: u32,
    retried: AtomicU64,
}

/// Sends chunk `n` (`part` of the file, whose sha256 is `hash`), retrying with backoff;
/// returns the task once the worker wrote it.
async fn send_chunk(
    client: &Client,
    part: Part<'_>,
    id: &str,
    n: u64,
    hash: &str,
    retries: &Retries,
) -> Result<Option<String>> {
    let mut last = String::new();
    let attempts = retries.attempts;
    for attempt in 0..attempts {
        if attempt > 0 {
            retries.retried.fetch_add(1, Ordering::Relaxed);
            let ms = (200u64 << attempt.min(6)).min(10_000);
            tokio::time::sleep(Duration::from_millis(ms / 2 + fastrand_ms(ms / 2))).await;
        }
        let path = format!("/api/v1/uploads/{id}/chunks/{n}");
        match client
            .send("PUT", &path, &[("Chunk-Sha256", hash)], Body::File(&part))
            .await
        {
            Ok((200, body)) => return Ok(body["task"].as_str().map(String::from)),
            // Corrupted on the way: send it again.
            Ok((422, body)) => last = format!("HTTP 422: {}", body["error"]),
            Ok((code, body)) if code == 408 || code == 429 || code >= 500 && code != 507 => {
                last = format!("HTTP {code}: {}", body["error"])
            }
            Ok((code, body)) => return Err(refused(code, &body)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(Error::Invalid(format!(
        "chunk {n}: {attempts} attempts failed (last: {last}); run the same command again \
         to resume"
    )))
}

fn fastrand_ms(max: u64) -> u64 {
    // Jitter from the clock: good enough to spread retries of parallel chunks.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    if max == 0 {
        0
    } else {
        nanos % max
    }
}

fn refused(code: u16, body: &Value) -> Error {
    let why = body["error"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| body.to_string());
    Error::Invalid(format!("the worker refused (HTTP {code}): {why}"))
}

/// `http://host:port[/]` → `host:port`.
fn target(to: &str) -> Result<String> {
    let rest = to
        .strip_prefix("http://")
        .ok_or_else(|| Error::Invalid(format!("--to: {to:?}; expected http://host:port")))?;
    let addr = rest.trim_end_matches('/');
    if addr.is_empty() || addr.contains('/') {
        return Err(Error::Invalid(format!(
            "--to: {to:?}; expected http://host:port"
        )));
    }
    Ok(addr.to_string())
}

/// The state file of `file` sent to `to`.
fn state_file(file: &Path, to: &str) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(file)
        .map_err(|e| Error::io(format!("resolving {}", file.display()), e))?;
    let key = hex::encode(Sha256::digest(format!("{}\n{to}", abs.display())));
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    Ok(base
        .join("artex")
        .join("uploads")
        .join(format!("{key}.json")))
}

/// Which version of a file an upload was started from: an upload is resumed only from
/// the same one (its content is checked whole by the worker at the end all the same).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    size: u64,
    modified_ns: i128,
    dev: u64,
    ino: u64,
}

impl Version {
    fn of(meta: &std::fs::Metadata) -> Version {
        use std::os::unix::fs::MetadataExt;
        Version {
            size: meta.len(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    fn to_json(&self) -> Value {
        json!({"size": self.size, "modified_ns": self.modified_ns.to_string(),
               "dev": self.dev, "ino": self.ino})
    }
}

/// The upload id saved for this file, if it was started from this version of it.
fn read_state(path: &Path, version: &Version) -> Option<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (v["version"] == version.to_json())
        .then(|| v["id"].as_str().map(String::from))
        .flatten()
}

fn write_state(path: &Path, id: &str, version: &Version) -> Result {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let text = json!({"id": id, "version": version.to_json()}).to_string();
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// A bare HTTP/1.1 client: one connection per request, `Content-Length` bodies out (a
/// chunk sent from the file by `sendfile`), `Content-Length`, chunked or until-close
/// bodies in.
struct Client {
    addr: String,
    token: String,
}

impl Client {
    /// `POST /api/v1/uploads` with `req`.
    async fn create(&self, req: &Value) -> Result<(u16, Value)> {
        let body = req.to_string();
        self.send("POST", "/api/v1/uploads", &[], Body::Bytes(body.as_bytes()))
            .await
    }

    /// `GET /api/v1/uploads/{id}`: what the upload misses, or its task once complete.
    async fn status(&self, id: &str) -> Result<(u16, Value)> {
        self.send(
            "GET",
            &format!("/api/v1/uploads/{id}"),
            &[],
            Body::Bytes(&[]),
        )
        .await
    }

    /// Sends one request; returns the status and the body as JSON (`Null` if not JSON).
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> Result<(u16, Value)> {
        let what = format!("{method} http://{}{path}", self.addr);
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(&self.addr).await?;
            let mut head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
                 Authorization: Bearer {}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n",
                self.addr,
                self.token,
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            s.write_all(head.as_bytes()).await?;
            // A refusal may come (and the connection close) before the body is read.
            let wrote = body.write_to(&mut s).await;
            let mut raw = Vec::new();
            let read = s.read_to_end(&mut raw).await;
            if raw.is_empty() {
                wrote?;
                read?;
            }
            Ok::<_, std::io::Error>(raw)
        };
        let raw = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                Error::io(
                    what.clone(),
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"),
                )
            })?
            .map_err(|e| Error::io(what.clone(), e))?;
        parse_response(&raw).ok_or_else(|| {
            Error::io(
                what,
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response"),
            )
        })
    }
}

fn parse_response(raw: &[u8]) -> Option<(u16, Value)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = &raw[end + 4..];
    let mut decoded = Vec::new();
    let lower = head.to_ascii_lowercase();
    if lower.contains("transfer-encoding: chunked") {
        loop {
            let line_end = body.windows(2).position(|w| w == b"\r\n")?;
            let len =
                usize::from_str_radix(std::str::from_utf8(&body[..line_end]).ok()?.trim(), 16)
                    .ok()?;
            body = &body[line_end + 2..];
            if len == 0 || body.len() < len {
                break;
            }
            decoded.extend_from_slice(&body[..len]);
            body = body.get(len + 2..).unwrap_or(&[]);
        }
    } else {
        decoded.extend_from_slice(body);
    }
    Some((
        status,
        serde_json::from_slice(&decoded).unwrap_or(Value::Null),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_parsed_whole_or_chunked() {
        let plain = b"HTTP/1.1 201 Created\r\ncontent-length: 9\r\n\r\n{\"id\":1}\n";
        assert_eq!(parse_response(plain), Some((201, json!({"id": 1}))));
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:2}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked), Some((200, json!({"a": 2}))));
        assert_eq!(parse_response(b"garbage"), None);
    }

    #[test]
    fn the_target_is_an_http_address() {
        assert_eq!(target("http://127.0.0.1:8080/").unwrap(), "127.0.0.1:8080");
        for bad in ["https://x:1", "127.0.0.1:80", "http://", "http://h:1/api"] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }
}

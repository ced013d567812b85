//! `PUT|POST /upgrade`: the raw bundle ZIP (`curl -T bundle.zip`) or a multipart form
//! upload. Authenticates, refuses a second upgrade while one runs, streams the body to a
//! fresh private folder (size-capped, each piece within the body timeout, the whole within
//! a deadline; written by a blocking task, never on the HTTP thread), and runs the
//! handover; on success this process then drains itself (SIGUSR2), exactly as an
//! operator's SIGUSR2 would.

mod multipart;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::hot_upgrade::{UpgradeError, Upgrader};

/// Largest upload accepted (the bundle's own limits are checked when it is unpacked).
pub const MAX_UPLOAD: u64 = 300 * 1024 * 1024;
/// The whole upload must arrive within this many body timeouts (10 minutes by default):
/// enough for [`MAX_UPLOAD`] at half a megabyte a second.
pub const UPLOAD_DEADLINE_FACTOR: u32 = 60;
/// Chunks on their way from the HTTP thread to the writer: what a slow disk can make the
/// upload hold in memory (actix's chunks are at most tens of KiB).
const QUEUED_CHUNKS: usize = 16;

/// The route.
pub async fn upgrade(
    req: HttpRequest,
    body: web::Payload,
    upgrader: web::Data<Arc<Upgrader>>,
) -> HttpResponse {
    let received = Instant::now();
    let header = |name: &str| req.headers().get(name).and_then(|h| h.to_str().ok());
    if let Err(e) = upgrader.authorize(header("authorization")) {
        return error_response(e);
    }
    let declared = header("content-length").and_then(|l| l.trim().parse::<u64>().ok());
    if declared.is_some_and(|l| l > MAX_UPLOAD) {
        return error_response(UpgradeError::TooLarge(MAX_UPLOAD));
    }
    let form = match Form::of(header("content-type").unwrap_or("")) {
        Ok(f) => f,
        Err(e) => return error_response(UpgradeError::BadBundle(e)),
    };
    if upgrader
        .in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return error_response(UpgradeError::InProgress);
    }
    // Frees the slot however this ends: answered, cut short, or dropped with the
    // connection.
    struct Release<'a>(&'a Upgrader);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.in_progress.store(false, Ordering::Release);
        }
    }
    let _release = Release(&upgrader);

    let incoming = match upgrader.fresh_dir("incoming") {
        Ok(d) => d,
        Err(e) => return error_response(UpgradeError::Internal(format!("upload folder: {e}"))),
    };
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(incoming.clone());
    let zip = match receive(body, &incoming, form, upgrader.body_timeout).await {
        Ok(p) => p,
        Err(e) => return error_response(e),
    };
    match upgrader.upgrade(&zip, received).await {
        Ok(report) => {
            if report.status == "upgraded" {
                // Drain exactly as an operator's SIGUSR2 would; the HTTP server finishes
                // this response before it stops.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGUSR2);
            }
            HttpResponse::Ok().json(report)
        }
        Err(e) => error_response(e),
    }
}

/// How the bundle comes: the body itself, or the first file part of a form.
enum Form {
    Raw,
    Multipart { boundary: String },
}

impl Form {
    fn of(content_type: &str) -> Result<Form, String> {
        if !content_type
            .to_ascii_lowercase()
            .starts_with("multipart/form-data")
        {
            return Ok(Form::Raw);
        }
        let boundary = content_type
            .split(';')
            .skip(1)
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
            .ok_or("multipart upload without a boundary")?;
        // RFC 2046: 1 to 70 characters.
        if boundary.is_empty() || boundary.len() > 70 {
            return Err(format!(
                "multipart boundary of {} characters: expected 1 to 70",
                boundary.len()
            ));
        }
        Ok(Form::Multipart { boundary })
    }
}

/// Why the writer stopped.
#[derive(Debug)]
enum WriteError {
    /// The body is not an acceptable upload (400).
    Refused(String),
    /// The disk failed (500).
    Io(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Refused(m) | WriteError::Io(m) => f.write_str(m),
        }
    }
}

impl From<WriteError> for UpgradeError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Refused(m) => UpgradeError::BadBundle(m),
            WriteError::Io(m) => UpgradeError::Internal(m),
        }
    }
}

/// Why reading the body stopped short.
#[derive(Debug, PartialEq)]
enum ReadError {
    /// Nothing arrived for the body timeout; `got` bytes had.
    Stalled { got: u64 },
    /// The whole-upload deadline passed; `got` bytes had arrived.
    TooSlow { got: u64 },
    /// More than [`MAX_UPLOAD`].
    TooLarge,
    /// The connection failed.
    Client(String),
    /// The writer stopped (its own error says why).
    WriterStopped,
}

/// Receives the body into `dir`: the HTTP thread reads it and a blocking task writes it
/// (for a form, it finds the file part as it goes). Returns the bundle's path.
async fn receive<S, E>(
    body: S,
    dir: &Path,
    form: Form,
    idle: Duration,
) -> Result<PathBuf, UpgradeError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    let out = dir.join("bundle.zip");
    let writer = tokio::task::spawn_blocking(move || write_upload(rx, &out, form));
    let overall = idle.saturating_mul(UPLOAD_DEADLINE_FACTOR);
    let read = read_body(body, &tx, idle, overall).await;
    // The writer sees the end of the body (or of a cut upload) and returns at once.
    drop(tx);
    let written = writer
        .await
        .map_err(|e| UpgradeError::Internal(format!("the upload writer failed: {e}")))?;
    let ms = |d: Duration| d.as_millis();
    match read {
        Ok(0) => Err(UpgradeError::BadBundle(
            "empty body: send the bundle ZIP (curl -T bundle.zip) or a multipart form".into(),
        )),
        Ok(_) => written.map_err(UpgradeError::from),
        Err(ReadError::Stalled { got }) => Err(UpgradeError::Timeout(format!(
            "the upload stalled: nothing arrived for {} ms (--upgrade-body-timeout-ms) \
             after {got} bytes",
            ms(idle)
        ))),
        Err(ReadError::TooSlow { got }) => Err(UpgradeError::Timeout(format!(
            "the upload took longer than {} ms ({UPLOAD_DEADLINE_FACTOR} x \
             --upgrade-body-timeout-ms); {got} bytes arrived",
            ms(overall)
        ))),
        Err(ReadError::TooLarge) => Err(UpgradeError::TooLarge(MAX_UPLOAD)),
        Err(ReadError::Client(e)) => {
            Err(UpgradeError::BadBundle(format!("reading the upload: {e}")))
        }
        Err(ReadError::WriterStopped) => Err(match written {
            Err(e) => e.into(),
            Ok(_) => UpgradeError::Internal("the upload writer stopped early".into()),
        }),
    }
}

/// Reads `body` to its end into `tx`: each piece within `idle`, all of it within
/// `overall` (waiting for a slow writer included), at most [`MAX_UPLOAD`] bytes.
/// Returns how many bytes came.
async fn read_body<S, E>(
    mut body: S,
    tx: &mpsc::Sender<Bytes>,
    idle: Duration,
    overall: Duration,
) -> Result<u64, ReadError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + overall;
    let mut got: u64 = 0;
    loop {
        let until = (tokio::time::Instant::now() + idle).min(deadline);
        let next = match tokio::time::timeout_at(until, body.next()).await {
            Ok(next) => next,
            Err(_) if until == deadline => return Err(ReadError::TooSlow { got }),
            Err(_) => return Err(ReadError::Stalled { got }),
        };
        let Some(chunk) = next else {
            return Ok(got);
        };
        let chunk = chunk.map_err(|e| ReadError::Client(e.to_string()))?;
        got += chunk.len() as u64;
        if got > MAX_UPLOAD {
            return Err(ReadError::TooLarge);
        }
        match tokio::time::timeout_at(deadline, tx.send(chunk)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ReadError::WriterStopped),
            Err(_) => return Err(ReadError::TooSlow { got }),
        }
    }
}

/// The blocking side: writes what comes through `rx` to `out` (a form: only its first
/// file part), until the sender is dropped.
fn write_upload(
    mut rx: mpsc::Receiver<Bytes>,
    out: &Path,
    form: Form,
) -> Result<PathBuf, WriteError> {
    match form {
        Form::Raw => {
            let mut file = multipart::create_private(out)?;
            while let Some(chunk) = rx.blocking_recv() {
                file.write_all(&chunk)
                    .map_err(|e| WriteError::Io(format!("writing the upload: {e}")))?;
            }
            Ok(out.to_owned())
        }
        Form::Multipart { boundary } => {
            let mut part = multipart::FirstFilePart::new(&boundary, out);
            while let Some(chunk) = rx.blocking_recv() {
                part.feed(&chunk)?;
            }
            part.finish()
        }
    }
}

fn error_response(e: UpgradeError) -> HttpResponse {
    let (status, body) = match e {
        UpgradeError::NotConfigured(m) => (StatusCode::FORBIDDEN, json!({ "error": m })),
        UpgradeError::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            json!({ "error": "missing or wrong bearer token (Authorization: Bearer …)" }),
        ),
        UpgradeError::InProgress => (
            StatusCode::CONFLICT,
            json!({ "error": "another upgrade is in progress on this worker" }),
        ),
        UpgradeError::Schema(m) => (
            StatusCode::CONFLICT,
            json!({ "error": m, "status": "refused" }),
        ),
        UpgradeError::TooLarge(max) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({ "error": format!("bundle larger than {max} bytes") }),
        ),
        UpgradeError::Timeout(m) => {
            // The rest of the body may still come: this connection cannot carry another
            // request.
            return HttpResponse::build(StatusCode::REQUEST_TIMEOUT)
                .force_close()
                .json(json!({ "error": m, "status": "refused" }));
        }
        UpgradeError::BadBundle(m) => (
            StatusCode::BAD_REQUEST,
            json!({ "error": format!("bundle refused: {m}"), "status": "refused" }),
        ),
        UpgradeError::RolledBack {
            why,
            child_pid,
            elapsed_ms,
        } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({
                "status": "rolled_back",
                "error": why,
                "old_pid": std::process::id(),
                "new_pid": child_pid,
                "elapsed_ms": elapsed_ms,
            }),
        ),
        UpgradeError::Internal(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": m, "status": "not_started" }),
        ),
    };
    HttpResponse::build(status).json(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    type Item = Result<Bytes, std::io::Error>;

    /// Reads `body` with a 100 ms body timeout and a 400 ms deadline.
    async fn read(body: impl Stream<Item = Item> + Unpin) -> (Result<u64, ReadError>, usize) {
        let (tx, mut rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
        let drain = tokio::spawn(async move {
            let mut n = 0;
            while let Some(c) = rx.recv().await {
                n += c.len();
            }
            n
        });
        let r = read_body(
            body,
            &tx,
            Duration::from_millis(100),
            Duration::from_millis(400),
        )
        .await;
        drop(tx);
        (r, drain.await.unwrap())
    }

    fn piece(n: usize) -> Item {
        Ok(Bytes::from(vec![7u8; n]))
    }

    #[tokio::test]
    async fn a_whole_body_is_passed_on() {
        let (r, written) = read(stream::iter([piece(10), piece(20)])).await;
        assert_eq!((r, written), (Ok(30), 30));
    }

    #[tokio::test]
    async fn a_stalled_body_is_cut_after_the_body_timeout() {
        let (r, _) = read(stream::iter([piece(100)]).chain(stream::pending())).await;
        assert_eq!(r, Err(ReadError::Stalled { got: 100 }));
    }

    #[tokio::test]
    async fn a_trickle_is_cut_at_the_deadline() {
        // A byte every 20 ms never stalls, and never ends.
        let trickle = Box::pin(stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((piece(1), ()))
        }));
        let (r, _) = read(trickle).await;
        assert!(
            matches!(r, Err(ReadError::TooSlow { got }) if got > 0),
            "{r:?}"
        );
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_refused() {
        let big = stream::repeat_with(|| piece(1 << 20)).take(301);
        let (r, written) = read(big).await;
        assert_eq!(r, Err(ReadError::TooLarge));
        assert!(written as u64 <= MAX_UPLOAD);
    }

    #[test]
    fn the_form_is_told_by_its_content_type() {
        assert!(matches!(Form::of(""), Ok(Form::Raw)));
        assert!(matches!(Form::of("application/zip"), Ok(Form::Raw)));
        match Form::of("multipart/form-data; charset=utf-8; Boundary=\"abc\"") {
            Ok(Form::Multipart { boundary }) => assert_eq!(boundary, "abc"),
            _ => panic!("not a form"),
        }
        assert!(Form::of("multipart/form-data").is_err());
        let long = format!("multipart/form-data; boundary={}", "x".repeat(71));
        assert!(Form::of(&long).is_err());
    }
}

//! Step 2 of an upgrade, its first half: the bundle received from the request's body, the
//! raw ZIP (`curl -T bundle.zip`) or the first file part of a multipart form, into a
//! fresh private folder: size-capped, each piece within the body timeout, the whole within
//! a deadline, and written by a blocking task, never on the HTTP thread.

mod multipart;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use actix_web::web::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use super::error::UpgradeError;

/// Largest upload accepted (the bundle's own limits are checked when it is unpacked).
pub const MAX_UPLOAD: u64 = 300 * 1024 * 1024;
/// The whole upload must arrive within this many body timeouts (10 minutes by default):
/// enough for [`MAX_UPLOAD`] at half a megabyte a second.
pub const UPLOAD_DEADLINE_FACTOR: u32 = 60;
/// Chunks on their way from the HTTP thread to the writer: what a slow disk can make the
/// upload hold in memory (actix's chunks are at most tens of KiB).
const QUEUED_CHUNKS: usize = 16;

/// How the bundle comes: the body itself, or the first file part of a form.
pub enum Form {
    /// The body is the bundle.
    Raw,
    /// `multipart/form-data`: the bundle is the first part with a file name.
    Multipart {
        /// The boundary the `Content-Type` named.
        boundary: String,
    },
}

impl Form {
    /// The form a `Content-Type` announces; a multipart one must name its boundary.
    pub fn of(content_type: &str) -> Result<Form, String> {
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
pub async fn receive<S, E>(
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

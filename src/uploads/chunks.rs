//! Receiving one chunk: the body streamed from the HTTP thread to a blocking writer
//! through a small queue (memory bounded whatever the chunk size), hashed on the way and
//! written at its offset in the upload's data file (`data`), marked received only whole,
//! matching its `Chunk-Sha256` and synced, before it is acknowledged.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::data::{self, Target};
use super::declaration::Meta;
use super::error::{io, Result, UploadError};
use super::Uploads;

impl Uploads {
    /// The length chunk `n` of `meta` must have.
    pub fn chunk_len(meta: &Meta, n: u64) -> Result<u64> {
        if n >= meta.chunks {
            return Err(UploadError::Invalid(format!(
                "chunk {n}: out of range; this upload has chunks 0 to {}",
                meta.chunks.saturating_sub(1)
            )));
        }
        Ok(meta.chunk_size.min(meta.size - n * meta.chunk_size))
    }

    /// Receives chunk `n` from `body`: written in place into the upload's data file by a
    /// blocking task while its sha256 is computed, checked against `sha256`, synced, then
    /// marked received. Memory: a few pieces of the body in flight, whatever the chunk
    /// size.
    pub async fn put_chunk<S, E>(
        self: &Arc<Self>,
        meta: &Meta,
        n: u64,
        sha256: &str,
        body: S,
    ) -> Result
    where
        S: futures_util::Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let expected = Uploads::chunk_len(meta, n)?;
        let dir = self.folder(meta.id);
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUED_PIECES);
        let want = sha256.to_string();
        let offset = n * meta.chunk_size;
        let writer =
            tokio::task::spawn_blocking(move || write_chunk(rx, &dir, n, offset, expected, &want));
        let read = read_body(body, &tx, self.settings.body_timeout, expected).await;
        drop(tx);
        let written = writer
            .await
            .map_err(|e| UploadError::Internal(format!("the chunk writer failed: {e}")))?;
        if written.is_ok() && matches!(read, Ok(got) if got == expected) {
            self.received.add(expected);
            // Hash the file on while it is in the page cache, off this request.
            let (me, m) = (self.clone(), meta.clone());
            tokio::task::spawn_blocking(move || me.prefixes.advance(&me.folder(m.id), &m));
        }
        match read {
            Ok(got) if got < expected => {
                // The writer saw a short body and kept nothing.
                Err(UploadError::Invalid(format!(
                    "chunk {n}: {got} bytes arrived; expected {expected}"
                )))
            }
            Ok(_) => written,
            Err(ReadError::Stalled(got)) => Err(UploadError::Timeout(format!(
                "chunk {n}: nothing arrived for {} ms after {got} bytes",
                self.settings.body_timeout.as_millis()
            ))),
            Err(ReadError::TooLarge) => Err(UploadError::TooLarge(format!(
                "chunk {n}: more than its {expected} bytes"
            ))),
            Err(ReadError::Client(e)) => Err(UploadError::Invalid(format!(
                "chunk {n}: reading the body: {e}"
            ))),
            Err(ReadError::WriterStopped) => Err(match written {
                Err(e) => e,
                Ok(()) => UploadError::Internal("the chunk writer stopped early".into()),
            }),
        }
    }
}

/// Body pieces on their way from the HTTP thread to the writer: actix's pieces are tens
/// of KiB, so this bounds an upload's memory to about a MiB whatever the chunk size.
const QUEUED_PIECES: usize = 16;

/// Why reading a chunk's body stopped short.
#[derive(Debug)]
enum ReadError {
    Stalled(u64),
    TooLarge,
    Client(String),
    WriterStopped,
}

/// Reads `body` into `tx`, each piece within `idle`, at most `cap` bytes.
async fn read_body<S, E>(
    mut body: S,
    tx: &tokio::sync::mpsc::Sender<actix_web::web::Bytes>,
    idle: Duration,
    cap: u64,
) -> std::result::Result<u64, ReadError>
where
    S: futures_util::Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    let mut got = 0u64;
    loop {
        let next = tokio::time::timeout(idle, body.next())
            .await
            .map_err(|_| ReadError::Stalled(got))?;
        let Some(piece) = next else {
            // The end, told to the writer by an empty piece: without it (a body cut or
            // refused) the writer keeps nothing.
            tokio::time::timeout(idle, tx.send(actix_web::web::Bytes::new()))
                .await
                .map_err(|_| ReadError::Stalled(got))?
                .map_err(|_| ReadError::WriterStopped)?;
            return Ok(got);
        };
        let piece = piece.map_err(|e| ReadError::Client(e.to_string()))?;
        if piece.is_empty() {
            continue;
        }
        got += piece.len() as u64;
        if got > cap {
            return Err(ReadError::TooLarge);
        }
        tokio::time::timeout(idle, tx.send(piece))
            .await
            .map_err(|_| ReadError::Stalled(got))?
            .map_err(|_| ReadError::WriterStopped)?;
    }
}

/// The blocking side of a chunk: writes what comes in place into the upload's data file
/// at `offset` (its range locked), hashing; once whole and matching `want`, syncs the
/// data and marks the chunk received. A chunk marked already is only checked (its hash,
/// then the bytes stored: others are a 409), never written again; a refused one stays
/// unmarked.
fn write_chunk(
    mut rx: tokio::sync::mpsc::Receiver<actix_web::web::Bytes>,
    dir: &Path,
    n: u64,
    offset: u64,
    expected: u64,
    want: &str,
) -> Result {
    if !dir.join("meta.json").exists() {
        return Err(UploadError::NotFound(data::id_of(dir)));
    }
    let target = data::lock_chunk(dir, n, offset, expected)?;
    let mut hash = Sha256::new();
    let mut got = 0u64;
    let mut ended = false;
    while let Some(piece) = rx.blocking_recv() {
        if piece.is_empty() {
            ended = true;
            break;
        }
        if got + piece.len() as u64 > expected {
            break; // the reader reports it; nothing past the chunk is written
        }
        hash.update(&piece);
        if let Target::Write(file) = &target {
            if let Err(e) = file.write_all_at(&piece, offset + got) {
                data::discard_if_alone(dir, file);
                return Err(io(format!("writing chunk {n} in {}", dir.display()))(e));
            }
        }
        got += piece.len() as u64;
    }
    let refuse = |target: &Target| {
        if let Target::Write(file) = target {
            data::discard_if_alone(dir, file);
        }
    };
    if !ended || got != expected {
        refuse(&target);
        return Ok(()); // cut, short or too long: the reader reports it; nothing is kept
    }
    let got_hash = hex::encode(hash.finalize());
    if got_hash != want {
        refuse(&target);
        return Err(UploadError::Mismatch(format!(
            "chunk {n}: its sha256 is {got_hash}, not the {want} of its Chunk-Sha256 header; \
             not stored, send it again"
        )));
    }
    if let Target::Done = &target {
        // Acknowledging other bytes than those kept would tell the client they are stored.
        let stored = data::stored_sha256(dir, offset, expected)?;
        if stored != want {
            return Err(UploadError::Conflict(format!(
                "chunk {n} is stored already, with sha256 {stored}; this copy's bytes differ \
                 and were not stored (a chunk is kept as first received: declare a new upload \
                 to send other bytes)"
            )));
        }
    }
    if let Target::Write(file) = &target {
        file.sync_data()
            .map_err(io(format!("syncing chunk {n} in {}", dir.display())))?;
        data::mark(dir, n)?;
    }
    Ok(())
}

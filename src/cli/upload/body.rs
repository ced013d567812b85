//! The file's side of `artex upload`: its sha256 and every chunk's, in one read pass
//! before anything is sent (the two digests on two threads), and chunk bodies streamed
//! from the file a piece at a time (memory per chunk in flight: one piece, whatever the
//! chunk size).

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// Bytes read from the file at a time, hashing or sending.
const PIECE: usize = 1 << 20;

/// The whole file's sha256 and each `chunk`-byte chunk's, hex.
pub(super) struct Digests {
    pub whole: String,
    pub chunk: u64,
    pub chunks: Vec<String>,
}

/// Reads `path` once: the whole file's sha256 here, the chunks' on a second thread fed
/// the same pieces (two cores hash at once; each piece is read once).
pub(super) fn hash_file(path: &Path, chunk: u64) -> Result<Digests> {
    use std::io::Read;
    if chunk == 0 {
        return Err(Error::Invalid(
            "--chunk-size: 0; expected a positive size".into(),
        ));
    }
    let mut f = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Vec<u8>>>(4);
    let chunker = std::thread::spawn(move || {
        let mut out = Vec::new();
        let (mut hash, mut filled) = (Sha256::new(), 0u64);
        for piece in rx {
            let mut rest = &piece[..];
            while !rest.is_empty() {
                let take = rest.len().min((chunk - filled) as usize);
                hash.update(&rest[..take]);
                rest = &rest[take..];
                filled += take as u64;
                if filled == chunk {
                    out.push(hex::encode(std::mem::take(&mut hash).finalize()));
                    filled = 0;
                }
            }
        }
        if filled > 0 {
            out.push(hex::encode(hash.finalize()));
        }
        out
    });
    let mut whole = Sha256::new();
    let read = loop {
        let mut buf = vec![0u8; PIECE];
        let n = match f.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(Error::io(format!("reading {}", path.display()), e)),
        };
        buf.truncate(n);
        whole.update(&buf);
        if tx.send(Arc::new(buf)).is_err() {
            break Err(Error::Invalid(
                "hashing chunks: the hashing thread stopped".into(),
            ));
        }
    };
    drop(tx);
    let chunks = chunker
        .join()
        .map_err(|_| Error::Invalid("hashing chunks: the hashing thread panicked".into()))?;
    read?;
    Ok(Digests {
        whole: hex::encode(whole.finalize()),
        chunk,
        chunks,
    })
}

/// `len` bytes of `file` from `offset`: one chunk.
pub(super) struct Part<'a> {
    pub file: &'a Path,
    pub offset: u64,
    pub len: u64,
}

/// The sha256 of `part`, read a piece at a time.
pub(super) async fn hash_part(part: &Part<'_>) -> Result<String> {
    let mut hash = Sha256::new();
    let mut reader = PartReader::open(part).await?;
    while let Some(piece) = reader.next().await? {
        hash.update(piece);
    }
    Ok(hex::encode(hash.finalize()))
}

/// A request's body.
pub(super) enum Body<'a> {
    /// Bytes in memory (a small JSON request, or nothing).
    Bytes(&'a [u8]),
    /// A chunk of the file, streamed.
    File(&'a Part<'a>),
}

impl Body<'_> {
    pub(super) fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::File(p) => p.len,
        }
    }

    /// Writes the body to `s`; a file that changed length meanwhile is an error.
    pub(super) async fn write_to(&self, s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
        match self {
            Body::Bytes(b) => s.write_all(b).await,
            Body::File(part) => {
                let mut reader = PartReader::open(part)
                    .await
                    .map_err(std::io::Error::other)?;
                while let Some(piece) = reader.next().await.map_err(std::io::Error::other)? {
                    s.write_all(piece).await?;
                }
                Ok(())
            }
        }
    }
}

/// Reads a part a piece at a time off the async threads, one buffer reused.
struct PartReader {
    file: Arc<std::fs::File>,
    path: Arc<Path>,
    at: u64,
    end: u64,
    buf: Option<Vec<u8>>,
}

impl PartReader {
    async fn open(part: &Part<'_>) -> Result<PartReader> {
        let path: Arc<Path> = Arc::from(part.file);
        let p = path.clone();
        let file = tokio::task::spawn_blocking(move || std::fs::File::open(&p))
            .await
            .map_err(|e| Error::Invalid(format!("opening the file: {e}")))?
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Ok(PartReader {
            file: Arc::new(file),
            path,
            at: part.offset,
            end: part.offset + part.len,
            buf: Some(Vec::with_capacity(PIECE)),
        })
    }

    /// The next piece, `None` at the part's end.
    async fn next(&mut self) -> Result<Option<&[u8]>> {
        if self.at >= self.end {
            return Ok(None);
        }
        let len = (self.end - self.at).min(PIECE as u64) as usize;
        let mut buf = self.buf.take().unwrap_or_default();
        let (file, at) = (self.file.clone(), self.at);
        let (buf, read) = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            buf.resize(len, 0);
            let r = file.read_exact_at(&mut buf, at);
            (buf, r)
        })
        .await
        .map_err(|e| Error::Invalid(format!("reading the file: {e}")))?;
        read.map_err(|e| Error::io(format!("reading {}", self.path.display()), e))?;
        self.at += len as u64;
        Ok(Some(self.buf.insert(buf).as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_gives_the_files_digest_and_every_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Chunks straddling the read pieces: 2.5 chunks of 0.75 piece.
        let chunk = (PIECE as u64) * 3 / 4;
        let bytes: Vec<u8> = (0..chunk * 5 / 2).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let d = hash_file(&path, chunk).unwrap();
        assert_eq!(d.whole, hex::encode(Sha256::digest(&bytes)));
        let want: Vec<String> = bytes
            .chunks(chunk as usize)
            .map(|c| hex::encode(Sha256::digest(c)))
            .collect();
        assert_eq!(d.chunks, want);
    }
}

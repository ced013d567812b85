//! The file's side of `artex upload`: its sha256 and every chunk's, hashed in one read
//! pass on two threads of their own while chunks are already being sent (a chunk waits
//! only for its own digest), and chunk bodies sent from the file by `sendfile` (the
//! kernel copies from the page cache to the socket; memory per chunk in flight: none,
//! whatever the chunk size).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::error::{Error, Result};

/// Bytes read from the file at a time while hashing.
const PIECE: usize = 1 << 20;

/// Pieces read ahead of the chunk hasher (memory: this many pieces, plus two).
const AHEAD: usize = 4;

/// What the hashing threads have found so far.
#[derive(Default)]
struct Found {
    /// Digests of chunks 0, 1, … in order, as each is hashed.
    chunks: Vec<String>,
    /// The whole file's, at the end.
    whole: Option<String>,
    /// Why hashing stopped short.
    error: Option<String>,
}

/// The digests of a file being hashed in the background; ask for each as it is needed.
pub(super) struct Hashing {
    found: watch::Receiver<Found>,
    path: PathBuf,
}

impl Hashing {
    /// Starts hashing `path` in `chunk`-byte chunks (and whole) on two threads.
    pub(super) fn start(path: &Path, chunk: u64) -> Result<Hashing> {
        if chunk == 0 {
            return Err(Error::Invalid(
                "--chunk-size: 0; expected a positive size".into(),
            ));
        }
        let file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let (tx, found) = watch::channel(Found::default());
        let tx = Arc::new(tx);
        let (pieces, rx) = sync_channel::<Vec<u8>>(AHEAD);
        let (free, spare) = sync_channel::<Vec<u8>>(AHEAD + 2);
        let chunker = tx.clone();
        let chunks = std::thread::Builder::new()
            .name("upload-chunks".into())
            .spawn(move || hash_chunks(rx, free, chunk, &chunker))
            .map_err(|e| Error::io("starting the chunk hasher", e))?;
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("upload-whole".into())
            .spawn(move || {
                let mut whole = hash_whole(file, &pieces, &spare);
                drop(pieces); // the chunk hasher ends its last chunk…
                if chunks.join().is_err() {
                    whole = Err(std::io::Error::other("the chunk hasher failed"));
                }
                // …and only then is the file done: every chunk's digest is out first.
                tx.send_modify(|f| match whole {
                    Ok(d) => f.whole = Some(d),
                    Err(e) => f.error = Some(format!("reading {shown}: {e}")),
                });
            })
            .map_err(|e| Error::io("starting the file hasher", e))?;
        Ok(Hashing {
            found,
            path: path.to_owned(),
        })
    }

    /// The sha256 of chunk `n`, once hashed.
    pub(super) async fn chunk(&self, n: u64) -> Result<String> {
        let mut found = self.found.clone();
        let f = found
            .wait_for(|f| f.chunks.len() as u64 > n || f.whole.is_some() || f.error.is_some())
            .await
            .map_err(|_| Error::Invalid("hashing: the hashing threads stopped".into()))?;
        if let Some(d) = f.chunks.get(n as usize) {
            return Ok(d.clone());
        }
        Err(Error::Invalid(match &f.error {
            Some(e) => format!("hashing: {e}"),
            None => format!(
                "{}: chunk {n} is past the end of the file; did it shrink while it was sent?",
                self.path.display()
            ),
        }))
    }

    /// The whole file's sha256, once hashed.
    pub(super) async fn whole(&self) -> Result<String> {
        let mut found = self.found.clone();
        let f = found
            .wait_for(|f| f.whole.is_some() || f.error.is_some())
            .await
            .map_err(|_| Error::Invalid("hashing: the hashing threads stopped".into()))?;
        match (&f.whole, &f.error) {
            (_, Some(e)) => Err(Error::Invalid(format!("hashing: {e}"))),
            (Some(d), None) => Ok(d.clone()),
            (None, None) => Err(Error::Invalid("hashing: no digest".into())),
        }
    }
}

/// Reads `file` to its end a piece at a time (buffers from `spare`, new ones only at the
/// start), hashing it whole and passing each piece to the chunk hasher.
fn hash_whole(
    mut file: std::fs::File,
    pieces: &SyncSender<Vec<u8>>,
    spare: &Receiver<Vec<u8>>,
) -> std::io::Result<String> {
    use std::io::Read;
    let mut whole = Sha256::new();
    loop {
        let mut buf = spare.try_recv().unwrap_or_default();
        buf.resize(PIECE, 0); // zeroed once: a returned buffer is full length already
        let n = match file.read(&mut buf) {
            Ok(0) => return Ok(hex::encode(whole.finalize())),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        buf.truncate(n);
        whole.update(&buf);
        if pieces.send(buf).is_err() {
            return Err(std::io::Error::other("the chunk hasher stopped"));
        }
    }
}

/// Hashes the pieces `rx` brings in `chunk`-byte chunks, publishing each digest as its
/// chunk ends; gives each piece back through `free`.
fn hash_chunks(
    rx: Receiver<Vec<u8>>,
    free: SyncSender<Vec<u8>>,
    chunk: u64,
    found: &watch::Sender<Found>,
) {
    let (mut hash, mut filled) = (Sha256::new(), 0u64);
    for piece in rx {
        let mut rest = &piece[..];
        while !rest.is_empty() {
            let take = rest.len().min((chunk - filled) as usize);
            hash.update(&rest[..take]);
            rest = &rest[take..];
            filled += take as u64;
            if filled == chunk {
                let d = hex::encode(std::mem::take(&mut hash).finalize());
                found.send_modify(|f| f.chunks.push(d));
                filled = 0;
            }
        }
        let _ = free.try_send(piece);
    }
    if filled > 0 {
        let d = hex::encode(hash.finalize());
        found.send_modify(|f| f.chunks.push(d));
    }
}

/// `len` bytes of `file` from `offset`: one chunk.
pub(super) struct Part<'a> {
    pub file: &'a Path,
    pub offset: u64,
    pub len: u64,
}

/// A request's body.
pub(super) enum Body<'a> {
    /// Bytes in memory (a small JSON request, or nothing).
    Bytes(&'a [u8]),
    /// A chunk of the file, sent from the page cache.
    File(&'a Part<'a>),
}

impl Body<'_> {
    pub(super) fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::File(p) => p.len,
        }
    }

    /// Writes the body to `s`; a file that is shorter than the part is an error.
    pub(super) async fn write_to(&self, s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Body::Bytes(b) => s.write_all(b).await,
            Body::File(part) => {
                let file = {
                    let p = part.file.to_owned();
                    tokio::task::spawn_blocking(move || std::fs::File::open(p))
                        .await
                        .map_err(std::io::Error::other)??
                };
                send_file(s, &file, part.offset, part.len).await
            }
        }
    }
}

/// Sends `len` bytes of `file` from `offset` to `s` with `sendfile`: no copy through
/// this process, and each call only as much as the socket takes without waiting (the
/// socket is non-blocking), so the async thread never waits on the network. The file's
/// pages were just read by the hasher; were they evicted, a call reads them from disk.
async fn send_file(
    s: &tokio::net::TcpStream,
    file: &std::fs::File,
    offset: u64,
    len: u64,
) -> std::io::Result<()> {
    let mut at = offset as i64;
    let end = offset + len;
    while (at as u64) < end {
        s.writable().await?;
        let left = (end - at as u64).min(1 << 30) as usize;
        let sent = s.try_io(tokio::io::Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile64(s.as_fd(), file.as_fd(), Some(&mut at), left)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ended at byte {at}, before the chunk's end at {end}"),
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_pass_gives_the_files_digest_and_every_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Chunks straddling the read pieces: 2.5 chunks of 0.75 piece.
        let chunk = (PIECE as u64) * 3 / 4;
        let bytes: Vec<u8> = (0..chunk * 5 / 2).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let h = Hashing::start(&path, chunk).unwrap();
        let want: Vec<String> = bytes
            .chunks(chunk as usize)
            .map(|c| hex::encode(Sha256::digest(c)))
            .collect();
        for (n, w) in want.iter().enumerate() {
            assert_eq!(&h.chunk(n as u64).await.unwrap(), w);
        }
        assert_eq!(
            h.whole().await.unwrap(),
            hex::encode(Sha256::digest(&bytes))
        );
        let past = h.chunk(want.len() as u64).await.unwrap_err().to_string();
        assert!(past.contains("past the end"), "{past}");
    }

    /// Sends `len` bytes of `path` from `offset` over a loopback connection: what the
    /// send returned and what arrived.
    async fn send_over(path: &Path, offset: u64, len: u64) -> (std::io::Result<()>, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let part = Part {
            file: path,
            offset,
            len,
        };
        let sent = Body::File(&part).write_to(&mut s).await;
        drop(s);
        (sent, reader.await.unwrap())
    }

    #[tokio::test]
    async fn a_part_is_sent_from_the_file_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let (sent, got) = send_over(&path, 1_000_001, 1_500_000).await;
        sent.unwrap();
        assert_eq!(got, &bytes[1_000_001..2_500_001]);
        // A part past the file's end (it shrank) is an error, not a short body.
        let (sent, got) = send_over(&path, 2_000_000, 1_500_000).await;
        let e = sent.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        assert_eq!(got, &bytes[2_000_000..]);
    }
}

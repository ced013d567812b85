//! The whole file's sha256, hashed ahead: each time a chunk is marked, the run of marked
//! chunks from the start of the data file is hashed on (from the page cache, off the
//! request that wrote them), so that completion hashes only what is left rather than
//! the whole file. In this process's memory only: after a restart, or in the other
//! process of a hot upgrade, completion starts from byte 0. Marked chunks are never
//! written again, so a prefix always describes bytes `0..upto` of the data file.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

use sha2::Sha256;
use uuid::Uuid;

use super::data::{hash_range, marker, DATA, WHOLE};
use super::declaration::Meta;
use super::Uploads;

/// Bytes read at a time (memory stays this whatever the chunk size).
const PIECE: usize = 1 << 20;

/// What is hashed of each upload being received.
#[derive(Default)]
pub(super) struct Prefixes(Mutex<HashMap<Uuid, Prefix>>);

/// Bytes `0..upto` of an upload's data file, hashed; `sealed` once completion took it
/// (nothing is hashed ahead any more).
#[derive(Default)]
pub(super) struct Prefix {
    pub hash: Sha256,
    pub upto: u64,
    sealed: bool,
}

impl Prefixes {
    /// Hashes the marked chunks that follow the prefix of `meta`'s data file in `dir`.
    /// Skipped when another thread is at it (it picks up what was marked meanwhile, or
    /// completion does); any failure just leaves the rest to completion.
    pub(super) fn advance(&self, dir: &Path, meta: &Meta) {
        let Ok(mut map) = self.0.try_lock() else {
            return;
        };
        let upto = match map.get(&meta.id) {
            Some(p) if p.sealed => return,
            Some(p) => p.upto,
            None => 0,
        };
        let mut n = upto / meta.chunk_size;
        if n >= meta.chunks || !marker(dir, n).exists() || dir.join(WHOLE).exists() {
            return;
        }
        let Ok(file) = File::open(dir.join(DATA)) else {
            return;
        };
        let p = map.entry(meta.id).or_default();
        let mut buf = vec![0u8; PIECE];
        while n < meta.chunks && marker(dir, n).exists() {
            let Ok(len) = Uploads::chunk_len(meta, n) else {
                return;
            };
            // A chunk is hashed whole or not at all: `upto` stays on a chunk boundary.
            let mut hash = p.hash.clone();
            if hash_range(&file, &mut hash, p.upto, len, &mut buf).is_err() {
                return;
            }
            p.hash = hash;
            p.upto += len;
            n += 1;
        }
    }

    /// Takes the prefix of upload `id` for completion (an empty one if none), and stops
    /// hashing it ahead.
    pub(super) fn take(&self, id: Uuid) -> Prefix {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let sealed = Prefix {
            sealed: true,
            ..Prefix::default()
        };
        match map.insert(id, sealed) {
            Some(p) if !p.sealed => p,
            _ => Prefix::default(),
        }
    }

    /// Forgets uploads whose folder is gone.
    pub(super) fn forget(&self, ids: &[Uuid]) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            map.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uploads::CreateRequest;
    use sha2::Digest;

    #[test]
    fn only_the_run_of_marked_chunks_from_the_start_is_hashed_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join(DATA), &bytes).unwrap();
        let req: CreateRequest = serde_json::from_value(serde_json::json!({
            "size": 2500, "sha256": "a".repeat(64), "chunk_size": 1024,
            "task": {"kind": "echo"}}))
        .unwrap();
        let meta = req.check().unwrap();
        let mark = |n| std::fs::write(marker(dir.path(), n), b"").unwrap();
        let prefixes = Prefixes::default();
        // Chunk 2 alone is not a prefix: nothing is hashed.
        mark(2);
        prefixes.advance(dir.path(), &meta);
        mark(0);
        prefixes.advance(dir.path(), &meta);
        let p = prefixes.take(meta.id);
        assert_eq!(p.upto, 1024);
        assert_eq!(p.hash.finalize(), Sha256::digest(&bytes[..1024]));
        // Taken for completion: nothing more is hashed ahead, and a second take is empty.
        mark(1);
        prefixes.advance(dir.path(), &meta);
        assert_eq!(prefixes.take(meta.id).upto, 0);
        prefixes.forget(&[meta.id]);
        prefixes.advance(dir.path(), &meta);
        let p = prefixes.take(meta.id);
        assert_eq!(p.upto, 2500);
        assert_eq!(p.hash.finalize(), Sha256::digest(&bytes));
    }
}

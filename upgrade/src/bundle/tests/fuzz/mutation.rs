//! The fuzzer's changes to an archive's bytes: bit flips, truncations, header fields set
//! to lying values, splices, hostile names and modes, and rewrites that keep a valid
//! archive valid; each drawn at random and applied at a position taken modulo the length.

use super::*;

/// One change to an archive's bytes. Positions are taken modulo the length at the time.
#[derive(Debug, Clone)]
pub(super) enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        value: u8,
    },
    Truncate {
        keep: usize,
    },
    /// A header field (u16 or u32, little endian) of the `nth` header of a kind set.
    Field {
        header: Header,
        nth: usize,
        offset: usize,
        wide: bool,
        value: u32,
    },
    /// `len` bytes from `from` copied over `to` (or inserted there).
    Splice {
        from: usize,
        to: usize,
        len: usize,
        insert: bool,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// The `nth` name (in central and local headers alike) overwritten with hostile bytes.
    Rename {
        nth: usize,
        name: Vec<u8>,
    },
    /// The `nth` central record's Unix mode: symlink, directory, device.
    Mode {
        nth: usize,
        mode: u32,
    },
    /// Changes a valid archive keeps valid: the entries rewritten in another order, each
    /// stored or deflated, with a modification time and an archive comment (bytes no
    /// signature covers: the bundle must still pass, and only as what was signed).
    Rewrite {
        order: Vec<usize>,
        deflate: Vec<bool>,
        time: u16,
        comment: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Header {
    Local,
    Central,
    End,
}

impl Header {
    fn signature(self) -> [u8; 4] {
        match self {
            Header::Local => *b"PK\x03\x04",
            Header::Central => CENTRAL_SIGNATURE,
            Header::End => EOCD_SIGNATURE,
        }
    }
    /// Fixed part's length: fields are only ever written inside it.
    fn len(self) -> usize {
        match self {
            Header::Local => 30,
            Header::Central => CENTRAL_LEN,
            Header::End => EOCD_LEN,
        }
    }
}

fn headers(bytes: &[u8], h: Header) -> Vec<usize> {
    let sig = h.signature();
    (0..bytes.len().saturating_sub(3))
        .filter(|&i| bytes[i..i + 4] == sig)
        .collect()
}

const HOSTILE_NAMES: [&[u8]; 10] = [
    b"../outside/pwned",
    b"/tmp/artex-fuzz-pwned",
    b"..",
    b"a/../../outside/x",
    b"artex\0",
    b"C:\\artex",
    b"artex/",
    b"ARTEX",
    b"manifest.sig",
    b"artex",
];

pub(super) fn mutation(rng: &mut fastrand::Rng) -> Mutation {
    let at = rng.usize(..1 << 20);
    match rng.u8(0..12) {
        0 | 1 => Mutation::FlipBit {
            at,
            bit: rng.u8(0..8),
        },
        2 => Mutation::SetByte {
            at,
            value: rng.u8(..),
        },
        3 => Mutation::Truncate { keep: at },
        4..=6 => {
            let header = match rng.u8(0..3) {
                0 => Header::Local,
                1 => Header::Central,
                _ => Header::End,
            };
            let wide = rng.bool();
            // Field offsets on even boundaries past the signature: every size, offset,
            // count and length field of all three headers is one of these.
            let offset =
                4 + 2 * rng.usize(0..(header.len() - 4 - if wide { 4 } else { 2 }) / 2 + 1);
            let value = cases::interesting_u32(rng);
            Mutation::Field {
                header,
                nth: rng.usize(0..8),
                offset,
                wide,
                value,
            }
        }
        7 => Mutation::Splice {
            from: rng.usize(..1 << 20),
            to: at,
            len: cases::len(rng, 128),
            insert: rng.bool(),
        },
        8 => Mutation::Delete {
            at,
            len: cases::len(rng, 64),
        },
        9 => {
            let n = cases::len(rng, 32);
            Mutation::Insert {
                at,
                bytes: cases::bytes(rng, n),
            }
        }
        10 if rng.bool() => Mutation::Rename {
            nth: rng.usize(0..4),
            name: HOSTILE_NAMES[rng.usize(..HOSTILE_NAMES.len())].to_vec(),
        },
        10 => Mutation::Mode {
            nth: rng.usize(0..4),
            mode: [0o120_777, 0o040_755, 0o020_644, 0o010_644, 0o100_755][rng.usize(0..5)],
        },
        _ => {
            let mut order: Vec<usize> = (0..8).collect();
            rng.shuffle(&mut order);
            let n = cases::len(rng, 40);
            Mutation::Rewrite {
                order,
                deflate: (0..8).map(|_| rng.bool()).collect(),
                time: rng.u16(..),
                comment: cases::bytes(rng, n),
            }
        }
    }
}

pub(super) fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    let pos = |at: usize| if len == 0 { 0 } else { at % len };
    match m {
        Mutation::FlipBit { at, bit } if len > 0 => bytes[pos(*at)] ^= 1 << bit,
        Mutation::SetByte { at, value } if len > 0 => bytes[pos(*at)] = *value,
        Mutation::Truncate { keep } => bytes.truncate(keep % (len + 1)),
        Mutation::Field {
            header,
            nth,
            offset,
            wide,
            value,
        } => {
            let found = headers(bytes, *header);
            if found.is_empty() {
                return;
            }
            let at = found[nth % found.len()] + offset;
            let field: &[u8] = if *wide {
                &value.to_le_bytes()
            } else {
                &value.to_le_bytes()[..2]
            };
            if at + field.len() <= len {
                bytes[at..at + field.len()].copy_from_slice(field);
            }
        }
        Mutation::Splice {
            from,
            to,
            len: n,
            insert,
        } if len > 0 => {
            let from = pos(*from);
            let chunk = bytes[from..(from + n).min(len)].to_vec();
            let to = pos(*to);
            if *insert {
                bytes.splice(to..to, chunk);
            } else {
                let end = (to + chunk.len()).min(len);
                bytes[to..end].copy_from_slice(&chunk[..end - to]);
            }
        }
        Mutation::Delete { at, len: n } if len > 0 => {
            let at = pos(*at);
            bytes.drain(at..(at + n).min(len));
        }
        Mutation::Insert { at, bytes: b } => {
            let at = at % (len + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        Mutation::Rename { nth, name } => rename(bytes, *nth, name),
        Mutation::Rewrite {
            order,
            deflate,
            time,
            comment,
        } => rewrite(bytes, order, deflate, *time, comment),
        Mutation::Mode { nth, mode } => {
            let found = headers(bytes, Header::Central);
            if let Some(&at) = found.get(nth % found.len().max(1)) {
                if at + CENTRAL_LEN <= len {
                    // Made by Unix (3), the mode in the high half of the attributes.
                    bytes[at + 5] = 3;
                    bytes[at + 38..at + 42].copy_from_slice(&(mode << 16).to_le_bytes());
                }
            }
        }
        _ => {}
    }
}

/// The archive's entries as the zip crate reads them; `None` if it cannot.
fn entries_of(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut archive = ZipArchive::new(Cursor::new(bytes)).ok()?;
    let mut out = Vec::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).ok()?;
        let mut data = Vec::new();
        f.read_to_end(&mut data).ok()?;
        out.push((f.name().to_string(), data));
    }
    Some(out)
}

fn rewrite(bytes: &mut Vec<u8>, order: &[usize], deflate: &[bool], time: u16, comment: &[u8]) {
    let Some(entries) = entries_of(bytes) else {
        return;
    };
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let mut ranked: Vec<usize> = (0..entries.len()).collect();
    ranked.sort_by_key(|&i| order.get(i).copied().unwrap_or(i));
    for (k, i) in ranked.into_iter().enumerate() {
        let (name, data) = &entries[i];
        let method = if deflate.get(k).copied().unwrap_or(false) {
            CompressionMethod::Deflated
        } else {
            CompressionMethod::Stored
        };
        let when = zip::DateTime::try_from_msdos(0x5b21, time).unwrap_or_default();
        let opts = SimpleFileOptions::default()
            .compression_method(method)
            .last_modified_time(when);
        if zip.start_file(name.as_str(), opts).is_err() {
            return;
        }
        zip.write_all(data).unwrap();
    }
    zip.set_raw_comment(comment.to_vec().into_boxed_slice());
    if let Ok(out) = zip.finish() {
        *bytes = out.into_inner();
    }
}

/// Overwrites the name of the `nth` central record with `name`, and the local header's
/// name it points at, resizing both (lengths and the end record follow), so the archive
/// stays well-formed but for the name.
fn rename(bytes: &mut Vec<u8>, nth: usize, name: &[u8]) {
    let Ok(mut archive) = ZipArchive::new(Cursor::new(bytes.clone())) else {
        return;
    };
    if archive.is_empty() {
        return;
    }
    let mut entries = Vec::new();
    for i in 0..archive.len() {
        let Ok(mut f) = archive.by_index(i) else {
            return;
        };
        let mut data = Vec::new();
        if f.read_to_end(&mut data).is_err() {
            return;
        }
        entries.push((f.name().as_bytes().to_vec(), data));
    }
    let target = nth % entries.len();
    // Written under a placeholder of the same length, then patched in the raw bytes: the
    // zip writer refuses some of these names itself.
    let placeholder: Vec<u8> = (0..name.len()).map(|i| b'q' + (i % 5) as u8).collect();
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (i, (n, data)) in entries.iter().enumerate() {
        let n = if i == target { &placeholder } else { n };
        if zip
            .start_file(String::from_utf8_lossy(n).into_owned(), stored())
            .is_err()
        {
            return;
        }
        zip.write_all(data).unwrap();
    }
    let Ok(out) = zip.finish() else { return };
    let mut out = out.into_inner();
    let mut i = 0;
    while !placeholder.is_empty() && i + placeholder.len() <= out.len() {
        if out[i..i + placeholder.len()] == placeholder[..] {
            out[i..i + placeholder.len()].copy_from_slice(name);
            i += placeholder.len();
        } else {
            i += 1;
        }
    }
    *bytes = out;
}

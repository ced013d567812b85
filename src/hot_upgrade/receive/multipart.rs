//! The first file part of a `multipart/form-data` body (`curl -F bundle=@bundle.zip`),
//! found while the body streams in and written to disk as it comes: whatever the size of
//! the upload, memory holds one chunk, a boundary's worth of bytes and one part's headers.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::WriteError;

/// Longest header block of one part (the browser's and curl's are a few hundred bytes).
const MAX_PART_HEADERS: usize = 16 * 1024;
/// Longest boundary line tail allowed after the boundary (RFC 2046's transport padding).
const MAX_BOUNDARY_LINE: usize = 1024;

/// Where the parser is in the body.
enum State {
    /// Before the first boundary: skipped.
    Preamble,
    /// Just after a boundary: `--` (the end) or the rest of its line.
    AfterBoundary,
    /// In a part's headers.
    Headers,
    /// In a part's content; `file` is set when it is the file part being written.
    Content { file: Option<File> },
    /// The file part is complete: the rest is ignored.
    Done,
    /// The closing boundary came before any file part.
    Closed,
}

/// Feeds on the body chunk by chunk ([`FirstFilePart::feed`]) and writes the content of
/// the first part that has a `filename=` to `out`.
pub struct FirstFilePart {
    /// `CRLF--boundary`: every boundary but the first follows a CRLF, and the parser
    /// starts with one of its own in the buffer so that the first one does too.
    delimiter: Vec<u8>,
    buf: Vec<u8>,
    state: State,
    out: PathBuf,
}

impl FirstFilePart {
    /// A parser for a body delimited by `boundary` (from the Content-Type), writing the
    /// file part to `out` (created when the part begins, never before).
    pub fn new(boundary: &str, out: &Path) -> FirstFilePart {
        FirstFilePart {
            delimiter: format!("\r\n--{boundary}").into_bytes(),
            buf: b"\r\n".to_vec(),
            state: State::Preamble,
            out: out.to_owned(),
        }
    }

    /// The next piece of the body.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), WriteError> {
        if matches!(self.state, State::Done | State::Closed) {
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        while self.step()? {}
        Ok(())
    }

    /// The body ended: the file's path, or what was missing.
    pub fn finish(self) -> Result<PathBuf, WriteError> {
        match self.state {
            State::Done => Ok(self.out),
            State::Content { file: Some(_) } => Err(WriteError::Refused(
                "multipart part without its closing boundary".into(),
            )),
            _ => Err(WriteError::Refused(
                "multipart upload without a file part".into(),
            )),
        }
    }

    /// One step on what is buffered; false when it needs more input.
    fn step(&mut self) -> Result<bool, WriteError> {
        match &mut self.state {
            State::Done | State::Closed => {
                self.buf.clear();
                Ok(false)
            }
            State::Preamble => match find(&self.buf, &self.delimiter) {
                Some(at) => {
                    self.buf.drain(..at + self.delimiter.len());
                    self.state = State::AfterBoundary;
                    Ok(true)
                }
                None => {
                    keep_tail(&mut self.buf, self.delimiter.len() - 1);
                    Ok(false)
                }
            },
            State::AfterBoundary => {
                if self.buf.len() < 2 {
                    return Ok(false);
                }
                if self.buf.starts_with(b"--") {
                    // The closing boundary: no more parts, and none was a file.
                    self.state = State::Closed;
                    return Ok(true);
                }
                // The limits are on what the body says, not on what is buffered: a
                // line is as long in one piece as in many.
                let line = find(&self.buf, b"\r\n")
                    .unwrap_or(self.buf.len() - usize::from(self.buf.ends_with(b"\r")));
                if line > MAX_BOUNDARY_LINE {
                    return Err(WriteError::Refused(
                        "multipart boundary line does not end".into(),
                    ));
                }
                match find(&self.buf, b"\r\n") {
                    Some(at) => {
                        self.buf.drain(..at + 2);
                        self.state = State::Headers;
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            State::Headers => {
                // A part without headers has its blank line right away.
                let end = if self.buf.starts_with(b"\r\n") {
                    Some((0, 2))
                } else {
                    find(&self.buf, b"\r\n\r\n").map(|at| (at, 4))
                };
                // As long however the body is cut: the block's own length, or (not ended
                // yet) what is buffered but a terminator's first bytes.
                let block = match end {
                    Some((at, _)) => at,
                    None => self.buf.len() - partial_suffix(&self.buf, b"\r\n\r\n"),
                };
                if block > MAX_PART_HEADERS {
                    return Err(WriteError::Refused(format!(
                        "multipart part headers longer than {MAX_PART_HEADERS} bytes"
                    )));
                }
                let Some((at, sep)) = end else {
                    return Ok(false);
                };
                let headers = String::from_utf8_lossy(&self.buf[..at]).to_ascii_lowercase();
                self.buf.drain(..at + sep);
                let file = if headers.contains("filename=") {
                    Some(create_private(&self.out)?)
                } else {
                    None
                };
                self.state = State::Content { file };
                Ok(true)
            }
            State::Content { file } => match find(&self.buf, &self.delimiter) {
                Some(at) => {
                    if let Some(f) = file {
                        write(f, &self.buf[..at])?;
                        self.state = State::Done;
                    } else {
                        self.state = State::AfterBoundary;
                    }
                    self.buf.drain(..at + self.delimiter.len());
                    Ok(true)
                }
                None => {
                    // All but what could be the start of a boundary is content.
                    let safe = self.buf.len().saturating_sub(self.delimiter.len() - 1);
                    if let Some(f) = file {
                        write(f, &self.buf[..safe])?;
                    }
                    self.buf.drain(..safe);
                    Ok(false)
                }
            },
        }
    }
}

/// Creates `path` for writing, readable by this user only; never an existing file.
pub(super) fn create_private(path: &Path) -> Result<File, WriteError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| WriteError::Io(format!("creating {}: {e}", path.display())))
}

fn write(file: &mut File, data: &[u8]) -> Result<(), WriteError> {
    file.write_all(data)
        .map_err(|e| WriteError::Io(format!("writing the bundle: {e}")))
}

/// Drops all of `buf` but its last `keep` bytes.
fn keep_tail(buf: &mut Vec<u8>, keep: usize) {
    let drop = buf.len().saturating_sub(keep);
    buf.drain(..drop);
}

/// The length of the longest end of `buf` that begins `needle` (shorter than it).
fn partial_suffix(buf: &[u8], needle: &[u8]) -> usize {
    (1..needle.len().min(buf.len() + 1))
        .rev()
        .find(|&k| buf.ends_with(&needle[..k]))
        .unwrap_or(0)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDARY: &str = "------------------------x7Mq3";

    fn body(parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = b"preamble to ignore\r\n".to_vec();
        for (headers, content) in parts {
            b.extend_from_slice(format!("--{BOUNDARY}\r\n{headers}\r\n\r\n").as_bytes());
            b.extend_from_slice(content);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(format!("--{BOUNDARY}--\r\nepilogue").as_bytes());
        b
    }

    /// Parses `body` fed in pieces of `size` bytes; the file's content.
    fn parse(body: &[u8], size: usize) -> Result<Vec<u8>, String> {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle.zip");
        let mut p = FirstFilePart::new(BOUNDARY, &out);
        for chunk in body.chunks(size) {
            p.feed(chunk).map_err(|e| e.to_string())?;
            // Memory stays bounded by the chunk, a boundary, and the headers.
            assert!(
                p.buf.len() <= size + MAX_PART_HEADERS + 64,
                "{}",
                p.buf.len()
            );
        }
        let path = p.finish().map_err(|e| e.to_string())?;
        Ok(std::fs::read(path).unwrap())
    }

    #[test]
    fn the_first_file_part_comes_out_whole_however_the_body_is_cut() {
        // Content that looks like a boundary but is not one, and CRLFs at the edges.
        let mut content = b"\r\nPK\x03\x04".to_vec();
        content.extend_from_slice(format!("--{BOUNDARY}x").as_bytes());
        content.extend_from_slice(&[0u8; 5000]);
        content.extend_from_slice(format!("\r\n--{}", &BOUNDARY[..10]).as_bytes());
        content.extend_from_slice(b"\r\n");
        let b = body(&[
            ("Content-Disposition: form-data; name=\"note\"", b"not me"),
            (
                "Content-Disposition: form-data; name=\"bundle\"; filename=\"b.zip\"\r\nContent-Type: application/zip",
                &content,
            ),
            (
                "Content-Disposition: form-data; name=\"second\"; filename=\"c.zip\"",
                b"nor me",
            ),
        ]);
        for size in [1, 2, 3, 7, 31, 64, 1000, b.len()] {
            assert_eq!(parse(&b, size).unwrap(), content, "pieces of {size} bytes");
        }
    }

    #[test]
    fn missing_parts_and_endless_headers_are_refused() {
        let no_file = body(&[("Content-Disposition: form-data; name=\"a\"", b"x")]);
        assert!(parse(&no_file, 5)
            .unwrap_err()
            .contains("without a file part"));

        let mut cut = body(&[(
            "Content-Disposition: form-data; name=\"b\"; filename=\"b.zip\"",
            b"half a bundle",
        )]);
        cut.truncate(cut.len() - BOUNDARY.len() - 20);
        assert!(parse(&cut, 5)
            .unwrap_err()
            .contains("without its closing boundary"));

        let mut endless = format!("--{BOUNDARY}\r\n").into_bytes();
        endless.extend(std::iter::repeat_n(b'h', MAX_PART_HEADERS + 10));
        assert!(parse(&endless, 4096)
            .unwrap_err()
            .contains("headers longer"));

        assert!(parse(b"no boundary anywhere", 3)
            .unwrap_err()
            .contains("without a file part"));
    }

    /// Found by the fuzz target (`multipart/fuzz.rs`): the limits on a boundary line and
    /// on a part's headers held only when the body came in small pieces; in one piece,
    /// the same oversized line or header block was taken.
    #[test]
    fn the_limits_hold_however_the_body_is_cut() {
        let file = |headers: &str, after_boundary: &str| {
            let mut b = format!("--{BOUNDARY}{after_boundary}\r\n").into_bytes();
            b.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"b\"; filename=\"b.zip\"{headers}\r\n\r\nPK").as_bytes(),
            );
            b.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
            b
        };
        let long_line = file("", &" ".repeat(MAX_BOUNDARY_LINE + 1));
        let long_headers = file(&format!("\r\nX-Pad: {}", "p".repeat(MAX_PART_HEADERS)), "");
        // (Pieces of a byte cost seconds on 16 KiB of headers: what matters is pieces
        // smaller than the limit, and one piece holding it all.)
        for size in [1, 7, 4096, usize::MAX] {
            let size = size.min(long_line.len());
            let err = parse(&long_line, size).unwrap_err();
            assert!(
                err.contains("boundary line does not end"),
                "pieces of {size}: {err}"
            );
        }
        for size in [100, 4096, usize::MAX] {
            let size = size.min(long_headers.len());
            let err = parse(&long_headers, size).unwrap_err();
            assert!(err.contains("headers longer"), "pieces of {size}: {err}");
        }
        // Just within both limits: taken, in any pieces.
        let line = file("", &" ".repeat(MAX_BOUNDARY_LINE));
        let head = "Content-Disposition: form-data; name=\"b\"; filename=\"b.zip\"";
        let pad = MAX_PART_HEADERS - head.len() - "\r\nX-Pad: ".len();
        let headers = file(&format!("\r\nX-Pad: {}", "p".repeat(pad)), "");
        for size in [1, 7, 4096, usize::MAX] {
            let size = size.min(line.len());
            assert_eq!(parse(&line, size).unwrap(), b"PK", "pieces of {size}");
        }
        for size in [100, 4096, usize::MAX] {
            let size = size.min(headers.len());
            assert_eq!(parse(&headers, size).unwrap(), b"PK", "pieces of {size}");
        }
    }
}

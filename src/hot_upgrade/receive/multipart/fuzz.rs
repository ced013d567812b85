//! The multipart reader of `/upgrade` fuzzed (issue 25 §2): random forms (boundaries of
//! every allowed length, parts with and without a file, contents full of near-boundaries,
//! a closing boundary or none) and mutations of them, fed in random pieces. Whatever the
//! body: no panic, memory within one piece and the header limit, the same answer however
//! the body is cut, and for a well-formed form exactly the first file part's bytes.
//! Seeded and bounded: `testkit/src/fuzz.rs`.

use super::*;

use artex_testkit::fuzz as cases;

const BOUNDARY_CHARS: &[u8] = b"abcXYZ0189'()+_,-./:=?";

#[derive(Clone)]
struct Form {
    boundary: String,
    body: Vec<u8>,
    /// The first file part's content, when the body is a well-formed form with one and
    /// no content holds the delimiter.
    expected: Option<Vec<u8>>,
    /// Piece sizes to feed it in (cycled).
    pieces: Vec<usize>,
}

fn content(rng: &mut fastrand::Rng, boundary: &str) -> Vec<u8> {
    let mut c = Vec::new();
    for _ in 0..rng.usize(0..=6) {
        match rng.u8(0..6) {
            0 => {
                let n = cases::len(rng, 300);
                c.extend(cases::bytes(rng, n));
            }
            // Almost a delimiter: cut short, or followed by more boundary characters.
            1 => {
                let d = format!("\r\n--{boundary}");
                c.extend_from_slice(&d.as_bytes()[..rng.usize(0..d.len())]);
            }
            2 => c.extend_from_slice(format!("--{boundary}").as_bytes()),
            3 => c.extend_from_slice(b"\r\n\r\n--\r\n"),
            4 => c.extend_from_slice(format!("\r\n-{boundary}").as_bytes()),
            _ => c.extend_from_slice(b"PK\x03\x04"),
        }
    }
    c
}

fn form(rng: &mut fastrand::Rng) -> Form {
    let blen = rng.usize(1..=70);
    let boundary: String = (0..blen)
        .map(|_| BOUNDARY_CHARS[rng.usize(..BOUNDARY_CHARS.len())] as char)
        .collect();
    let delimiter = format!("\r\n--{boundary}");
    let mut body = Vec::new();
    if rng.bool() {
        body.extend_from_slice(b"a preamble\r\n");
    }
    let mut expected = None;
    let mut clean = true;
    for _ in 0..rng.usize(0..=3) {
        let file = rng.bool();
        let headers = if file {
            "Content-Disposition: form-data; name=\"bundle\"; filename=\"b.zip\"\r\nContent-Type: application/zip"
        } else if rng.bool() {
            "Content-Disposition: form-data; name=\"note\""
        } else {
            ""
        };
        let c = content(rng, &boundary);
        // A part without headers keeps a CRLF of its blank line in its content: a content
        // starting `--boundary` then ends it there. Any delimiter inside means the form's
        // parts are not the ones written.
        if find(&[b"\r\n", &c[..]].concat(), delimiter.as_bytes()).is_some() {
            clean = false;
        }
        body.extend_from_slice(format!("--{boundary}\r\n{headers}\r\n\r\n").as_bytes());
        body.extend_from_slice(&c);
        body.extend_from_slice(b"\r\n");
        if file && expected.is_none() {
            expected = Some(c);
        }
    }
    let closed = rng.u8(0..4) != 0;
    if closed {
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    }
    // The file part ends at the next delimiter: without a closing one after it, the part
    // may run to the end (refused) — unless another part followed it.
    let mut expected = expected.filter(|_| clean);
    // Damage, now and then.
    if rng.u8(0..3) == 0 && !body.is_empty() {
        expected = None;
        for _ in 0..rng.usize(1..=3) {
            let at = rng.usize(..body.len());
            match rng.u8(0..3) {
                0 => body[at] ^= 1 << rng.u8(0..8),
                1 => body.truncate(at),
                _ => {
                    // Now and then past the headers' limit (16 KiB), mostly past the
                    // boundary line's (1 KiB).
                    let most = if rng.u8(0..8) == 0 { 20000 } else { 3000 };
                    let n = cases::len(rng, most);
                    let junk = vec![b'h'; n];
                    body.splice(at..at, junk);
                }
            }
            if body.is_empty() {
                break;
            }
        }
    }
    let pieces = (0..rng.usize(1..=4))
        .map(|_| {
            let most = 1 + cases::len(rng, 5000);
            rng.usize(1..=most)
        })
        .collect();
    Form {
        boundary,
        body,
        expected,
        pieces,
    }
}

impl std::fmt::Debug for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Form")
            .field("boundary", &self.boundary)
            .field("body", &String::from_utf8_lossy(&self.body))
            .field(
                "expected",
                &self.expected.as_deref().map(String::from_utf8_lossy),
            )
            .field("pieces", &self.pieces)
            .finish()
    }
}

/// Feeds `body` in `pieces` (cycled); the result and the file's bytes.
fn parse(boundary: &str, body: &[u8], pieces: &[usize]) -> Result<Vec<u8>, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle.zip");
    let mut p = FirstFilePart::new(boundary, &out);
    let (mut at, mut i) = (0, 0);
    while at < body.len() {
        let n = pieces[i % pieces.len()].min(body.len() - at);
        p.feed(&body[at..at + n]).map_err(|e| e.to_string())?;
        let bound = n + MAX_PART_HEADERS + MAX_BOUNDARY_LINE + p.delimiter.len();
        assert!(p.buf.len() <= bound, "{} bytes buffered", p.buf.len());
        at += n;
        i += 1;
    }
    let path = p.finish().map_err(|e| e.to_string())?;
    Ok(std::fs::read(path).unwrap())
}

fn check(f: &Form) {
    let cut = parse(&f.boundary, &f.body, &f.pieces);
    let whole = parse(&f.boundary, &f.body, &[f.body.len().max(1)]);
    // Byte by byte is quadratic in a part's headers (each byte searches them again):
    // only for the smaller bodies.
    let small = if f.body.len() <= 4096 { 1 } else { 61 };
    let bytewise = parse(&f.boundary, &f.body, &[small]);
    assert_eq!(cut, whole, "the answer depends on how the body was cut");
    assert_eq!(
        bytewise, whole,
        "the answer depends on how the body was cut"
    );
    if let Some(expected) = &f.expected {
        // A well-formed form: its file part comes out whole, if closed by a delimiter.
        match &whole {
            Ok(got) => assert_eq!(got, expected, "the file part's bytes differ"),
            Err(e) => assert!(e.contains("closing boundary"), "a good form refused: {e}"),
        }
    }
}

fn shrink(f: &Form) -> Vec<Form> {
    let mut out = Vec::new();
    if f.pieces.len() > 1 {
        out.push(Form {
            pieces: vec![f.pieces[0]],
            ..f.clone()
        });
    }
    for keep in [f.body.len() / 2, f.body.len().saturating_sub(1)] {
        if keep < f.body.len() {
            out.push(Form {
                body: f.body[..keep].to_vec(),
                expected: None,
                ..f.clone()
            });
        }
    }
    out
}

#[test]
fn any_form_gets_the_same_answer_however_it_is_cut() {
    cases::run("upgrade::multipart", 600, form, shrink, check);
}

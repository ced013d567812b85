//! The upload protocol fuzzed against a real worker (issue 25 §2). Each case is one
//! upload: a declaration (sometimes mutated: sizes, chunk sizes, hashes, names, fields of
//! the wrong type), then a random mix of chunk requests (right, corrupted, cut short,
//! longer or shorter than declared, lying `Content-Length`, damaged or missing
//! `Chunk-Sha256`, chunk numbers out of range, out of order, repeated, stalled bodies)
//! with progress reads and early `complete`s, and finally every chunk sent honestly.
//!
//! Every answer is a 2xx, or a 4xx with a JSON body saying why (507 only for the quota),
//! never a 5xx, and never later than the client's timeout (a hung connection fails the
//! case). An upload whose declared sha256 is the file's ends with a task, whose run (the
//! `digest` handler reads the stored file) finds exactly the file's sha256: no refused,
//! cut or repeated chunk ever corrupted it. Seeded and bounded: `testkit/src/fuzz.rs`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use artex_testkit::fuzz as cases;
use serde_json::{json, Value};

use crate::common::procs::wait_status;
use crate::{data, setup, sha, WRITE_TOKEN};

/// The worker's body timeout (`--upload-body-timeout-ms`): a stalled chunk is cut after it.
const BODY_TIMEOUT_MS: u64 = 600;
/// The client's read timeout: far above every answer's expected time, so that firing
/// means a connection the server left hanging.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// One request's body, and how it is sent.
#[derive(Clone)]
enum Body {
    /// All of it, `Content-Length` exact (or lying by `lie` bytes).
    Whole { bytes: Vec<u8>, lie: i64 },
    /// `Content-Length` of `declared`, `bytes` sent, then the write side closed.
    CutShort { bytes: Vec<u8>, declared: usize },
    /// `Content-Length` of `declared`, `bytes` sent, then nothing (the server's body
    /// timeout must answer).
    Stalled { bytes: Vec<u8>, declared: usize },
}

/// Headers a chunk request may carry besides its own.
const EXTRA_HEADERS: [(&str, &str); 6] = [
    ("Content-Range", "bytes 0-9/10"),
    ("Upload-Offset", "5"),
    ("Content-Encoding", "gzip"),
    ("Expect", "100-continue"),
    ("Content-Type", "multipart/form-data; boundary=x"),
    (
        "Chunk-Sha256",
        "0000000000000000000000000000000000000000000000000000000000000000",
    ),
];

/// What a chunk's body is made of.
#[derive(Debug, Clone)]
enum Action {
    /// PUT chunk `n` (as text: it may be no number), with `sha` as `Chunk-Sha256`.
    Put {
        n: String,
        sha: Option<String>,
        body: Body,
        /// The body is chunk `n`'s true bytes, whole, with an honest length.
        exact: bool,
        /// And `sha` is their sha256.
        honest: bool,
        /// Headers the protocol does not know (ranges, offsets, an encoding) or that
        /// change the exchange (`Expect: 100-continue`): ignored, or honoured.
        extra: Vec<(&'static str, &'static str)>,
    },
    Progress,
    Complete {
        body: Vec<u8>,
    },
}

#[derive(Debug, Clone)]
struct Case {
    size: usize,
    chunk: usize,
    seed: u64,
    /// The declaration: the file's sha256, a wrong one, or none (given at `complete`).
    declared: Declared,
    /// Extra fields of the declaration replaced (a mutated declaration).
    mutated: Option<(String, Value)>,
    actions: Vec<Action>,
    /// The order the chunks are sent in at the end.
    order: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Declared {
    Right,
    Wrong,
    None,
}

fn file_of(c: &Case) -> Vec<u8> {
    data(c.size, c.seed)
}

fn chunk_of(file: &[u8], size: usize, n: u64) -> &[u8] {
    let start = (n as usize).saturating_mul(size).min(file.len());
    &file[start..(start + size).min(file.len())]
}

fn bad_sha(rng: &mut fastrand::Rng, right: &str) -> Option<String> {
    match rng.u8(0..7) {
        0 => None,
        1 => Some(right[..63].to_string()),
        2 => Some(format!("{right}0")),
        3 => Some(right.to_uppercase()), // accepted: hex in any case
        4 => Some("zz".repeat(32)),
        5 => Some(format!(" {right}")),
        _ => Some(sha(b"some other bytes")),
    }
}

fn action(rng: &mut fastrand::Rng, file: &[u8], chunk: usize, chunks: u64) -> Action {
    match rng.u8(0..12) {
        0 => Action::Progress,
        1 => Action::Complete {
            body: match rng.u8(0..4) {
                0 => Vec::new(),
                1 => json!({"sha256": sha(file)}).to_string().into_bytes(),
                2 => json!({"sha256": 7}).to_string().into_bytes(),
                _ => b"{\"sha256\": \"".to_vec(),
            },
        },
        _ => {
            let n = match rng.u8(0..12) {
                0 => chunks,
                1 => u64::MAX,
                2 => rng.u64(..),
                _ => rng.u64(..chunks),
            };
            let right = chunk_of(file, chunk, n).to_vec();
            let right_sha = sha(&right);
            let n_text = match rng.u8(0..20) {
                0 => "-1".to_string(),
                1 => "0x1".to_string(),
                2 => "99999999999999999999999".to_string(),
                3 => format!("{n}%20"),
                _ => n.to_string(),
            };
            let mut bytes = right.clone();
            let mut sha = Some(right_sha.clone());
            let mut exact = n < chunks && n_text == n.to_string();
            let mut header_ok = true;
            match rng.u8(0..10) {
                // Corrupted: a bit flipped, the header for the true bytes.
                0 if !bytes.is_empty() => {
                    let at = rng.usize(..bytes.len());
                    bytes[at] ^= 1 << rng.u8(0..8);
                    exact = false;
                }
                // Too short or too long, with a matching hash (so only the length is off).
                1 => {
                    let keep = rng.usize(..=bytes.len());
                    bytes.truncate(keep);
                    exact &= keep == right.len();
                    sha = Some(crate::sha(&bytes));
                }
                2 => {
                    let extra = cases::len(rng, 5000).max(1);
                    bytes.extend(cases::bytes(rng, extra));
                    sha = Some(crate::sha(&bytes));
                    exact = false;
                }
                // The header damaged or missing.
                3 => {
                    sha = bad_sha(rng, &right_sha);
                    // HTTP trims a header value's surrounding blanks; hex is any case.
                    header_ok =
                        sha.as_deref().map(|s| s.trim().to_lowercase()) == Some(right_sha.clone());
                }
                _ => {}
            }
            // Stalls cost a body timeout each: rare.
            let body = match rng.u8(0..40) {
                0..=2 => {
                    let cut = rng.usize(..bytes.len().max(1));
                    exact = false;
                    Body::CutShort {
                        declared: bytes.len().max(1),
                        bytes: bytes[..cut.min(bytes.len())].to_vec(),
                    }
                }
                3 => {
                    exact = false;
                    let cut = rng.usize(..bytes.len().max(1));
                    Body::Stalled {
                        declared: bytes.len().max(1),
                        bytes: bytes[..cut.min(bytes.len())].to_vec(),
                    }
                }
                4..=9 => {
                    exact = false;
                    Body::Whole {
                        bytes,
                        lie: [-1, 1, -100, 100, 1 << 30][rng.usize(0..5)],
                    }
                }
                _ => Body::Whole { bytes, lie: 0 },
            };
            Action::Put {
                n: n_text,
                sha,
                body,
                exact,
                honest: exact && header_ok,
                extra: EXTRA_HEADERS
                    .iter()
                    .filter(|_| rng.u8(0..12) == 0)
                    .copied()
                    .collect(),
            }
        }
    }
}

fn case(rng: &mut fastrand::Rng) -> Case {
    let chunk = rng.usize(1024..=4096);
    let size = match rng.u8(0..4) {
        0 => rng.usize(1..=chunk),
        1 => chunk * rng.usize(1..=4),
        _ => rng.usize(1..=6 * chunk),
    };
    let seed = rng.u64(..);
    let file = data(size, seed);
    let chunks = size.div_ceil(chunk) as u64;
    let declared = match rng.u8(0..8) {
        0 => Declared::Wrong,
        1 | 2 => Declared::None,
        _ => Declared::Right,
    };
    let mutated = (rng.u8(0..8) == 0).then(|| {
        let fields = ["size", "chunk_size", "sha256", "name", "task", "extra"];
        let values = [
            json!(-1),
            json!(0),
            json!(1.5),
            json!(u64::MAX),
            json!("12"),
            json!(null),
            json!([1]),
            json!({"kind": ""}),
            json!("../x"),
            json!(1u64 << 50),
        ];
        (
            fields[rng.usize(..fields.len())].to_string(),
            values[rng.usize(..values.len())].clone(),
        )
    });
    let actions = (0..rng.usize(0..=10))
        .map(|_| action(rng, &file, chunk, chunks))
        .collect();
    let mut order: Vec<u64> = (0..chunks).collect();
    rng.shuffle(&mut order);
    Case {
        size,
        chunk,
        seed,
        declared,
        mutated,
        actions,
        order,
    }
}

/// An answer: the status (0 if the connection ended without one) and the body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// One request on its own connection; the answer read to the server's close.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &Body,
) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let (bytes, declared) = match body {
        Body::Whole { bytes, lie } => (bytes, (bytes.len() as i64 + lie).max(0) as usize),
        Body::CutShort { bytes, declared } | Body::Stalled { bytes, declared } => {
            (bytes, *declared)
        }
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {WRITE_TOKEN}\r\nContent-Length: {declared}\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    // The server may answer and close before taking the whole body (413, 400): then a
    // write fails, and the answer is read all the same.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(bytes));
    if let Body::CutShort { .. } = body {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "{method} {path}: no answer within {CLIENT_TIMEOUT:?} (a hung connection); \
                     got {:?}",
                    String::from_utf8_lossy(&raw)
                )
            }
            // A reset after the server answered early and closed with our body unread.
            Err(_) => break,
        }
    }
    // An interim `100 Continue` (asked by `Expect`) comes before the answer.
    while raw.starts_with(b"HTTP/1.1 100") {
        match raw.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => drop(raw.drain(..at + 4)),
            None => break,
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // The first answer only: bytes sent past a lying `Content-Length` are a second
    // request to the server, which may answer that one too before it closes.
    let body = match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => {
            let head = text[..at].to_ascii_lowercase();
            let b = &raw[at + 4..];
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            match length {
                Some(n) => b[..n.min(b.len())].to_vec(),
                None if head.contains("transfer-encoding: chunked") => {
                    artex_testkit::http::dechunk(b)
                }
                None => b.to_vec(),
            }
        }
        None => Vec::new(),
    };
    Answer { status, body }
}

/// Every answer's promise: 2xx, or a refusal that says why; never a 5xx but the quota's.
fn assert_clear(what: &str, a: &Answer, may_vanish: bool) {
    if a.status == 0 {
        assert!(may_vanish, "{what}: the connection ended without an answer");
        return;
    }
    let v = a.json();
    match a.status {
        200..=299 => {}
        400..=499 | 507 => assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: {} without a clear error: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ),
        s => panic!(
            "{what}: {s} (a server error): {}",
            String::from_utf8_lossy(&a.body)
        ),
    }
}

fn whole(bytes: Vec<u8>) -> Body {
    Body::Whole { bytes, lie: 0 }
}

/// Runs one case; returns the task its upload wrote, to be checked once run.
fn run_case(http: &str, c: &Case) -> Option<uuid::Uuid> {
    let file = file_of(c);
    let mut decl = json!({"size": c.size, "name": "fuzz.bin", "chunk_size": c.chunk,
                          "task": {"kind": "digest"}});
    match c.declared {
        Declared::Right => decl["sha256"] = sha(&file).into(),
        Declared::Wrong => decl["sha256"] = sha(b"not the file").into(),
        Declared::None => {}
    }
    if let Some((k, v)) = &c.mutated {
        decl[k] = v.clone();
    }
    let a = request(
        http,
        "POST",
        "/api/v1/uploads",
        &[("Content-Type", "application/json".into())],
        &whole(decl.to_string().into_bytes()),
    );
    assert_clear("the declaration", &a, false);
    if c.mutated.is_some() {
        // A clear answer was all a mutated declaration owed (what it would upload is
        // another case's business).
        return None;
    }
    assert_eq!(a.status, 201, "a good declaration refused: {:?}", a.json());
    let created = a.json();
    let id = created["id"].as_str().expect("an id").to_string();
    assert_eq!(
        created["chunks"].as_u64(),
        Some(c.size.div_ceil(c.chunk) as u64),
        "{created}"
    );
    assert_eq!(
        created["chunk_size"].as_u64(),
        Some(c.chunk as u64),
        "{created}"
    );
    let mut received = std::collections::BTreeSet::new();
    let mut task = None;
    for act in &c.actions {
        match act {
            Action::Progress => {
                let a = request(
                    http,
                    "GET",
                    &format!("/api/v1/uploads/{id}"),
                    &[],
                    &whole(vec![]),
                );
                assert_clear("progress", &a, false);
                assert_eq!(a.status, 200);
                let got: Vec<u64> = serde_json::from_value(a.json()["received"].clone()).unwrap();
                if task.is_none() {
                    // Never a chunk that was not sent whole and right.
                    assert!(
                        got.iter().all(|n| received.contains(n)),
                        "received {got:?}, but only {received:?} were sent right"
                    );
                }
            }
            Action::Complete { body } => {
                let path = format!("/api/v1/uploads/{id}/complete");
                let a = request(http, "POST", &path, &[], &whole(body.clone()));
                assert_clear("complete", &a, false);
            }
            Action::Put {
                n,
                sha,
                body,
                exact,
                honest,
                extra,
            } => {
                let path = format!("/api/v1/uploads/{id}/chunks/{n}");
                let mut headers: Vec<(&str, String)> =
                    sha.iter().map(|s| ("Chunk-Sha256", s.clone())).collect();
                headers.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
                let a = request(http, "PUT", &path, &headers, body);
                let what = format!("chunk {n} ({body:?})");
                // A body cut short may leave the server nothing to answer on.
                assert_clear(&what, &a, matches!(body, Body::CutShort { .. }));
                // The last chunk checks the whole file: a wrong sha256 discards the
                // upload (422), which is unknown from then on (404).
                if c.declared == Declared::Wrong && *exact && matches!(a.status, 404 | 422) {
                    return None;
                }
                if *honest {
                    assert_eq!(a.status, 200, "{what}: {:?}", a.json());
                }
                if a.status == 200 {
                    let v = a.json();
                    if let Some(t) = v["task"].as_str() {
                        task = Some(t.to_string());
                    }
                    let n: u64 = n.trim_end_matches("%20").parse().unwrap_or(u64::MAX);
                    if *exact {
                        received.insert(n);
                    } else {
                        // Bytes other than the chunk's are acknowledged only when the chunk
                        // is durable already (a re-send is only checked against its own
                        // header, never written) or the file is whole.
                        assert!(
                            task.is_some() || received.contains(&n),
                            "{what}: a wrong chunk acknowledged: {v}"
                        );
                    }
                }
            }
        }
    }
    // Then every chunk, honestly, in a random order.
    for &n in &c.order {
        let bytes = chunk_of(&file, c.chunk, n).to_vec();
        let path = format!("/api/v1/uploads/{id}/chunks/{n}");
        let a = request(
            http,
            "PUT",
            &path,
            &[("Chunk-Sha256", crate::sha(&bytes))],
            &whole(bytes),
        );
        assert_clear("an honest chunk", &a, false);
        if c.declared == Declared::Wrong {
            if a.status == 422 {
                // The whole file's hash is not the declared one: discarded, no task.
                return None;
            }
            // Or discarded already (an earlier last chunk): unknown from then on.
            if a.status == 404 {
                return None;
            }
        }
        assert_eq!(a.status, 200, "honest chunk {n}: {:?}", a.json());
        if let Some(t) = a.json()["task"].as_str() {
            task = Some(t.to_string());
        }
    }
    assert_ne!(
        c.declared,
        Declared::Wrong,
        "a wrong sha256 was accepted: task {task:?}"
    );
    if c.declared == Declared::None && task.is_none() {
        let a = request(
            http,
            "POST",
            &format!("/api/v1/uploads/{id}/complete"),
            &[],
            &whole(json!({"sha256": sha(&file)}).to_string().into_bytes()),
        );
        assert_clear("the last complete", &a, false);
        assert!(matches!(a.status, 200 | 409), "{:?}", a.json());
        task = a.json()["task"].as_str().map(String::from).or_else(|| {
            // 409: completed already by an earlier `complete` of the actions.
            let p = request(
                http,
                "GET",
                &format!("/api/v1/uploads/{id}"),
                &[],
                &whole(vec![]),
            );
            p.json()["task"].as_str().map(String::from)
        });
    }
    let task = task.expect("a whole upload with its right sha256 has a task");
    Some(uuid::Uuid::parse_str(&task).unwrap())
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&short(self))
    }
}

/// A body without its bytes, for messages.
fn short(b: &Body) -> String {
    match b {
        Body::Whole { bytes, lie } => format!("{} bytes, length lying by {lie}", bytes.len()),
        Body::CutShort { bytes, declared } => {
            format!("{} of {declared} bytes, then closed", bytes.len())
        }
        Body::Stalled { bytes, declared } => {
            format!("{} of {declared} bytes, then stalled", bytes.len())
        }
    }
}

fn shrink(c: &Case) -> Vec<Case> {
    cases::shrink_vec(&c.actions)
        .into_iter()
        .map(|actions| Case {
            actions,
            ..c.clone()
        })
        .collect()
}

#[tokio::test]
async fn any_upload_request_gets_a_clear_answer_and_never_corrupts_the_file() {
    let timeout = BODY_TIMEOUT_MS.to_string();
    let (db, _dir, _uploads, f) = setup(&["--upload-body-timeout-ms", &timeout]).await;
    let http = f.http.clone();
    let tasks = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::new();
        cases::run("uploads::protocol", 30, case, shrink, |c| {
            if let Some(t) = run_case(&http, c) {
                tasks.push((t, sha(&file_of(c))));
            }
        });
        tasks
    })
    .await
    .unwrap();
    assert!(
        tasks.len() >= 10,
        "too few uploads completed to mean much: {}",
        tasks.len()
    );
    // The stored files, read by their tasks where they are: each exactly the file sent.
    for (task, file_sha) in tasks {
        wait_status(&db.bb, task, "succeeded", Duration::from_secs(60)).await;
        let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
        assert_eq!(
            result["sha256"],
            file_sha.as_str(),
            "task {task}: the stored file differs"
        );
        assert_eq!(result["matches"], true, "task {task}");
    }
    drop(f);
}

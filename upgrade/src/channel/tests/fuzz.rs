//! The upgrade channel's frames fuzzed (issue 25 §2): a hostile peer writes raw bytes to
//! the Unix socket (well-formed frames, frames with lying lengths, damaged JSON, streams
//! cut anywhere, descriptors attached to any piece and in any number) and closes it. The
//! receiver must answer every `recv` with a frame or an error, never panic, never wait
//! past the close, and every descriptor it was sent must end up closed (each one is the
//! only other end of a witness socket, which then sees EOF). Seeded and bounded:
//! `testkit/src/fuzz.rs`.

use super::*;
use std::os::fd::OwnedFd;

use artex_testkit::fuzz as cases;

/// What the hostile peer writes, in order: each piece one `sendmsg`, with `fds`
/// descriptors attached.
#[derive(Debug, Clone)]
struct Piece {
    bytes: Vec<u8>,
    fds: usize,
}

#[derive(Debug, Clone)]
struct Case {
    pieces: Vec<Piece>,
}

fn frame(declared: u32, body: &[u8]) -> Vec<u8> {
    let mut f = declared.to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn hello_json(rng: &mut fastrand::Rng) -> Vec<u8> {
    let hello = Hello {
        kind: "x".repeat(cases::len(rng, 40)),
        port: rng.u16(..),
    };
    serde_json::to_vec(&hello).unwrap()
}

/// The byte stream, as frames (good or damaged), before it is cut into pieces.
fn stream(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.usize(0..=4) {
        let mut body = hello_json(rng);
        match rng.u8(0..10) {
            // A good frame.
            0..=3 => out.extend(frame(body.len() as u32, &body)),
            // A length that lies (shorter, longer, huge, zero).
            4 | 5 => {
                let declared = match rng.u8(0..4) {
                    0 => cases::interesting_u32(rng),
                    1 => (body.len() as u32).saturating_sub(rng.u32(1..=4)),
                    2 => body.len() as u32 + rng.u32(1..=64),
                    _ => MAX_FRAME_BYTES as u32 + rng.u32(0..2),
                };
                out.extend(frame(declared, &body));
            }
            // Damaged JSON of the right length.
            6 | 7 => {
                for _ in 0..rng.usize(1..=3) {
                    if !body.is_empty() {
                        let at = rng.usize(..body.len());
                        body[at] ^= 1 << rng.u8(0..8);
                    }
                }
                out.extend(frame(body.len() as u32, &body));
            }
            // JSON of another shape, or not JSON at all.
            8 => {
                let other =
                    [&b"\"a string\""[..], b"[]", b"{}", b"null", b"\xff\xfe"][rng.usize(0..5)];
                out.extend(frame(other.len() as u32, other));
            }
            _ => {
                let n = cases::len(rng, 64);
                out.extend(cases::bytes(rng, n));
            }
        }
    }
    // Cut anywhere (or not).
    if rng.bool() && !out.is_empty() {
        out.truncate(rng.usize(..out.len()));
    }
    out
}

fn case(rng: &mut fastrand::Rng) -> Case {
    let bytes = stream(rng);
    // Cut into pieces of random sizes, each with some descriptors now and then; a
    // descriptor needs a byte to ride on, so an empty stream sends none.
    let mut pieces = Vec::new();
    let mut at = 0;
    // One piece at most with the kernel's maximum: the test's own descriptors are bounded.
    let mut big = false;
    while at < bytes.len() {
        let most = 1 + cases::len(rng, 200);
        let n = rng.usize(1..=(bytes.len() - at).min(most));
        let fds = match rng.u8(0..10) {
            0..=5 => 0,
            6..=8 => rng.usize(1..=3),
            // The kernel's most per message: two such pieces in one frame overflow the
            // receiver's per-frame limit.
            _ if !big => {
                big = true;
                MAX_FDS_PER_FRAME
            }
            _ => 1,
        };
        pieces.push(Piece {
            bytes: bytes[at..at + n].to_vec(),
            fds,
        });
        at += n;
    }
    Case { pieces }
}

fn shrink(c: &Case) -> Vec<Case> {
    let mut out: Vec<Case> = cases::shrink_vec(&c.pieces)
        .into_iter()
        .map(|pieces| Case { pieces })
        .collect();
    for i in 0..c.pieces.len() {
        if c.pieces[i].fds > 0 {
            let mut pieces = c.pieces.clone();
            pieces[i].fds = 0;
            out.push(Case { pieces });
        }
    }
    out
}

/// Sends `pieces` on `sock` (blocking), each with fresh descriptors whose other ends it
/// returns; stops at the first failure (the receiver gave up and closed).
fn write_pieces(sock: std::os::unix::net::UnixStream, pieces: &[Piece]) -> Vec<StdUnixStream> {
    let mut witnesses = Vec::new();
    for p in pieces {
        let mut ours: Vec<OwnedFd> = Vec::new();
        for _ in 0..p.fds {
            let (a, b) = StdUnixStream::pair().unwrap();
            ours.push(a.into());
            witnesses.push(b);
        }
        let raw: Vec<RawFd> = ours.iter().map(|f| f.as_raw_fd()).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
        let mut sent = 0;
        while sent < p.bytes.len() {
            let iov = [IoSlice::new(&p.bytes[sent..])];
            let c = if sent == 0 { cmsgs } else { &[] };
            match sendmsg::<()>(sock.as_raw_fd(), &iov, c, MsgFlags::MSG_NOSIGNAL, None) {
                Ok(n) => sent += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return witnesses,
            }
        }
        // Our copies close here: the receiver's are the only ones left.
    }
    witnesses
}

fn check(rt: &tokio::runtime::Runtime, c: &Case) {
    let witnesses = rt.block_on(async {
        let (_dir, old, mut new) = pair().await;
        let sock = old.stream.into_std().unwrap();
        sock.set_nonblocking(false).unwrap();
        let pieces = c.pieces.clone();
        // The peer writes and closes from a thread of its own (it blocks when the
        // socket's buffer is full, until the receiver reads or closes).
        let writer = std::thread::spawn(move || write_pieces(sock, &pieces));
        // At most four frames and some junk: a receiver still answering after 16 is looping.
        let max = 16;
        let mut ended = false;
        for _ in 0..max {
            let got = tokio::time::timeout(LIMIT, new.recv::<Hello>())
                .await
                .unwrap_or_else(|_| panic!("recv still waiting {LIMIT:?} after the peer closed"));
            match got {
                Ok((hello, fds)) => {
                    assert!(fds.len() <= MAX_FDS_PER_FRAME);
                    drop((hello, fds));
                }
                // Whatever the error, the channel is done: the caller rolls back.
                Err(_) => {
                    ended = true;
                    break;
                }
            }
        }
        assert!(ended, "{max} frames from a peer that sent at most four");
        drop(new);
        tokio::task::spawn_blocking(move || writer.join().unwrap())
            .await
            .unwrap()
    });
    // Every descriptor the peer sent is closed now (received and dropped, or still queued
    // in the socket, which the kernel disposes of with it): the witnesses see EOF.
    for mut w in witnesses {
        w.set_read_timeout(Some(LIMIT)).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            w.read(&mut buf).unwrap(),
            0,
            "a passed descriptor was leaked"
        );
    }
}

#[test]
fn hostile_frames_get_an_answer_or_an_error_and_leak_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    cases::run("channel::recv", 400, case, shrink, |c| check(&rt, c));
}

//! The new side's listener pass fed wrong frames (issue 25 §2): the old side's answer to
//! `Ready` carries any number of descriptors (none, one, several) on the `Listener`
//! message or on another one. Only `Listener` with exactly one descriptor is taken; every
//! other frame is refused, and every descriptor that came is closed (each is the only
//! other end of a witness socket, which then sees EOF). Seeded: `testkit/src/fuzz.rs`.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use artex_upgrade::channel::{self, ChannelListener};

use super::*;
use artex_testkit::fuzz as cases;

const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
struct Case {
    /// Which message answers `Ready`: 0 `Listener`, else another one.
    msg: u8,
    fds: usize,
}

fn message(which: u8) -> Msg {
    match which {
        0 => Msg::Listener,
        1 => Msg::Serving,
        2 => Msg::Welcome {
            http_addr: "127.0.0.1:1".into(),
            old_worker: "w".into(),
        },
        _ => Msg::Ready {
            worker_id: "w".into(),
        },
    }
}

async fn check(c: &Case) {
    let dir = tempfile::tempdir().unwrap();
    let listener = ChannelListener::bind(&dir.path().join("h")).unwrap();
    let path = listener.path().to_owned();
    let client = tokio::spawn(async move { channel::connect(&path).await.unwrap() });
    let mut old = listener.accept(std::process::id()).await.unwrap();
    let mut new = NewSide {
        ch: client.await.unwrap(),
    };
    let (ours, witnesses): (Vec<UnixStream>, Vec<UnixStream>) =
        (0..c.fds).map(|_| UnixStream::pair().unwrap()).unzip();
    let fds: Vec<_> = ours.iter().map(|s| s.as_fd()).collect();
    old.send(&message(c.msg), &fds).await.unwrap();
    drop(fds);
    drop(ours);
    let got = tokio::time::timeout(LIMIT, new.receive_listener("w"))
        .await
        .expect("receive_listener still waiting with its frame there");
    match (c.msg, c.fds, got) {
        (0, 1, Ok(listener)) => drop(listener),
        (_, _, Ok(_)) => panic!("{c:?}: taken"),
        (_, _, Err(e)) => assert!(matches!(e, ChannelError::Unexpected { .. }), "{c:?}: {e}"),
    }
    // The old side got `Ready` before anything was sent back.
    let (ready, _): (Msg, _) = old.recv().await.unwrap();
    assert!(matches!(ready, Msg::Ready { .. }), "{ready:?}");
    drop(new);
    for mut w in witnesses {
        w.set_read_timeout(Some(LIMIT)).unwrap();
        assert_eq!(
            w.read(&mut [0u8; 1]).unwrap(),
            0,
            "{c:?}: a descriptor leaked"
        );
    }
}

#[test]
fn the_listener_pass_takes_one_descriptor_on_listener_and_nothing_else() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    cases::run(
        "new_side::receive_listener",
        200,
        |rng| Case {
            msg: if rng.bool() { 0 } else { rng.u8(1..4) },
            fds: [0, 1, 1, 2, 3, 16][rng.usize(0..6)],
        },
        cases::no_shrink,
        |c| rt.block_on(check(c)),
    );
}

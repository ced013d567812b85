//! Upgrade channel tests over real Unix sockets: descriptors passed in-process and to a real
//! child process, peer-credential refusal, frame limits, and descriptor ownership.

use super::*;
use serde::Deserialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Hello {
    kind: String,
    port: u16,
}

const CHILD_ENV: &str = "ARTEX_CHANNEL_TEST_CHILD_SOCKET";
const LIMIT: Duration = Duration::from_secs(20);

async fn pair() -> (tempfile::TempDir, Channel, Channel) {
    let dir = tempfile::tempdir().unwrap();
    let listener = ChannelListener::bind(&dir.path().join("h")).unwrap();
    let path = listener.path().to_owned();
    let client = tokio::spawn(async move { connect(&path).await.unwrap() });
    let server = listener.accept(std::process::id()).await.unwrap();
    (dir, server, client.await.unwrap())
}

/// Proves `fd` is a working listening socket: a TCP client gets through and is served.
fn serve_one(listener: TcpListener, port: u16, greeting: &[u8]) {
    assert_eq!(listener.local_addr().unwrap().port(), port);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut served, _) = listener.accept().unwrap();
    served.write_all(greeting).unwrap();
    drop(served);
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, greeting);
}

#[tokio::test]
async fn a_listening_socket_survives_the_trip_and_keeps_accepting() {
    let (_dir, mut old, mut new) = pair().await;
    assert_eq!(old.peer_pid(), std::process::id());
    assert_eq!(new.peer_pid(), std::process::id());

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let hello = Hello {
        kind: "http-listener".into(),
        port,
    };
    old.send(&hello, &[tcp.as_fd()]).await.unwrap();
    // The sender closes its copy: from now on only the received descriptor holds the port.
    drop(tcp);

    let (got, mut fds): (Hello, _) = new.recv().await.unwrap();
    assert_eq!(got, hello);
    assert_eq!(fds.len(), 1);
    let received = TcpListener::from(fds.remove(0));
    tokio::task::spawn_blocking(move || serve_one(received, port, b"served by the heir"))
        .await
        .unwrap();
}

#[tokio::test]
async fn descriptors_belong_to_the_frame_they_were_sent_with() {
    let (_dir, mut old, mut new) = pair().await;
    let (a, _a_peer) = StdUnixStream::pair().unwrap();
    let (b, _b_peer) = StdUnixStream::pair().unwrap();
    // Three frames queued back to back before the receiver reads any of them.
    old.send(&"first", &[]).await.unwrap();
    old.send(&"second", &[a.as_fd(), b.as_fd()]).await.unwrap();
    old.send(&"third", &[]).await.unwrap();
    for (want, count) in [("first", 0), ("second", 2), ("third", 0)] {
        let (got, fds): (String, _) = new.recv().await.unwrap();
        assert_eq!((got.as_str(), fds.len()), (want, count));
    }
}

#[tokio::test]
async fn received_descriptors_are_cloexec_and_closed_on_drop() {
    let (_dir, mut old, mut new) = pair().await;
    let (ours, mut witness) = StdUnixStream::pair().unwrap();
    old.send(&"pipe", &[ours.as_fd()]).await.unwrap();
    drop(ours);
    let (_, fds): (String, _) = new.recv().await.unwrap();
    assert_eq!(fds.len(), 1);
    let flags = nix::fcntl::fcntl(&fds[0], nix::fcntl::FcntlArg::F_GETFD).unwrap();
    let flags = nix::fcntl::FdFlag::from_bits_truncate(flags);
    assert!(flags.contains(nix::fcntl::FdFlag::FD_CLOEXEC));

    // The received descriptor is now the only open end: dropping it must close the
    // socket, which the witness sees as EOF (a leaked fd would leave it blocked).
    drop(fds);
    witness.set_read_timeout(Some(LIMIT)).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(witness.read(&mut buf).unwrap(), 0, "descriptor leaked");
}

#[tokio::test]
async fn a_connection_from_another_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listener = ChannelListener::bind(&dir.path().join("h")).unwrap();
    let path = listener.path().to_owned();
    let client = tokio::spawn(async move {
        let mut channel = connect(&path).await.unwrap();
        channel.recv::<String>().await
    });
    let not_us = std::process::id() + 1;
    let err = listener.accept(not_us).await.unwrap_err();
    match err {
        Error::PeerRefused { expected, found } => {
            assert_eq!(expected, not_us);
            assert_eq!(found, Some(std::process::id()));
        }
        other => panic!("expected PeerRefused, got {other:?}"),
    }
    // The refused peer is disconnected, not left hanging.
    let seen = tokio::time::timeout(LIMIT, client).await.unwrap().unwrap();
    assert!(matches!(seen, Err(Error::ChannelClosed)), "{seen:?}");
}

#[tokio::test]
async fn oversized_frames_are_refused_on_both_sides() {
    let (_dir, mut old, mut new) = pair().await;
    let huge = "x".repeat(MAX_FRAME_BYTES);
    let err = old.send(&huge, &[]).await.unwrap_err();
    assert!(
        matches!(err, Error::FrameTooLarge { size, .. } if size == MAX_FRAME_BYTES as u64 + 2),
        "{err:?}"
    );
    // A hostile peer declaring a huge frame is refused before anything is allocated.
    old.stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let err = new.recv::<String>().await.unwrap_err();
    assert!(
        matches!(err, Error::FrameTooLarge { size, .. } if size == u64::from(u32::MAX)),
        "{err:?}"
    );
}

#[tokio::test]
async fn eof_mid_frame_is_an_error_and_eof_between_frames_is_closed() {
    let (_dir, mut old, mut new) = pair().await;
    old.send(&"whole", &[]).await.unwrap();
    old.stream.write_all(&100u32.to_be_bytes()).await.unwrap();
    old.stream.write_all(b"\"only part").await.unwrap();
    drop(old);
    let (whole, _): (String, _) = new.recv().await.unwrap();
    assert_eq!(whole, "whole");
    let err = new.recv::<String>().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ChannelTruncated {
                got: 14,
                expected: 104
            }
        ),
        "{err:?}"
    );

    let (_dir, old, mut new) = pair().await;
    drop(old);
    let err = new.recv::<String>().await.unwrap_err();
    assert!(matches!(err, Error::ChannelClosed), "{err:?}");
}

#[tokio::test]
async fn a_frame_of_the_wrong_shape_is_a_decode_error_and_its_fds_are_closed() {
    let (_dir, mut old, mut new) = pair().await;
    let (ours, mut witness) = StdUnixStream::pair().unwrap();
    old.send(&"not a Hello", &[ours.as_fd()]).await.unwrap();
    drop(ours);
    let err = new.recv::<Hello>().await.unwrap_err();
    assert!(matches!(err, Error::FrameDecode { .. }), "{err:?}");
    witness.set_read_timeout(Some(LIMIT)).unwrap();
    assert_eq!(witness.read(&mut [0u8; 1]).unwrap(), 0, "descriptor leaked");
}

#[tokio::test]
async fn bind_insists_on_a_private_directory_and_replaces_stale_sockets() {
    let root = tempfile::tempdir().unwrap();
    let open = root.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = ChannelListener::bind(&open).unwrap_err();
    assert!(matches!(err, Error::DirInvalid { .. }), "{err:?}");

    let fresh = root.path().join("fresh");
    let listener = ChannelListener::bind(&fresh).unwrap();
    assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
    // A second bind while the first listens must not steal the socket.
    let err = ChannelListener::bind(&fresh).unwrap_err();
    assert!(matches!(err, Error::ChannelSocketInUse { .. }), "{err:?}");
    drop(listener);
    assert!(
        !fresh.join(SOCKET_NAME).exists(),
        "socket not removed on drop"
    );

    // A stale socket left by a crash (bound, never listened) is replaced.
    let stale = std::os::unix::net::UnixDatagram::bind(fresh.join(SOCKET_NAME)).unwrap();
    drop(stale);
    let again = ChannelListener::bind(&fresh).unwrap();
    let path = again.path().to_owned();
    let client = tokio::spawn(async move { connect(&path).await.map(|c| c.peer_pid()) });
    again.accept(std::process::id()).await.unwrap();
    assert_eq!(client.await.unwrap().unwrap(), std::process::id());
}

fn open_fd_count() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Runs only as the child of `a_real_child_process_receives_the_listener`, which re-runs
/// this test binary with the socket path in the environment.
#[tokio::test]
#[ignore = "helper: started in a child process by a_real_child_process_receives_the_listener"]
async fn channel_child() {
    let path = std::env::var_os(CHILD_ENV).expect("run only by the cross-process test");
    let mut channel = connect(Path::new(&path)).await.unwrap();
    let before = open_fd_count();
    let (hello, mut fds): (Hello, _) = channel.recv().await.unwrap();
    let with = open_fd_count();
    let listener = TcpListener::from(fds.remove(0));
    let (mut conn, _) = listener.accept().unwrap();
    conn.write_all(format!("served by pid {}", std::process::id()).as_bytes())
        .unwrap();
    drop(conn);
    drop(listener);
    let after = open_fd_count();
    channel
        .send(&(hello.port, before, with, after), &[])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_real_child_process_receives_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let listener = ChannelListener::bind(&dir.path().join("h")).unwrap();
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "channel::tests::channel_child",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_ENV, listener.path())
        // The child's own test-harness report would read as ours; keep it for failures.
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let child_pid = child.id().unwrap();
    let mut channel = tokio::time::timeout(LIMIT, listener.accept(child_pid))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(channel.peer_pid(), child_pid);

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    channel
        .send(
            &Hello {
                kind: "http-listener".into(),
                port,
            },
            &[tcp.as_fd()],
        )
        .await
        .unwrap();
    drop(tcp);

    // Only the child holds the port now; it must be the one answering.
    let greeting = tokio::task::spawn_blocking(move || {
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut got = String::new();
        client.read_to_string(&mut got).unwrap();
        got
    })
    .await
    .unwrap();
    assert_eq!(greeting, format!("served by pid {child_pid}"));

    let ((echoed, before, with, after), _): ((u16, usize, usize, usize), _) =
        tokio::time::timeout(LIMIT, channel.recv())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(echoed, port);
    assert_eq!(
        with,
        before + 1,
        "the child gained exactly the one passed fd"
    );
    assert_eq!(
        after, before,
        "the child's fd table is back where it started"
    );
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "child test failed: {status}");
}

mod fuzz;

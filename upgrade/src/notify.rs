//! systemd's `sd_notify` protocol without libsystemd.
//!
//! Under `Type=notify`, systemd waits for `READY=1` and follows `MAINPID=` when the
//! successor becomes the service's main process (systemd's MAINPID hand-over, our
//! main-PID pass); both are one datagram to
//! `$NOTIFY_SOCKET`. Outside systemd the variable is unset and every call is a no-op.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use crate::error::{Error, Result};

/// The environment variable systemd sets to the notification socket's address.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Sends `state` (newline-separated `KEY=VALUE` assignments) to `$NOTIFY_SOCKET`.
///
/// Returns `Ok(false)` when `NOTIFY_SOCKET` is unset or empty (not run by systemd, or
/// notifications not asked for), `Ok(true)` once the datagram is sent.
pub fn notify(state: &str) -> Result<bool> {
    match std::env::var_os(NOTIFY_SOCKET_ENV) {
        Some(socket) if !socket.is_empty() => notify_to(&socket, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the socket named by `socket`, in `$NOTIFY_SOCKET` syntax: a
/// filesystem path, or an abstract name written with a leading `@`.
pub fn notify_to(socket: &OsStr, state: &str) -> Result {
    let addr = notify_addr(socket)?;
    let sender = UnixDatagram::unbound().map_err(|source| Error::Notify {
        socket: socket.to_owned(),
        source,
    })?;
    let sent = sender
        .send_to_addr(state.as_bytes(), &addr)
        .map_err(|source| Error::Notify {
            socket: socket.to_owned(),
            source,
        })?;
    if sent != state.len() {
        // Datagrams are all-or-nothing on Unix sockets; a short count means the kernel
        // changed the rules under us, and systemd would see a mangled state.
        return Err(Error::NotifyShort {
            socket: socket.to_owned(),
            sent,
            expected: state.len(),
        });
    }
    Ok(())
}

fn notify_addr(socket: &OsStr) -> Result<SocketAddr> {
    let bytes = socket.as_bytes();
    let invalid = |reason: &'static str| Error::NotifySocketInvalid {
        socket: socket.to_owned(),
        reason,
    };
    match bytes.first() {
        Some(b'@') => abstract_addr(&bytes[1..]).map_err(|_| invalid("abstract name too long")),
        Some(b'/') => {
            SocketAddr::from_pathname(socket).map_err(|_| invalid("path too long or contains NUL"))
        }
        _ => Err(invalid(
            "expected an absolute path or an abstract name starting with '@'",
        )),
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_addr(name: &[u8]) -> std::io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_addr(_name: &[u8]) -> std::io::Result<SocketAddr> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Tells systemd the service is up (`READY=1`).
pub fn ready() -> Result<bool> {
    notify("READY=1")
}

/// Sets the free-form status line `systemctl status` shows (`STATUS=…`).
pub fn status(text: &str) -> Result<bool> {
    // A newline would end the assignment and let the rest pose as another key.
    let one_line = text.replace('\n', " ");
    notify(&format!("STATUS={one_line}"))
}

/// Tells systemd that `pid` is now the service's main process (`MAINPID=…`), the step
/// that lets a hot upgrade replace the process systemd supervises.
pub fn mainpid(pid: u32) -> Result<bool> {
    notify(&format!("MAINPID={pid}"))
}

/// Tells systemd the service is shutting down (`STOPPING=1`).
pub fn stopping() -> Result<bool> {
    notify("STOPPING=1")
}

/// Tells systemd the service is reloading (`RELOADING=1`), e.g. during an upgrade.
pub fn reloading() -> Result<bool> {
    notify("RELOADING=1")
}

/// The socket systemd set for this process, if any (for logs and diagnostics).
pub fn socket() -> Option<OsString> {
    std::env::var_os(NOTIFY_SOCKET_ENV).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("no notification received");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    // The environment is process-global, so every check that touches NOTIFY_SOCKET lives
    // in this one test.
    #[test]
    fn notifications_reach_the_socket_named_by_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

        std::env::remove_var(NOTIFY_SOCKET_ENV);
        assert!(!ready().unwrap(), "unset NOTIFY_SOCKET must be a no-op");
        std::env::set_var(NOTIFY_SOCKET_ENV, "");
        assert!(!ready().unwrap(), "empty NOTIFY_SOCKET must be a no-op");

        std::env::set_var(NOTIFY_SOCKET_ENV, &path);
        assert_eq!(socket().as_deref(), Some(path.as_os_str()));
        assert!(ready().unwrap());
        assert_eq!(recv(&sock), "READY=1");
        assert!(status("upgrading\nto 1.2").unwrap());
        assert_eq!(recv(&sock), "STATUS=upgrading to 1.2");
        assert!(mainpid(4242).unwrap());
        assert_eq!(recv(&sock), "MAINPID=4242");
        assert!(reloading().unwrap());
        assert_eq!(recv(&sock), "RELOADING=1");
        assert!(stopping().unwrap());
        assert_eq!(recv(&sock), "STOPPING=1");

        // An abstract-namespace socket, as systemd uses by default nowadays.
        let name = format!("artex-notify-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&abstract_addr(name.as_bytes()).unwrap()).unwrap();
        abs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::env::set_var(NOTIFY_SOCKET_ENV, format!("@{name}"));
        assert!(notify("READY=1\nSTATUS=abstract").unwrap());
        assert_eq!(recv(&abs), "READY=1\nSTATUS=abstract");

        // Nobody listening: an error naming the socket, not a silent success.
        drop(sock);
        std::env::set_var(NOTIFY_SOCKET_ENV, &path);
        let err = ready().unwrap_err();
        assert!(matches!(err, Error::Notify { .. }), "{err:?}");
        assert!(err.to_string().contains("notify.sock"), "{err}");

        std::env::set_var(NOTIFY_SOCKET_ENV, "relative/path");
        let err = ready().unwrap_err();
        assert!(matches!(err, Error::NotifySocketInvalid { .. }), "{err:?}");

        std::env::remove_var(NOTIFY_SOCKET_ENV);
    }
}

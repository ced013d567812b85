//! The upgrade channel: the Unix socket between the old process (which listens) and the
//! new one (which connects), and its framed protocol: length-prefixed JSON frames, each
//! able to carry file descriptors (SCM_RIGHTS). It carries the listener pass (the HTTP
//! listening socket, so the port never stops accepting) and the task transfer.
//!
//! A frame is a u32 big-endian length and that many bytes of JSON. Descriptors travel as
//! ancillary data on the frame's first byte; the receiver never reads past the end of
//! the current frame, so descriptors can only ever be attributed to the frame they came
//! with.

use std::fs;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};

use crate::error::{Error, Result};
use crate::private_dir::ensure_private_dir;

/// Version of the upgrade channel's protocol; a bundle's manifest must declare the same.
pub const PROTOCOL_VERSION: u32 = 1;
/// File name of the socket inside the directory given to [`ChannelListener::bind`].
pub const SOCKET_NAME: &str = "channel.sock";
/// Largest frame body either side sends or accepts.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Most descriptors one frame may carry: Linux's own per-message limit (SCM_MAX_FD).
pub const MAX_FDS_PER_FRAME: usize = 253;

const HEADER_BYTES: usize = 4;

/// The old process's end: a listening socket in a private directory.
///
/// The socket file is removed when the listener is dropped.
#[derive(Debug)]
pub struct ChannelListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ChannelListener {
    /// Listens on `dir/channel.sock`. `dir` is created with mode 0700 if missing; if it
    /// exists it must be a directory owned by this user with no group or other access,
    /// since anyone who can connect could ask for our listening socket. A leftover socket
    /// nobody listens on (from a crashed generation) is replaced. Must be called inside a
    /// tokio runtime.
    pub fn bind(dir: &Path) -> Result<Self> {
        ensure_private_dir(dir, "upgrade channel directory")?;
        let path = dir.join(SOCKET_NAME);
        remove_stale_socket(&path)?;
        let listener = UnixListener::bind(&path)
            .map_err(|source| Error::io("binding the upgrade channel socket", &path, source))?;
        Ok(Self { listener, path })
    }

    /// Where the socket is; pass it to the new process (see `spawn::CHANNEL_ENV`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one connection and checks, with the kernel's SO_PEERCRED, that it comes
    /// from `expected_pid` (the child just spawned). Any other peer is disconnected and
    /// reported as [`Error::PeerRefused`]; the caller may accept again.
    pub async fn accept(&self, expected_pid: u32) -> Result<Channel> {
        let (stream, _) = self.listener.accept().await.map_err(|source| {
            Error::io(
                "accepting on the upgrade channel socket",
                &self.path,
                source,
            )
        })?;
        let cred = stream
            .peer_cred()
            .map_err(|source| Error::io("reading peer credentials on", &self.path, source))?;
        let found = cred.pid().and_then(|pid| u32::try_from(pid).ok());
        if found != Some(expected_pid) {
            tracing::warn!(
                expected_pid,
                found_pid = ?found,
                uid = cred.uid(),
                "refused an upgrade channel connection from an unexpected process"
            );
            return Err(Error::PeerRefused {
                expected: expected_pid,
                found,
            });
        }
        Ok(Channel {
            stream,
            peer_pid: expected_pid,
        })
    }
}

impl Drop for ChannelListener {
    fn drop(&mut self) {
        // Leave nothing that the next generation's bind would mistake for a live socket.
        let _ = fs::remove_file(&self.path);
    }
}

fn remove_stale_socket(path: &Path) -> Result {
    let Ok(meta) = path.symlink_metadata() else {
        return Ok(());
    };
    let in_use = |reason: &str| Error::ChannelSocketInUse {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if !meta.file_type().is_socket() {
        return Err(in_use("exists and is not a socket"));
    }
    // A synchronous probe is fine here: connecting to a local socket never blocks for
    // long, and refusal is exactly the "stale" answer we are looking for.
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(in_use("another process is listening on it")),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => fs::remove_file(path)
            .map_err(|source| Error::io("removing a stale upgrade channel socket", path, source)),
        Err(source) => Err(Error::io(
            "probing an existing upgrade channel socket",
            path,
            source,
        )),
    }
}

/// The new process's end: connects to the socket the old process named in
/// [`crate::spawn::CHANNEL_ENV`]. Must be called inside a tokio runtime.
pub async fn connect(path: &Path) -> Result<Channel> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| Error::io("connecting to the upgrade channel socket", path, source))?;
    let cred = stream
        .peer_cred()
        .map_err(|source| Error::io("reading peer credentials on", path, source))?;
    let peer_pid = cred
        .pid()
        .and_then(|pid| u32::try_from(pid).ok())
        .ok_or_else(|| Error::PeerUnknown {
            path: path.to_owned(),
        })?;
    Ok(Channel { stream, peer_pid })
}

/// One connected end of the upgrade channel, exchanging typed frames.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    peer_pid: u32,
}

impl Channel {
    /// The process at the other end, as the kernel reported it when connecting.
    pub fn peer_pid(&self) -> u32 {
        self.peer_pid
    }

    /// Sends `msg` as one frame, with `fds` duplicated into the peer. The caller keeps
    /// its own descriptors. Not cancel-safe: a dropped send may leave half a frame.
    pub async fn send<T: Serialize>(&mut self, msg: &T, fds: &[BorrowedFd<'_>]) -> Result {
        let body = serde_json::to_vec(msg).map_err(Error::FrameEncode)?;
        if body.len() > MAX_FRAME_BYTES {
            return Err(Error::FrameTooLarge {
                size: body.len() as u64,
                limit: MAX_FRAME_BYTES,
            });
        }
        if fds.len() > MAX_FDS_PER_FRAME {
            return Err(Error::TooManyFds {
                count: fds.len(),
                limit: MAX_FDS_PER_FRAME,
            });
        }
        // The length fits: it was just checked against a bound far below u32::MAX.
        let header = (body.len() as u32).to_be_bytes();
        let raw_fds: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        let total = HEADER_BYTES + body.len();
        let mut sent = 0usize;
        while sent < total {
            let iov = if sent < HEADER_BYTES {
                [IoSlice::new(&header[sent..]), IoSlice::new(&body)]
            } else {
                [
                    IoSlice::new(&[]),
                    IoSlice::new(&body[sent - HEADER_BYTES..]),
                ]
            };
            // Descriptors ride on the first chunk only; once any byte is out, they are
            // attached to the frame's first byte and must not be sent again.
            let rights = [ControlMessage::ScmRights(&raw_fds)];
            let cmsgs: &[ControlMessage] = if sent == 0 && !raw_fds.is_empty() {
                &rights
            } else {
                &[]
            };
            let fd = self.stream.as_raw_fd();
            let n = self
                .stream
                .async_io(Interest::WRITABLE, || {
                    sendmsg::<()>(
                        fd,
                        &iov,
                        cmsgs,
                        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                        None,
                    )
                    .map_err(io::Error::from)
                })
                .await
                .map_err(Error::ChannelSend)?;
            if n == 0 {
                return Err(Error::ChannelSend(io::ErrorKind::WriteZero.into()));
            }
            sent += n;
        }
        Ok(())
    }

    /// Receives one frame and the descriptors that came with it, owned (closed on drop)
    /// and close-on-exec. A clean close before a frame starts is
    /// [`Error::ChannelClosed`]; one in the middle is [`Error::ChannelTruncated`].
    /// Not cancel-safe: a dropped receive may lose part of a frame.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<(T, Vec<OwnedFd>)> {
        let mut fds = Vec::new();
        let mut header = [0u8; HEADER_BYTES];
        self.read_exact(&mut header, &mut fds, 0).await?;
        let len = u32::from_be_bytes(header) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(Error::FrameTooLarge {
                size: len as u64,
                limit: MAX_FRAME_BYTES,
            });
        }
        let mut body = vec![0u8; len];
        self.read_exact(&mut body, &mut fds, HEADER_BYTES).await?;
        let msg = serde_json::from_slice(&body)
            .map_err(|source| Error::FrameDecode { size: len, source })?;
        Ok((msg, fds))
    }

    /// Fills `buf` exactly, never reading a byte beyond it, collecting any descriptors.
    /// `already` is how many bytes of the frame were read before, for error reports.
    async fn read_exact(
        &mut self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        already: usize,
    ) -> Result {
        let mut filled = 0;
        let fd = self.stream.as_raw_fd();
        while filled < buf.len() {
            let (n, received) = self
                .stream
                .async_io(Interest::READABLE, || recv_chunk(fd, &mut buf[filled..]))
                .await
                .map_err(Error::ChannelRecv)?;
            let received = received?;
            if fds.len() + received.len() > MAX_FDS_PER_FRAME {
                return Err(Error::TooManyFds {
                    count: fds.len() + received.len(),
                    limit: MAX_FDS_PER_FRAME,
                });
            }
            fds.extend(received);
            if n == 0 {
                let got = already + filled;
                return Err(if got == 0 {
                    Error::ChannelClosed
                } else {
                    Error::ChannelTruncated {
                        got,
                        expected: already + buf.len(),
                    }
                });
            }
            filled += n;
        }
        Ok(())
    }
}

/// One non-blocking `recvmsg`. The outer result is the socket's (WouldBlock makes tokio
/// wait); the inner one is ours, so descriptors already taken into ownership are closed
/// rather than leaked if the control data turns out to be damaged.
fn recv_chunk(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Result<Vec<OwnedFd>>)> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS_PER_FRAME]);
    let mut iov = [IoSliceMut::new(buf)];
    // MSG_CMSG_CLOEXEC: the descriptors must not leak into anything we exec later, and
    // setting the flag afterwards would race a concurrent fork.
    let msg = recvmsg::<()>(
        fd,
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let n = msg.bytes;
    let cmsgs = match msg.cmsgs() {
        Ok(cmsgs) => cmsgs,
        // The buffer fits the kernel's per-message maximum of descriptors, so only control
        // data we never asked for gets here. nix cannot safely walk a truncated buffer,
        // so descriptors in it stay open: a bounded leak, reported loudly.
        Err(_) => return Ok((n, Err(Error::ControlTruncated))),
    };
    let mut owned = Vec::new();
    for cmsg in cmsgs {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for raw_fd in raw {
                // SAFETY: the kernel has just installed `raw_fd` in our descriptor table
                // for this message; nothing else in the process knows the number, so this
                // is its only owner.
                owned.push(unsafe { OwnedFd::from_raw_fd(raw_fd) });
            }
        }
    }
    Ok((n, Ok(owned)))
}

#[cfg(test)]
mod tests;

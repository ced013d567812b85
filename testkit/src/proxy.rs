//! A small TCP proxy for fault tests, on loopback only: it forwards every connection to a
//! target, counts the bytes going up (client → target), remembers each connection's
//! first line (with one request per connection, the request line), and on demand cuts
//! every open connection once a number of bytes went up, or refuses new connections.
//! Threads and `std::net`: two threads per connection, nothing shared but counters.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Never cut.
const NEVER: u64 = u64::MAX;

/// A running proxy; stops (cutting what is open) on drop.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    /// Bytes forwarded client → target since the start.
    up: AtomicU64,
    /// Cut every connection when `up` reaches this (then disarmed).
    cut_at: AtomicU64,
    /// Times every connection was cut.
    cuts: AtomicU64,
    /// New connections are closed at once.
    refusing: AtomicBool,
    /// The cut sets `refusing`.
    refuse_after_cut: AtomicBool,
    stopping: AtomicBool,
    /// Both ends of every open connection (clones), to cut them.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    next_id: AtomicU64,
    /// The first line each connection sent, in order.
    first_lines: Mutex<Vec<String>>,
}

impl Proxy {
    /// A proxy on 127.0.0.1 forwarding to `target` (a loopback address).
    pub fn start(target: &str) -> Proxy {
        let target: SocketAddr = target.parse().expect("a socket address");
        assert!(
            target.ip().is_loopback(),
            "the test proxy forwards to loopback only, not {target}"
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            cut_at: AtomicU64::new(NEVER),
            ..Shared::default()
        });
        let s = shared.clone();
        let acceptor = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stopping.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                if s.refusing.load(Ordering::Acquire) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(upstream) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                connect(&s, client, upstream);
            }
        });
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect: `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Cuts every open connection once `more` further bytes went up (counting from now).
    pub fn cut_after(&self, more: u64) {
        let now = self.shared.up.load(Ordering::Acquire);
        self.shared.cut_at.store(now + more, Ordering::Release);
    }

    /// As [`Proxy::cut_after`], and from the cut on, closes new connections at once
    /// (until `refuse(false)`): a link down for good, as far as the client knows.
    pub fn cut_and_refuse_after(&self, more: u64) {
        self.shared.refuse_after_cut.store(true, Ordering::Release);
        self.cut_after(more);
    }

    /// Closes new connections at once (`true`) or forwards them again (`false`).
    pub fn refuse(&self, on: bool) {
        self.shared.refusing.store(on, Ordering::Release);
    }

    /// Bytes forwarded client → target so far.
    pub fn up_bytes(&self) -> u64 {
        self.shared.up.load(Ordering::Acquire)
    }

    /// How many times every connection was cut.
    pub fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::Acquire)
    }

    /// The first line of every connection forwarded so far, in order.
    pub fn first_lines(&self) -> Vec<String> {
        self.shared.first_lines.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        cut_all(&self.shared);
        // Wakes the acceptor, which sees `stopping` and returns.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Starts forwarding one connection, both ways.
fn connect(s: &Arc<Shared>, client: TcpStream, upstream: TcpStream) {
    let id = s.next_id.fetch_add(1, Ordering::AcqRel);
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    {
        // Under the lock a cut takes: a connection accepted just before a cut that
        // refuses is closed here, not forwarded after it.
        let mut open = s.open.lock().unwrap();
        if s.refusing.load(Ordering::Acquire) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        }
        open.push((id, c2, u2));
    }
    let (Ok(c3), Ok(u3)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let up = s.clone();
    std::thread::spawn(move || forward_up(&up, id, client, upstream));
    std::thread::spawn(move || {
        // Target → client, uncounted.
        let (mut from, mut to) = (u3, c3);
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Client → target, counted, cut when the budget runs out.
fn forward_up(s: &Shared, id: u64, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut first = Vec::new();
    let mut first_done = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !first_done {
            first.extend_from_slice(&buf[..n.min(256)]);
            if let Some(end) = first.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&first[..end]).trim().to_string();
                s.first_lines.lock().unwrap().push(line);
                first_done = true;
            }
        }
        let before = s.up.fetch_add(n as u64, Ordering::AcqRel);
        let cut_at = s.cut_at.load(Ordering::Acquire);
        if before + n as u64 >= cut_at {
            // Forward what fits in the budget, then cut everything (once).
            let fits = cut_at.saturating_sub(before) as usize;
            let _ = to.write_all(&buf[..fits.min(n)]);
            s.up.fetch_sub((n - fits.min(n)) as u64, Ordering::AcqRel);
            // The first connection past the budget cuts them all, and disarms the cut
            // only then: until it has, every other one finds the budget spent and
            // forwards nothing more (disarming first let others forward freely while
            // the cut was on its way: a whole extra chunk, on a loaded machine).
            let mut open = s.open.lock().unwrap();
            if s.cut_at.load(Ordering::Acquire) == cut_at {
                if s.refuse_after_cut.swap(false, Ordering::AcqRel) {
                    s.refusing.store(true, Ordering::Release);
                }
                for (_, client, upstream) in open.drain(..) {
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = upstream.shutdown(Shutdown::Both);
                }
                s.cuts.fetch_add(1, Ordering::AcqRel);
                s.cut_at.store(NEVER, Ordering::Release);
            }
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    s.open.lock().unwrap().retain(|(i, _, _)| *i != id);
}

fn cut_all(s: &Shared) {
    for (_, client, upstream) in s.open.lock().unwrap().drain(..) {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
    }
}

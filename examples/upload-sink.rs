//! A plain HTTP sink for the upload benchmark (`scripts/bench.sh`, part `upload`): what
//! `curl -T` of a file is compared with. It accepts on `127.0.0.1:<port>` (printed on
//! stdout), reads each request's head and `Content-Length` body into one reused buffer,
//! answers `200` and closes; one thread per connection. Nothing is hashed.
//!
//! Two modes, two baselines:
//! - no argument: the body is discarded — the cheapest receiver there is, so the ratio
//!   says what all of artex's receiving (hashing, writing, syncing) costs;
//! - `FILE`: the body is written to FILE (created or truncated) and fsynced once at the
//!   end before the answer — what storing a file durably on that disk costs at least.
//!
//! Usage: `cargo run --release --example upload-sink [FILE]` (runs until killed);
//! `UPLOAD_SINK_BIND=10.0.0.2:0` binds elsewhere than loopback (the bench's part over a
//! rate-limited link between network namespaces).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;

fn main() -> std::io::Result<()> {
    let store: Option<Arc<PathBuf>> = std::env::args_os().nth(1).map(|p| Arc::new(p.into()));
    let bind = std::env::var("UPLOAD_SINK_BIND").unwrap_or_else(|_| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&bind)?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let store = store.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve(conn, store.as_deref()) {
                eprintln!("upload-sink: {e}");
            }
        });
    }
    Ok(())
}

fn serve(conn: TcpStream, store: Option<&PathBuf>) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut r = BufReader::with_capacity(1 << 20, conn);
    let (mut len, mut expect) = (0u64, false);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if l.starts_with("expect:") && l.contains("100-continue") {
            expect = true;
        }
    }
    if expect {
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    let mut file = store.map(File::create).transpose()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = r.read(&mut buf[..left.min(1 << 20) as usize])?;
        if n == 0 {
            break;
        }
        if let Some(f) = &mut file {
            f.write_all(&buf[..n])?;
        }
        left -= n as u64;
    }
    if let Some(f) = &file {
        f.sync_all()?;
    }
    out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}

//! A plain HTTP sink for the upload benchmark (`scripts/bench.sh`, part `upload`): what
//! `curl -T` of a file is compared with. It accepts on `127.0.0.1:<port>` (printed on
//! stdout), reads each request's head and `Content-Length` body into one reused buffer,
//! discards it, answers `200` and closes; one thread per connection. Nothing is stored
//! or hashed: the cheapest receiver there is, so the ratio says what artex's receiving
//! (hashing, writing, fsyncing each chunk) costs.
//!
//! Usage: `cargo run --release --example upload-sink` (runs until killed).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

fn main() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        std::thread::spawn(move || {
            if let Err(e) = serve(conn) {
                eprintln!("upload-sink: {e}");
            }
        });
    }
    Ok(())
}

fn serve(conn: TcpStream) -> std::io::Result<()> {
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
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = r.read(&mut buf[..left.min(1 << 20) as usize])?;
        if n == 0 {
            break;
        }
        left -= n as u64;
    }
    out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}

//! A small load client for `scripts/bench.sh`'s `api` part: submits tasks through
//! `POST /api/v1/tasks` from several concurrent clients, each on one keep-alive
//! HTTP/1.1 connection, one task a request or a batch (a JSON array) a request, and
//! prints what it achieved. std and tokio only (the workspace has no HTTP client).
//!
//! ```text
//! api-load ADDR TOKEN_FILE KIND TASKS CLIENTS BATCH
//! → tasks=20000 requests=20000 secs=8.123 tasks_per_s=2462
//! ```
//! Every answer must be 201; anything else ends the run with exit 1 and the answer.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Load {
    addr: String,
    token: String,
    body: String,
    /// Requests not yet taken by a client.
    left: AtomicU64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, token_file, kind, tasks, clients, batch] = &args[..] else {
        eprintln!("usage: api-load ADDR TOKEN_FILE KIND TASKS CLIENTS BATCH");
        return ExitCode::from(2);
    };
    let number = |what: &str, s: &str| match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{what}: expected a positive whole number, not {s:?}"
        )),
    };
    let parsed = (|| {
        Ok::<_, String>((
            number("TASKS", tasks)?,
            number("CLIENTS", clients)?,
            number("BATCH", batch)?,
            std::fs::read_to_string(token_file)
                .map_err(|e| format!("TOKEN_FILE {token_file}: {e}"))?,
        ))
    })();
    let (tasks, clients, batch, token) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("api-load: {e}");
            return ExitCode::from(2);
        }
    };
    let one = serde_json::json!({"kind": kind, "payload": {}}).to_string();
    let body = if batch == 1 {
        one
    } else {
        format!("[{}]", vec![one; batch as usize].join(","))
    };
    let requests = tasks.div_ceil(batch);
    let load = Arc::new(Load {
        addr: addr.clone(),
        token: token.trim().to_string(),
        body,
        left: AtomicU64::new(requests),
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("api-load: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let result = runtime.block_on(async {
        let mut handles = Vec::new();
        for _ in 0..clients {
            handles.push(tokio::spawn(client(load.clone())));
        }
        for h in handles {
            h.await.map_err(|e| format!("a client panicked: {e}"))??;
        }
        Ok::<_, String>(())
    });
    let secs = started.elapsed().as_secs_f64();
    if let Err(e) = result {
        eprintln!("api-load: {e}");
        return ExitCode::FAILURE;
    }
    let sent = requests * batch;
    println!(
        "tasks={sent} requests={requests} secs={secs:.3} tasks_per_s={:.0}",
        sent as f64 / secs.max(1e-9)
    );
    ExitCode::SUCCESS
}

/// Takes requests until none is left, on one connection (a new one if the server
/// closed it).
async fn client(load: Arc<Load>) -> Result<(), String> {
    let mut conn: Option<BufReader<TcpStream>> = None;
    while load
        .left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let stream = match conn.take() {
            Some(c) => c,
            None => BufReader::new(
                TcpStream::connect(&load.addr)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", load.addr))?,
            ),
        };
        let (stream, keep) = submit(stream, &load).await?;
        if keep {
            conn = Some(stream);
        }
    }
    Ok(())
}

/// One request and its answer; whether the connection may be used again.
async fn submit(
    mut stream: BufReader<TcpStream>,
    load: &Load,
) -> Result<(BufReader<TcpStream>, bool), String> {
    let request = format!(
        "POST /api/v1/tasks HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        load.addr,
        load.token,
        load.body.len(),
        load.body
    );
    let io = |e: std::io::Error| format!("talking to {}: {e}", load.addr);
    stream
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .map_err(io)?;
    let mut status = String::new();
    stream.read_line(&mut status).await.map_err(io)?;
    let (mut length, mut keep) = (0usize, true);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.map_err(io)? == 0 {
            return Err(format!("{} closed the connection mid-answer", load.addr));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().map_err(|_| format!("bad length {value:?}"))?;
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep = false;
            }
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.map_err(io)?;
    if status.split_whitespace().nth(1) != Some("201") {
        return Err(format!(
            "answer {}: {}",
            status.trim(),
            String::from_utf8_lossy(&body)
        ));
    }
    Ok((stream, keep))
}

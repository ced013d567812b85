//! The benchmark's worker binary (scripts/bench.sh), built on the artex crate the way a
//! user builds their own worker: the stock kinds plus one,
//! `stamp`, whose result is the wall-clock time its handler started (`{"t_us": …}`, Unix
//! microseconds), so enqueue → handler start is measured where the handler runs, not
//! where the database thinks the task started.
//! `artex-bench sha256 FILE` hashes FILE once on one thread and prints the seconds it took: the upload part's floor (the upload protocol
//! hashes a file four times: client and worker, whole and per chunk).

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use artex::TaskContext;
use serde_json::json;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("sha256") {
        return sha256_seconds(std::env::args_os().nth(2));
    }
    let mut handlers = artex::handlers::stock();
    handlers.register("stamp", |_ctx: TaskContext| async move {
        let t_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(json!({ "t_us": t_us }))
    });
    artex::cli::main_with(handlers)
}

/// Hashes the file once, a MiB at a time, and prints the seconds taken.
fn sha256_seconds(path: Option<std::ffi::OsString>) -> ExitCode {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let Some(path) = path else {
        eprintln!("usage: artex-bench sha256 FILE");
        return ExitCode::FAILURE;
    };
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("artex-bench: opening {}: {e}", path.to_string_lossy());
            return ExitCode::FAILURE;
        }
    };
    let started = std::time::Instant::now();
    let (mut hash, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hash.update(&buf[..n]),
            Err(e) => {
                eprintln!("artex-bench: reading {}: {e}", path.to_string_lossy());
                return ExitCode::FAILURE;
            }
        }
    }
    let digest = hash.finalize();
    println!(
        "{:.3} {}",
        started.elapsed().as_secs_f64(),
        hex::encode(digest)
    );
    ExitCode::SUCCESS
}

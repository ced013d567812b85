//! Large files sent to a worker in chunks (issue 15): each chunk acknowledged once on
//! disk, a corrupted one refused, the file recorded with its task exactly once, the task
//! run where the file is and the file removed when it ends; hostile input and a full
//! disk refused with nothing left behind.
//!
//! # Layout
//! - `chunks`: chunks acknowledged and checked, the file recorded with its task once.
//! - `refusals`: hostile input and a full quota refused, nothing left behind.
//! - `client`: `artex upload` sends, resumes and retries only what is missing.
//! - `restarts`: a worker crashed, killed or upgraded midway loses nothing.
//! - `hosts`: an upload's task fails when its host's workers are gone for good.
//! - `flows`: an upload's task joins the flow its spec names.
//! - `lifecycle`: abandoned uploads expire, files kept past their task, shared folders.
//! - `apart`: deployments on one host keep their uploads apart (default folders).
//! - `fuzz`: random and hostile requests get clear answers and never corrupt a file.

#[path = "../common/mod.rs"]
mod common;

mod apart;
mod chunks;
mod client;
mod flows;
mod fuzz;
mod hosts;
mod lifecycle;
mod refusals;
mod restarts;

use std::path::Path;
use std::time::Duration;

use artex_testkit::http::{Exchange, Request};
use common::procs::{worker_http, Proc};
use common::TestDb;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const WRITE_TOKEN: &str = "upload-write-token";

/// A worker and a planner on `db`, the worker keeping uploads in `dir`.
struct Fleet {
    worker: Proc,
    _planner: Proc,
    http: String,
    _token_dir: tempfile::TempDir,
}

/// What most tests start from: their database, a folder, the worker's upload folder in
/// it, and a worker and a planner (`extra`: the worker's further flags). Keep the folder
/// bound (`_dir`) while the worker runs: dropped, it takes the uploads with it.
async fn setup(extra: &[&str]) -> (TestDb, tempfile::TempDir, std::path::PathBuf, Fleet) {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let f = fleet(&db, &uploads, extra).await;
    (db, dir, uploads, f)
}

fn token_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("write-token");
    std::fs::write(&file, WRITE_TOKEN).unwrap();
    let f = file.to_str().unwrap().to_string();
    (dir, f)
}

async fn fleet(db: &TestDb, uploads: &Path, extra: &[&str]) -> Fleet {
    let (token_dir, token) = token_file();
    let mut args = vec![
        "--write-token-file",
        &token,
        "--upload-dir",
        uploads.to_str().unwrap(),
        "--upload-sweep-ms",
        "100",
    ];
    args.extend_from_slice(extra);
    let worker = Proc::worker("uploads-worker", &db.url, &args);
    let planner = Proc::planner("uploads-planner", &db.url, &[]);
    let http = worker_http(&db.client().await, &worker).await;
    Fleet {
        worker,
        _planner: planner,
        http,
        _token_dir: token_dir,
    }
}

/// One HTTP/1.1 request with the write token; returns (status, JSON body or Null).
fn call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let mut request = Request::new(method, path)
        .bearer(WRITE_TOKEN)
        .timeout(Duration::from_secs(60));
    for (k, v) in headers {
        request = request.header(k, v);
    }
    // The server may refuse before reading the body and close: that is an answer too.
    answer(request.body(body).start(addr).expect("connect"))
}

/// Reads an answer to its end (the requests say `Connection: close`): (status, JSON body
/// or Null; status 0 when the server closed without one).
fn answer(mut exchange: Exchange) -> (u16, Value) {
    match exchange.response() {
        Ok(r) => (r.status, r.json_or_null()),
        Err(_) => (0, Value::Null),
    }
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic, incompressible-enough test data.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn create(http: &str, file: &[u8], chunk: u64, kind: &str) -> (String, u64) {
    let (code, body) = call(
        http,
        "POST",
        "/api/v1/uploads",
        &[("Content-Type", "application/json")],
        json!({"size": file.len(), "sha256": sha(file), "name": "data.bin",
               "chunk_size": chunk, "task": {"kind": kind, "payload": {"note": "hi"}}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_string(),
        body["chunks"].as_u64().unwrap(),
    )
}

fn put(http: &str, id: &str, n: u64, bytes: &[u8]) -> (u16, Value) {
    call(
        http,
        "PUT",
        &format!("/api/v1/uploads/{id}/chunks/{n}"),
        &[("Chunk-Sha256", &sha(bytes))],
        bytes,
    )
}

fn chunk(file: &[u8], size: usize, n: u64) -> &[u8] {
    let start = n as usize * size;
    &file[start..(start + size).min(file.len())]
}

/// Sends every chunk of `file` (in chunks of `size`) to upload `id`, each acknowledged;
/// returns the task the last one wrote.
fn send_all(http: &str, id: &str, file: &[u8], size: usize) -> uuid::Uuid {
    let chunks = file.len().div_ceil(size) as u64;
    let mut task = None;
    for n in 0..chunks {
        let (code, body) = put(http, id, n, chunk(file, size, n));
        assert_eq!(code, 200, "chunk {n}: {body}");
        task = body["task"].as_str().map(String::from);
    }
    uuid::Uuid::parse_str(&task.expect("the last chunk wrote the task")).unwrap()
}

/// A file of `len` bytes of [`data`] in `dir`: (its path, its bytes).
fn test_file(dir: &Path, len: usize, seed: u64) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("f.bin");
    let content = data(len, seed);
    std::fs::write(&path, &content).unwrap();
    (path, content)
}

/// The output of an `artex upload` run (see [`cli`]) that must have succeeded: (its
/// stdout, its stderr).
fn succeeded(out: std::io::Result<std::process::Output>) -> (Vec<u8>, String) {
    let out = out.expect("artex upload ran");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (out.stdout, stderr)
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// `artex upload` run against `http`, with its cache in `cache`.
fn cli(
    http: &str,
    file: &Path,
    cache: &Path,
    token: &str,
    extra: &[&str],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(common::artex_bin());
    cmd.arg("upload")
        .arg(file)
        .args(["--to", &format!("http://{http}"), "--kind", "digest"])
        .args(extra)
        .env("ARTEX_TOKEN_FILE", token)
        .env("XDG_CACHE_HOME", cache)
        .env("ARTEX_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

fn parts(uploads: &Path) -> usize {
    std::fs::read_dir(uploads)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
        .count()
}

async fn ran_whole(db: &TestDb, stdout: &[u8], file: &[u8]) -> Value {
    ran_whole_sha(db, stdout, &sha(file)).await
}

/// [`ran_whole`] for a file known by its sha256 (too large to hold in memory).
async fn ran_whole_sha(db: &TestDb, stdout: &[u8], file_sha: &str) -> Value {
    let task = String::from_utf8_lossy(stdout).trim().to_string();
    let task = uuid::Uuid::parse_str(&task).unwrap_or_else(|_| panic!("no task id: {task:?}"));
    common::procs::wait_status(&db.bb, task, "succeeded", Duration::from_secs(120)).await;
    let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
    assert_eq!(result["sha256"], file_sha);
    assert_eq!(result["matches"], true);
    result
}

//! `artex upload`: a large file sent whole, a killed client or a cut link resumed sending
//! only the missing chunks, an older worker given the sha256 first.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common;
use crate::common::count;
use crate::common::procs::wait_for;
use crate::{
    call, cli, data, parts, ran_whole, ran_whole_sha, setup, sha, succeeded, test_file, token_file,
};

/// A worker of a build that wants the sha256 when the upload starts, as far as one
/// upload of a one-chunk file goes: it refuses a start without one as such a build does
/// (serde's "missing field"), then takes the chunk and answers with a task. Returns the
/// address and the requests' first lines and bodies, in order.
fn older_worker() -> (String, std::thread::JoinHandle<Vec<(String, String)>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for conn in listener.incoming() {
            let mut s = conn.unwrap();
            let mut raw = Vec::new();
            let mut buf = [0u8; 65536];
            // Head, then Content-Length bytes of body.
            let (head, body) = loop {
                let n = s.read(&mut buf).unwrap();
                raw.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&raw).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len || n == 0 {
                        break (head.to_string(), body.to_string());
                    }
                }
            };
            let line = head.lines().next().unwrap().to_string();
            let answer = if line.starts_with("POST /api/v1/uploads ") && !body.contains("sha256") {
                (
                    400,
                    json!({"error": "the request: missing field `sha256` at line 1 column 90"}),
                )
            } else if line.starts_with("POST /api/v1/uploads ") {
                (201, json!({"id": "u1", "chunk_size": 1 << 20, "chunks": 1}))
            } else {
                (
                    200,
                    json!({"ack": true, "chunk": 0, "received": 1, "missing": [], "task": "t1"}),
                )
            };
            let text = answer.1.to_string();
            write!(
                s,
                "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                answer.0,
                text.len()
            )
            .unwrap();
            let done = line.starts_with("PUT");
            seen.push((line, body));
            if done {
                return seen;
            }
        }
        seen
    });
    (addr, seen)
}

#[tokio::test]
async fn the_cli_gives_a_worker_that_wants_the_sha256_first_the_sha256_first() {
    let dir = tempfile::tempdir().unwrap();
    let (_token_dir, token) = token_file();
    let file = dir.path().join("small.bin");
    let bytes = data(5000, 21);
    std::fs::write(&file, &bytes).unwrap();
    let (addr, seen) = older_worker();
    let (stdout, _) = succeeded(cli(&addr, &file, &dir.path().join("cache"), &token, &[]).output());
    assert_eq!(String::from_utf8_lossy(&stdout).trim(), "t1");
    let seen = seen.join().unwrap();
    let lines: Vec<&str> = seen.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        lines,
        [
            "POST /api/v1/uploads HTTP/1.1",
            "POST /api/v1/uploads HTTP/1.1",
            "PUT /api/v1/uploads/u1/chunks/0 HTTP/1.1"
        ]
    );
    let second: Value = serde_json::from_str(&seen[1].1).unwrap();
    assert_eq!(second["sha256"], sha(&bytes));
}

// 1 GiB in 10 MiB chunks, as the issue asks: ~10 s and 2 GiB of temporary disk (the
// file and its upload), never the whole file in the test's memory.
#[tokio::test]
async fn a_large_file_sent_by_the_cli_arrives_whole_and_runs_where_it_is() {
    let (db, dir, _uploads, f) = setup(&[]).await;
    let (_t, token) = token_file();
    let path = dir.path().join("big.bin");
    let file_sha = {
        let block = data(1 << 20, 11);
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut hash = Sha256::new();
        for i in 0..1024u32 {
            let mut b = block.clone();
            b[..4].copy_from_slice(&i.to_le_bytes());
            out.write_all(&b).unwrap();
            hash.update(&b);
        }
        out.flush().unwrap();
        hex::encode(hash.finalize())
    };
    let (stdout, stderr) =
        succeeded(cli(&f.http, &path, dir.path(), &token, &["--parallel", "4"]).output());
    assert!(stderr.contains("sent 103 chunks"), "{stderr}");
    let result = ran_whole_sha(&db, &stdout, &file_sha).await;
    assert_eq!(result["pid"], f.worker.pid());
}

#[tokio::test]
async fn a_client_killed_midway_resumes_and_sends_only_the_missing_chunks() {
    let (db, dir, uploads, f) = setup(&[]).await;
    let (_t, token) = token_file();
    let (path, content) = test_file(dir.path(), 40 * 65536, 13);
    let slow = [
        "--chunk-size",
        "65536",
        "--parallel",
        "1",
        "--chunk-delay-ms",
        "100",
    ];
    let mut first = cli(&f.http, &path, dir.path(), &token, &slow)
        .spawn()
        .unwrap();
    wait_for("5 chunks on disk", Duration::from_secs(60), || async {
        (parts(&uploads) >= 5).then_some(())
    })
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    let (stdout, stderr) =
        succeeded(cli(&f.http, &path, dir.path(), &token, &["--parallel", "3"]).output());
    // It asked what was missing and sent that only.
    let missing: usize = stderr
        .split("resuming upload ")
        .nth(1)
        .and_then(|s| s.split(": ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resume: {stderr}"));
    assert!(missing < 40 && missing > 0, "{stderr}");
    assert!(
        stderr.contains(&format!("sent {missing} chunks")),
        "{stderr}"
    );
    ran_whole(&db, &stdout, &content).await;
    let c = db.client().await;
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
}

/// The chunk numbers PUT through `proxy` (one request per connection), in order.
fn chunks_put(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("PUT "))
        .filter_map(|l| l.split("/chunks/").nth(1))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn connections_cut_midway_resend_only_the_chunks_in_flight() {
    let (db, dir, _uploads, f) = setup(&[]).await;
    let (_t, token) = token_file();
    let proxy = artex_testkit::proxy::Proxy::start(&f.http);
    let chunk = 65536u64;
    let (path, content) = test_file(dir.path(), 48 * chunk as usize, 29);

    // Every connection cut once a third of the file went up; the client retries.
    proxy.cut_after(16 * chunk);
    let (stdout, stderr) = succeeded(
        cli(
            &proxy.addr(),
            &path,
            dir.path(),
            &token,
            &["--chunk-size", "65536", "--parallel", "4"],
        )
        .output(),
    );
    assert_eq!(proxy.cuts(), 1, "the proxy cut the connections");
    ran_whole(&db, &stdout, &content).await;
    let puts = chunks_put(&proxy.first_lines());
    let mut again = puts.clone();
    again.sort();
    let distinct = {
        let mut d = again.clone();
        d.dedup();
        d
    };
    assert_eq!(distinct, (0..48).collect::<Vec<u64>>(), "every chunk sent");
    // Only what was in flight when the cut came is sent twice: at most --parallel.
    let resent = puts.len() - distinct.len();
    assert!(
        (1..=4).contains(&resent),
        "{resent} chunks sent again: {puts:?}"
    );
    assert!(stderr.contains("sent 48 chunks"), "{stderr}");
    // Bytes: the file, plus at most the chunks cut in flight, plus the requests' heads.
    let heads = (puts.len() as u64 + 2) * 1024;
    assert!(
        proxy.up_bytes() <= content.len() as u64 + 4 * chunk + heads,
        "{} bytes went up for a file of {}",
        proxy.up_bytes(),
        content.len()
    );
    eprintln!(
        "UPLOAD-CUT puts={} resent={resent} up_bytes={} file={}",
        puts.len(),
        proxy.up_bytes(),
        content.len()
    );
}

#[tokio::test]
async fn a_link_down_past_the_retries_resumes_and_sends_only_the_missing_chunks() {
    let (db, dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let (_t, token) = token_file();
    let proxy = artex_testkit::proxy::Proxy::start(&f.http);
    let (path, content) = test_file(dir.path(), 48 * 65536, 31);
    let args = [
        "--chunk-size",
        "65536",
        "--parallel",
        "4",
        "--attempts",
        "2",
    ];

    // The link goes down for good a third of the way: the client gives up.
    proxy.cut_and_refuse_after(16 * 65536);
    let out = cli(&proxy.addr(), &path, dir.path(), &token, &args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("run the same command again"), "{stderr}");
    let first_run = proxy.first_lines().len();
    let id = std::fs::read_dir(&uploads)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 200);
    let missing: Vec<u64> = state["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert!(!missing.is_empty() && missing.len() < 48, "{state}");

    // Back up: the same command asks what is missing and sends exactly that.
    proxy.refuse(false);
    let before = proxy.up_bytes();
    let (stdout, stderr) = succeeded(cli(&proxy.addr(), &path, dir.path(), &token, &args).output());
    assert!(
        stderr.contains(&format!(
            "resuming upload {id}: {} of 48 chunks missing",
            missing.len()
        )),
        "{stderr}"
    );
    let lines = proxy.first_lines();
    let mut second = chunks_put(&lines[first_run..]);
    second.sort();
    assert_eq!(second, missing, "the second run sent other chunks");
    let sent = proxy.up_bytes() - before;
    assert!(
        sent <= missing.len() as u64 * 65536 + (lines.len() - first_run) as u64 * 1024,
        "{sent} bytes went up for {} missing chunks",
        missing.len()
    );
    ran_whole(&db, &stdout, &content).await;
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1);
}

/// Its output a pipe whose reader has gone (a reader killed, `| head -0`): the file is
/// still sent whole and its task runs, and the command ends quietly with exit 141.
#[tokio::test]
async fn a_cli_whose_reader_has_gone_sends_the_file_and_ends_quietly() {
    let (db, dir, _uploads, f) = setup(&[]).await;
    let (_t, token) = token_file();
    let (path, _) = test_file(dir.path(), 3 << 20, 5);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = cli(&f.http, &path, dir.path(), &token, &[])
        .stdout(writer)
        .output()
        .expect("artex upload ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    for sign in ["panicked", "backtrace", "Broken pipe", "error"] {
        assert!(!stderr.contains(sign), "{stderr}");
    }
    assert!(stderr.contains("sent 1 chunks"), "{stderr}");
    let c = db.client().await;
    let task: uuid::Uuid = c
        .query_one("select id from artex.tasks", &[])
        .await
        .unwrap()
        .get(0);
    common::procs::wait_status(&db.bb, task, "succeeded", Duration::from_secs(60)).await;
}

//! A worker crashed, killed or hot-upgraded midway: no chunk lost, no request refused,
//! a whole file left unrecorded recorded.

use std::path::Path;
use std::time::Duration;

use artex_testkit::http::Request;
use serde_json::{json, Value};

use crate::common;
use crate::common::procs::{wait_for, Proc};
use crate::common::{count, TestDb};
use crate::{
    answer, call, chunk, cli, create, data, fleet, parts, put, ran_whole, setup, sha, succeeded,
    test_file, token_file, WRITE_TOKEN,
};

/// Lays out upload `id` in `uploads` as a process that died just after naming the whole
/// file would have left it: `meta.json` (of `layout`, or the first layout's without the
/// field) and `file`, no row.
fn left_whole(uploads: &Path, id: uuid::Uuid, file: &[u8], layout: Option<u32>) {
    let dir = uploads.join(id.to_string());
    std::fs::create_dir(&dir).unwrap();
    let mut meta = json!({"id": id, "size": file.len(), "sha256": sha(file), "name": "x.bin",
        "chunk_size": 1024, "chunks": file.len().div_ceil(1024), "task": {"kind": "digest"}});
    if let Some(l) = layout {
        meta["layout"] = json!(l);
    }
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    std::fs::write(dir.join("file"), file).unwrap();
}

/// On a folder the fleet shares, a whole file left unrecorded may be found by another
/// host's worker: the row names the host that received it (kept in its `meta.json`).
#[tokio::test]
async fn a_whole_file_swept_by_another_host_is_recorded_for_the_host_that_took_it() {
    let (db, _dir, uploads, _f) = setup(&["--upload-shared"]).await;
    let c = db.client().await;
    wait_for("the upload folder", Duration::from_secs(30), || async {
        uploads.is_dir().then_some(())
    })
    .await;
    let id = uuid::Uuid::now_v7();
    left_whole(&uploads, id, &data(3000, 33), Some(2));
    let meta = uploads.join(id.to_string()).join("meta.json");
    let mut declared: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    declared["host"] = json!("the-receiving-host");
    std::fs::write(&meta, declared.to_string()).unwrap();
    let row = wait_for("the file recorded", Duration::from_secs(30), || async {
        c.query_opt(
            "select host, shared from artex.uploads where id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1)))
    })
    .await;
    assert_eq!(row, ("the-receiving-host".to_string(), true));
}

#[tokio::test]
async fn a_whole_file_a_crash_left_unrecorded_is_recorded_whatever_its_layout() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let (now, before) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let (a, b) = (data(3000, 31), data(2000, 32));
    // The worker makes its upload folder as it starts taking uploads.
    wait_for("the upload folder", Duration::from_secs(30), || async {
        uploads.is_dir().then_some(())
    })
    .await;
    left_whole(&uploads, now, &a, Some(2));
    left_whole(&uploads, before, &b, None);
    wait_for("both files recorded", Duration::from_secs(30), || async {
        (count(&c, "select count(*) from artex.uploads").await == 2).then_some(())
    })
    .await;
    for (id, bytes) in [(now, &a), (before, &b)] {
        let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
        assert_eq!(code, 200, "{state}");
        let task = uuid::Uuid::parse_str(state["task"].as_str().unwrap()).unwrap();
        common::procs::wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
        let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
        assert_eq!(result["sha256"], sha(bytes), "{id}");
        assert_eq!(result["matches"], true);
    }
}

#[tokio::test]
async fn a_worker_killed_midway_is_restarted_and_the_upload_completes() {
    let (db, dir, uploads, mut f) = setup(&[]).await;
    let c = db.client().await;
    let (_t, token) = token_file();
    let (path, content) = test_file(dir.path(), 30 * 65536, 17);
    let args = [
        "--chunk-size",
        "65536",
        "--parallel",
        "2",
        "--chunk-delay-ms",
        "100",
    ];
    let client = cli(&f.http, &path, dir.path(), &token, &args)
        .spawn()
        .unwrap();
    wait_for("5 chunks on disk", Duration::from_secs(60), || async {
        (parts(&uploads) >= 5).then_some(())
    })
    .await;
    f.worker.signal(nix::sys::signal::Signal::SIGKILL);
    f.worker.wait_exit(Duration::from_secs(10)).expect("killed");
    // Restarted on the same port and folder; the client's retries find it.
    let (_t2, token2) = token_file();
    let w = Proc::worker(
        "uploads-worker-2",
        &db.url,
        &[
            "--http",
            &f.http,
            "--write-token-file",
            &token2,
            "--upload-dir",
            uploads.to_str().unwrap(),
        ],
    );
    let (stdout, _) = succeeded(client.wait_with_output());
    let result = ran_whole(&db, &stdout, &content).await;
    assert_eq!(result["pid"], w.pid());
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
}

/// What the sender of [`a_hot_upgrade_midway_loses_no_chunk_and_refuses_no_request`]
/// saw: every request's answer, and whether it was sent once the old process was gone.
#[derive(Debug)]
struct Sent {
    chunk: Option<u64>,
    code: u16,
    ack: bool,
    after_old_exit: bool,
    task: Option<String>,
    error: Value,
}

#[tokio::test]
async fn a_hot_upgrade_midway_loses_no_chunk_and_refuses_no_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = common::bundles::Keys::new();
    let (bundle, new_sha) = keys.variant_bundle(1);
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let flags = keys.flags("upgrades");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut f = fleet(&db, &uploads, &flags).await;
    let old_pid = f.worker.pid();

    // Started with the old process: 240 chunks of 16 KiB.
    let size = 16 * 1024;
    let file = Arc::new(data(240 * size, 23));
    let (id, chunks) = create(&f.http, &file, size as u64, "digest");
    assert_eq!(chunks, 240);

    // Two senders, one connection per request, chunks interleaved. The last 20 wait
    // until the old process is gone (asking where the upload stands meanwhile, so
    // requests keep coming whatever the upgrade's pace): those go to the new one.
    let old_gone = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..2u64)
        .map(|k| {
            let (http, id, file, old_gone) =
                (f.http.clone(), id.clone(), file.clone(), old_gone.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for n in (k..chunks).step_by(2).filter(|&n| n != SLOW_CHUNK) {
                    while n >= chunks - 20 && !old_gone.load(Ordering::Acquire) {
                        let (code, _) =
                            call(&http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
                        seen.push(Sent {
                            chunk: None,
                            code,
                            ack: false,
                            after_old_exit: false,
                            task: None,
                            error: Value::Null,
                        });
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let after_old_exit = old_gone.load(Ordering::Acquire);
                    let (code, body) = put(&http, &id, n, chunk(&file, size, n));
                    seen.push(Sent {
                        chunk: Some(n),
                        code,
                        ack: body["ack"] == true,
                        after_old_exit,
                        task: body["task"].as_str().map(String::from),
                        error: body["error"].clone(),
                    });
                    std::thread::sleep(Duration::from_millis(5));
                }
                seen
            })
        })
        .collect();
    wait_for("10 chunks on disk", Duration::from_secs(60), || async {
        (parts(&uploads) >= 10).then_some(())
    })
    .await;
    // One chunk in flight across the listener pass: its body starts with the old process and
    // ends only once the new one has taken over, so the old one must finish it.
    let upgraded = Arc::new(AtomicBool::new(false));
    let slow = {
        let (http, id, file, upgraded) =
            (f.http.clone(), id.clone(), file.clone(), upgraded.clone());
        std::thread::spawn(move || {
            slow_put(
                &http,
                &id,
                SLOW_CHUNK,
                chunk(&file, size, SLOW_CHUNK),
                &upgraded,
            )
        })
    };

    // The upgrade, while chunks keep coming.
    let report = Request::new("PUT", "/upgrade")
        .bearer(common::bundles::TOKEN)
        .body(std::fs::read(&bundle).unwrap())
        .timeout(Duration::from_secs(60))
        .send(&f.http)
        .unwrap_or_else(|e| panic!("upgrade: {e}"))
        .json();
    assert_eq!(report["status"], "upgraded", "{report}");
    let new_pid = report["new_pid"].as_i64().unwrap() as i32;
    let _end_new = KillOnDrop(new_pid);
    let parts_at_upgrade = parts(&uploads);
    upgraded.store(true, Ordering::Release);
    let (code, body) = slow.join().unwrap();
    assert_eq!(
        (code, body["ack"].as_bool()),
        (200, Some(true)),
        "the chunk in flight: {body}"
    );
    let status = f
        .worker
        .wait_exit(Duration::from_secs(60))
        .expect("the old process exits");
    assert!(status.success(), "old process exit status {status:?}");
    old_gone.store(true, Ordering::Release);

    let seen: Vec<Sent> = senders
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    let refused: Vec<&Sent> = seen
        .iter()
        .filter(|s| s.code != 200 || !s.error.is_null() || (s.chunk.is_some() && !s.ack))
        .collect();
    assert!(
        refused.is_empty(),
        "refused or failed requests: {refused:?}"
    );
    let puts = seen.iter().filter(|s| s.chunk.is_some()).count();
    let after = seen
        .iter()
        .filter(|s| s.chunk.is_some() && s.after_old_exit)
        .count();
    eprintln!("UPLOAD-UPGRADE puts={puts} after_old_exit={after} parts_at_upgrade={parts_at_upgrade} requests={}", seen.len());
    assert_eq!(puts, 239, "every other chunk sent once and acknowledged");
    assert!(after >= 20, "the new process took the rest: {after} chunks");
    // The port is the new process's now.
    let (_, st) = common::procs::http_get(&f.http, "/status").unwrap();
    let st: Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["pid"], new_pid, "{st}");
    assert_eq!(st["binary_sha256"], new_sha.as_str(), "{st}");

    // One task, written once, run whole on the new process.
    let tasks: std::collections::BTreeSet<&str> =
        seen.iter().filter_map(|s| s.task.as_deref()).collect();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let task = uuid::Uuid::parse_str(tasks.first().unwrap()).unwrap();
    common::procs::wait_status(&db.bb, task, "succeeded", Duration::from_secs(60)).await;
    let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
    assert_eq!(result["sha256"], sha(&file));
    assert_eq!(result["matches"], true);
    assert_eq!(result["pid"], new_pid);
    assert_ne!(old_pid, new_pid);
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1);
}

/// The chunk whose body crosses the listener pass.
const SLOW_CHUNK: u64 = 101;

/// PUTs chunk `n`, its body a piece at a time: half of it, then one piece every 20 ms
/// until `until` is set, then the rest; (status, JSON body).
fn slow_put(
    addr: &str,
    id: &str,
    n: u64,
    bytes: &[u8],
    until: &std::sync::atomic::AtomicBool,
) -> (u16, Value) {
    let mut s = Request::new("PUT", &format!("/api/v1/uploads/{id}/chunks/{n}"))
        .bearer(WRITE_TOKEN)
        .header("Chunk-Sha256", &sha(bytes))
        .length(bytes.len())
        .timeout(Duration::from_secs(60))
        .start(addr)
        .expect("connect");
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    s.write(first).unwrap();
    let mut rest = rest.chunks(64).peekable();
    while let Some(piece) = rest.next() {
        // Hold the last piece back until the new process has taken over.
        while rest.peek().is_none() && !until.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
        }
        s.write(piece).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    answer(s)
}

/// A process the test did not start itself (a hot upgrade's new generation): killed at
/// the end, pass or fail.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

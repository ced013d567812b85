//! The upload page in a real browser: a file sent in chunks and its task seen to
//! succeed, an upload cut off midway and resumed from a new page, a remembered upload
//! that cannot be resumed started again, a file changed since its first chunks refused
//! whole and sent anew.

use std::path::Path;
use std::time::Duration;

use artex_testkit::http::Request;
use artex_testkit::proxy::Proxy;
use serde_json::{json, Value};

use crate::browser::Browser;
use crate::common::procs::wait_for;
use crate::common::{TestDb, READ_TOKEN};
use crate::{call, created, Cluster, WRITE_TOKEN};

/// A browser on the upload page at `addr`, the read token given, its form shown.
async fn upload_page(addr: &str) -> Browser {
    let b = Browser::start().await;
    b.open_with_token(addr, "#/upload", READ_TOKEN).await;
    b.until(
        "the upload form",
        "return !!document.getElementById('upload-file')",
    )
    .await;
    b
}

/// Picks `file` in the form, makes the page remember upload `old` for it (as if it had
/// started it) and starts, giving the write token when asked.
async fn start_remembering(b: &Browser, file: &Path, old: &str) {
    b.type_into("#upload-file", &file.to_string_lossy()).await;
    b.eval(&format!(
        "const f = document.getElementById('upload-file').files[0];
         localStorage.setItem('artex.upload.' + [f.name, f.size, f.lastModified].join('|'),
           JSON.stringify({{id: {old:?}}}));
         return null"
    ))
    .await;
    b.click("#upload-start").await;
    b.give_token(WRITE_TOKEN).await;
}

/// Once the page shows its upload's task succeeded: that task as the API at `addr`
/// shows it.
async fn uploads_task(b: &Browser, addr: &str) -> Value {
    b.until(
        "the upload's task shown succeeded",
        "return !!document.querySelector('#upload-task-status [data-status=succeeded]')",
    )
    .await;
    let task = b
        .eval("return document.querySelector('#upload-task a').title")
        .await;
    let (code, shown) = call(
        "GET",
        addr,
        &format!("/api/v1/tasks/{}", task.as_str().unwrap()),
        None,
    );
    assert_eq!(code, 200, "{shown}");
    shown
}

/// [`uploads_task`], checked to name an upload other than `old`.
async fn new_uploads_task(b: &Browser, addr: &str, old: &str) -> Value {
    let shown = uploads_task(b, addr).await;
    let new = &shown["task"]["payload"]["upload"]["id"];
    assert!(new.is_string() && *new != json!(old), "{shown}");
    shown
}

#[tokio::test]
async fn the_upload_page_sends_a_file_in_chunks_and_sees_its_task_succeed() {
    use sha2::{Digest, Sha256};
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let b = upload_page(&cluster.addr).await;

    // The page's SHA-256 against FIPS 180-2's vectors, and fed in uneven pieces.
    let vectors = b
        .eval(
            "const hex = (s) => new Sha256().update(new TextEncoder().encode(s)).hex();
             const a = new Sha256(); const piece = new TextEncoder().encode('a'.repeat(997));
             for (let n = 0; n < 1003; n++) a.update(piece);
             a.update(new TextEncoder().encode('a'.repeat(1000000 - 997 * 1003)));
             return [hex(''), hex('abc'),
               hex('abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq'), a.hex()]",
        )
        .await;
    assert_eq!(
        vectors,
        json!([
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
        ])
    );

    // 3.5 MiB in chunks of 1 MiB: four chunks, the last one short.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..(3 * 1024 * 1024 + 512 * 1024) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &bytes).unwrap();
    let sha = hex::encode(Sha256::digest(&bytes));
    b.eval("document.getElementById('upload-chunk').value = '1'; return null")
        .await;
    b.eval(RECORD_WORKER).await;
    b.type_into("#upload-file", &file.to_string_lossy()).await;
    b.click("#upload-start").await;
    // The tab has the read token only: uploads need the write scope.
    b.give_token(WRITE_TOKEN).await;
    let shown = uploads_task(&b, &cluster.addr).await;
    let result = &shown["task"]["result"];
    assert_eq!(result["sha256"], json!(sha), "{shown}");
    assert_eq!(result["matches"], json!(true), "{shown}");
    assert_eq!(result["size"], json!(bytes.len()), "{shown}");
    assert_eq!(
        b.eval("return document.getElementById('send-bar').style.width")
            .await,
        json!("100%")
    );
    // The upload was created before the file was read (no hashing pass first), and its
    // sha256, declared by none, was given with `complete` once every chunk was there.
    let said = b.eval("return __said.map(m => m.type)").await;
    let said: Vec<&str> = said
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = |t: &str| said.iter().position(|s| *s == t);
    assert!(
        matches!((at("created"), at("hashing")), (Some(c), Some(h)) if c < h),
        "the worker said {said:?}"
    );
    let completing = b
        .eval("return __said.find(m => m.type === 'completing') || null")
        .await;
    assert_eq!(completing["sha256"], json!(sha), "{completing}");
    assert_eq!(
        said.iter().filter(|s| **s == "progress").count(),
        1 + 4,
        "{said:?}"
    );
    let id = shown["task"]["payload"]["upload"]["id"].as_str().unwrap();
    let (code, upload) = call("GET", &cluster.addr, &format!("/api/v1/uploads/{id}"), None);
    assert_eq!(code, 200, "{upload}");
    assert_eq!(upload["sha256"], json!(sha), "{upload}");
    b.assert_no_errors().await;
    b.close().await;
}

/// Makes the page record every message of the upload workers it starts (in `__said`).
const RECORD_WORKER: &str = "window.__said = []; const W = window.Worker;
     window.Worker = function (url) {
       const w = new W(url); w.addEventListener('message', (e) => __said.push(e.data)); return w;
     };
     return null";

/// The upload the page remembers in `localStorage` (to resume it), if any.
const REMEMBERED: &str =
    "const k = Object.keys(localStorage).find(k => k.startsWith('artex.upload.'));
     return k ? JSON.parse(localStorage.getItem(k)).id : null";

#[tokio::test]
async fn an_interrupted_upload_resumes_from_the_same_file_and_sends_only_the_missing_chunks() {
    use sha2::{Digest, Sha256};
    const MIB: usize = 1 << 20;
    let db = TestDb::new().await;
    let mut cluster = Cluster::start(&db, &[]).await;
    // The browser reaches the worker through a proxy that counts the bytes sent to it
    // and can cut the link.
    let proxy = Proxy::start(&cluster.addr);
    let b = upload_page(&proxy.addr()).await;

    // 8 MiB in chunks of 1 MiB: eight chunks, each a different MiB.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resumed.bin");
    let bytes: Vec<u8> = (0..(8 * MIB) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ (i >> 20) as u8)
        .collect();
    std::fs::write(&file, &bytes).unwrap();
    let sha = hex::encode(Sha256::digest(&bytes));
    b.eval("document.getElementById('upload-chunk').value = '1'; return null")
        .await;
    b.type_into("#upload-file", &file.to_string_lossy()).await;
    // The link goes down for good once 4.5 MiB went up: with at most four chunks of
    // 1 MiB in flight, at least one arrived whole, and at least four never did.
    proxy.cut_and_refuse_after((4 * MIB + MIB / 2) as u64);
    b.click("#upload-start").await;
    b.give_token(WRITE_TOKEN).await;
    let id = b.until("the upload remembered", REMEMBERED).await;
    let id = id.as_str().unwrap().to_string();
    b.until(
        "the page retrying after the cut",
        "return /retry/.test(document.getElementById('upload-state').textContent)",
    )
    .await;
    assert_eq!(proxy.cuts(), 1);
    let status = format!("/api/v1/uploads/{id}");
    wait_for(
        "a chunk on the worker's disk",
        Duration::from_secs(30),
        || async {
            let (code, p) = call("GET", &cluster.addr, &status, None);
            (code == 200 && p["received"].as_array().is_some_and(|r| !r.is_empty())).then_some(())
        },
    )
    .await;
    b.assert_no_errors().await;

    // The user gives up and closes the tab; the worker dies too (so that what its disk
    // holds is final) and is started again; the link comes back.
    b.goto("about:blank").await;
    cluster.restart_worker(&db).await;
    let (code, before) = call("GET", &cluster.addr, &status, None);
    assert_eq!(code, 200, "{before}");
    let missing: Vec<u64> = serde_json::from_value(before["missing"].clone()).unwrap();
    let received = before["received"].as_array().unwrap().len();
    assert!(received >= 1 && missing.len() >= 4, "{before}");
    assert_eq!(received + missing.len(), 8, "{before}");
    // Created without the file's sha256 (its first chunks went out before the file was
    // read whole): it is given with `complete`.
    assert!(before["sha256"].is_null(), "{before}");
    proxy.refuse(false);

    // The user opens the upload page again and picks the same file (the chunk size
    // left at the form's default: the upload keeps its own).
    b.goto(&format!("http://{}/#/upload", proxy.addr())).await;
    b.until(
        "the upload form again",
        "return !!document.getElementById('upload-file')",
    )
    .await;
    assert_eq!(b.eval(REMEMBERED).await, json!(id));
    let sent_before = proxy.up_bytes();
    b.type_into("#upload-file", &file.to_string_lossy()).await;
    b.click("#upload-start").await;
    // The task is read from the worker, not through the proxy: what the proxy counts is
    // the page's only.
    let shown = uploads_task(&b, &cluster.addr).await;
    let sent = (proxy.up_bytes() - sent_before) as usize;
    assert_eq!(
        b.eval("return document.getElementById('upload-state').textContent")
            .await,
        json!(format!("upload {id} complete"))
    );

    // Only the missing chunks went to the worker: their bytes, plus requests' headers
    // (the status asked, each PUT's, the task read) far below one chunk more.
    let owed = missing.len() * MIB;
    assert!(
        sent >= owed && sent < owed + MIB / 4,
        "{sent} bytes sent to resume; the {} missing chunks hold {owed}",
        missing.len()
    );
    let task = &shown["task"];
    assert_eq!(task["payload"]["upload"]["id"], json!(id), "{shown}");
    assert_eq!(task["result"]["sha256"], json!(sha), "{shown}");
    assert_eq!(task["result"]["matches"], json!(true), "{shown}");
    assert_eq!(task["result"]["size"], json!(bytes.len()), "{shown}");
    let (code, after) = call("GET", &cluster.addr, &status, None);
    assert_eq!(code, 200, "{after}");
    assert_eq!(after["sha256"], json!(sha), "{after}");
    // Done: nothing left to resume.
    assert_eq!(b.eval(REMEMBERED).await, Value::Null);
    assert_eq!(
        b.eval("return document.getElementById('send-bar').style.width")
            .await,
        json!("100%")
    );
    b.assert_no_errors().await;
    b.close().await;
}

#[tokio::test]
async fn a_remembered_upload_that_cannot_be_resumed_is_started_again() {
    use sha2::{Digest, Sha256};
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("again.bin");
    let bytes: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    // An upload of this file that an earlier build started: its meta.json has no
    // layout, and the worker refuses to resume it (409).
    let old = created(call(
        "POST",
        &cluster.addr,
        "/api/v1/uploads",
        Some(
            json!({"size": bytes.len(), "sha256": hex::encode(Sha256::digest(&bytes)),
            "chunk_size": 65536, "task": {"kind": "digest"}}),
        ),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let meta = cluster
        .dir
        .path()
        .join("uploads")
        .join(&old)
        .join("meta.json");
    let mut declared: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    declared.as_object_mut().unwrap().remove("layout");
    std::fs::write(&meta, declared.to_string()).unwrap();
    let status = format!("/api/v1/uploads/{old}");
    assert_eq!(call("GET", &cluster.addr, &status, None).0, 409);

    // The page remembers it for this file, as if it had started it.
    let b = upload_page(&cluster.addr).await;
    start_remembering(&b, &file, &old).await;
    // Picked again, the file goes up as a new upload, and its task runs.
    let shown = new_uploads_task(&b, &cluster.addr, &old).await;
    assert_eq!(shown["task"]["result"]["matches"], json!(true), "{shown}");
    assert_eq!(b.eval(REMEMBERED).await, Value::Null);
    b.assert_no_errors().await;
    b.close().await;
}

/// `PUT` of `body` as chunk `n` of upload `id` at `addr`, with its sha256; the HTTP code
/// (0 when no answer came).
pub(crate) fn put_chunk(addr: &str, id: &str, n: u64, body: &[u8]) -> u16 {
    use sha2::{Digest, Sha256};
    Request::new("PUT", &format!("/api/v1/uploads/{id}/chunks/{n}"))
        .bearer(WRITE_TOKEN)
        .header("Chunk-Sha256", &hex::encode(Sha256::digest(body)))
        .body(body)
        .timeout(Duration::from_secs(120))
        .send(addr)
        .map_or(0, |r| r.status)
}

#[tokio::test]
async fn a_file_changed_since_its_first_chunks_went_up_is_refused_whole_and_sent_anew() {
    use sha2::{Digest, Sha256};
    const CHUNK: usize = 64 * 1024;
    let db = TestDb::new().await;
    let cluster = Cluster::start(&db, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("changed.bin");
    let bytes: Vec<u8> = (0..(4 * CHUNK) as u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    // An upload of this file that a page started (its sha256 left for `complete`) when
    // its first chunk held other bytes: that chunk is on the worker's disk.
    let old = created(call(
        "POST",
        &cluster.addr,
        "/api/v1/uploads",
        Some(json!({"size": bytes.len(), "chunk_size": CHUNK, "task": {"kind": "digest"}})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(put_chunk(&cluster.addr, &old, 0, &vec![7u8; CHUNK]), 200);
    let status = format!("/api/v1/uploads/{old}");

    let b = upload_page(&cluster.addr).await;
    start_remembering(&b, &file, &old).await;
    // Resumed, the missing chunks go up; the whole file does not match what arrived:
    // the worker discards the upload, and the page says so and forgets it.
    let said = b
        .until(
            "the page to report the changed file",
            "const s = document.getElementById('upload-state');
             return s.className === 'error' && !document.getElementById('upload-start').disabled
               ? s.textContent : null",
        )
        .await;
    let said = said.as_str().unwrap();
    assert!(
        said.contains(&old) && said.contains("changed") && said.contains("upload the file again"),
        "{said}"
    );
    assert_eq!(b.eval(REMEMBERED).await, Value::Null);
    assert_eq!(call("GET", &cluster.addr, &status, None).0, 404);

    // Uploaded again, it goes up as a new upload, and its task runs.
    b.click("#upload-start").await;
    let shown = new_uploads_task(&b, &cluster.addr, &old).await;
    assert_eq!(
        shown["task"]["result"]["sha256"],
        json!(hex::encode(Sha256::digest(&bytes))),
        "{shown}"
    );
    assert_eq!(b.eval(REMEMBERED).await, Value::Null);
    b.assert_no_errors().await;
    b.close().await;
}

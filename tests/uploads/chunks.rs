//! Chunks acknowledged once on disk, a corrupted one refused, the sha256 checked when
//! given or at `complete`, the file recorded with its task exactly once.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::common::count;
use crate::common::procs::wait_for;
use crate::{call, chunk, create, data, entries, put, setup, sha};

#[tokio::test]
async fn chunks_are_acknowledged_checked_and_the_task_runs_where_the_file_is() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let size = 16 * 1024;
    let file = data(100_000, 7);
    let (id, chunks) = create(&f.http, &file, size as u64, "digest");
    assert_eq!(chunks, 7);

    // Out of order; a corrupted chunk is refused, not stored, and sent again.
    for n in [3, 0, 5] {
        let (code, body) = put(&f.http, &id, n, chunk(&file, size, n));
        assert_eq!((code, body["ack"].as_bool()), (200, Some(true)), "{body}");
    }
    let mut bad = chunk(&file, size, 1).to_vec();
    bad[10] ^= 0xff;
    let (code, body) = call(
        &f.http,
        "PUT",
        &format!("/api/v1/uploads/{id}/chunks/1"),
        &[("Chunk-Sha256", &sha(chunk(&file, size, 1)))],
        &bad,
    );
    assert_eq!(code, 422, "{body}");
    let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 200);
    assert_eq!(state["state"], "receiving");
    assert_eq!(state["received"], json!([0, 3, 5]));
    assert_eq!(state["missing"], json!([1, 2, 4, 6]));
    assert!(state["task"].is_null());
    // Re-sending an acknowledged chunk is harmless.
    assert_eq!(put(&f.http, &id, 3, chunk(&file, size, 3)).0, 200);
    for n in [1, 2, 4] {
        assert_eq!(put(&f.http, &id, n, chunk(&file, size, n)).0, 200);
    }
    // Seven chunks written and checked (one twice), the corrupted one not: the worker's
    // /metrics counts their bytes.
    let (code, metrics) = common::procs::http_get(&f.http, "/metrics").unwrap();
    assert_eq!(code, 200, "{metrics}");
    let line = format!("\nartex_worker_upload_bytes_total {}\n", 7 * size);
    assert!(metrics.contains(&line), "{line:?} not in\n{metrics}");
    // No task before the file is whole.
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 0);
    // The last chunk, twice: one task.
    let (code, first) = put(&f.http, &id, 6, chunk(&file, size, 6));
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["state"], "complete");
    let task = first["task"].as_str().unwrap().to_string();
    let (code, again) = put(&f.http, &id, 6, chunk(&file, size, 6));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["task"].as_str(), Some(task.as_str()));
    // A second `complete` is refused and changes nothing.
    let (code, body) = call(
        &f.http,
        "POST",
        &format!("/api/v1/uploads/{id}/complete"),
        &[],
        b"",
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where kind = 'digest'").await,
        1
    );

    // The task runs on the worker holding the file and reads it whole.
    let task_id = uuid::Uuid::parse_str(&task).unwrap();
    common::procs::wait_status(&db.bb, task_id, "succeeded", Duration::from_secs(30)).await;
    let row = db.bb.operator().task(task_id).await.unwrap();
    let result = row.result.unwrap();
    assert_eq!(result["sha256"], sha(&file));
    assert_eq!(result["matches"], true);
    // Run by the worker that holds the file (the handler reports its pid).
    assert_eq!(result["pid"], f.worker.pid());
    assert_eq!(row.payload["note"], "hi");
    assert_eq!(row.payload["upload"]["id"], id.as_str());
    // Its task ended: the file goes, the row says so.
    wait_for(
        "the file to be deleted",
        Duration::from_secs(30),
        || async {
            let s: String = c
                .query_one("select state from artex.uploads", &[])
                .await
                .ok()?
                .get(0);
            (s == "deleted").then_some(())
        },
    )
    .await;
    assert_eq!(entries(&uploads), 0);
    let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!((code, state["state"].as_str()), (200, Some("deleted")));
    // A chunk that arrives once all this is over (a slow re-send, or a PUT still in
    // flight when another completed the file) is acknowledged with the task, not lost
    // in a 404 or a 500.
    let (code, late) = put(&f.http, &id, 6, chunk(&file, size, 6));
    assert_eq!(code, 200, "{late}");
    assert_eq!(late["ack"], true, "{late}");
    assert_eq!(late["task"].as_str(), Some(task.as_str()), "{late}");
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where kind = 'digest'").await,
        1
    );
}

/// Starts an upload of `file` declaring no sha256 (it is given with `complete`).
fn create_unhashed(http: &str, file: &[u8], chunk: u64) -> (String, u64) {
    let (code, body) = call(
        http,
        "POST",
        "/api/v1/uploads",
        &[("Content-Type", "application/json")],
        json!({"size": file.len(), "chunk_size": chunk, "task": {"kind": "digest"}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(code, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_string(),
        body["chunks"].as_u64().unwrap(),
    )
}

fn complete(http: &str, id: &str, body: &str) -> (u16, Value) {
    call(
        http,
        "POST",
        &format!("/api/v1/uploads/{id}/complete"),
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

#[tokio::test]
async fn a_sha256_left_for_complete_is_checked_there_and_writes_one_task() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let size = 16 * 1024;
    let file = data(40_000, 11);
    let (id, chunks) = create_unhashed(&f.http, &file, size as u64);
    assert_eq!(chunks, 3);
    // `complete` before the chunks: the sha256 is checked first, then what is missing.
    let (code, body) = complete(&f.http, &id, "");
    assert_eq!(
        (code, body["field"].as_str()),
        (422, Some("sha256")),
        "{body}"
    );
    let (code, body) = complete(&f.http, &id, &json!({"sha256": sha(&file)}).to_string());
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("missing"),
        "{body}"
    );
    for n in 0..chunks {
        let (code, body) = put(&f.http, &id, n, chunk(&file, size, n));
        assert_eq!(code, 200, "{body}");
        // Whole, but no sha256 to check it against yet: no task.
        assert!(body["task"].is_null(), "{body}");
    }
    let (_, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(
        (&state["state"], &state["missing"], &state["sha256"]),
        (&json!("receiving"), &json!([]), &Value::Null),
        "{state}"
    );
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 0);
    // Hostile bodies: refused, nothing changes.
    for (bad, code) in [
        ("{\"sha256\": \"xyz\"}", 400),
        ("{\"sha256\": 7}", 400),
        ("{\"size\": 1}", 400),
        ("not json", 400),
    ] {
        let (got, body) = complete(&f.http, &id, bad);
        assert_eq!(got, code, "{bad}: {body}");
    }
    let (code, body) = complete(
        &f.http,
        &id,
        &format!("{{\"sha256\": \"{}\"}}", "0".repeat(5000)),
    );
    assert_eq!(code, 413, "{body}");
    // The right one (in capitals: hex is hex) writes the task, once.
    let given = sha(&file).to_ascii_uppercase();
    let (code, body) = complete(&f.http, &id, &json!({ "sha256": given }).to_string());
    assert_eq!(code, 200, "{body}");
    let task = body["task"].as_str().unwrap().to_string();
    let (code, body) = complete(&f.http, &id, &json!({"sha256": sha(&file)}).to_string());
    assert_eq!(code, 409, "{body}");
    let (code, again) = put(&f.http, &id, 2, chunk(&file, size, 2));
    assert_eq!((code, again["task"].as_str()), (200, Some(task.as_str())));
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 1);
    let (_, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(state["sha256"], sha(&file), "{state}");
    let task_id = uuid::Uuid::parse_str(&task).unwrap();
    common::procs::wait_status(&db.bb, task_id, "succeeded", Duration::from_secs(30)).await;
    let result = db
        .bb
        .operator()
        .task(task_id)
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(
        (&result["sha256"], &result["matches"]),
        (&json!(sha(&file)), &json!(true))
    );

    // A wrong sha256 at `complete` discards the upload: its content is never told.
    let other = data(20_000, 12);
    let (id, chunks) = create_unhashed(&f.http, &other, size as u64);
    for n in 0..chunks {
        assert_eq!(put(&f.http, &id, n, chunk(&other, size, n)).0, 200);
    }
    let (code, body) = complete(&f.http, &id, &json!({"sha256": sha(&file)}).to_string());
    assert_eq!(code, 422, "{body}");
    assert!(!body.to_string().contains(&sha(&other)), "{body}");
    let (code, _) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 404);
    assert!(!uploads.join(&id).exists());

    // A sha256 declared at the start stands: a different one at `complete` changes
    // nothing, the same one completes.
    let (id, chunks) = create(&f.http, &other, size as u64, "digest");
    for n in 0..chunks - 1 {
        assert_eq!(put(&f.http, &id, n, chunk(&other, size, n)).0, 200);
    }
    let (code, body) = complete(&f.http, &id, &json!({"sha256": sha(&file)}).to_string());
    assert_eq!(
        (code, body["field"].as_str()),
        (422, Some("sha256")),
        "{body}"
    );
    let (code, body) = put(&f.http, &id, chunks - 1, chunk(&other, size, chunks - 1));
    assert_eq!(code, 200, "{body}");
    assert!(body["task"].is_string(), "{body}");
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 2);
}

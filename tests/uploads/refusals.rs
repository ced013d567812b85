//! Hostile input gets a clear 4xx and a full quota a 507, with nothing left behind.

use artex_testkit::http::Request;
use serde_json::{json, Value};

use crate::common::count;
use crate::common::procs::{Proc, FAST_WORKER};
use crate::common::TestDb;
use crate::{call, chunk, create, data, entries, fleet, put, setup, sha};

#[tokio::test]
async fn hostile_input_gets_a_clear_4xx_and_changes_nothing() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let good = |v: Value| {
        let mut base = json!({"size": 3000, "sha256": "a".repeat(64), "chunk_size": 1024,
                              "task": {"kind": "digest"}});
        for (k, x) in v.as_object().unwrap() {
            base[k] = x.clone();
        }
        base.to_string()
    };
    for bad in [
        json!({"size": -1}),
        json!({"size": 0}),
        json!({"size": 1u64 << 62}),
        json!({"chunk_size": 0}),
        json!({"chunk_size": 1u64 << 40}),
        json!({"sha256": "nope"}),
        json!({"name": "../../etc/passwd"}),
        json!({"name": "a/b"}),
        json!({"task": {"kind": "digest", "payload": "text"}}),
        json!({"task": {"kind": ""}}),
        json!({"path": "/tmp/x"}),
    ] {
        let (code, body) = call(
            &f.http,
            "POST",
            "/api/v1/uploads",
            &[],
            good(bad.clone()).as_bytes(),
        );
        assert!(
            (400..500).contains(&code) && body["error"].is_string(),
            "{bad}: {code} {body}"
        );
    }
    let (code, _) = call(&f.http, "POST", "/api/v1/uploads", &[], b"{not json");
    assert_eq!(code, 400);
    assert_eq!(entries(&uploads), 0, "a refused upload left something");

    // Chunks: out of range, larger than declared, shorter, without or with a bad hash,
    // an unknown or malformed id, no token.
    let file = data(3000, 3);
    let (id, _) = create(&f.http, &file, 1024, "digest");
    let one = chunk(&file, 1024, 0);
    for (n, bytes, hash, want) in [
        // A chunk this upload has not, and one shorter than the chunk: refused for the
        // upload's sake (422; they were 400, which called a request the document allows
        // malformed: schemathesis, issue 25).
        ("3", one.to_vec(), sha(one), 422),
        ("-1", one.to_vec(), sha(one), 400),
        ("99999999999999999999", one.to_vec(), sha(one), 400),
        ("0", [one, b"x"].concat(), sha(&[one, b"x"].concat()), 413),
        ("0", one[..10].to_vec(), sha(&one[..10]), 422),
        ("0", one.to_vec(), "zz".into(), 400),
        ("0", one.to_vec(), sha(b"other"), 422),
    ] {
        let (code, body) = call(
            &f.http,
            "PUT",
            &format!("/api/v1/uploads/{id}/chunks/{n}"),
            &[("Chunk-Sha256", &hash)],
            &bytes,
        );
        assert_eq!(code, want, "chunk {n}, {} bytes: {body}", bytes.len());
        assert!(body["error"].is_string(), "{body}");
    }
    for path in [
        "/api/v1/uploads/../../etc/chunks/0".to_string(),
        format!("/api/v1/uploads/{}/chunks/0", uuid::Uuid::new_v4()),
        "/api/v1/uploads/not-an-id/chunks/0".to_string(),
    ] {
        let (code, _) = call(&f.http, "PUT", &path, &[("Chunk-Sha256", &sha(one))], one);
        assert!((400..500).contains(&code), "{path}: {code}");
    }
    let (code, body) = call(
        &f.http,
        "POST",
        &format!("/api/v1/uploads/{id}/complete"),
        &[],
        b"",
    );
    assert_eq!(code, 409, "complete with chunks missing: {body}");
    // Without a token.
    let anonymous = Request::get(&format!("/api/v1/uploads/{id}"))
        .send(&f.http)
        .unwrap();
    assert_eq!(
        (anonymous.version.as_str(), anonymous.status),
        ("HTTP/1.1", 401),
        "{anonymous:?}"
    );

    let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 200);
    assert_eq!(state["received"], json!([]), "a refused chunk was kept");
    let mut folder: Vec<String> = std::fs::read_dir(uploads.join(&id))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folder.sort();
    assert_eq!(folder, ["lock", "meta.json"]);
    assert_eq!(count(&c, "select count(*) from artex.uploads").await, 0);
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);
    drop(f);
}

#[tokio::test]
async fn a_quota_too_small_gets_507_and_nothing_is_left() {
    let (_db, _dir, uploads, f) = setup(&["--upload-max-bytes", "5000"]).await;
    let file = data(3000, 5);
    let (_id, _) = create(&f.http, &file, 1024, "digest");
    // 3,000 of 5,000 reserved: another 3,000 does not fit.
    let (code, body) = call(
        &f.http,
        "POST",
        "/api/v1/uploads",
        &[],
        json!({"size": 3000, "sha256": sha(&file), "task": {"kind": "digest"}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(code, 507, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("--upload-max-bytes"));
    assert_eq!(entries(&uploads), 1, "the refused upload left something");
}

#[tokio::test]
async fn uploads_started_at_once_take_no_more_room_than_there_is() {
    let (_db, _dir, uploads, f) = setup(&["--upload-max-bytes", "10000"]).await;
    let file = data(3000, 5);
    let body = json!({"size": 3000, "sha256": sha(&file), "task": {"kind": "digest"}}).to_string();
    // Room for three of 3,000 bytes; twelve asked for at once.
    let starts: Vec<_> = (0..12)
        .map(|_| {
            let (http, body) = (f.http.clone(), body.clone());
            std::thread::spawn(move || {
                call(&http, "POST", "/api/v1/uploads", &[], body.as_bytes()).0
            })
        })
        .collect();
    let codes: Vec<u16> = starts.into_iter().map(|s| s.join().unwrap()).collect();
    let started = codes.iter().filter(|&&c| c == 201).count();
    assert_eq!(started, 3, "{codes:?}");
    assert_eq!(codes.iter().filter(|&&c| c == 507).count(), 9, "{codes:?}");
    assert_eq!(entries(&uploads), 3);
}

#[tokio::test]
async fn a_declaration_is_read_up_to_2_mib_and_refused_in_json_past_it() {
    let (_db, _dir, uploads, f) = setup(&[]).await;
    let declare = |note: usize| {
        let body = json!({"size": 3000, "task": {"kind": "digest",
                          "payload": {"note": "n".repeat(note)}}});
        call(
            &f.http,
            "POST",
            "/api/v1/uploads",
            &[],
            body.to_string().as_bytes(),
        )
    };
    // Past actix's default of 256 KiB for a buffered body: read all the same.
    let (code, body) = declare(300_000);
    assert_eq!(code, 201, "{body}");
    let (code, body) = declare(2 * 1024 * 1024);
    assert_eq!(
        (code, body["field"].as_str()),
        (413, Some("body")),
        "{body}"
    );
    assert!(
        body["error"].as_str().unwrap().contains("2097152"),
        "{body}"
    );
    assert_eq!(entries(&uploads), 1, "the refused upload left something");
}

/// `POST /api/v1/uploads` for a 3,000-byte file whose task is `task`.
fn start(http: &str, task: Value) -> (u16, Value) {
    let file = data(3000, 11);
    let body = json!({"size": 3000, "sha256": sha(&file), "name": "data.bin", "task": task});
    call(
        http,
        "POST",
        "/api/v1/uploads",
        &[],
        body.to_string().as_bytes(),
    )
}

#[tokio::test]
async fn a_task_no_worker_can_run_is_refused_before_any_byte_is_sent() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    // A typo: the upload would complete, and its task wait for a worker that never comes.
    let (code, body) = start(&f.http, json!({"kind": "digset"}));
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["field"], "task.kind", "{body}");
    let m = body["error"].as_str().unwrap();
    assert!(
        m.starts_with("task.kind: \"digset\" has never been declared by a worker")
            && m.contains("digest")
            && m.contains("allow_unregistered_kind"),
        "{m}"
    );
    assert_eq!(entries(&uploads), 0, "a refused upload left something");
    // Unless the task says its workers come later, as a submission may.
    let (code, body) = start(
        &f.http,
        json!({"kind": "digset", "allow_unregistered_kind": true}),
    );
    assert_eq!(code, 201, "{body}");
    assert_eq!(entries(&uploads), 1);
    drop(db);
}

#[tokio::test]
async fn a_payload_over_the_limit_is_refused_as_the_api_refuses_it() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    db.bb.operator().set_max_payload_bytes(400).await.unwrap();
    let (code, body) = start(
        &f.http,
        json!({"kind": "digest", "payload": {"s": "x".repeat(1000)}}),
    );
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["field"], "task.payload", "{body}");
    let m = body["error"].as_str().unwrap();
    assert!(m.contains("more than the limit of 400 bytes"), "{m}");
    // What counts is the task's payload as written: with the file named in it (some 170
    // bytes), 300 of the client's bytes do not fit under 400.
    let (code, body) = start(
        &f.http,
        json!({"kind": "digest", "payload": {"s": "x".repeat(300)}}),
    );
    assert_eq!(
        (code, &body["field"]),
        (422, &json!("task.payload")),
        "{body}"
    );
    assert_eq!(entries(&uploads), 0, "a refused upload left something");
    let (code, body) = start(
        &f.http,
        json!({"kind": "digest", "payload": {"s": "x".repeat(100)}}),
    );
    assert_eq!(code, 201, "{body}");
}

// Found by the soak (scripts/soak.sh): a chunk written to a disk that filled up was
// answered 500, as if the worker had failed, where the disk's own limit is the same
// refusal as `--upload-max-bytes`.
#[tokio::test]
async fn a_disk_that_fills_up_gets_507_not_500() {
    let db = crate::common::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let _disk = artex_testkit::disk::SmallDisk::mount(&uploads, "1m");
    let f = fleet(&db, &uploads, &[]).await;
    // 3 MiB declared (well within the worker's quota) on a 1 MiB disk.
    let file = data(3 * 1024 * 1024, 9);
    let (id, chunks) = create(&f.http, &file, 512 * 1024, "digest");
    let mut refused = None;
    for n in 0..chunks {
        let (code, body) = put(&f.http, &id, n, chunk(&file, 512 * 1024, n));
        if code != 200 && code != 201 {
            refused = Some((code, body));
            break;
        }
    }
    let (code, body) = refused.expect("a 3 MiB upload fitted on a 1 MiB disk");
    assert_eq!(code, 507, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("disk is full"),
        "{body}"
    );
    assert_eq!(
        count(&db.client().await, "select count(*) from artex.tasks").await,
        0
    );
}

// Found by the upload fuzz (issue 25): a chunk sent again with other bytes (and their
// true hash) was acknowledged though nothing was written, telling the client they were
// stored. A chunk is kept as first received: the same bytes again are 200, others 409,
// before and after the upload finished, and the file stays the first bytes.
#[tokio::test]
async fn a_chunk_sent_again_with_other_bytes_is_409_and_the_first_bytes_stay() {
    let (db, _dir, _uploads, f) = setup(&[]).await;
    let file = data(3000, 4);
    let (id, chunks) = create(&f.http, &file, 1024, "digest");
    assert_eq!(chunks, 3);
    let first = chunk(&file, 1024, 0);
    let mut other = first.to_vec();
    other[17] ^= 0x40;
    let (code, body) = put(&f.http, &id, 0, first);
    assert_eq!(code, 200, "{body}");
    let (code, body) = put(&f.http, &id, 0, first);
    assert_eq!(code, 200, "the same bytes again: {body}");
    let (code, body) = put(&f.http, &id, 0, &other);
    assert_eq!(code, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("chunk 0 is stored already") && error.contains(&sha(first)),
        "{error}"
    );
    let mut task = None;
    for n in 1..chunks {
        let (code, body) = put(&f.http, &id, n, chunk(&file, 1024, n));
        assert_eq!(code, 200, "chunk {n}: {body}");
        task = body["task"].as_str().map(String::from);
    }
    let task = uuid::Uuid::parse_str(&task.expect("the last chunk wrote the task")).unwrap();
    // Finished: the whole file answers for its chunks.
    let (code, body) = put(&f.http, &id, 0, &other);
    assert_eq!(code, 409, "{body}");
    let (code, body) = put(&f.http, &id, 0, first);
    assert_eq!(code, 200, "{body}");
    let wait = std::time::Duration::from_secs(30);
    crate::common::procs::wait_status(&db.bb, task, "succeeded", wait).await;
    let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
    assert_eq!(result["sha256"], sha(&file), "the file is the first bytes");
}

/// A worker given an upload folder others can enter stops at once with a message naming
/// it and what is wrong: not registered (no worker row left behind to look online until
/// its heartbeat lapses), and without a panic as it goes.
#[tokio::test]
async fn a_worker_refuses_an_upload_folder_others_can_enter_before_it_registers() {
    use std::os::unix::fs::PermissionsExt;
    let db = TestDb::new().await;
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join("open");
    std::fs::create_dir(&folder).unwrap();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut args = vec!["worker", "--upload-dir", folder.to_str().unwrap()];
    args.extend(FAST_WORKER);
    let mut p = Proc::start("worker", &db.url, &args, &[]);
    let status = p
        .wait_exit(std::time::Duration::from_secs(30))
        .expect("the worker stops");
    assert!(!status.success(), "{status:?}");
    let log = p.log_text();
    assert!(
        log.contains(&format!("upload folder {} refused", folder.display()))
            && log.contains("mode 0755 gives group or others access"),
        "the message names the folder and what is wrong: {log}"
    );
    assert!(!log.contains("panicked"), "it stops without a panic: {log}");
    let c = db.client().await;
    assert_eq!(count(&c, "select count(*) from artex.workers").await, 0);
}

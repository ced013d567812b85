//! How long an upload's folder lives: an abandoned upload expires (and frees its room
//! under `--upload-max-bytes`) while one still receiving chunks does not; a file outlives
//! its task by `--upload-keep-ms`; on an `--upload-shared` folder the task is bound to no
//! host, and a worker on another host runs it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::procs::{wait_for, wait_status, with_defaults, worker_http, Proc, FAST_WORKER};
use crate::common::{fixtures, TestDb};
use crate::{call, chunk, create, data, entries, fleet, put, send_all, setup, sha, token_file};

/// What the row of upload `id` says: its state, and seconds from its task's end to the
/// file's deletion (None while not deleted).
async fn row_state(c: &tokio_postgres::Client, id: &str) -> Option<(String, Option<f64>)> {
    let id = uuid::Uuid::parse_str(id).unwrap();
    let r = c
        .query_opt(
            "select u.state, extract(epoch from
                        u.deleted_at - coalesce(t.finished_at, t.updated_at))::float8
             from artex.uploads u join artex.tasks t on t.id = u.task_id
             where u.id = $1",
            &[&id],
        )
        .await
        .unwrap()?;
    Some((r.get(0), r.get(1)))
}

/// Waits until the row of upload `id` says `deleted`; returns the seconds from its task's
/// end to the deletion.
async fn wait_deleted(c: &tokio_postgres::Client, id: &str) -> f64 {
    wait_for(
        "the file to be deleted",
        Duration::from_secs(20),
        || async {
            match row_state(c, id).await {
                Some((state, after)) if state == "deleted" => after,
                _ => None,
            }
        },
    )
    .await
}

#[tokio::test]
async fn an_abandoned_upload_expires_and_frees_its_room_but_an_active_one_stays() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let expire = Duration::from_millis(1000);
    // Room for one upload of 13 KiB, not two.
    let f = fleet(
        &db,
        &uploads,
        &["--upload-expire-ms", "1000", "--upload-max-bytes", "20000"],
    )
    .await;
    let file = data(13 * 1024, 43);
    let (id, chunks) = create(&f.http, &file, 1024, "digest");
    assert_eq!(chunks, 13);
    let again = || {
        call(
            &f.http,
            "POST",
            "/api/v1/uploads",
            &[],
            json!({"size": file.len(), "sha256": sha(&file), "chunk_size": 1024,
                   "task": {"kind": "digest"}})
            .to_string()
            .as_bytes(),
        )
    };
    let (code, body) = again();
    assert_eq!(code, 507, "a second upload while the first is live: {body}");

    // A chunk every 200 ms for more than twice the expiry: still receiving, kept.
    let started = Instant::now();
    let mut last_put = started;
    for n in 0..chunks - 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last_put = Instant::now();
        let (code, body) = put(&f.http, &id, n, chunk(&file, 1024, n));
        assert_eq!(code, 200, "chunk {n}, {:?} in: {body}", started.elapsed());
    }
    assert!(started.elapsed() >= 2 * expire);
    let (code, state) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 200, "{state}");
    assert_eq!(state["state"], "receiving");
    assert_eq!(state["missing"], json!([chunks - 1]));
    let (code, body) = again();
    assert_eq!(code, 507, "{body}");

    // Left alone with its last chunk missing: the sweep removes it, not before it has
    // been idle for the expiry.
    wait_for("the upload to expire", Duration::from_secs(10), || async {
        (!uploads.join(&id).exists()).then_some(())
    })
    .await;
    let idle = last_put.elapsed();
    assert!(idle >= expire, "removed after {idle:?} idle");
    let (code, body) = call(&f.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 404, "{body}");
    // A late chunk does not bring it back.
    let (code, body) = put(&f.http, &id, chunks - 1, chunk(&file, 1024, chunks - 1));
    assert_eq!(code, 404, "{body}");
    assert_eq!(entries(&uploads), 0);
    // Its room is free again.
    let (code, body) = again();
    assert_eq!(code, 201, "a second upload once the first expired: {body}");
}

#[tokio::test]
async fn a_file_outlives_its_task_by_the_keep_time_then_goes() {
    let (db, _dir, uploads, f) = setup(&["--upload-keep-ms", "3000"]).await;
    let c = db.client().await;
    let file = data(5000, 47);
    let (id, _) = create(&f.http, &file, 1024, "digest");
    let task = send_all(&f.http, &id, &file, 1024);
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;

    // Its task ended: the file is still there, the row says so.
    let whole = uploads.join(&id).join("file");
    assert!(whole.is_file(), "{} is gone", whole.display());
    assert_eq!(row_state(&c, &id).await, Some(("complete".into(), None)));
    // Then it goes, no sooner than it was asked to stay.
    let after = wait_deleted(&c, &id).await;
    assert!(after >= 3.0, "deleted {after} s after its task ended");
    assert!(!uploads.join(&id).exists());
    assert_eq!(entries(&uploads), 0);
}

#[tokio::test]
async fn files_of_another_folder_on_this_host_keep_none_of_this_folders_from_going() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let host: String = c
        .query_one(
            "select host from artex.workers where pid = $1",
            &[&f.worker.pid()],
        )
        .await
        .unwrap()
        .get(0);
    // A hundred files another worker of this host received in its own folder, their
    // tasks ended, that worker gone for good: not this worker's to delete, and
    // older than anything this one receives.
    for _ in 0..100 {
        let task = fixtures::task(&db.bb, "digest").await;
        fixtures::cancel(&db.bb, task).await;
        let id = uuid::Uuid::now_v7();
        fixtures::raw::upload(&c, id, &host, &format!("/another/folder/{id}/file"), task).await;
    }
    let file = data(3000, 59);
    let (id, _) = create(&f.http, &file, 1024, "digest");
    let task = send_all(&f.http, &id, &file, 1024);
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
    wait_deleted(&c, &id).await;
    assert!(!uploads.join(&id).exists());
    assert_eq!(
        crate::common::count(
            &c,
            "select count(*) from artex.uploads where state = 'complete'"
        )
        .await,
        100,
        "another folder's rows are that folder's worker's"
    );
}

/// `artex worker` as [`Proc::worker`] starts it, on a host of its own name: a UTS
/// namespace whose hostname is `host` (what the worker records as its host). Needs
/// root, as the fleet tests do; `unshare` execs `sh`, which execs artex: the pid is
/// artex's.
fn worker_on_host(host: &str, name: &str, url: &str, extra: &[&str]) -> Proc {
    Proc::start_via(
        &[
            "unshare",
            "--uts",
            "sh",
            "-c",
            "hostname \"$0\" && exec \"$@\"",
            host,
        ],
        name,
        url,
        &with_defaults("worker", FAST_WORKER, extra),
        &[],
    )
}

#[tokio::test]
async fn a_shared_uploads_task_is_bound_to_no_host_and_runs_on_another() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let folder = uploads.to_str().unwrap();
    let (_t, token) = token_file();
    // A takes the upload but runs no `digest`; B, on another host, runs it. Both sweep
    // the folder: were B's sweep to find the whole file before A recorded it, it would
    // record it for host-a all the same (its `meta.json` names the host that took it).
    let a = worker_on_host(
        "host-a",
        "uploads-a",
        &db.url,
        &[
            "--write-token-file",
            &token,
            "--kinds",
            "echo",
            "--upload-dir",
            folder,
            "--upload-shared",
            "--upload-sweep-ms",
            "100",
        ],
    );
    let b = worker_on_host(
        "host-b",
        "uploads-b",
        &db.url,
        &[
            "--kinds",
            "digest",
            "--upload-dir",
            folder,
            "--upload-shared",
            "--upload-sweep-ms",
            "100",
        ],
    );
    let _planner = Proc::planner("uploads-planner", &db.url, &[]);
    let http = worker_http(&c, &a).await;
    worker_http(&c, &b).await;
    let host_of = |pid: i32| {
        let c = &c;
        async move {
            c.query_one(
                "select host from artex.workers where pid = $1 and state = 'online'",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
        }
    };
    assert_eq!(host_of(a.pid()).await, "host-a");
    assert_eq!(host_of(b.pid()).await, "host-b");

    let file = data(10_000, 53);
    let (id, _) = create(&http, &file, 1024, "digest");
    let task = send_all(&http, &id, &file, 1024);
    let row = c
        .query_one(
            "select t.host, u.host, u.shared from artex.tasks t
             join artex.uploads u on u.task_id = t.id where t.id = $1",
            &[&task],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0), None, "the task's host");
    assert_eq!(row.get::<_, String>(1), "host-a", "the upload's host");
    assert!(row.get::<_, bool>(2), "the upload is shared");

    // B reads the file A received, whole.
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
    let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
    assert_eq!(result["sha256"], sha(&file));
    assert_eq!(result["matches"], true);
    assert_eq!(result["pid"], b.pid());
    assert_eq!(result["host"], "host-b");
    // Then it goes, at once (no --upload-keep-ms).
    let after = wait_deleted(&c, &id).await;
    assert!(after < 3.0, "deleted {after} s after its task ended");
    assert!(!Path::new(folder).join(&id).exists());
    assert_eq!(entries(&uploads), 0);
}

//! Deployments on one host keep their uploads apart (issue 25): two blackboards' workers
//! started as one user with the default `--upload-dir` each finish, run and sweep only
//! their own uploads; an `--upload-dir` given to two blackboards keeps each upload with
//! its own; and workers of one blackboard sharing its folder finish one upload once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::procs::{wait_for, wait_status, with_defaults, worker_http, Proc, FAST_WORKER};
use crate::common::{count, TestDb};
use crate::{call, chunk, create, data, fleet, put, send_all, sha, token_file};

/// A worker on `db` with the default upload folder (no `--upload-dir`), its `$TMPDIR`
/// being `tmp`; `extra`: further flags.
fn default_worker(name: &str, db: &TestDb, tmp: &Path, token: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--write-token-file", token, "--upload-sweep-ms", "100"];
    args.extend_from_slice(extra);
    Proc::start(
        name,
        &db.url,
        &with_defaults("worker", FAST_WORKER, &args),
        &[("TMPDIR", tmp.to_str().unwrap())],
    )
}

/// The upload ids recorded in `db`.
async fn recorded(db: &TestDb) -> Vec<String> {
    db.client()
        .await
        .query("select id::text from artex.uploads order by id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The upload folders in `dir` (folders named by an upload id).
fn uploads_in(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| uuid::Uuid::parse_str(n).is_ok())
        .collect();
    ids.sort();
    ids
}

/// `db`'s blackboard id, as its workers read it.
async fn blackboard_id(db: &TestDb) -> uuid::Uuid {
    db.client()
        .await
        .query_one("select id from artex.blackboard", &[])
        .await
        .unwrap()
        .get(0)
}

/// The default upload folder of blackboard `id` under `tmp`.
fn default_folder(tmp: &Path, id: uuid::Uuid) -> PathBuf {
    tmp.join(format!("artex-uploads-{}-{id}", nix::unistd::geteuid()))
}

#[tokio::test]
async fn two_deployments_on_one_host_with_default_folders_never_take_each_others_uploads() {
    let tmp = tempfile::tempdir().unwrap();
    let (_token_dir, token) = token_file();
    let (a, b) = (TestDb::new().await, TestDb::new().await);
    // Files outlive their tasks by 2 s: time enough for a sweeper that took other
    // deployments' whole files (as before issue 25) to find them.
    let keep = ["--upload-keep-ms", "2000"];
    let wa = default_worker("worker-a", &a, tmp.path(), &token, &keep);
    let wb = default_worker("worker-b", &b, tmp.path(), &token, &keep);
    let _pa = Proc::planner("planner-a", &a.url, &[]);
    let _pb = Proc::planner("planner-b", &b.url, &[]);
    let http_a = worker_http(&a.client().await, &wa).await;
    let http_b = worker_http(&b.client().await, &wb).await;
    let size = 4096;
    let (file_a, file_b) = (data(3 * size + 100, 1), data(2 * size + 7, 2));
    // Both at once.
    let sending = [(http_a, file_a.clone()), (http_b, file_b.clone())].map(|(http, file)| {
        std::thread::spawn(move || {
            let (id, _) = create(&http, &file, size as u64, "digest");
            let task = send_all(&http, &id, &file, size);
            (id, task)
        })
    });
    let [(up_a, task_a), (up_b, task_b)] = sending.map(|t| t.join().unwrap());
    for (db, task, file) in [(&a, task_a, &file_a), (&b, task_b, &file_b)] {
        wait_status(&db.bb, task, "succeeded", Duration::from_secs(60)).await;
        let result = db.bb.operator().task(task).await.unwrap().result.unwrap();
        assert_eq!(result["sha256"], sha(file));
        assert_eq!(result["matches"], true);
    }
    // Each upload's file deleted by its own sweeper, once its own task ended…
    for (db, up) in [(&a, &up_a), (&b, &up_b)] {
        let id = uuid::Uuid::parse_str(up).unwrap();
        wait_for("the file to be swept", Duration::from_secs(30), || async {
            let row = db.bb.worker().upload(id).await.unwrap()?;
            (row.state == "deleted").then_some(())
        })
        .await;
    }
    // …and each blackboard recorded its own upload and ran its own task, once: none of
    // the other's.
    assert_eq!(recorded(&a).await, vec![up_a.clone()]);
    assert_eq!(recorded(&b).await, vec![up_b.clone()]);
    for db in [&a, &b] {
        let c = db.client().await;
        assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1);
    }
    // Each kept its uploads in a folder of its own, and never named the other's.
    let (id_a, id_b) = (blackboard_id(&a).await, blackboard_id(&b).await);
    assert_ne!(id_a, id_b, "two databases, two blackboards");
    let (dir_a, dir_b) = (
        default_folder(tmp.path(), id_a),
        default_folder(tmp.path(), id_b),
    );
    assert!(dir_a.is_dir() && dir_b.is_dir(), "{dir_a:?} {dir_b:?}");
    assert_eq!(uploads_in(&dir_a), Vec::<String>::new(), "swept");
    assert_eq!(uploads_in(&dir_b), Vec::<String>::new(), "swept");
    assert!(
        !wa.log_text().contains(&up_b),
        "worker a touched b's upload"
    );
    assert!(
        !wb.log_text().contains(&up_a),
        "worker b touched a's upload"
    );
}

#[tokio::test]
async fn workers_of_one_blackboard_sharing_its_folder_finish_an_upload_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (_token_dir, token) = token_file();
    let db = TestDb::new().await;
    let w1 = default_worker("worker-1", &db, tmp.path(), &token, &[]);
    let w2 = default_worker("worker-2", &db, tmp.path(), &token, &[]);
    let _planner = Proc::planner("planner", &db.url, &[]);
    let c = db.client().await;
    let (h1, h2) = (worker_http(&c, &w1).await, worker_http(&c, &w2).await);
    let size = 4096;
    let file = data(6 * size, 3);
    let (id, chunks) = create(&h1, &file, size as u64, "digest");
    // All but the last two chunks, to either worker: they share the folder.
    for n in 0..chunks - 2 {
        let http = if n % 2 == 0 { &h1 } else { &h2 };
        let (code, body) = put(http, &id, n, chunk(&file, size, n));
        assert_eq!(code, 200, "chunk {n}: {body}");
    }
    // The last two at once, one to each: both find nothing missing and finish.
    let last = [(h1.clone(), chunks - 2), (h2.clone(), chunks - 1)].map(|(http, n)| {
        let (id, bytes) = (id.clone(), chunk(&file, size, n).to_vec());
        std::thread::spawn(move || put(&http, &id, n, &bytes))
    });
    for t in last {
        let (code, body) = t.join().unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let task = wait_for("the task", Duration::from_secs(20), || async {
        let id = uuid::Uuid::parse_str(&id).unwrap();
        db.bb.worker().upload(id).await.ok()?.map(|r| r.task)
    })
    .await;
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(60)).await;
    let id_uuid = uuid::Uuid::parse_str(&id).unwrap();
    wait_for("the file to be swept", Duration::from_secs(30), || async {
        let row = db.bb.worker().upload(id_uuid).await.unwrap()?;
        (row.state == "deleted").then_some(())
    })
    .await;
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 1);
    // Sealed and recorded by one of them; the other found it done.
    let logs = [w1.log_text(), w2.log_text()];
    let finished: usize = logs
        .iter()
        .map(|l| l.matches("upload complete; task submitted").count())
        .sum();
    assert_eq!(finished, 1, "{logs:?}");
    for l in &logs {
        assert!(!l.contains("sweeping uploads"), "a sweep failed: {l}");
    }
    let dir = default_folder(tmp.path(), blackboard_id(&db).await);
    assert_eq!(uploads_in(&dir), Vec::<String>::new());
}

#[tokio::test]
async fn an_upload_dir_given_to_two_blackboards_keeps_each_uploads_with_its_own() {
    let (a, b) = (TestDb::new().await, TestDb::new().await);
    let dir = tempfile::tempdir().unwrap();
    let uploads = dir.path().join("uploads");
    let keep = ["--upload-keep-ms", "2000"];
    let fa = fleet(&a, &uploads, &keep).await;
    let fb = fleet(&b, &uploads, &keep).await;
    let size = 4096;
    let file = data(2 * size + 5, 4);
    let (id, _) = create(&fa.http, &file, size as u64, "digest");
    // Half sent: b's worker does not resume it, nor say how far it is.
    let (code, body) = put(&fa.http, &id, 0, chunk(&file, size, 0));
    assert_eq!(code, 200, "{body}");
    let (code, body) = put(&fb.http, &id, 1, chunk(&file, size, 1));
    assert_eq!(code, 404, "{body}");
    let (code, body) = call(&fb.http, "GET", &format!("/api/v1/uploads/{id}"), &[], b"");
    assert_eq!(code, 404, "{body}");
    let task = send_all(&fa.http, &id, &file, size);
    wait_status(&a.bb, task, "succeeded", Duration::from_secs(60)).await;
    let up = uuid::Uuid::parse_str(&id).unwrap();
    wait_for("the file to be swept", Duration::from_secs(30), || async {
        let row = a.bb.worker().upload(up).await.unwrap()?;
        (row.state == "deleted").then_some(())
    })
    .await;
    // b's sweeper saw the whole file for two seconds and more, and left it to a.
    assert_eq!(recorded(&a).await, vec![id.clone()]);
    assert_eq!(recorded(&b).await, Vec::<String>::new());
    assert_eq!(
        count(&b.client().await, "select count(*) from artex.tasks").await,
        0
    );
    assert!(
        fb.worker
            .log_text()
            .contains("upload of another blackboard in this folder: left alone"),
        "b says why it leaves the upload alone"
    );
}

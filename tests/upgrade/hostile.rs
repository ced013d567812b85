//! Hostile bundles and bad callers are refused and change nothing; a stalled upload is
//! cut and frees the upgrade slot.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use artex_testkit::http::{Ended, Exchange, Request};
use serde_json::Value;

use crate::common;
use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{http_get, wait_for, worker_http, Proc};
use crate::common::TestDb;
use crate::{curl_upgrade, upgradable_worker, wait_gone, KillAll};

/// Writes a ZIP with the given (name, data, unix mode) entries, stored (no compression)
/// unless `deflate`.
fn write_zip(path: &Path, entries: &[(&str, Vec<u8>, u32)], deflate: bool) {
    use zip::write::SimpleFileOptions;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, data, mode) in entries {
        let method = if deflate {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        let opts = SimpleFileOptions::default()
            .compression_method(method)
            .unix_permissions(*mode);
        z.start_file(*name, opts).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

fn read_zip_entry(path: &Path, name: &str) -> Vec<u8> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut e = z.by_name(name).unwrap();
    let mut v = Vec::new();
    e.read_to_end(&mut v).unwrap();
    v
}

#[tokio::test]
async fn hostile_bundles_and_bad_callers_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let w = upgradable_worker("worker", &db.url, &keys, &[], &[]);
    let http = worker_http(&c, &w).await;
    let good = keys.variant_bundle(1).0;
    let manifest = read_zip_entry(&good, "manifest.json");
    let sig = read_zip_entry(&good, "manifest.sig");
    let binary = std::fs::read(keys.path("artex-v1")).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let escape = format!("artex-escape-{}", uuid::Uuid::new_v4().simple());

    // Auth first: nothing is read without the token.
    assert_eq!(curl_upgrade(&http, &good, None, false).0, 401);
    assert_eq!(curl_upgrade(&http, &good, Some("wrong"), false).0, 401);

    let mut cases: Vec<(&str, PathBuf)> = Vec::new();
    let mk = |name: &str| scratch.path().join(format!("{name}.zip"));
    let p = mk("not-a-zip");
    std::fs::write(&p, b"this is not a zip file at all").unwrap();
    cases.push(("not a zip", p));
    let p = mk("absolute");
    write_zip(
        &p,
        &[
            ("manifest.json", manifest.clone(), 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            (&format!("/tmp/{escape}"), b"x".to_vec(), 0o755),
        ],
        false,
    );
    cases.push(("absolute path", p));
    let p = mk("dotdot");
    write_zip(
        &p,
        &[
            ("manifest.json", manifest.clone(), 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            (&format!("../../{escape}"), b"x".to_vec(), 0o755),
        ],
        false,
    );
    cases.push(("parent path", p));
    let p = mk("symlink");
    {
        use zip::write::SimpleFileOptions;
        let mut z = zip::ZipWriter::new(std::fs::File::create(&p).unwrap());
        z.start_file("manifest.json", SimpleFileOptions::default())
            .unwrap();
        z.write_all(&manifest).unwrap();
        z.start_file("manifest.sig", SimpleFileOptions::default())
            .unwrap();
        z.write_all(&sig).unwrap();
        z.add_symlink("artex", "/etc/passwd", SimpleFileOptions::default())
            .unwrap();
        z.finish().unwrap();
    }
    cases.push(("symlink", p));
    let p = mk("duplicate");
    write_zip(
        &p,
        &[
            ("manifest.json", manifest.clone(), 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            ("artex", binary.clone(), 0o755),
            ("artey", b"#!/bin/sh\nexit 0\n".to_vec(), 0o755),
        ],
        false,
    );
    let mut bytes = std::fs::read(&p).unwrap();
    // Rename "artey" to "artex" in the local header and the central directory alike.
    for i in 0..bytes.len().saturating_sub(5) {
        if &bytes[i..i + 5] == b"artey" {
            bytes[i + 4] = b'x';
        }
    }
    std::fs::write(&p, bytes).unwrap();
    cases.push(("duplicate entry", p));
    let p = mk("many");
    let many: Vec<(String, Vec<u8>, u32)> = (0..10_000)
        .map(|i| (format!("f{i}"), Vec::new(), 0o644))
        .collect();
    let many_refs: Vec<(&str, Vec<u8>, u32)> = many
        .iter()
        .map(|(n, d, m)| (n.as_str(), d.clone(), *m))
        .collect();
    write_zip(&p, &many_refs, false);
    cases.push(("too many entries", p));
    let p = mk("bomb");
    write_zip(
        &p,
        &[
            ("manifest.json", manifest.clone(), 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            ("artex", vec![0u8; 40 * 1024 * 1024], 0o755),
        ],
        true,
    );
    cases.push(("zip bomb", p));
    let p = mk("tampered");
    write_zip(
        &p,
        &[
            ("manifest.json", manifest.clone(), 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            ("artex", b"#!/bin/sh\necho evil\n".to_vec(), 0o755),
        ],
        false,
    );
    cases.push(("binary not the signed one", p));
    let p = mk("forged");
    let mut forged = manifest.clone();
    let text = String::from_utf8(forged.clone())
        .unwrap()
        .replace("0.1.0-v1", "9.9.9-forged");
    forged = text.into_bytes();
    write_zip(
        &p,
        &[
            ("manifest.json", forged, 0o644),
            ("manifest.sig", sig.clone(), 0o644),
            ("artex", binary.clone(), 0o755),
        ],
        false,
    );
    cases.push(("manifest not the signed one", p));
    let other = Keys::new();
    cases.push(("signed by another key", other.variant_bundle(7).0));

    for (what, bundle) in &cases {
        let (code, body) = curl_upgrade(&http, bundle, Some(TOKEN), false);
        assert_eq!(code, 400, "{what}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or("")
                .starts_with("bundle refused"),
            "{what}: {body}"
        );
        // Nothing left in the upgrade folder, nothing escaped it.
        let left: Vec<_> = std::fs::read_dir(keys.path("upgrades")).unwrap().collect();
        assert!(left.is_empty(), "{what}: left behind {left:?}");
        for dir in [
            PathBuf::from("/tmp"),
            keys.path(""),
            keys.path("upgrades/.."),
        ] {
            assert!(
                !dir.join(&escape).exists(),
                "{what}: wrote {escape} into {}",
                dir.display()
            );
        }
        let (code, health) = http_get(&http, "/health").unwrap();
        assert_eq!(code, 200, "{what}: {health}");
        assert!(
            health.contains(&format!("\"pid\":{}", w.pid())),
            "{what}: {health}"
        );
    }

    // The same build as the one running: 200, nothing done.
    let same = keys
        .bundle_of(Path::new(common::artex_bin()), "same", "same.zip")
        .0;
    let (code, body) = curl_upgrade(&http, &same, Some(TOKEN), false);
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("unchanged")),
        "{body}"
    );

    // A second upgrade while one runs: 409.
    let slow = keys.script_bundle("slow", "#!/bin/sh\nexec sleep 60\n");
    let (http2, slow2) = (http.clone(), slow.clone());
    let first = std::thread::spawn(move || curl_upgrade(&http2, &slow2, Some(TOKEN), false));
    wait_for(
        "the first upgrade to be under way",
        Duration::from_secs(10),
        || {
            let dir = keys.path("upgrades");
            async move { (std::fs::read_dir(dir).ok()?.count() > 0).then_some(()) }
        },
    )
    .await;
    let (code, body) = curl_upgrade(&http, &good, Some(TOKEN), false);
    assert_eq!(code, 409, "{body}");
    let (code, _) = first.join().unwrap();
    assert_eq!(code, 500, "the never-ready bundle rolls back");
}

/// A PUT /upgrade that declares `declared` bytes and sends only `sent`, then waits for
/// the answer (up to `wait`): (status code, JSON body, the exchange, its socket still
/// open). Not `Connection: close`: the server must close of its own accord.
fn stalled_upload(
    addr: &str,
    declared: usize,
    sent: usize,
    wait: Duration,
) -> (u16, Value, Exchange) {
    let mut s = Request::new("PUT", "/upgrade")
        .keep_alive()
        .bearer(TOKEN)
        .header("Content-Type", "application/zip")
        .length(declared)
        .start(addr)
        .unwrap();
    s.write(&vec![b'P'; sent]).unwrap();
    s.set_timeout(wait).unwrap();
    // Until the server closes (it must: the rest of the body will never come) or `wait`.
    let r = match s.response() {
        Ok(r) if matches!(r.ended, Ended::Closed) => r,
        Ok(r) => panic!("no close of the stalled upload within {wait:?}: {r:?}"),
        Err(e) => panic!("no answer to the stalled upload within {wait:?}: {e}"),
    };
    let body = serde_json::from_slice(&r.body).unwrap_or_else(|_| Value::String(format!("{r:?}")));
    (r.status, body, s)
}

#[tokio::test]
async fn a_stalled_upload_is_cut_frees_the_slot_and_a_form_upload_follows() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &["--upgrade-body-timeout-ms", "1000"],
        &[],
    );
    let http = worker_http(&c, &w).await;

    // Declares 1 MB, sends 100 bytes, stalls: cut by the 1 s body timeout. (Before, the
    // connection hung for a minute, holding the upgrade slot.) 30 s is only how long the
    // test waits for any answer at all.
    let (code, body, _socket) = stalled_upload(&http, 1_000_000, 100, Duration::from_secs(30));
    assert_eq!(code, 408, "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains("stalled") && error.contains("after 100 bytes"),
        "{body}"
    );
    // Its folder is gone with it.
    let left: Vec<_> = std::fs::read_dir(keys.path("upgrades")).unwrap().collect();
    assert!(left.is_empty(), "the cut upload left {left:?}");

    // A form without a file part is refused, and changes nothing either.
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-F", "note=no file here"])
        .arg(format!("http://{http}/upgrade"))
        .current_dir(scratch.path())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "400");

    // The slot is free: a real upgrade, sent as a multipart form, goes through.
    let bundle = keys.variant_bundle(1).0;
    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), true);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "upgraded", "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    let status = w
        .wait_exit(Duration::from_secs(30))
        .expect("the old worker drains");
    assert!(status.success(), "{status:?}");
    let (_, status) = http_get(&http, "/status").unwrap();
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pid"], new, "{status}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(new, Duration::from_secs(30)).await;
}

//! Hot upgrade with real binaries, real curl and real load: five upgrades in a row under
//! continuous HTTP and task traffic, rollbacks of broken bundles, hostile bundles,
//! authentication and the systemd notifications.

mod common;

use common::count;

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use artex_actors::blackboard::NewTask;
use common::bundles::{Keys, TOKEN};
use common::procs::{
    alive, fd_count, http_get, wait_for, wait_status, worker_http, Proc, FAST_WORKER,
};
use common::TestDb;
use serde_json::{json, Value};

/// `curl -T BUNDLE` (or a multipart form) to /upgrade; (HTTP code, JSON body).
fn curl_upgrade(addr: &str, bundle: &Path, token: Option<&str>, multipart: bool) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    if multipart {
        cmd.arg("-F").arg(format!("bundle=@{}", bundle.display()));
    } else {
        cmd.arg("-T").arg(bundle);
    }
    let out = cmd
        .arg(format!("http://{addr}/upgrade"))
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code: u16 = code.trim().parse().unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    (code, body)
}

/// A worker with upgrades enabled.
fn upgradable_worker(
    name: &str,
    url: &str,
    keys: &Keys,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let mut args: Vec<String> = vec!["worker".into()];
    args.extend(FAST_WORKER.iter().map(|s| s.to_string()));
    args.extend(keys.flags("upgrades"));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::start(name, url, &args, env)
}

/// HTTP load from separate processes: `n` shell loops, each one curl (one connection) per
/// request to /health and /status, recording every status code.
struct Load {
    loops: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Load {
    fn start(addr: &str, n: usize) -> Load {
        let dir = tempfile::tempdir().unwrap();
        let stop = dir.path().join("stop");
        let loops = (0..n)
            .map(|i| {
                let out = dir.path().join(format!("codes-{i}"));
                let script = format!(
                    "while [ ! -e '{stop}' ]; do \
                       for p in health status; do \
                         curl -s -o /dev/null --max-time 10 -H 'Authorization: Bearer {token}' -w '%{{http_code}} %{{errormsg}}\\n' http://{addr}/$p >> '{out}'; \
                       done; \
                     done",
                    stop = stop.display(),
                    out = out.display(),
                    token = common::READ_TOKEN
                );
                Command::new("bash")
                    .arg("-c")
                    .arg(script)
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Load { loops, dir }
    }

    /// Stops the loops; (requests answered 200, every other outcome as code → count).
    fn stop(mut self) -> (usize, Vec<(String, usize)>) {
        std::fs::write(self.dir.path().join("stop"), b"").unwrap();
        for l in &mut self.loops {
            let _ = l.wait();
        }
        let mut ok = 0;
        let mut bad: std::collections::BTreeMap<String, usize> = Default::default();
        for i in 0..self.loops.len() {
            let text = std::fs::read_to_string(self.dir.path().join(format!("codes-{i}")))
                .unwrap_or_default();
            for code in text.lines() {
                if code.trim() == "200" {
                    ok += 1;
                } else {
                    *bad.entry(code.to_string()).or_default() += 1;
                }
            }
        }
        (ok, bad.into_iter().collect())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for l in &mut self.loops {
            let _ = l.kill();
            let _ = l.wait();
        }
    }
}

/// Generations after the first are not the test's children: end them even if the test
/// fails midway.
struct KillAll(Vec<i32>);

impl Drop for KillAll {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

async fn wait_gone(pid: i32, timeout: Duration) {
    wait_for(&format!("pid {pid} to exit"), timeout, || async move {
        (!alive(pid)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn five_upgrades_under_load_refuse_nothing_and_lose_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let bundles: Vec<PathBuf> = keys.variant_bundles(5).into_iter().map(|b| b.0).collect();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &[], &[]);
    let http = worker_http(&c, &gen0).await;

    // A long resumable task that must cross all five upgrades, every step once.
    let long = db
        .bb
        .submit(
            &NewTask::new("checkpoint", json!({ "steps": 100, "ms": 250 })),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, long, "running", Duration::from_secs(20)).await;

    let load = Load::start(&http, 4);
    // Continuous task traffic while the upgrades run.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let bb = db.bb.clone();
    let traffic = tokio::spawn(async move {
        let mut submitted = 0usize;
        loop {
            let batch: Vec<NewTask> = (0..5)
                .map(|i| NewTask::new("echo", json!({ "i": i })))
                .collect();
            bb.submit_many(&batch, "traffic").await.unwrap();
            submitted += 5;
            tokio::select! {
                _ = &mut stop_rx => return submitted,
                _ = tokio::time::sleep(Duration::from_millis(40)) => {}
            }
        }
    });
    // Measure the first generation's descriptors once traffic flows through it.
    wait_for("task traffic to flow", Duration::from_secs(20), || async {
        (count(
            &c,
            "select count(*) from artex.tasks where kind = 'echo' and status = 'succeeded'",
        )
        .await
            > 0)
        .then_some(())
    })
    .await;

    let mut pids = vec![gen0.pid()];
    let mut spawned = KillAll(Vec::new());
    let mut handover_ms = Vec::new();
    // Descriptors of each new generation at the same point of its life (its predecessor
    // just exited, load running): a leak grows with every generation.
    let mut fds = Vec::new();
    for (i, bundle) in bundles.iter().enumerate() {
        let old = *pids.last().unwrap();
        let started = Instant::now();
        // The third upgrade goes up as a multipart form, the others as a raw PUT.
        let (code, body) = curl_upgrade(&http, bundle, Some(TOKEN), i == 2);
        assert_eq!(code, 200, "upgrade {}: {body}", i + 1);
        assert_eq!(body["status"], "upgraded", "{body}");
        assert_eq!(body["old_pid"], old);
        let new = body["new_pid"].as_i64().unwrap() as i32;
        spawned.0.push(new);
        if i == 0 {
            let status = gen0.wait_exit(Duration::from_secs(30)).expect("gen0 exits");
            assert!(status.success(), "gen0 exit status {status:?}");
        } else {
            wait_gone(old, Duration::from_secs(30)).await;
        }
        handover_ms.push(started.elapsed().as_millis() as u64);
        let (_, status) = http_get(&http, "/status").unwrap();
        let status: Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["pid"], new, "the port is served by the new process");
        assert_eq!(status["binary_sha256"], body["new_binary_sha256"]);
        fds.push(fd_count(new));
        pids.push(new);
        // The resumed task runs a step in this generation before the next upgrade (on a
        // loaded machine the next upgrade could otherwise come first).
        wait_for(
            &format!("generation {new} to run a step of the resumed task"),
            Duration::from_secs(30),
            || async {
                let c = &c;
                let ran: bool = c
                    .query_one(
                        "select coalesce(checkpoint->'steps', '[]') @> jsonb_build_array(jsonb_build_object('pid', $2::int)) \
                         from artex.tasks where id = $1",
                        &[&long, &new],
                    )
                    .await
                    .ok()?
                    .get(0);
                ran.then_some(())
            },
        )
        .await;
    }
    let last = *pids.last().unwrap();

    let submitted = {
        let _ = stop_tx.send(());
        traffic.await.unwrap()
    };
    let (ok, failed) = load.stop();
    handover_ms.sort();
    eprintln!(
        "UPGRADE-METRICS handover_ms={handover_ms:?} median_ms={} requests_ok={ok} failed={failed:?} tasks_submitted={submitted} fds={fds:?}",
        handover_ms[2]
    );
    assert!(
        failed.is_empty(),
        "failed or refused requests: {failed:?} (ok: {ok})"
    );
    assert!(ok > 100, "too little load to prove anything: {ok} requests");
    // The pools open connections lazily (up to 4 durable + 2 relaxed), so allow that much
    // jitter, not growth.
    assert!(
        fds[4] <= fds[0] + 6 && fds.windows(2).any(|w| w[1] <= w[0]),
        "file descriptors grew generation after generation: {fds:?}"
    );

    wait_for("every task to finish", Duration::from_secs(60), || async {
        (count(&c, "select count(*) from artex.tasks where status not in ('succeeded','failed','timeout','canceled')").await == 0)
            .then_some(())
    })
    .await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status <> 'succeeded'"
        )
        .await,
        0,
        "every task succeeds"
    );
    assert_eq!(
        count(&c, "select count(*) from artex.tasks where kind = 'echo'").await,
        submitted as i64,
        "no task lost"
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from (select task_id from artex.task_transitions
                   where to_status = 'succeeded' group by 1 having count(*) > 1) x"
        )
        .await,
        0,
        "no task succeeded twice"
    );
    let t = db.bb.task(long).await.unwrap();
    let steps = t.result.unwrap()["steps"].as_array().unwrap().clone();
    let numbers: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(
        numbers,
        (1..=100).collect::<Vec<u64>>(),
        "every step exactly once"
    );
    let step_pids: std::collections::BTreeSet<i64> =
        steps.iter().map(|s| s["pid"].as_i64().unwrap()).collect();
    for pid in &pids {
        assert!(
            step_pids.contains(&i64::from(*pid)),
            "generation {pid} ran no step of the resumed task: {step_pids:?} vs {pids:?}"
        );
    }
    // Old generations clean up after themselves: only the running one is unpacked.
    let left = std::fs::read_dir(keys.path("upgrades")).unwrap().count();
    assert_eq!(left, 1, "unpacked generations left behind");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(last),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(last, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn failed_upgrades_roll_back_and_the_old_worker_carries_on() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &["--upgrade-ready-ms", "3000"],
        &[],
    );
    let http = worker_http(&c, &w).await;
    let task = db
        .bb
        .submit(
            &NewTask::new("checkpoint", json!({ "steps": 30, "ms": 150 })),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, task, "running", Duration::from_secs(20)).await;
    let panicking = format!(
        "#!/bin/sh\nARTEX_FAILPOINTS=handover_after_ready exec {} \"$@\"\n",
        common::artex_bin()
    );
    let cases = [
        (
            "exits-at-start",
            "#!/bin/sh\nexit 3\n".to_string(),
            "exited",
        ),
        (
            "never-ready",
            "#!/bin/sh\nexec sleep 60\n".to_string(),
            "did not",
        ),
        (
            "panics-after-ready",
            panicking,
            "exited during the handover",
        ),
    ];
    for (name, script, why) in cases {
        let bundle = keys.script_bundle(name, &script);
        let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
        assert_eq!(code, 500, "{name}: {body}");
        assert_eq!(body["status"], "rolled_back", "{name}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(why),
            "{name}: {body}"
        );
        let child = body["new_pid"].as_i64().unwrap() as i32;
        assert!(
            !alive(child),
            "{name}: the failed child {child} was left running"
        );
        let (code, health) = http_get(&http, "/health").unwrap();
        assert_eq!(code, 200, "{name}: {health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(
            health["pid"],
            w.pid(),
            "{name}: the old worker still serves"
        );
    }
    // Its task was never disturbed beyond a suspend-and-resume in the same process.
    wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
    let t = db.bb.task(task).await.unwrap();
    let steps = t.result.unwrap()["steps"].as_array().unwrap().clone();
    assert_eq!(steps.len(), 30);
    assert!(
        steps.iter().all(|s| s["pid"] == w.pid()),
        "steps ran elsewhere: {steps:?}"
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.workers where state = 'online'"
        )
        .await,
        1,
        "the failed generations left no online worker behind"
    );
    // And it still works: a fresh task runs there.
    let id = db
        .bb
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
    assert!(std::fs::read_dir(keys.path("upgrades"))
        .unwrap()
        .next()
        .is_none());
}

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

#[tokio::test]
async fn upgrades_are_refused_when_not_configured() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let w = Proc::worker("plain", &db.url, &[]);
    let http = worker_http(&c, &w).await;
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("upgrades not configured"),
        "{body}"
    );
}

#[tokio::test]
async fn systemd_hears_ready_and_the_new_main_pid() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock_path = sock_dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &[],
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let http = worker_http(&c, &w).await;
    let mut seen = Vec::new();
    let mut read_until = |want: &str| {
        let mut buf = [0u8; 4096];
        loop {
            let n = sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("waiting for {want}: {e}; seen {seen:?}"));
            let msg = String::from_utf8_lossy(&buf[..n]).to_string();
            seen.push(msg.clone());
            if msg.lines().any(|l| l == want) {
                return;
            }
        }
    };
    read_until("READY=1");
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap();
    let _spawned = KillAll(vec![new as i32]);
    read_until(&format!("MAINPID={new}"));
    read_until("READY=1");
    wait_gone(w.pid(), Duration::from_secs(30)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(new as i32, Duration::from_secs(30)).await;
}

/// A raw PUT /upgrade that declares `declared` bytes and sends only `sent`, then waits
/// for the answer (up to `wait`): (status code, JSON body, the socket, still open).
fn stalled_upload(
    addr: &str,
    declared: usize,
    sent: usize,
    wait: Duration,
) -> (u16, Value, std::net::TcpStream) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT /upgrade HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/zip\r\nContent-Length: {declared}\r\n\r\n"
    )
    .unwrap();
    s.write_all(&vec![b'P'; sent]).unwrap();
    s.flush().unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the server closes (it must: the rest of the body will never come) or `wait`.
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "no answer to the stalled upload within {wait:?}: {e}; got {:?}",
                String::from_utf8_lossy(&raw)
            ),
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    let body = serde_json::from_str(body).unwrap_or(Value::String(text.clone()));
    (code, body, s)
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

/// Pids of the processes whose environment holds `marker` (zombies have none).
fn marked_processes(marker: &str) -> Vec<i32> {
    let needle = marker.as_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .collect()
}

/// A bundle whose "binary" starts a background `sleep 600`, writes its pid to `bg_pid`,
/// then `ends` (`exec sleep 60`: never ready; `exit 3`: dies at once). Both carry
/// `marker` in their environment.
fn leaky_bundle(keys: &Keys, name: &str, marker: &str, bg_pid: &Path, ends: &str) -> PathBuf {
    let script = format!(
        "#!/bin/sh\nexport ARTEX_TEST_MARKER={marker}\nsleep 600 &\necho $! > '{}'\n{ends}\n",
        bg_pid.display()
    );
    keys.script_bundle(name, &script)
}

/// Uploads bundles that leave a background process behind, expects each to be rolled
/// back, and checks that nothing of them is left: not the child, not its background
/// process, nothing with their marker.
async fn rollbacks_leave_nothing(http: &str, keys: &Keys, serving: i32) {
    for (name, ends, why) in [
        ("leaky-never-ready", "exec sleep 60", "did not"),
        ("leaky-exits", "exit 3", "exited"),
    ] {
        let marker = uuid::Uuid::new_v4().simple().to_string();
        let bg_file = keys.path(&format!("{name}.pid"));
        let bundle = leaky_bundle(keys, name, &marker, &bg_file, ends);
        let (code, body) = curl_upgrade(http, &bundle, Some(TOKEN), false);
        assert_eq!(code, 500, "{name}: {body}");
        assert_eq!(body["status"], "rolled_back", "{name}: {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains(why),
            "{name}: {body}"
        );
        let child = body["new_pid"].as_i64().unwrap() as i32;
        let bg: i32 = std::fs::read_to_string(&bg_file)
            .unwrap_or_else(|e| panic!("{name}: the script never ran: {e}"))
            .trim()
            .parse()
            .unwrap();
        let _leftovers = KillAll(vec![child, bg]);
        // SIGKILL is sent before the answer; the kernel may take a moment to finish them.
        wait_for(
            &format!("{name}: child {child} and its background {bg} to be gone"),
            Duration::from_secs(10),
            || async { (!alive(child) && !alive(bg)).then_some(()) },
        )
        .await;
        wait_for(
            &format!("{name}: no process with marker {marker} left"),
            Duration::from_secs(10),
            || async { marked_processes(&marker).is_empty().then_some(()) },
        )
        .await;
        let (code, health) = http_get(http, "/health").unwrap();
        assert_eq!(code, 200, "{name}: {health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(
            health["pid"], serving,
            "{name}: the old worker still serves"
        );
    }
}

#[tokio::test]
async fn a_rolled_back_successor_leaves_no_process_behind() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let w = upgradable_worker(
        "worker",
        &db.url,
        &keys,
        &["--upgrade-ready-ms", "3000"],
        &[],
    );
    let http = worker_http(&c, &w).await;
    rollbacks_leave_nothing(&http, &keys, w.pid()).await;
}

/// (ppid, pgid) of process `pid`.
fn parent_and_group(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    (fields[1].parse().unwrap(), fields[2].parse().unwrap())
}

#[tokio::test]
async fn under_master_a_rollback_leaves_nothing_and_a_successor_joins_the_lineage() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let mut args: Vec<String> = vec!["master".into()];
    args.extend(FAST_WORKER.iter().map(|s| s.to_string()));
    args.extend(keys.flags("upgrades"));
    args.extend(["--upgrade-ready-ms".into(), "3000".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut master = Proc::start("master", &db.url, &args, &[]);
    let http: String = wait_for(
        "the generation to register",
        Duration::from_secs(30),
        || {
            let c = &c;
            async move {
                c.query_opt(
                    "select http_addr from artex.workers where state = 'online' limit 1",
                    &[],
                )
                .await
                .ok()
                .flatten()
                .and_then(|r| r.get::<_, Option<String>>(0))
            }
        },
    )
    .await;
    let (_, health) = http_get(&http, "/health").unwrap();
    let first = serde_json::from_str::<Value>(&health).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    // Whatever happens, the lineage's group goes with the test.
    struct KillGroup(i32);
    impl Drop for KillGroup {
        fn drop(&mut self) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _lineage = KillGroup(first);
    assert_eq!(parent_and_group(first), (master.pid(), first));

    rollbacks_leave_nothing(&http, &keys, first).await;
    assert_eq!(
        parent_and_group(first),
        (master.pid(), first),
        "the generation and its group are untouched"
    );

    // A successful successor ends up in the lineage's group, not in the one it was
    // spawned in, so the master keeps tracking (and stopping) it.
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    wait_gone(first, Duration::from_secs(30)).await;
    assert_eq!(parent_and_group(new), (master.pid(), first));
    assert!(
        master.wait_exit(Duration::from_millis(50)).is_none(),
        "the master keeps running: {}",
        master.log_text()
    );
    assert!(
        !master.log_text().contains("died"),
        "the master saw no generation die"
    );
    master.signal(nix::sys::signal::Signal::SIGTERM);
    let status = master
        .wait_exit(Duration::from_secs(30))
        .expect("the master stops");
    assert!(status.success(), "{status:?}");
    assert!(!alive(new), "the successor stopped with the master");
}

#[tokio::test]
async fn an_upgrade_folder_not_ours_alone_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let db = TestDb::new().await;
    let keys = Keys::new();
    let root = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&str, PathBuf, &str)> = Vec::new();
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    cases.push(("mode 0777", open, "mode 0777"));
    let private = root.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    cases.push(("symlink", link, "symlink"));
    if nix::unistd::geteuid().is_root() {
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        cases.push(("another owner", theirs, "owned by uid 65534"));
    } else {
        eprintln!("the wrong-owner case needs root to make a folder someone else's");
    }
    let key_flags = |dir: &Path| {
        let mut f = keys.flags("unused");
        let at = f.iter().position(|a| a == "--upgrade-dir").unwrap();
        f[at + 1] = dir.to_string_lossy().into_owned();
        f
    };
    let refused = |what: &str, p: &mut Proc, folder: &Path, why: &str| {
        let status = p
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{what}: {} started anyway", p.name));
        assert!(!status.success(), "{what}: {status:?}");
        let log = p.log_text();
        assert!(
            log.contains("upgrade folder")
                && log.contains(&folder.display().to_string())
                && log.contains(why),
            "{what}: the message names the folder and what is wrong: {log}"
        );
    };
    for (what, folder, why) in &cases {
        let args: Vec<String> = ["worker".to_string()]
            .into_iter()
            .chain(FAST_WORKER.iter().map(|s| s.to_string()))
            .chain(key_flags(folder))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = Proc::start("worker", &db.url, &args, &[]);
        refused(what, &mut p, folder, why);
    }
    // The default folder, in the temp folder, is held to the same rule; `artex master`
    // checks it too.
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let default = tmp.join(format!("artex-upgrade-{}", nix::unistd::geteuid()));
    std::fs::create_dir(&default).unwrap();
    std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut flags = keys.flags("unused");
    flags.truncate(4); // key and token, no --upgrade-dir
    for command in ["worker", "master"] {
        let args: Vec<String> = [command.to_string()]
            .into_iter()
            .chain(FAST_WORKER.iter().map(|s| s.to_string()))
            .chain(flags.iter().cloned())
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let tmpdir = tmp.to_str().unwrap();
        let mut p = Proc::start(command, &db.url, &args, &[("TMPDIR", tmpdir)]);
        refused(
            &format!("default folder, {command}"),
            &mut p,
            &default,
            "mode 0777",
        );
    }
}

#[tokio::test]
async fn a_bundle_needing_a_newer_schema_is_refused_with_409_and_nothing_spawned() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let knows = artex_actors::blackboard::MIGRATIONS
        .last()
        .map(|m| m.version)
        .unwrap();
    let (expand, contract) = (knows + 1, knows + 2);
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut w = upgradable_worker("worker", &db.url, &keys, &[], &[]);
    let http = worker_http(&c, &w).await;

    // "The new build": it needs one migration more than this one, and says so when
    // `bundle create` asks it; otherwise it runs this build.
    let out = Command::new(common::artex_bin())
        .args(["schema", "--json"])
        .output()
        .unwrap();
    let mut schema: Value = serde_json::from_slice(&out.stdout).unwrap();
    schema["needs"].as_array_mut().unwrap().push(json!({
        "version": expand, "name": "future_things", "checksum": "ffffffffffffffff"
    }));
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = schema ]; then echo '{schema}'; exit 0; fi\nexec {} \"$@\"\n",
        common::artex_bin()
    );
    let bin = keys.path("newer");
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (newer, _) = keys.bundle_of(&bin, "0.2.0", "newer.zip");

    let (code, body) = curl_upgrade(&http, &newer, Some(TOKEN), false);
    // Should the check fail to refuse, the process it let through is not left running.
    let _leaked = KillAll(
        body["new_pid"]
            .as_i64()
            .map(|p| p as i32)
            .into_iter()
            .collect(),
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["status"], "refused", "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("V{expand}__future_things"))
            && error.contains("run `artex migrate` with the new build first"),
        "{body}"
    );
    // Nothing was spawned: no new process said so, no new worker registered, nothing
    // unpacked stays behind; the old worker serves and runs tasks.
    assert!(
        !w.log_text().contains("new process spawned"),
        "{}",
        w.log_text()
    );
    assert_eq!(count(&c, "select count(*) from artex.workers").await, 1);
    assert!(std::fs::read_dir(keys.path("upgrades"))
        .unwrap()
        .next()
        .is_none());
    let (code, health) = http_get(&http, "/health").unwrap();
    assert_eq!(code, 200, "{health}");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["pid"], w.pid());
    let id = db
        .bb
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;

    // The rolling order: the new build's `artex migrate` expands the schema (simulated:
    // the table and its row), the old worker runs on, and the same bundle now goes in.
    c.batch_execute(&format!(
        "create table artex.future_things (id bigint primary key);
         insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({expand}, 'future_things', 'ffffffffffffffff', 0)"
    ))
    .await
    .unwrap();
    let (code, body) = curl_upgrade(&http, &newer, Some(TOKEN), false);
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("upgraded")),
        "{body}"
    );
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    w.wait_exit(Duration::from_secs(30))
        .expect("the old worker exits");
    let id = db
        .bb
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;

    // A rollback to a build that predates a contraction is refused the same way.
    c.batch_execute(&format!(
        "insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({contract}, 'drop_old_things', 'eeeeeeeeeeeeeeee', {expand})"
    ))
    .await
    .unwrap();
    let (older, _) = keys.variant_bundle(1);
    let (code, body) = curl_upgrade(&http, &older, Some(TOKEN), false);
    assert_eq!(code, 409, "{body}");
    let error = body["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("V{contract}__drop_old_things"))
            && error.contains(&format!("the new build knows up to V{knows}")),
        "{body}"
    );
    let (_, health) = http_get(&http, "/health").unwrap();
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["pid"], new, "the running generation serves on");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(new, Duration::from_secs(30)).await;
}

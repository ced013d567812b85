//! upgrade: hot upgrades under load (was scripts/bench-upgrade.sh). 5 upgrades in a row of
//! one worker (release build, `--public-read`) while 4 HTTP clients, one connection per
//! request, ask for /health and /status and a client submits an `echo` task every 50 ms
//! with `artex submit`: time from upload to takeover (the new process serving, the tasks
//! moved: the worker's own figure) and to the old process's exit, median and max;
//! requests served and failed, submissions failed. A failed request fails the bench.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use artex_testkit::http::Request;
use tokio::process::Command;

use crate::report::result;
use crate::{sql, Bench};

const DB: &str = "bench_upgrade";
const UPGRADES: usize = 5;
const TOKEN: &str = "bench-token";

pub async fn run(bench: &mut Bench) {
    let dir = bench.rig.tmp.path().join("upgrade");
    std::fs::create_dir_all(&dir).expect("the upgrade folder");
    let bundles = bundles(bench, &dir).await;
    let c = bench.rig.new_db(DB).await;
    let warn = [("ARTEX_LOG", "warn")];
    bench
        .rig
        .spawn_env(DB, "planner", "artex", &["planner".into()], &warn);
    let mut worker = bench
        .rig
        .command(&format!("{DB}.worker"), bench.rig.bin("artex"));
    worker.args(["worker", "--http", "127.0.0.1:0", "--public-read"]);
    worker.arg("--upgrade-public-key").arg(dir.join("key.pub"));
    worker.arg("--upgrade-token-file").arg(dir.join("token"));
    worker.arg("--upgrade-dir").arg(dir.join("up"));
    worker
        .env("ARTEX_DATABASE_URL", bench.rig.url(DB))
        .envs(warn);
    let mut first = worker.spawn().expect("the worker");
    let mut pid = first.id().expect("its pid");
    let addr = worker_http(&c, pid).await;
    let load = Load::start(&addr, &bench.rig.bin("artex"), &bench.rig.url(DB));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut taken, mut exited) = (Vec::new(), Vec::new());
    for (n, bundle) in bundles.iter().enumerate() {
        let t0 = Instant::now();
        let (old, new, server_ms) = upgrade(&addr, bundle).await;
        let curl_ms = t0.elapsed().as_millis();
        while alive(old) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let exit_ms = t0.elapsed().as_millis() as u64;
        eprintln!("upgrade {}: pid {old} -> {new}, taken over {server_ms} ms after upload, old exited {exit_ms} ms after upload (request {curl_ms} ms)", n + 1);
        taken.push(server_ms);
        exited.push(exit_ms);
        pid = new;
    }
    let (ok, bad, submits_failed) = load.stop().await;
    let _ = first.wait().await;
    stop_pid(pid).await;
    bench.rig.stop_runtime().await;
    report(&mut taken, &mut exited, ok, bad, submits_failed);
    assert_eq!(bad, 0, "upgrade: {bad} requests failed during the upgrades");
    bench.rig.drop_db(DB, c).await;
}

fn report(taken: &mut [u64], exited: &mut [u64], ok: u64, bad: u64, submits_failed: u64) {
    taken.sort_unstable();
    exited.sort_unstable();
    let median = |v: &[u64]| v[v.len() / 2];
    let max = |v: &[u64]| v[v.len() - 1];
    result("upgrade_takeover_ms_median", median(taken), "ms");
    result("upgrade_takeover_ms_max", max(taken), "ms");
    result("upgrade_old_exit_ms_median", median(exited), "ms");
    result("upgrade_old_exit_ms_max", max(exited), "ms");
    result("upgrade_requests_ok", ok, "requests");
    result("upgrade_requests_failed", bad, "requests");
    result("upgrade_submits_failed", submits_failed, "submits");
}

/// A key pair, the token, and `UPGRADES` signed bundles of the release binary, each with
/// other bytes appended (another build as far as sha256 goes).
async fn bundles(bench: &Bench, dir: &Path) -> Vec<Vec<u8>> {
    let artex = bench.rig.bin("artex");
    let key = dir.join("key");
    let mut keygen = Command::new(&artex);
    keygen.args(["bundle", "keygen", "--secret"]).arg(&key);
    succeed(keygen.arg("--public").arg(dir.join("key.pub"))).await;
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).expect("the token");
    let mut zips = Vec::new();
    for n in 1..=UPGRADES {
        let bin = dir.join(format!("artex-{n}"));
        let mut bytes = std::fs::read(&artex).expect("the binary");
        bytes.extend_from_slice(format!("bench build {n}\n").as_bytes());
        std::fs::write(&bin, bytes).expect("a build");
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let zip = dir.join(format!("b{n}.zip"));
        let mut create = Command::new(&artex);
        create.args(["bundle", "create", "--binary"]).arg(&bin);
        create.arg("--key").arg(&key).arg("--out").arg(&zip);
        succeed(create.arg(format!("--manifest-version=bench-{n}"))).await;
        zips.push(std::fs::read(&zip).expect("a bundle"));
    }
    zips
}

/// Runs `cmd` to its end; a failure fails the bench with its standard error.
async fn succeed(cmd: &mut Command) {
    let out = cmd.output().await.expect("artex");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The worker's HTTP address once it answers /health.
async fn worker_http(c: &tokio_postgres::Client, pid: u32) -> String {
    for _ in 0..1200 {
        let row = c
            .query_opt(sql::WORKER_HTTP, &[&(pid as i32)])
            .await
            .expect("the worker");
        if let Some(Some(addr)) = row.map(|r| r.get::<_, Option<String>>(0)) {
            let probe = addr.clone();
            let up = tokio::task::spawn_blocking(move || get(&probe, "/health") == 200);
            if up.await.unwrap_or(false) {
                return addr;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upgrade: the worker did not come up");
}

/// `PUT /upgrade` of `bundle`: old pid, new pid, and the worker's time to takeover (ms).
async fn upgrade(addr: &str, bundle: &[u8]) -> (u32, u32, u64) {
    let (addr, bundle) = (addr.to_string(), bundle.to_vec());
    let r = tokio::task::spawn_blocking(move || {
        Request::new("PUT", "/upgrade")
            .bearer(TOKEN)
            .body(bundle)
            .timeout(Duration::from_secs(120))
            .send(&addr)
            .and_then(|r| r.complete())
            .expect("PUT /upgrade")
    })
    .await
    .expect("the upgrade");
    assert!((200..300).contains(&r.status), "PUT /upgrade: {r:?}");
    let v = r.json();
    let number = |x: &serde_json::Value| x.as_u64().unwrap_or_else(|| panic!("{v}"));
    let taken = number(&v["timings_ms"]["taken_over"]);
    (
        number(&v["old_pid"]) as u32,
        number(&v["new_pid"]) as u32,
        taken,
    )
}

/// A GET on a connection of its own (10 s at most): its status, 0 when it failed.
fn get(addr: &str, path: &str) -> u16 {
    Request::get(path)
        .timeout(Duration::from_secs(10))
        .send(addr)
        .and_then(|r| r.complete())
        .map_or(0, |r| r.status)
}

/// Whether process `pid` runs (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// SIGTERM to the last worker (started by the one before it, not by the bench), and its
/// end awaited.
async fn stop_pid(pid: u32) {
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGTERM);
    for _ in 0..600 {
        if !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The load: 4 HTTP clients on /health and /status, and a submission every 50 ms.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    bad: Arc<AtomicU64>,
    submits_failed: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(addr: &str, artex: &Path, url: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, bad, submits_failed) = Default::default();
        let mut load = Load {
            stop,
            ok,
            bad,
            submits_failed,
            threads: Vec::new(),
        };
        for _ in 0..4 {
            let (addr, stop) = (addr.to_string(), load.stop.clone());
            let (ok, bad) = (load.ok.clone(), load.bad.clone());
            load.threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for path in ["/health", "/status"] {
                        let counter = if get(&addr, path) == 200 { &ok } else { &bad };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        let (artex, url, stop) = (artex.to_path_buf(), url.to_string(), load.stop.clone());
        let failed = load.submits_failed.clone();
        load.threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let submitted = std::process::Command::new(&artex)
                    .args(["submit", "echo", "--payload", r#"{"bench":true}"#])
                    .env("ARTEX_DATABASE_URL", &url)
                    .env("ARTEX_LOG", "warn")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                if !submitted.is_ok_and(|s| s.success()) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }));
        load
    }

    /// Stops the clients (each ends its request under way): requests answered 200,
    /// other outcomes, failed submissions.
    async fn stop(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let threads = self.threads;
        tokio::task::spawn_blocking(move || {
            threads.into_iter().for_each(|t| {
                let _ = t.join();
            })
        })
        .await
        .expect("the load");
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (read(&self.ok), read(&self.bad), read(&self.submits_failed))
    }
}

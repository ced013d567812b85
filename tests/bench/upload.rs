//! upload: a 1 GiB file over loopback, `artex upload` against `curl -T` to a plain sink
//! (issue 15). `artex upload` (10 MiB chunks, `--parallel` at its default) to a worker on
//! this host, from start (the client hashes the file first) to the task's id, as a ratio
//! to `curl -T` of the same file in the same run to examples/upload-sink.rs, twice:
//! reading and discarding the body (`upload_vs_curl_sink`, the target ≥ 0.8), and
//! writing it to a file in the same folder, fsynced once at the end
//! (`upload_vs_curl_file_sink`: what storing the file durably costs at least). Then the
//! worker's peak RSS (VmHWM) over one upload each of 256 MiB and 1 GiB in 1 MiB and
//! 10 MiB chunks, a fresh worker each: target, independent of both. Then the same over a
//! 1 Gbit/s link between network namespaces (`upload_link_1gbit_vs_curl`; as root, with
//! `ip` and `tc`). `--quick`: 64 and 16 MiB.
//!
//! curl stays the reference: the figures are ratios to `curl -T`, what an operator would
//! otherwise send a file with.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::report::{fixed, result};
use crate::rig::proc_kb;
use crate::{sql, Bench};

const DB: &str = "bench_upload";
const MIB: u64 = 1 << 20;

/// Where the worker and the sink run: here on loopback, or in the link's namespace.
struct Place {
    launcher: Vec<String>,
    bind: String,
}

impl Place {
    fn loopback() -> Place {
        Place {
            launcher: Vec::new(),
            bind: "127.0.0.1".into(),
        }
    }

    /// `program` started through the launcher, if any.
    fn command(&self, bench: &Bench, log: &str, program: &Path) -> Command {
        match self.launcher.split_first() {
            Some((first, rest)) => {
                let mut cmd = bench.rig.command(log, first);
                cmd.args(rest).arg(program);
                cmd
            }
            None => bench.rig.command(log, program),
        }
    }
}

pub async fn run(bench: &mut Bench) {
    let (big, small) = if bench.quick {
        (64 * MIB, 16 * MIB)
    } else {
        (1024 * MIB, 256 * MIB)
    };
    let dir = bench.rig.tmp.path().join("upload");
    std::fs::create_dir_all(&dir).expect("the upload folder");
    let (big_file, small_file) = (dir.join("big.bin"), dir.join("small.bin"));
    random_files(&big_file, big, &small_file, small).await;
    std::fs::write(dir.join("token"), "bench-upload-token").expect("the token");
    let c = bench.rig.new_db(DB).await;
    let (curl_s, curl_file_s) = curl_figures(bench, &dir, &big_file, big).await;
    let sizes = [(small, &small_file), (big, &big_file)];
    let (rss, artex_s) = peak_rss(bench, &dir, sizes).await;
    let mib = big as f64 / MIB as f64;
    result("upload_artex_mib_per_s", fixed(mib / artex_s, 0), "MiB/s");
    result(
        "upload_vs_curl_sink",
        fixed(curl_s / artex_s, 2),
        "ratio (target >= 0.8)",
    );
    result(
        "upload_vs_curl_file_sink",
        fixed(curl_file_s / artex_s, 2),
        "ratio (to a durable write of the file)",
    );
    sha256_floor(bench, &big_file, big, curl_s).await;
    let (lo, hi) = (
        rss.iter().min().copied().unwrap_or(1),
        rss.iter().max().copied().unwrap_or(0),
    );
    result(
        "upload_rss_spread",
        fixed(hi as f64 / lo.max(1) as f64, 2),
        "ratio of highest to lowest peak RSS",
    );
    link_bench(bench, &dir, &big_file).await;
    let _ = std::fs::remove_dir_all(&dir);
    bench.rig.drop_db(DB, c).await;
}

/// One upload of each file in 1 MiB and 10 MiB chunks, a fresh worker each: the
/// worker's peak RSS of each (reported), and the seconds of the last (the big file in
/// 10 MiB chunks).
async fn peak_rss(bench: &Bench, dir: &Path, files: [(u64, &PathBuf); 2]) -> (Vec<u64>, f64) {
    let here = Place::loopback();
    let mut rss = Vec::new();
    let mut secs = 0.0;
    for (size, file) in files {
        for chunk in [MIB, 10 * MIB] {
            let kb;
            (secs, kb) = upload_once(bench, dir, file, chunk, &here).await;
            println!(
                "# upload: {} MiB in {} MiB chunks: {} s, worker peak RSS {kb} kB",
                size / MIB,
                chunk / MIB,
                fixed(secs, 3)
            );
            let name = format!("upload_rss_kb_{}mib_{}mib_chunks", size / MIB, chunk / MIB);
            result(&name, kb, "kB");
            rss.push(kb);
        }
    }
    (rss, secs)
}

/// `big` random bytes in `big_file`, its first `small` in `small_file`; then read once, so
/// that the page cache is warm for every reader alike.
async fn random_files(big_file: &Path, big: u64, small_file: &Path, small: u64) {
    let (big_file, small_file) = (big_file.to_path_buf(), small_file.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let mut rng = fastrand::Rng::new();
        let mut block = vec![0u8; MIB as usize];
        let mut out = std::io::BufWriter::new(std::fs::File::create(&big_file).expect("big.bin"));
        let mut head =
            std::io::BufWriter::new(std::fs::File::create(&small_file).expect("small.bin"));
        for i in 0..big / MIB {
            rng.fill(&mut block);
            out.write_all(&block).expect("big.bin");
            if i < small / MIB {
                head.write_all(&block).expect("small.bin");
            }
        }
        out.flush().expect("big.bin");
        head.flush().expect("small.bin");
        drop(out);
        std::fs::read(&big_file).expect("reading big.bin");
    })
    .await
    .expect("the files");
}

/// curl -T of the big file to a discarding sink, then to a file sink: their seconds.
async fn curl_figures(bench: &Bench, dir: &Path, big_file: &Path, big: u64) -> (f64, f64) {
    let here = Place::loopback();
    let mib = big as f64 / MIB as f64;
    let curl_s = curl(bench, big_file, None, &here).await;
    println!(
        "# upload: {} MiB, curl -T to a sink (examples/upload-sink.rs, discards) in {} s",
        big / MIB,
        fixed(curl_s, 3)
    );
    result(
        "upload_curl_sink_mib_per_s",
        fixed(mib / curl_s, 0),
        "MiB/s",
    );
    let sink_file = dir.join("sink.out");
    let curl_file_s = curl(bench, big_file, Some(&sink_file), &here).await;
    let _ = std::fs::remove_file(&sink_file);
    println!(
        "# upload: {} MiB, curl -T to a file sink (written, fsynced at the end) in {} s",
        big / MIB,
        fixed(curl_file_s, 3)
    );
    result(
        "upload_curl_file_sink_mib_per_s",
        fixed(mib / curl_file_s, 0),
        "MiB/s",
    );
    (curl_s, curl_file_s)
}

/// The floor the protocol sets: the file hashed four times (the client, whole and per
/// chunk; the worker, per chunk and whole), here on the cores the client and the worker
/// share. Copies and the disk come on top; curl hashes nothing.
async fn sha256_floor(bench: &Bench, big_file: &Path, big: u64, curl_s: f64) {
    let out = Command::new(bench.rig.bin("artex-bench"))
        .arg("sha256")
        .arg(big_file)
        .output()
        .await
        .expect("artex-bench sha256");
    let text = String::from_utf8_lossy(&out.stdout);
    let sha_s: f64 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("artex-bench sha256 printed {text}"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let floor: f64 = fixed(4.0 * sha_s / cores as f64, 3)
        .parse()
        .expect("a number");
    println!("# upload: sha256 of {} MiB on one core {sha_s} s; four passes on {cores} cores: {} s at least", big / MIB, fixed(floor, 3));
    result(
        "upload_sha256_floor_s",
        fixed(floor, 3),
        &format!("s (4 sha256 passes over {cores} cores)"),
    );
    result(
        "upload_vs_curl_sink_ceiling",
        fixed(curl_s / floor, 2),
        "ratio (the best any receiver of this protocol could reach here)",
    );
}

/// A fresh worker at `place`, one upload of `file` in chunks of `chunk` bytes: the
/// upload's seconds and the worker's peak RSS (kB).
async fn upload_once(
    bench: &Bench,
    dir: &Path,
    file: &Path,
    chunk: u64,
    place: &Place,
) -> (f64, u64) {
    let _ = std::fs::remove_dir_all(dir.join("uploads"));
    let _ = std::fs::remove_dir_all(dir.join("cache"));
    let (mut worker, pid, http) = upload_worker(bench, dir, place).await;
    let log = bench.rig.log("upload.client");
    let out = std::fs::File::create(dir.join("task")).expect("the task's file");
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("a log");
    let t0 = Instant::now();
    let status = Command::new(bench.rig.bin("artex"))
        .arg("upload")
        .arg(file)
        .args([
            "--to",
            &format!("http://{http}"),
            "--kind",
            "noop",
            "--token-file",
        ])
        .arg(dir.join("token"))
        .args(["--chunk-size", &chunk.to_string()])
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .stdout(out)
        .stderr(err)
        .status()
        .await
        .expect("artex upload");
    let secs = t0.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "artex upload failed: {text}");
    let kb = proc_kb(pid, "status", "VmHWM");
    stop(&mut worker).await;
    (secs, kb)
}

/// `artex worker --http <bind>:0` for no-op tasks with an upload folder in `dir`: the
/// process, its pid and its HTTP address once it is online.
async fn upload_worker(bench: &Bench, dir: &Path, place: &Place) -> (Child, u32, String) {
    let mut cmd = place.command(bench, &format!("{DB}.worker"), &bench.rig.bin("artex"));
    cmd.args([
        "worker",
        "--http",
        &format!("{}:0", place.bind),
        "--kinds",
        "noop",
    ])
    .arg("--write-token-file")
    .arg(dir.join("token"))
    .arg("--upload-dir")
    .arg(dir.join("uploads"))
    .env("ARTEX_DATABASE_URL", bench.rig.url(DB));
    let child = cmd.spawn().expect("the upload worker");
    let pid = child.id().expect("its pid");
    let c = bench.rig.client(DB).await;
    for _ in 0..400 {
        let row = c
            .query_opt(sql::WORKER_HTTP, &[&(pid as i32)])
            .await
            .expect("the worker");
        if let Some(Some(http)) = row.map(|r| r.get::<_, Option<String>>(0)) {
            return (child, pid, http);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the upload worker did not register");
}

/// SIGTERM, and its end awaited.
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
    let _ = child.wait().await;
}

/// Seconds of `curl -T file` to a fresh sink at `place` (writing to `sink_file`, if any).
async fn curl(bench: &Bench, file: &Path, sink_file: Option<&PathBuf>, place: &Place) -> f64 {
    let mut cmd = place.command(bench, "upload.sink", &bench.rig.bin("upload-sink"));
    cmd.args(sink_file)
        .env("UPLOAD_SINK_BIND", format!("{}:0", place.bind));
    let mut sink = cmd.stdout(Stdio::piped()).spawn().expect("upload-sink");
    let mut lines = BufReader::new(sink.stdout.take().expect("its output")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .ok()
        .and_then(|l| l.ok().flatten())
        .expect("upload-sink said where it listens");
    let t0 = Instant::now();
    let out = Command::new("curl")
        .args(["-sS", "-f", "-H", "Expect:", "-T"])
        .arg(file)
        .args([&format!("http://{addr}/"), "-o", "/dev/null"])
        .output()
        .await
        .expect("curl");
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "curl -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = sink.kill().await;
    secs
}

/// The same file over a 1 Gbit/s link, as between two hosts of a fleet: a veth pair into
/// a network namespace of its own, its egress limited by `tc tbf`, the worker (and then
/// the sink) in the namespace, the client (and curl) outside; the database by its Unix
/// socket. Here the four sha256 passes run while the link is busy: what loopback's shared
/// cores cannot show. Needs root, `ip` and `tc` (skipped otherwise).
async fn link_bench(bench: &Bench, dir: &Path, big_file: &Path) {
    let Some(link) = Link::make() else {
        println!("# upload over a 1 Gbit/s link: skipped (needs root, ip and tc)");
        return;
    };
    let there = Place {
        launcher: ["ip", "netns", "exec", &link.ns]
            .map(str::to_string)
            .to_vec(),
        bind: "10.231.77.2".into(),
    };
    let curl_s = curl(bench, big_file, None, &there).await;
    let (artex_s, _) = upload_once(bench, dir, big_file, 10 * MIB, &there).await;
    drop(link);
    println!("# upload over a 1 Gbit/s link (tbf on a veth pair into a namespace): curl -T {} s, artex upload {} s", fixed(curl_s, 3), fixed(artex_s, 3));
    result(
        "upload_link_1gbit_vs_curl",
        fixed(curl_s / artex_s, 2),
        "ratio (the same 10 MiB chunks, 4 in flight)",
    );
}

/// The namespace and its veth pair; deleted when dropped.
struct Link {
    ns: String,
}

impl Link {
    fn make() -> Option<Link> {
        let has = |tool: &str| {
            std::process::Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        if !nix::unistd::geteuid().is_root() || !has("ip") || !has("tc") {
            return None;
        }
        let id = std::process::id();
        let link = Link {
            ns: format!("artex-bench-{id}"),
        };
        let (outer, inner) = (format!("abu{id}a"), format!("abu{id}b"));
        let ns = link.ns.as_str();
        for cmd in [
            vec!["ip", "netns", "add", ns],
            vec![
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ],
            vec!["ip", "link", "set", &inner, "netns", ns],
            vec!["ip", "addr", "add", "10.231.77.1/24", "dev", &outer],
            vec!["ip", "link", "set", &outer, "up"],
            vec![
                "ip",
                "netns",
                "exec",
                ns,
                "ip",
                "addr",
                "add",
                "10.231.77.2/24",
                "dev",
                &inner,
            ],
            vec!["ip", "netns", "exec", ns, "ip", "link", "set", &inner, "up"],
            vec!["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            vec![
                "tc", "qdisc", "add", "dev", &outer, "root", "tbf", "rate", "1gbit", "burst",
                "1mb", "latency", "50ms",
            ],
        ] {
            let out = std::process::Command::new(cmd[0])
                .args(&cmd[1..])
                .output()
                .expect("ip/tc");
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

//! Supervisors, with real processes and real signals: `artex master` (the stable parent
//! for supervisord and runit) across hot upgrades, a generation killed with SIGKILL, a
//! clean stop; and `scripts/rolling-upgrade.sh` across a small fleet.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use artex_testkit::http::Request;
use common::bundles::{Keys, TOKEN};
use common::procs::{http_get, online_http, wait_for, Proc, FAST_WORKER};
use common::TestDb;
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio_postgres::Client;

/// Kills, when the test ends however it ends, the processes it started that the `Proc`
/// handles do not own: generations (by process group) and adopted successors.
#[derive(Default)]
struct Leftovers {
    groups: Vec<i32>,
    pids: Vec<i32>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for g in &self.groups {
            let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
        }
        for p in &self.pids {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
    }
}

/// (ppid, pgid) of a running process.
fn parent_and_group(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("process {pid}: {e}"));
    // After "pid (comm)": state ppid pgrp …
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    (fields[1].parse().unwrap(), fields[2].parse().unwrap())
}

/// Whether `pid` exists at all (a zombie not yet reaped still exists).
fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether process group `pgid` has any process left (zombies included).
fn group_exists(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None) != Err(Errno::ESRCH)
}

fn get_json(addr: &str, path: &str) -> Option<(u16, Value)> {
    let (code, body) = http_get(addr, path).ok()?;
    Some((code, serde_json::from_str(&body).ok()?))
}

/// (pid, binary sha256) that `/status` reports.
fn pid_and_sha(addr: &str) -> (i32, String) {
    let (code, v) = get_json(addr, "/status").expect("/status");
    assert_eq!(code, 200, "{v}");
    let pid = v["pid"].as_i64().unwrap_or(0) as i32;
    (pid, v["binary_sha256"].as_str().unwrap_or("").to_string())
}

/// Waits for /health to answer 200 from a process other than `not`; returns its pid.
async fn serving_pid(addr: &str, not: &[i32]) -> i32 {
    wait_for(
        &format!("{addr} to be served by a process other than {not:?}"),
        Duration::from_secs(20),
        || async {
            let (code, v) = get_json(addr, "/health")?;
            let pid = v["pid"].as_i64()? as i32;
            (code == 200 && !not.contains(&pid)).then_some(pid)
        },
    )
    .await
}

/// The HTTP address of the worker process `pid`.
async fn http_of(c: &Client, pid: i32) -> String {
    wait_for(
        &format!("worker {pid} to register"),
        Duration::from_secs(20),
        || async move {
            c.query_opt(
                "select http_addr from artex.workers where pid = $1 and state = 'online'",
                &[&pid],
            )
            .await
            .ok()
            .flatten()
            .and_then(|r| r.get::<_, Option<String>>(0))
        },
    )
    .await
}

/// Submits `n` echo tasks and waits until every one of them succeeded.
async fn tasks_flow(db: &TestDb, c: &Client, n: usize) {
    let tag = uuid::Uuid::new_v4().to_string();
    let batch: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new("echo", json!({ "tag": tag, "i": i })))
        .collect();
    db.bb.operator().submit_many(&batch, "test").await.unwrap();
    let want = n as i64;
    wait_for(
        &format!("{n} echo tasks ({tag}) to succeed"),
        Duration::from_secs(20),
        || {
            let tag = tag.clone();
            async move {
                let row = c
                    .query_one(
                        "select count(*) filter (where status = 'succeeded'), count(*)
                         from artex.tasks where payload->>'tag' = $1",
                        &[&tag],
                    )
                    .await
                    .ok()?;
                let (ok, all): (i64, i64) = (row.get(0), row.get(1));
                assert_eq!(all, want);
                (ok == want).then_some(())
            }
        },
    )
    .await;
}

/// `PUT bundle` to `/upgrade` (as `curl -T` would), which must succeed; the JSON answer.
fn upgrade(addr: &str, bundle: &Path) -> Value {
    let answer = Request::new("PUT", "/upgrade")
        .bearer(TOKEN)
        .body(std::fs::read(bundle).expect("the bundle"))
        .timeout(Duration::from_secs(60))
        .send(addr)
        .unwrap_or_else(|e| panic!("upgrade of {addr}: {e}"));
    assert!(
        (200..400).contains(&answer.status),
        "upgrade of {addr} failed: {answer:?}"
    );
    answer.json()
}

/// `artex master` with fast worker settings plus `extra`.
fn master(url: &str, extra: &[String], env: &[(&str, &str)]) -> Proc {
    let mut args: Vec<&str> = vec!["master"];
    args.extend_from_slice(FAST_WORKER);
    args.extend(extra.iter().map(String::as_str));
    Proc::start("master", url, &args, env)
}

fn notifications(sock: &UnixDatagram) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    got
}

#[tokio::test]
async fn master_keeps_its_pid_across_upgrades_and_stops_every_generation() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let bundles = keys.variant_bundles(2);
    // systemd's side, faked: the master must say READY=1 and nobody may send MAINPID.
    let notify_path = keys.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut master = master(
        &db.url,
        &keys.flags("upgrades"),
        &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())],
    );
    let mut leftovers = Leftovers::default();

    let addr = online_http(&c).await;
    let first = serving_pid(&addr, &[master.pid()]).await;
    leftovers.groups.push(first);
    let (ppid, pgid) = parent_and_group(first);
    assert_eq!(
        ppid,
        master.pid(),
        "the master started the first generation"
    );
    assert_eq!(
        pgid, first,
        "the first generation leads a process group of its own"
    );
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut said = vec![{
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).expect("no READY=1 from the master");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }];
    assert_eq!(said[0], "READY=1");
    tasks_flow(&db, &c, 20).await;

    let mut serving = first;
    let mut seen = vec![first];
    for (zip, sha) in &bundles {
        let answer = upgrade(&addr, zip);
        assert_eq!(answer["status"], "upgraded", "{answer}");
        assert_eq!(answer["old_pid"], serving, "{answer}");
        assert_eq!(answer["new_binary_sha256"], sha.as_str(), "{answer}");
        let new = answer["new_pid"].as_i64().unwrap() as i32;
        seen.push(new);
        // The old generation drains and exits, and the master reaps it: no zombie.
        let old = serving;
        wait_for(
            &format!("generation {old} to exit and be reaped"),
            Duration::from_secs(20),
            || async move { (!exists(old)).then_some(()) },
        )
        .await;
        assert_eq!(serving_pid(&addr, &seen[..seen.len() - 1]).await, new);
        let (code, status) = get_json(&addr, "/status").unwrap();
        assert_eq!(
            (code, status["binary_sha256"].as_str()),
            (200, Some(sha.as_str()))
        );
        let (ppid, pgid) = parent_and_group(new);
        assert_eq!(
            ppid,
            master.pid(),
            "the orphaned successor was adopted by the master"
        );
        assert_eq!(
            pgid, first,
            "every generation stays in the first one's group"
        );
        assert!(
            master.wait_exit(Duration::from_millis(50)).is_none(),
            "the master must keep running"
        );
        tasks_flow(&db, &c, 20).await;
        serving = new;
    }

    notify.set_nonblocking(true).unwrap();
    said.extend(notifications(&notify));
    master.signal(Signal::SIGTERM);
    let status = master
        .wait_exit(Duration::from_secs(25))
        .expect("the master did not stop within 25 s");
    assert!(status.success(), "master exit: {status:?}");
    assert!(
        !group_exists(first),
        "a generation process outlived the master"
    );
    for pid in &seen {
        assert!(!exists(*pid), "generation {pid} left behind");
    }
    said.extend(notifications(&notify));
    assert!(
        said.iter().all(|m| !m.contains("MAINPID")),
        "generations must not talk to systemd: {said:?}"
    );
    assert!(said.iter().any(|m| m.contains("STOPPING=1")), "{said:?}");
    let log = master.log_text();
    assert!(!log.contains("died"), "no generation died: {log}");
}

#[tokio::test]
async fn a_generation_killed_with_sigkill_is_respawned_and_sigusr2_restarts_one() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let upgrades = dir.path().join("upgrades").to_string_lossy().into_owned();
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut master = master(&db.url, &["--upgrade-dir".into(), upgrades], &[]);
    let mut leftovers = Leftovers::default();

    let addr = online_http(&c).await;
    let first = serving_pid(&addr, &[master.pid()]).await;
    leftovers.groups.push(first);
    tasks_flow(&db, &c, 10).await;

    kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    // The port stays open (the master holds it): this waits for the respawned generation.
    let second = serving_pid(&addr, &[master.pid(), first]).await;
    leftovers.groups.push(second);
    assert!(!exists(first), "the killed generation was reaped");
    let (ppid, pgid) = parent_and_group(second);
    assert_eq!(ppid, master.pid());
    assert_eq!(pgid, second, "a respawn starts a new group");
    assert!(master.wait_exit(Duration::from_millis(50)).is_none());
    assert!(
        master.log_text().contains("generation died"),
        "the death is logged"
    );
    tasks_flow(&db, &c, 10).await;

    // SIGUSR2 to the master: the generation drains and exits, and a fresh one follows;
    // an intended restart, not a death.
    master.signal(Signal::SIGUSR2);
    let third = serving_pid(&addr, &[master.pid(), first, second]).await;
    leftovers.groups.push(third);
    wait_for(
        "the drained generation to be reaped",
        Duration::from_secs(20),
        || async move { (!exists(second)).then_some(()) },
    )
    .await;
    assert_eq!(parent_and_group(third), (master.pid(), third));
    let log = master.log_text();
    assert_eq!(log.matches("generation died").count(), 1, "{log}");
    tasks_flow(&db, &c, 10).await;

    master.signal(Signal::SIGTERM);
    let status = master
        .wait_exit(Duration::from_secs(25))
        .expect("the master did not stop within 25 s");
    assert!(status.success(), "master exit: {status:?}");
    assert!(!group_exists(third), "the generation outlived the master");
}

/// The new generations' pids in `scripts/rolling-upgrade.sh`'s progress, from each
/// upgrade's answer (`…, pid OLD -> NEW; waiting …`).
fn new_pids(progress: &str) -> Vec<i32> {
    progress
        .lines()
        .filter_map(|l| l.split(" -> ").nth(1))
        .filter_map(|rest| rest.split(';').next()?.trim().parse().ok())
        .collect()
}

#[tokio::test]
async fn rolling_upgrade_walks_the_fleet_and_stops_at_the_first_failure() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let bundles = keys.variant_bundles(2);
    let worker = |name: &str| {
        let flags = keys.flags(&format!("upgrades-{name}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Proc::worker(name, &db.url, &flags)
    };
    let (w1, w2) = (worker("w1"), worker("w2"));
    let mut leftovers = Leftovers::default();
    let (a1, a2) = (http_of(&c, w1.pid()).await, http_of(&c, w2.pid()).await);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/rolling-upgrade.sh");
    let (zip1, sha1) = &bundles[0];
    let out = Command::new("bash")
        .arg(&script)
        .args(["--timeout", "20"])
        .arg("--read-token-file")
        .arg(common::read_token_file())
        .arg(zip1)
        .args([&a1, &a2])
        .env("ARTEX_UPGRADE_TOKEN", TOKEN)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Before any assertion: every generation an upgrade answer named is ended with the
    // test, whatever fails below.
    leftovers.pids.extend(new_pids(&stdout));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all 2 hosts upgraded"), "{stdout}");
    // Host by host, counted: uploading, the new generation awaited, done.
    for (i, a) in [&a1, &a2].into_iter().enumerate() {
        let at = format!("rolling-upgrade: [{}/2] {a}:", i + 1);
        for step in ["uploading", "waiting for the new generation", "healthy on"] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&at) && l.contains(step)),
                "no '{at} … {step}' line in:\n{stdout}"
            );
        }
    }
    let first = |step: &str| stdout.lines().position(|l| l.contains(step)).unwrap();
    assert!(
        first("[1/2]") < first("[2/2]") && first("healthy on") < first("[2/2]"),
        "one host after the other: {stdout}"
    );
    for a in [&a1, &a2] {
        let (pid, sha) = pid_and_sha(a);
        leftovers.pids.push(pid);
        assert_eq!(&sha, sha1, "{a}");
    }

    // The second host is a dead port: the first is upgraded, then the run stops there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let (zip2, sha2) = &bundles[1];
    let out = Command::new("bash")
        .arg(&script)
        .args(["--timeout", "20", "--token-file"])
        .arg(keys.path("token"))
        .env("ARTEX_READ_TOKEN", common::READ_TOKEN)
        .arg(zip2)
        .args([&a1, &dead_addr, &a2])
        .env_remove("ARTEX_UPGRADE_TOKEN")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    leftovers.pids.extend(new_pids(&stdout));
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("[2/3] {dead_addr}: uploading")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("FAILED at {dead_addr} (2 of 3)")),
        "{stderr}"
    );
    let (pid, sha) = pid_and_sha(&a1);
    leftovers.pids.push(pid);
    assert_eq!(&sha, sha2, "the first host was upgraded");
    assert_eq!(
        &pid_and_sha(&a2).1,
        sha1,
        "the host after the failure is untouched"
    );
    drop((w1, w2));
}

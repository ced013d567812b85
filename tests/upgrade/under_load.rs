//! Five upgrades in a row under continuous HTTP and task traffic: no request refused,
//! no task lost, no descriptor leaked.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use artex_actors::blackboard::NewTask;
use serde_json::{json, Value};

use crate::common;
use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{fd_count, http_get, wait_for, wait_status, worker_http, Proc};
use crate::common::{count, TestDb};
use crate::{curl_upgrade, upgradable_worker, wait_gone, KillAll};

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
        .operator()
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
            bb.operator().submit_many(&batch, "traffic").await.unwrap();
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
    let mut upgrade_ms = Vec::new();
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
        upgrade_ms.push(started.elapsed().as_millis() as u64);
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
    upgrade_ms.sort();
    eprintln!(
        "UPGRADE-METRICS upgrade_ms={upgrade_ms:?} median_ms={} requests_ok={ok} failed={failed:?} tasks_submitted={submitted} fds={fds:?}",
        upgrade_ms[2]
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
    let t = db.bb.operator().task(long).await.unwrap();
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

/// Twenty upgrades back to back, each as soon as the last one's old process is gone,
/// under a stream of resumable tasks that checkpoint every 100 ms with the tests' 3 s
/// lease: no task ever runs again. None is retried, none goes back to pending or loses a
/// lease, every execution of a task starts after the previous one ended, and each runs
/// in its first attempt only (a handed-over task resumes from its checkpoint).
#[tokio::test]
async fn twenty_upgrades_back_to_back_run_no_task_again() {
    const UPGRADES: usize = 20;
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    // Two builds, upgraded to in turn: each upgrade changes the binary.
    let bundles: Vec<PathBuf> = keys.variant_bundles(2).into_iter().map(|b| b.0).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let extra = ["--lease-ms", "3000", "--concurrency", "16"];
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &extra, &[]);
    let http = worker_http(&c, &gen0).await;

    // Every 250 ms a resumable task of 20 steps of 100 ms (each step checkpointed), and
    // a few short ones.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (bb, journal) = (db.bb.clone(), file.clone());
    let traffic = tokio::spawn(async move {
        let mut long = Vec::new();
        loop {
            let t = NewTask::new(
                "journal-checkpoint",
                json!({ "file": journal, "steps": 20, "ms": 100 }),
            );
            long.push(bb.operator().submit(&t, "traffic").await.unwrap());
            let short: Vec<NewTask> = (0..3)
                .map(|i| NewTask::new("echo", json!({ "i": i })))
                .collect();
            bb.operator().submit_many(&short, "traffic").await.unwrap();
            tokio::select! {
                _ = &mut stop_rx => return long,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    });
    wait_for("resumable tasks to run", Duration::from_secs(20), || async {
        (count(
            &c,
            "select count(*) from artex.tasks where kind = 'journal-checkpoint' and status = 'running'",
        )
        .await
            > 0)
        .then_some(())
    })
    .await;

    let mut spawned = KillAll(Vec::new());
    let mut old = gen0.pid();
    let mut resumed = 0;
    for i in 0..UPGRADES {
        let (code, body) = curl_upgrade(&http, &bundles[i % 2], Some(TOKEN), false);
        assert_eq!(code, 200, "upgrade {}: {body}", i + 1);
        assert_eq!(body["status"], "upgraded", "{body}");
        assert_eq!(body["tasks_conflicting"], 0, "{body}");
        resumed += body["tasks_resumed"].as_u64().unwrap_or(0);
        let new = body["new_pid"].as_i64().unwrap() as i32;
        spawned.0.push(new);
        if i == 0 {
            gen0.wait_exit(Duration::from_secs(30)).expect("gen0 exits");
        } else {
            wait_gone(old, Duration::from_secs(30)).await;
        }
        old = new;
    }
    let long = {
        let _ = stop_tx.send(());
        traffic.await.unwrap()
    };
    wait_for("every task to finish", Duration::from_secs(90), || async {
        (count(&c, "select count(*) from artex.tasks where status not in ('succeeded','failed','timeout','canceled')").await == 0)
            .then_some(())
    })
    .await;
    eprintln!(
        "UPGRADE-METRICS back_to_back={UPGRADES} long_tasks={} resumed_in_transfers={resumed}",
        long.len()
    );
    assert!(resumed > 0, "no task crossed an upgrade: nothing was shown");

    let again = common::pairs::<String, String, Vec<(String, String)>>(
        &c,
        "select t.id::text, t.status::text || ' after ' || t.retries || ' retries' from artex.tasks t
         where t.status <> 'succeeded' or t.retries <> 0
         union all
         select h.task_id::text, coalesce(h.reason, '') from artex.task_transitions h
         where (h.to_status = 'pending' and h.from_status is not null)
            or h.reason like '%lease%'",
    )
    .await;
    assert!(again.is_empty(), "tasks run again or taken back: {again:?}");
    let lines = crate::common::journal::read(&file);
    let mut open: std::collections::HashMap<uuid::Uuid, i32> = Default::default();
    for l in &lines {
        assert_eq!(l.attempt, 1, "a later attempt ran: {l:?}");
        match l.what.as_str() {
            "start" => {
                if let Some(pid) = open.insert(l.task, l.pid) {
                    panic!(
                        "task {} started in {} while running in {pid}",
                        l.task, l.pid
                    );
                }
            }
            _ => assert_eq!(
                open.remove(&l.task),
                Some(l.pid),
                "an end without its start: {l:?}"
            ),
        }
    }
    assert!(open.is_empty(), "executions never ended: {open:?}");
    let log = gen0.log_text();
    let lost: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lease lost") || l.contains("outcome discarded"))
        .collect();
    assert!(lost.is_empty(), "{}", lost.join("\n"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_gone(old, Duration::from_secs(30)).await;
}

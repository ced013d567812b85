//! The task transfer of a hot upgrade under load: every resumable task the old process
//! hands over runs on in the new one to its end, once, in the attempt it was in, at the
//! lease epoch it was handed over at. Nobody takes it back in between: no "lease lost",
//! no retry, no second execution.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use artex_actors::blackboard::{NewTask, TaskStatus};
use serde_json::json;
use uuid::Uuid;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::journal::{self, Line};
use crate::common::procs::{wait_for, worker_http, Proc};
use crate::common::TestDb;
use crate::{curl_upgrade, upgradable_worker, KillAll};
use artex_actors::Blackboard;
use std::path::Path;

/// Resumable tasks running when the upgrade comes.
const TASKS: usize = 8;
/// Their steps of 100 ms, each checkpointed: enough to be still running when an upgrade
/// slowed by a loaded machine (a full run) reaches the transfer, and to run on in the new
/// process past many lease renewals (the tests' lease is 3 s).
const STEPS: u64 = 150;

/// What happened to `id`: its history and its executions, for a failure's message.
async fn story(bb: &Blackboard, id: Uuid, lines: &[Line]) -> String {
    let mut s = format!("task {id}:\n");
    for t in bb.operator().transitions(id).await.unwrap() {
        let _ = writeln!(
            s,
            "  {} {:?} -> {:?} epoch {} by {} (worker {:?}): {:?}",
            t.at.format("%H:%M:%S%.3f"),
            t.from_status,
            t.to_status,
            t.lease_epoch,
            t.actor,
            t.worker,
            t.reason
        );
    }
    for l in lines.iter().filter(|l| l.task == id) {
        let _ = writeln!(s, "  {l:?}");
    }
    s
}

#[tokio::test]
async fn tasks_handed_over_under_load_run_on_once_in_the_new_process() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let bundle = keys.variant_bundles(1).remove(0).0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &["--concurrency", "16"], &[]);
    let http = worker_http(&c, &gen0).await;
    let old = gen0.pid();

    let ids = submit_long(&db.bb, &file, TASKS, STEPS).await;

    // Load while the upgrade runs: short tasks through the same worker. (No busy loops:
    // they made no difference to this test's outcome in 40 runs, and in a full run they
    // slow every other test sharing the machine.)
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let bb = db.bb.clone();
    let traffic = tokio::spawn(async move {
        loop {
            let batch: Vec<NewTask> = (0..20)
                .map(|i| NewTask::new("echo", json!({ "i": i })))
                .collect();
            bb.operator().submit_many(&batch, "traffic").await.unwrap();
            tokio::select! {
                _ = &mut stop_rx => return,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    });

    // Every long task runs here and has saved progress: each is suspended at a
    // checkpoint and handed over.
    wait_checkpointed(&db.bb, &ids).await;

    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    assert_eq!(body["tasks_resumed"], TASKS, "{body}");
    gen0.wait_exit(Duration::from_secs(60))
        .expect("the first process exits");
    // The port is the new process's alone now: its /metrics counts the tasks it took.
    let (_, metrics) = crate::common::procs::http_get(&http, "/metrics").unwrap();
    let line = format!("artex_worker_tasks_transferred_total{{direction=\"in\"}} {TASKS}\n");
    assert!(metrics.contains(&line), "{line:?} not in\n{metrics}");

    wait_ended(&db.bb, &ids).await;
    let _ = stop_tx.send(());
    traffic.await.unwrap();

    assert_ran_on_once(&db.bb, &ids, &file, old, new, &gen0.log_text()).await;
}

/// Submits `n` resumable tasks of `steps` checkpointed steps of 100 ms, journaled to `file`.
pub(crate) async fn submit_long(bb: &Blackboard, file: &Path, n: usize, steps: u64) -> Vec<Uuid> {
    let long: Vec<NewTask> = (0..n)
        .map(|_| {
            NewTask::new(
                "journal-checkpoint",
                json!({ "file": file, "steps": steps, "ms": 100 }),
            )
        })
        .collect();
    bb.operator().submit_many(&long, "test").await.unwrap()
}

/// Until every one of `ids` runs and has saved a checkpoint past its third step.
pub(crate) async fn wait_checkpointed(bb: &Blackboard, ids: &[Uuid]) {
    wait_for(
        "the long tasks to run and checkpoint in the first process",
        Duration::from_secs(60),
        || async {
            let mut ready = 0;
            for id in ids {
                let t = bb.operator().task(*id).await.ok()?;
                let done = t
                    .checkpoint
                    .as_ref()
                    .and_then(|c| c.get("done"))
                    .and_then(|d| d.as_u64());
                if t.status == TaskStatus::Running && done.is_some_and(|d| d >= 3) {
                    ready += 1;
                }
            }
            (ready == ids.len()).then_some(())
        },
    )
    .await;
}

/// Until every one of `ids` has ended.
pub(crate) async fn wait_ended(bb: &Blackboard, ids: &[Uuid]) {
    wait_for(
        "every long task to end",
        Duration::from_secs(120),
        || async {
            for id in ids {
                let t = bb.operator().task(*id).await.ok()?;
                if !t.status.is_terminal() {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// Every one of `ids` ran in process `old`, was handed over once, and ran on in `new` to
/// its end, once, in its first attempt, at the epoch it was handed over at; nobody took
/// it back in between; `log` (both processes') says no lease was lost.
pub(crate) async fn assert_ran_on_once(
    bb: &Blackboard,
    ids: &[Uuid],
    file: &Path,
    old: i32,
    new: i32,
    log: &str,
) {
    let lines = journal::read(file);
    let mut failures = String::new();
    for id in ids {
        let t = bb.operator().task(*id).await.unwrap();
        let history = bb.operator().transitions(*id).await.unwrap();
        let mine: Vec<&Line> = lines.iter().filter(|l| l.task == *id).collect();
        let count = |pid: i32, what: &str| {
            mine.iter()
                .filter(|l| l.pid == pid && l.what == what)
                .count()
        };
        let handed: Vec<_> = history
            .iter()
            .filter(|h| {
                h.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("handed over by"))
            })
            .collect();
        let mut why = Vec::new();
        if t.status != TaskStatus::Succeeded || t.retries != 0 {
            why.push(format!("ended {} after {} retries", t.status, t.retries));
        }
        if mine.iter().any(|l| l.attempt != 1) {
            why.push("ran again as a later attempt".to_string());
        }
        if (count(new, "start"), count(new, "end")) != (1, 1)
            || !mine
                .iter()
                .any(|l| l.pid == new && l.what == "end" && l.how == "ok")
        {
            why.push("not exactly one execution, to its end, in the new process".into());
        }
        if count(old, "start") != count(old, "end")
            || mine.iter().any(|l| l.pid != old && l.pid != new)
        {
            why.push("an execution outside the two processes, or one left running".into());
        }
        // Handed over once, and finished at the epoch it was handed over at: nobody took
        // it back or assigned it again in between.
        let last = history.last().unwrap();
        if handed.len() != 1 || last.lease_epoch != handed[0].lease_epoch {
            why.push("not finished at the epoch it was handed over at".into());
        }
        if history.iter().any(|h| {
            (h.from_status.is_some() && h.to_status == TaskStatus::Pending)
                || h.reason.as_deref().is_some_and(|r| r.contains("lease"))
        }) {
            why.push("taken back after the transfer".into());
        }
        if !why.is_empty() {
            let _ = write!(
                failures,
                "{}\n{}",
                why.join("; "),
                story(bb, *id, &lines).await
            );
        }
    }
    let lost: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lease lost") || l.contains("outcome discarded"))
        .collect();
    assert!(
        failures.is_empty() && lost.is_empty(),
        "old pid {old}, new pid {new}\n{failures}\nlog lines:\n{}",
        lost.join("\n")
    );
    // No overlap: each task's execution in the old process ended before the new one's
    // began (its lines are in the order written).
    let order: BTreeMap<Uuid, Vec<(i32, String)>> =
        lines.iter().fold(BTreeMap::new(), |mut m, l| {
            m.entry(l.task)
                .or_insert_with(Vec::new)
                .push((l.pid, l.what.clone()));
            m
        });
    for (id, seq) in order {
        let expected = vec![
            (old, "start".to_string()),
            (old, "end".to_string()),
            (new, "start".to_string()),
            (new, "end".to_string()),
        ];
        assert_eq!(seq, expected, "task {id}");
    }
}

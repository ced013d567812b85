//! The runtime end to end, with real planner and worker processes on real PostgreSQL:
//! mixed workloads, crashes (kill -9), a PostgreSQL restart, a zombie worker, several
//! planners, graceful stops, NOTIFY and its safety nets, supervision, worker HTTP.

mod common;

use common::count;

use std::collections::HashMap;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use common::procs::{http_get, wait_for, wait_status, worker_http, worker_id, Proc};
use common::TestDb;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio_postgres::Client;

async fn unfinished(c: &Client) -> i64 {
    count(
        c,
        "select count(*) from artex.tasks
         where status not in ('succeeded', 'failed', 'timeout', 'canceled')",
    )
    .await
}

async fn wait_all_finished(c: &Client, timeout: Duration) {
    wait_for("every task to finish", timeout, || async {
        (unfinished(c).await == 0).then_some(())
    })
    .await;
}

/// The history rows that stand for an assignment (since V10): the start of one
/// (`assigned > running`, which names its worker and epoch), or, for an assignment that
/// ended without a start, its own row (`pending > assigned`). Each assignment has exactly
/// one of them; a task transfer's `assigned > assigned` row is not one.
const ASSIGNMENT_ROWS: &str = "((from_status = 'pending' and to_status = 'assigned')
     or (from_status = 'assigned' and to_status = 'running'))";

/// No task ever succeeded twice, and none was assigned twice at one epoch.
async fn assert_no_double_run(c: &Client) {
    let twice = count(
        c,
        "select count(*) from (select task_id from artex.task_transitions
         where to_status = 'succeeded' group by task_id having count(*) > 1) x",
    )
    .await;
    assert_eq!(twice, 0, "tasks that succeeded twice");
    let same_epoch = count(
        c,
        &format!(
            "select count(*) from (select task_id, lease_epoch from artex.task_transitions
             where {ASSIGNMENT_ROWS} group by 1, 2 having count(*) > 1) x"
        ),
    )
    .await;
    assert_eq!(same_epoch, 0, "assignments sharing a fencing token");
}

fn tasks(kind: &str, n: usize, payload: serde_json::Value) -> Vec<NewTask> {
    (0..n)
        .map(|_| NewTask::new(kind, payload.clone()))
        .collect()
}

#[tokio::test]
async fn five_thousand_mixed_tasks_through_one_planner_and_three_workers() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let workers: Vec<Proc> = (0..3)
        .map(|i| Proc::worker(&format!("worker{i}"), &db.url, &[]))
        .collect();
    let mut batch: Vec<NewTask> = (0..3000)
        .map(|i| NewTask::new("echo", json!({ "i": i })))
        .collect();
    batch.extend(tasks("noop", 1000, json!({})));
    batch.extend(tasks("fail", 500, json!({ "times": 1 })));
    batch.extend((0..250).map(|_| NewTask {
        max_retries: Some(1),
        ..NewTask::new("fail", json!({}))
    }));
    batch.extend(tasks("sleep", 230, json!({ "ms": 5 })));
    batch.extend((0..20).map(|_| NewTask {
        max_retries: Some(0),
        timeout_ms: Some(100),
        ..NewTask::new("sleep", json!({ "ms": 5000 }))
    }));
    db.bb.operator().submit_many(&batch, "test").await.unwrap();
    for w in &workers {
        worker_id(&c, w).await;
    }
    wait_all_finished(&c, Duration::from_secs(180)).await;

    let by_status: HashMap<String, i64> = common::pairs(
        &c,
        "select status::text, count(*) from artex.tasks group by 1",
    )
    .await;
    assert_eq!(by_status.get("succeeded"), Some(&4730), "{by_status:?}");
    assert_eq!(by_status.get("failed"), Some(&250), "{by_status:?}");
    assert_eq!(by_status.get("timeout"), Some(&20), "{by_status:?}");
    assert_no_double_run(&c).await;
    // echo returns its payload; fail{times:1} succeeded on its second attempt.
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'echo' and result <> payload"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'fail' and status = 'succeeded'
                   and (retries <> 1 or result->>'succeeded_on_attempt' <> '2')"
        )
        .await,
        0
    );
    // Failed for good after 1 + max_retries attempts, each failure recorded.
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'failed'
                   and (retries <> 2 or error not like 'failing on purpose%')"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'timeout'
                   and error not like '%past its timeout%'"
        )
        .await,
        0
    );
    // Every worker took part.
    assert_eq!(
        count(
            &c,
            "select count(distinct worker) from artex.task_transitions
                   where to_status = 'succeeded'"
        )
        .await,
        3
    );
}

#[tokio::test]
async fn a_worker_killed_mid_task_has_its_tasks_finished_by_another() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let a = Proc::worker(
        "victim",
        &db.url,
        &["--concurrency", "4", "--prefetch", "0"],
    );
    let a_id = worker_id(&c, &a).await;
    db.bb
        .operator()
        .submit_many(&tasks("sleep", 4, json!({ "ms": 1500 })), "test")
        .await
        .unwrap();
    let c2 = &c;
    let a_id2 = a_id.clone();
    wait_for("4 tasks running on the victim", Duration::from_secs(20), || {
        let id = a_id2.clone();
        async move {
            let n: i64 = c2
                .query_one(
                    "select count(*) from artex.tasks where status = 'running' and assigned_to = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            (n == 4).then_some(())
        }
    })
    .await;
    a.signal(Signal::SIGKILL);
    let b = Proc::worker("rescuer", &db.url, &[]);
    let b_id = worker_id(&c, &b).await;
    // Within the lease (3 s) plus the reaper's interval, another worker finishes them.
    wait_all_finished(&c, Duration::from_secs(30)).await;
    let rows = c
        .query(
            "select status::text, retries,
                    (select worker from artex.task_transitions x
                     where x.task_id = t.id and x.to_status = 'succeeded')
             from artex.tasks t",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(r.get::<_, String>(0), "succeeded");
        assert_eq!(r.get::<_, i32>(1), 1, "the lost attempt counts as a retry");
        assert_eq!(
            r.get::<_, Option<String>>(2).as_deref(),
            Some(b_id.as_str())
        );
    }
    assert_no_double_run(&c).await;
}

#[tokio::test]
async fn a_zombie_worker_that_lost_its_lease_cannot_write() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let z = Proc::worker(
        "zombie",
        &db.url,
        &["--concurrency", "1", "--prefetch", "0"],
    );
    let z_id = worker_id(&c, &z).await;
    let z_http = worker_http(&c, &z).await;
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new("checkpoint", json!({ "steps": 6, "ms": 500 })),
            "test",
        )
        .await
        .unwrap();
    let zid = z_id.clone();
    let c2 = &c;
    wait_for(
        "the task to run on the zombie-to-be",
        Duration::from_secs(20),
        || {
            let zid = zid.clone();
            async move {
                let r = c2
                    .query_one(
                        "select status::text, assigned_to from artex.tasks where id = $1",
                        &[&id],
                    )
                    .await
                    .unwrap();
                (r.get::<_, String>(0) == "running" && r.get::<_, Option<String>>(1) == Some(zid))
                    .then_some(())
            }
        },
    )
    .await;
    z.signal(Signal::SIGSTOP);
    let w = Proc::worker("successor", &db.url, &[]);
    let w_id = worker_id(&c, &w).await;
    let wid = w_id.clone();
    wait_for(
        "the task to be taken back and run by the successor",
        Duration::from_secs(30),
        || {
            let wid = wid.clone();
            async move {
                let r = c2
                    .query_one("select assigned_to from artex.tasks where id = $1", &[&id])
                    .await
                    .unwrap();
                (r.get::<_, Option<String>>(0) == Some(wid)).then_some(())
            }
        },
    )
    .await;
    let zombie_writes_before = count(
        &c,
        &format!("select count(*) from artex.task_transitions where actor = '{z_id}'"),
    )
    .await;
    z.signal(Signal::SIGCONT);
    // Woken up, the zombie goes on with the task it had (its next checkpoint, its lease
    // renewal or its outcome): the blackboard refuses that write, and it says so.
    wait_for(
        "the zombie to try to write and be fenced off",
        Duration::from_secs(30),
        || {
            let z_http = z_http.clone();
            async move {
                let (code, body) = http_get(&z_http, "/status").ok()?;
                let status: serde_json::Value = serde_json::from_str(&body).ok()?;
                let fenced = status["fenced_off"].as_u64()?;
                (code == 200 && fenced >= 1).then_some(())
            }
        },
    )
    .await;
    wait_all_finished(&c, Duration::from_secs(30)).await;
    let t = db.bb.operator().task(id).await.unwrap();
    assert_eq!(t.status.as_str(), "succeeded");
    // The zombie wrote no transition after it lost the lease…
    let zombie_writes_after = count(
        &c,
        &format!("select count(*) from artex.task_transitions where actor = '{z_id}'"),
    )
    .await;
    assert_eq!(zombie_writes_before, zombie_writes_after);
    // …and the successor finished the task, resuming the checkpoint: every step once.
    let steps = t.result.unwrap()["steps"].as_array().unwrap().clone();
    let numbers: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(numbers, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(
        count(&c, &format!(
            "select count(*) from artex.task_transitions where to_status = 'succeeded' and worker = '{w_id}'"
        ))
        .await,
        1
    );
    assert_no_double_run(&c).await;
}

/// A held task's row kept locked most of the time by short writes (as a handler that
/// checkpoints every 100 ms keeps it under load) still has its lease renewed: a renewal
/// that finds the row locked goes again at once, not a third of the lease later. It used
/// to wait, so two renewals in a row met the lock, the worker's own fence stopped the
/// task before its lease could run out, and it ran again (the re-run of a hot upgrade's
/// transferred task under load).
#[tokio::test]
async fn a_task_whose_row_is_locked_at_renewal_time_keeps_its_lease() {
    let db = TestDb::new().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    // 6 s of work (two lease lengths), no checkpoint of its own: the locks are ours.
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new("journal", json!({ "file": file, "steps": 60, "ms": 100 })),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, id, "running", Duration::from_secs(20)).await;

    // The row locked 450 ms of every 600 ms until the task ends. Renewals come every
    // second: of three in a row at most one can fall in a free 150 ms, so without a
    // prompt second try two in a row meet the lock and the lease is never renewed in
    // time; retried every 100 ms, one lands in each free window.
    let locker = db.client().await;
    loop {
        locker.batch_execute("begin").await.unwrap();
        locker
            .query("select 1 from artex.tasks where id = $1 for update", &[&id])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(450)).await;
        locker.batch_execute("commit").await.unwrap();
        let t = db.bb.operator().task(id).await.unwrap();
        if t.status.is_terminal() || t.retries > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
    let t = db.bb.operator().task(id).await.unwrap();
    let journal = std::fs::read_to_string(&file).unwrap();
    assert_eq!(t.retries, 0, "{journal}\n{}", w.log_text());
    // One execution: one start and one end, in attempt 1.
    let lines: Vec<&str> = journal.lines().collect();
    assert_eq!(lines.len(), 2, "{journal}");
    assert!(
        lines.iter().all(|l| l.split(' ').nth(1) == Some("1")),
        "{journal}"
    );
    assert!(!w.log_text().contains("lease not renewed in time"));
}

#[tokio::test]
async fn three_planners_never_assign_a_task_twice() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("planner{i}"), &db.url, &["--batch", "50"]))
        .collect();
    let workers: Vec<Proc> = (0..3)
        .map(|i| Proc::worker(&format!("worker{i}"), &db.url, &["--concurrency", "20"]))
        .collect();
    for w in &workers {
        worker_id(&c, w).await;
    }
    // Submitted in waves so every planner is woken many times and they race.
    for wave in 0..30 {
        let batch: Vec<NewTask> = (0..100)
            .map(|i| NewTask::new("echo", json!({ "wave": wave, "i": i })))
            .collect();
        db.bb.operator().submit_many(&batch, "test").await.unwrap();
    }
    wait_all_finished(&c, Duration::from_secs(120)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'"
        )
        .await,
        3000
    );
    // A task is assigned again only after it was taken back (its worker was declared
    // gone under load, say): never while another worker holds it.
    let assignments = count(
        &c,
        &format!("select count(*) from artex.task_transitions where {ASSIGNMENT_ROWS}"),
    )
    .await;
    assert!(
        assignments >= 3000,
        "{assignments} assignments in the history"
    );
    let assigned_without_release = count(
        &c,
        &format!(
            "select count(*) from (
                 select task_id,
                        count(*) filter (where {ASSIGNMENT_ROWS}) as assignments,
                        count(*) filter (where to_status = 'pending'
                                         and from_status in ('assigned', 'running')) as releases
                 from artex.task_transitions group by task_id) x
             where assignments > releases + 1"
        ),
    )
    .await;
    assert_eq!(assigned_without_release, 0);
    assert_no_double_run(&c).await;
    // (Which planner made each assignment is no longer in the history since V10: an
    // assignment followed by a start has no row of its own, and the start names the
    // worker, not the planner.)
}

#[tokio::test]
async fn postgres_restart_mid_run_loses_nothing() {
    // A private cluster: restarting the shared one would cut every other test off.
    let private = common::PrivateCluster::start().await;
    let (cluster, url, bb) = (&private.cluster, private.url.clone(), &private.bb);
    let c = common::connect(&url).await;
    let _p = Proc::planner("planner", &url, &[]);
    let w1 = Proc::worker("worker1", &url, &[]);
    let _w2 = Proc::worker("worker2", &url, &[]);
    let http = worker_http(&c, &w1).await;
    bb.operator()
        .submit_many(&tasks("sleep", 3000, json!({ "ms": 5 })), "test")
        .await
        .unwrap();
    wait_for("300 tasks to succeed", Duration::from_secs(60), || async {
        (count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'",
        )
        .await
            >= 300)
            .then_some(())
    })
    .await;
    cluster.restart().unwrap();
    let c = common::connect(&url).await;
    wait_all_finished(&c, Duration::from_secs(120)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'"
        )
        .await,
        3000
    );
    assert_no_double_run(&c).await;

    // /health says why it is not ready while the database is down, and recovers.
    assert_eq!(http_get(&http, "/health").unwrap().0, 200);
    cluster.stop().unwrap();
    let body = wait_for(
        "/health to report the database down",
        Duration::from_secs(20),
        || {
            let http = http.clone();
            async move {
                let (code, body) = http_get(&http, "/health").ok()?;
                (code == 503).then_some(body)
            }
        },
    )
    .await;
    assert!(body.contains("database unreachable"), "{body}");
    cluster.start().unwrap();
    wait_for("/health to recover", Duration::from_secs(30), || {
        let http = http.clone();
        async move { (http_get(&http, "/health").ok()?.0 == 200).then_some(()) }
    })
    .await;
}

/// Found by the hour-long soak: a process started while PostgreSQL was down exited at
/// once (218 times in that hour), each exit a failure a supervisor counts against its
/// start limit (systemd gives up after 5 in 10 s). A planner, a worker and `serve`
/// started before their database now wait for it and come up with it; one told not to
/// wait (`--db-start-wait-ms 0`) fails at once, saying why.
#[tokio::test]
async fn processes_started_before_their_database_come_up_with_it() {
    let private = common::PrivateCluster::start().await;
    let (cluster, url, bb) = (&private.cluster, private.url.clone(), &private.bb);
    cluster.stop().unwrap();
    let (code, _, err) = common::run_cli(
        &url,
        &["worker", "--db-start-wait-ms", "0", "--http", "127.0.0.1:0"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("database"), "{err}");

    let mut planner = Proc::planner("planner", &url, &[]);
    let mut worker = Proc::worker("worker", &url, &[]);
    let mut serve = Proc::start("serve", &url, &["serve", "--http", "127.0.0.1:0"], &[]);
    for p in [&planner, &worker, &serve] {
        wait_for(
            "a process to say it waits",
            Duration::from_secs(30),
            || async {
                p.log_text()
                    .contains("the database is unreachable; trying again")
                    .then_some(())
            },
        )
        .await;
    }
    for p in [&mut planner, &mut worker, &mut serve] {
        assert!(p.exited_now().is_none(), "{}", p.log_text());
    }

    cluster.start().unwrap();
    let id = bb
        .operator()
        .submit(&NewTask::new("echo", json!({"up": true})), "test")
        .await
        .unwrap();
    wait_status(bb, id, "succeeded", Duration::from_secs(60)).await;
    common::procs::serve_address(&serve).await;
    for p in [&mut planner, &mut worker, &mut serve] {
        assert!(p.exited_now().is_none(), "{}", p.log_text());
    }
}

#[tokio::test]
async fn sigterm_drains_a_worker_gracefully() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let mut a = Proc::worker(
        "draining",
        &db.url,
        &["--concurrency", "2", "--prefetch", "4"],
    );
    let a_id = worker_id(&c, &a).await;
    db.bb
        .operator()
        .submit_many(&tasks("sleep", 6, json!({ "ms": 1000 })), "test")
        .await
        .unwrap();
    let c2 = &c;
    let aid = a_id.clone();
    let http = worker_http(&c, &a).await;
    // Two handlers run; the other four wait in the worker's local queue, still `assigned`
    // in the blackboard.
    wait_for(
        "2 running and 4 queued on the worker",
        Duration::from_secs(20),
        || {
            let aid = aid.clone();
            let http = http.clone();
            async move {
                let r = c2
                    .query_one(
                        "select count(*) filter (where status = 'running'),
                            count(*) filter (where status = 'assigned')
                     from artex.tasks where assigned_to = $1",
                        &[&aid],
                    )
                    .await
                    .unwrap();
                let (_, body) = http_get(&http, "/status").ok()?;
                let status: serde_json::Value = serde_json::from_str(&body).ok()?;
                let running = status["running"].as_array()?.len();
                (r.get::<_, i64>(0) == 2
                    && r.get::<_, i64>(1) == 4
                    && running == 2
                    && status["queued"] == 4)
                    .then_some(())
            }
        },
    )
    .await;
    a.signal(Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(15))
        .expect("worker exits after draining");
    assert!(status.success(), "exit status {status:?}");
    // The two running tasks finished there; the four queued were given back unstarted.
    assert_eq!(
        count(&c, &format!(
            "select count(*) from artex.task_transitions where to_status = 'succeeded' and worker = '{a_id}'"
        ))
        .await,
        2
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'pending' and retries = 0 and started_at is null"
        )
        .await,
        4
    );
    let state: String = c
        .query_one(
            "select state::text from artex.workers where id = $1",
            &[&a_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "gone");
    let _b = Proc::worker("next", &db.url, &[]);
    wait_all_finished(&c, Duration::from_secs(30)).await;
    assert_no_double_run(&c).await;
}

#[tokio::test]
async fn a_drain_deadline_gives_long_tasks_back_without_counting_an_attempt() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let mut a = Proc::worker("slow", &db.url, &["--drain-ms", "300"]);
    worker_id(&c, &a).await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("sleep", json!({ "ms": 60000 })), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "running", Duration::from_secs(20)).await;
    a.signal(Signal::SIGTERM);
    let status = a
        .wait_exit(Duration::from_secs(10))
        .expect("worker exits at its deadline");
    assert!(status.success());
    let t = db.bb.operator().task(id).await.unwrap();
    assert_eq!(t.status.as_str(), "pending");
    assert_eq!(t.retries, 0);
}

#[tokio::test]
async fn a_stopped_planner_leaves_the_work_to_another() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut p1 = Proc::planner("planner1", &db.url, &[]);
    let _p2 = Proc::planner("planner2", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    worker_id(&c, &w).await;
    p1.signal(Signal::SIGTERM);
    let status = p1
        .wait_exit(Duration::from_secs(10))
        .expect("planner exits");
    assert!(status.success());
    db.bb
        .operator()
        .submit_many(&tasks("echo", 50, json!({})), "test")
        .await
        .unwrap();
    wait_all_finished(&c, Duration::from_secs(30)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'"
        )
        .await,
        50
    );
}

#[tokio::test]
async fn notify_dispatches_at_once_and_a_dropped_listener_reconnects() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Polls so slow that only NOTIFY (or the reconnect rescan) can explain a dispatch.
    let _p = Proc::planner("planner", &db.url, &["--planner-poll-ms", "600000"]);
    let w = Proc::worker("worker", &db.url, &["--worker-poll-ms", "600000"]);
    worker_id(&c, &w).await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({"n": 1})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(10)).await;
    // Cut every LISTEN session: both reconnect, re-LISTEN and rescan.
    let cut = count(
        &c,
        "select count(pg_terminate_backend(pid)) from pg_stat_activity
         where datname = current_database() and query ilike 'listen%'",
    )
    .await;
    assert!(
        cut >= 2,
        "expected the planner's and the worker's LISTEN sessions, cut {cut}"
    );
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({"n": 2})), "test")
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
}

#[tokio::test]
async fn the_poll_catches_tasks_that_no_notification_announces() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    worker_id(&c, &w).await;
    // Delayed: the insert's NOTIFY comes too early, nothing announces it becoming due.
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask {
                run_at: Some(chrono::Utc::now() + chrono::Duration::milliseconds(1500)),
                ..NewTask::new("echo", json!({}))
            },
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(15)).await;
    let t = db.bb.operator().task(id).await.unwrap();
    assert!(t.started_at.unwrap() >= t.run_at);
}

#[tokio::test]
async fn a_panicking_actor_is_restarted_counted_and_work_goes_on() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let up = Proc::start(
        "up",
        &db.url,
        &["up", "--http", "127.0.0.1:0", "--reap-ms", "200"],
        &[("ARTEX_FAILPOINTS", "assigner,reaper")],
    );
    let http = worker_http(&c, &up).await;
    db.bb
        .operator()
        .submit_many(&tasks("echo", 20, json!({})), "test")
        .await
        .unwrap();
    wait_all_finished(&c, Duration::from_secs(30)).await;
    let (code, metrics) = http_get(&http, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("artex_actor_restarts_total{actor=\"assigner\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("artex_actor_restarts_total{actor=\"reaper\"} 1"),
        "{metrics}"
    );
    assert!(up
        .log_text()
        .contains("actor panicked; the supervisor restarts it"));
}

#[tokio::test]
async fn worker_http_reports_health_and_status() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    let http = worker_http(&c, &w).await;
    let (code, body) = http_get(&http, "/health").unwrap();
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["ready"], true);

    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("sleep", json!({ "ms": 3000 })), "test")
        .await
        .unwrap();
    let status = wait_for(
        "/status to list the running task",
        Duration::from_secs(15),
        || {
            let http = http.clone();
            async move {
                let (_, body) = http_get(&http, "/status").ok()?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                (v["running"].as_array()?.len() == 1).then_some(v)
            }
        },
    )
    .await;
    assert_eq!(status["running"][0]["id"], id.to_string());
    assert_eq!(status["pid"], w.pid());
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    let bin = std::fs::read(common::artex_bin()).unwrap();
    use sha2::Digest;
    assert_eq!(
        status["binary_sha256"],
        hex::encode(sha2::Sha256::digest(&bin))
    );
    let (code, metrics) = http_get(&http, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("artex_tasks_running 1"), "{metrics}");
}

/// `/status` of the worker serving `http`, as JSON.
fn status_of(http: &str) -> Option<serde_json::Value> {
    let (_, body) = http_get(http, "/status").ok()?;
    serde_json::from_str(&body).ok()
}

/// The capacity a worker registered in the blackboard, which planners never exceed.
async fn registered_capacity(c: &Client, worker: &str) -> i64 {
    c.query_one(
        "select capacity::int8 from artex.workers where id = $1",
        &[&worker],
    )
    .await
    .unwrap()
    .get(0)
}

// Without --prefetch, a worker's local queue follows its pace: shallow while idle, deep
// while it finishes short tasks by the thousand, shallow again once idle; the planners
// see each depth as the worker's capacity. --prefetch pins it.
#[tokio::test]
async fn a_worker_without_prefetch_sizes_its_queue_to_its_pace() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let auto = Proc::worker("auto", &db.url, &["--concurrency", "10"]);
    let pinned = Proc::worker(
        "pinned",
        &db.url,
        &["--concurrency", "10", "--prefetch", "7"],
    );
    let (auto_id, pinned_id) = (worker_id(&c, &auto).await, worker_id(&c, &pinned).await);
    let (auto_http, pinned_http) = (worker_http(&c, &auto).await, worker_http(&c, &pinned).await);
    let idle = status_of(&auto_http).unwrap();
    assert_eq!(idle["prefetch"], 4, "{idle}");
    assert_eq!(idle["prefetch_auto"], true, "{idle}");
    assert_eq!(registered_capacity(&c, &auto_id).await, 14);
    let (_, metrics) = http_get(&auto_http, "/metrics").unwrap();
    assert!(metrics.contains("\nartex_queue_depth 4\n"), "{metrics}");

    c.batch_execute("insert into artex.tasks (kind) select 'noop' from generate_series(1, 20000)")
        .await
        .unwrap();
    // Deeper, and the planners told: the blackboard holds the same capacity.
    let busy = wait_for(
        "the queue to deepen with the work",
        Duration::from_secs(60),
        || {
            let (c, http, id) = (&c, auto_http.clone(), auto_id.clone());
            async move {
                let s = status_of(&http)?;
                let depth = s["prefetch"].as_i64()?;
                (depth >= 40 && registered_capacity(c, &id).await == 10 + depth).then_some(s)
            }
        },
    )
    .await;
    assert!(busy["finished_per_s"].as_f64().unwrap() > 0.0, "{busy}");
    let fixed = status_of(&pinned_http).unwrap();
    assert_eq!(fixed["prefetch"], 7, "{fixed}");
    assert_eq!(fixed["prefetch_auto"], false, "{fixed}");
    assert_eq!(registered_capacity(&c, &pinned_id).await, 17);
    wait_all_finished(&c, Duration::from_secs(120)).await;
    // Idle again: back to the minimum, in the blackboard too.
    wait_for(
        "the queue to shrink back once idle",
        Duration::from_secs(30),
        || {
            let (c, http, id) = (&c, auto_http.clone(), auto_id.clone());
            async move {
                let s = status_of(&http)?;
                (s["prefetch"] == 4 && registered_capacity(c, &id).await == 14).then_some(())
            }
        },
    )
    .await;
    assert_no_double_run(&c).await;
}

/// A handler decides what follows its failure: discard (failed now, retries left),
/// snooze (later, no attempt counted), retry at a time of its choosing; the history says
/// which it was.
#[tokio::test]
async fn a_handler_discards_snoozes_or_retries_at_a_time_and_the_history_says_which() {
    use artex_actors::blackboard::TaskStatus;
    let db = TestDb::new().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &["--retry-base-ms", "60000"]);
    let op = db.bb.operator();
    let task = |payload: serde_json::Value| NewTask {
        max_retries: Some(3),
        ..NewTask::new("fail", payload)
    };
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 1200;
    let discard = op
        .submit(&task(json!({"then": "discard"})), "test")
        .await
        .unwrap();
    let snooze = op
        .submit(
            &task(json!({"then": "snooze", "ms": 300, "until": until})),
            "test",
        )
        .await
        .unwrap();
    // The backoff would be a minute (--retry-base-ms): only the handler's time brings it
    // back within the wait.
    let retry = op
        .submit(
            &task(json!({"times": 1, "then": "retry_at", "ms": 1500})),
            "test",
        )
        .await
        .unwrap();
    wait_status(&db.bb, discard, TaskStatus::Failed, Duration::from_secs(20)).await;
    wait_status(
        &db.bb,
        snooze,
        TaskStatus::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    wait_status(
        &db.bb,
        retry,
        TaskStatus::Succeeded,
        Duration::from_secs(20),
    )
    .await;

    let d = op.task(discard).await.unwrap();
    assert_eq!(d.retries, 1, "one attempt, three retries left unused");
    assert!(
        d.error.as_deref().unwrap().starts_with("discarded: "),
        "{:?}",
        d.error
    );
    let reasons = |id| {
        let op = op.clone();
        async move {
            op.transitions(id)
                .await
                .unwrap()
                .into_iter()
                .map(|t| (t.to_status, t.reason.unwrap_or_default(), t.at))
                .collect::<Vec<_>>()
        }
    };
    let d_history = reasons(discard).await;
    assert!(
        d_history
            .iter()
            .any(|(to, r, _)| *to == TaskStatus::Failed && r.starts_with("discarded: ")),
        "{d_history:?}"
    );

    let s = op.task(snooze).await.unwrap();
    assert_eq!(s.retries, 0, "a snooze counts no attempt");
    let snoozes = reasons(snooze)
        .await
        .into_iter()
        .filter(|(to, r, _)| *to == TaskStatus::Pending && r == "snoozed for 300 ms")
        .count();
    assert!(snoozes >= 2, "snoozed until its time came: {snoozes}");

    let r = op.task(retry).await.unwrap();
    assert_eq!(r.retries, 1, "the retry at a time counted its attempt");
    let history = reasons(retry).await;
    let failed_at = history
        .iter()
        .find(|(to, r, _)| *to == TaskStatus::Pending && r.starts_with("retry at "))
        .map(|(_, _, at)| *at)
        .unwrap_or_else(|| panic!("{history:?}"));
    let rerun_at = history
        .iter()
        .filter(|(to, _, at)| *to == TaskStatus::Running && *at > failed_at)
        .map(|(_, _, at)| *at)
        .next()
        .unwrap_or_else(|| panic!("{history:?}"));
    assert!(
        rerun_at - failed_at >= chrono::Duration::milliseconds(1400),
        "rerun {} ms after the failure, before the time asked",
        (rerun_at - failed_at).num_milliseconds()
    );
}

//! Crashes and outages: a worker killed mid-task (kill -9), a zombie worker that lost its
//! lease, a row locked when its lease is renewed, PostgreSQL restarted mid-run or not yet
//! up when the processes start, an actor that panics.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use artex_actors::Blackboard;
use nix::sys::signal::Signal;
use serde_json::json;

use super::{assert_no_double_run, tasks, wait_all_finished};
use crate::common::procs::{
    http_get, metric_value, wait_count, wait_for, wait_status, with_defaults, worker_http,
    worker_id, Proc, FAST_WORKER,
};
use crate::common::{self, count, TestDb};

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
    // Its /metrics counted the renewals that extended the lease, and no lease lost.
    let http = worker_http(&db.client().await, &w).await;
    let (_, metrics) = http_get(&http, "/metrics").unwrap();
    let value = |name: &str| -> f64 {
        metric_value(&metrics, name).unwrap_or_else(|| panic!("{name} not in\n{metrics}"))
    };
    assert!(
        value("artex_worker_lease_renewals_total") >= 1.0,
        "{metrics}"
    );
    assert_eq!(value("artex_worker_leases_lost_total"), 0.0, "{metrics}");
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

/// A connection lost between a worker's connect and its registration (PostgreSQL
/// restarting right then) used to end the process; only a hot upgrade's new process
/// waited there. The window is opened on purpose: the worker is held at the
/// `before_register` delay point (`ARTEX_DELAYS`) while the server restarts.
#[tokio::test]
async fn a_worker_whose_database_restarts_before_it_registers_waits_for_it() {
    let private = common::PrivateCluster::start().await;
    let (cluster, url) = (private.cluster.clone(), private.url.clone());
    let _p = Proc::planner("planner", &url, &[]);
    let args = with_defaults("worker", FAST_WORKER, &[]);
    let mut w = Proc::start(
        "worker",
        &url,
        &args,
        &[("ARTEX_DELAYS", "before_register=1000")],
    );
    wait_for(
        "the worker at its delay point",
        Duration::from_secs(30),
        || async { w.log_text().contains("delay point reached").then_some(()) },
    )
    .await;
    tokio::task::spawn_blocking(move || {
        cluster.stop().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        cluster.start().unwrap();
    })
    .await
    .unwrap();
    // A pool of its own: the test's connections from before the restart may be found
    // closed only at their first use.
    let bb = Blackboard::connect(&url, 2).unwrap();
    let id = bb
        .operator()
        .submit(&NewTask::new("echo", json!({"after": "restart"})), "test")
        .await
        .unwrap();
    wait_status(&bb, id, "succeeded", Duration::from_secs(60)).await;
    assert!(w.exited_now().is_none(), "{}", w.log_text());
    assert!(
        w.log_text()
            .contains("the database is unreachable; trying again"),
        "the window was not hit: {}",
        w.log_text()
    );
}

/// Found by the hour-long soak: a process started while PostgreSQL was down exited at
/// once (218 times in that hour), each exit a failure a supervisor counts against its
/// start limit (systemd gives up after 5 in 10 s). A planner, a worker and `serve`
/// started before their database now wait for it and come up with it; one told not to
/// wait (`--db-start-wait-ms 0`) fails at once, saying why.
#[tokio::test]
async fn processes_started_before_their_database_come_up_with_it() {
    let private = common::PrivateCluster::start().await;
    let (cluster, url) = (&private.cluster, private.url.clone());
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
    // A pool of its own: the test's connection from before the server was stopped may be
    // found closed only at its first use (seen under load).
    let bb = Blackboard::connect(&url, 2).unwrap();
    let id = bb
        .operator()
        .submit(&NewTask::new("echo", json!({"up": true})), "test")
        .await
        .unwrap();
    wait_status(&bb, id, "succeeded", Duration::from_secs(60)).await;
    common::procs::serve_address(&serve).await;
    for p in [&mut planner, &mut worker, &mut serve] {
        assert!(p.exited_now().is_none(), "{}", p.log_text());
    }
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

/// A worker whose running task is taken from it (its lease gone: here its epoch moved on
/// behind its back, as the reaper's take-back moves it) stops that handler and starts
/// the tasks waiting in its queue. Nothing else would start them: the stopped handler
/// never reports, and a queue that fills the worker's capacity keeps it from reading.
/// (Seen under load: a worker held 500 queued tasks unstarted for two minutes after its
/// handlers were stopped.)
#[tokio::test]
async fn a_worker_starts_its_queue_when_a_running_task_is_taken_from_it() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority) values
             ('sleep', '{\"ms\": 60000}', 10), ('echo', '{}', 0), ('echo', '{}', 0)",
    )
    .await
    .expect("three tasks");
    // One slot and a queue of two: the long task runs, the two others wait behind it, and
    // the worker's three places are full. No planner; the poll a minute apart.
    let _w = Proc::worker(
        "worker",
        &db.url,
        &[
            "--concurrency",
            "1",
            "--prefetch",
            "2",
            "--worker-poll-ms",
            "60000",
        ],
    );
    let long: uuid::Uuid = wait_for("the long task to run", Duration::from_secs(30), || async {
        c.query_opt(
            "select id from artex.tasks where kind = 'sleep' and status = 'running'",
            &[],
        )
        .await
        .ok()
        .flatten()
        .map(|r| r.get(0))
    })
    .await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'echo' and status = 'assigned'"
        )
        .await,
        2,
        "the two others wait in its queue"
    );
    // Its lease taken away: the next renewal finds it gone.
    c.execute(
        "update artex.tasks set lease_epoch = lease_epoch + 1 where id = $1",
        &[&long],
    )
    .await
    .expect("the epoch moved on");
    wait_count(
        &c,
        "select count(*) from artex.tasks where kind = 'echo' and status = 'succeeded'",
        2,
        Duration::from_secs(20),
    )
    .await;
}

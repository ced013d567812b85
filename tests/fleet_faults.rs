//! The fleet under faults, on the fleet harness (tests/common/fleet.rs: every process on
//! a host of its own, PostgreSQL on another, talking over the fleet's network): several
//! planners never overfill a worker; a PostgreSQL outage re-runs no task and marks no
//! live worker gone; a killed worker stops receiving work at once; a worker cut off from
//! PostgreSQL stops its handler before its lease can expire, and the task finishes once,
//! elsewhere — these three through pgbouncer in transaction mode (the fleet's setup: no
//! worker holds a session). No run leaves a deadlock in the server's log. Each test prints its figures
//! (`FIGURE name=value`), which docs/reliability.md quotes.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::fleet::{Fleet, FleetDb};
use common::procs::{wait_for, worker_id, Proc};
use nix::sys::signal::Signal;
use tokio_postgres::Client;

/// Inserts `n` tasks of `kind` with `payload` (plain SQL, as any client may).
async fn submit(c: &Client, kind: &str, payload: serde_json::Value, n: i32) {
    c.execute(
        "insert into artex.tasks (kind, payload) select $1, $2 from generate_series(1, $3::int)",
        &[&kind, &payload, &n],
    )
    .await
    .expect("submitting tasks");
}

/// Waits until no task is unfinished.
async fn wait_all_done(c: &Client, timeout: Duration) {
    wait_for("every task to finish", timeout, || async move {
        let left: i64 = c
            .query_one(
                "select count(*) from artex.tasks where status not in ('succeeded', 'failed', \
                 'timeout', 'canceled')",
                &[],
            )
            .await
            .ok()?
            .get(0);
        (left == 0).then_some(())
    })
    .await;
}

/// Panics if the server ever detected a deadlock.
fn assert_no_deadlock(db: &FleetDb) {
    let log = db.server_log();
    assert!(
        !log.contains("deadlock detected"),
        "the server log shows a deadlock:\n{}",
        log.lines()
            .filter(|l| l.contains("deadlock"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A planner on host p1 giving leases of 6 s, its LISTEN through `listen` (a pooler's
/// session-mode alias).
fn planner_with_6s_leases(fleet: &Fleet, url: &str, listen: &str) -> Proc {
    let args = ["--assign-lease-ms", "6000", "--listen-database-url", listen];
    fleet.planner("p1", "p1", url, &args)
}

/// Submits one 12-second `sleep` and waits until it runs on `worker`; its id.
async fn long_task_running_on(c: &Client, worker: &str) -> uuid::Uuid {
    submit(c, "sleep", serde_json::json!({ "ms": 12000 }), 1).await;
    wait_for("the long task to run", Duration::from_secs(20), || async {
        c.query_opt(
            "select id from artex.tasks where status = 'running' and assigned_to = $1",
            &[&worker],
        )
        .await
        .ok()
        .flatten()
        .map(|r| r.get(0))
    })
    .await
}

/// The workers whose transitions ended `task` succeeded (one, once, when all is well).
async fn succeeded_by(c: &Client, task: uuid::Uuid) -> Vec<Option<String>> {
    c.query(
        "select worker from artex.task_transitions \
         where task_id = $1 and to_status = 'succeeded'",
        &[&task],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// (tasks that started more than once, tasks that succeeded more than once).
async fn repeats(c: &Client) -> (i64, i64) {
    let r = c
        .query_one(
            "select (select count(*) from (select task_id from artex.task_transitions \
                     where to_status = 'running' group by 1 having count(*) > 1) s), \
                    (select count(*) from (select task_id from artex.task_transitions \
                     where to_status = 'succeeded' group by 1 having count(*) > 1) d)",
            &[],
        )
        .await
        .expect("counting repeats");
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn two_and_three_planners_never_give_a_worker_more_than_its_capacity() {
    let fleet = Fleet::new(&["db", "p1", "p2", "p3", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    let url = db.url_from_fleet();
    let c = db.client().await;
    // Capacity 5 each (2 running + 3 queued): small, so that planners compete for it.
    let small = ["--concurrency", "2", "--prefetch", "3"];
    let w1 = fleet.worker("w1", "w1", &url, &small);
    let w2 = fleet.worker("w2", "w2", &url, &small);
    worker_id(&c, &w1).await;
    worker_id(&c, &w2).await;
    let _p1 = fleet.planner("p1", "p1", &url, &[]);
    let _p2 = fleet.planner("p2", "p2", &url, &[]);
    let mut planners_third: Option<Proc> = None;
    let mut peak: HashMap<String, i64> = HashMap::new();
    let mut samples = 0;
    for round in 0..2 {
        if round == 1 {
            planners_third = Some(fleet.planner("p3", "p3", &url, &[]));
        }
        submit(&c, "sleep", serde_json::json!({ "ms": 2 }), 1500).await;
        let started = Instant::now();
        loop {
            // What each worker holds, counted from the tasks themselves (not from the
            // counter the assignment relies on), against its capacity.
            let rows = c
                .query(
                    "select w.id, w.capacity, count(t.id) from artex.workers w \
                     left join artex.tasks t on t.assigned_to = w.id \
                       and t.status in ('assigned', 'running') \
                     group by w.id, w.capacity",
                    &[],
                )
                .await
                .expect("sampling held tasks");
            samples += 1;
            for r in &rows {
                let (id, capacity, held): (String, i32, i64) = (r.get(0), r.get(1), r.get(2));
                assert!(
                    held <= i64::from(capacity),
                    "worker {id} holds {held} tasks, capacity {capacity}"
                );
                let p = peak.entry(id).or_default();
                *p = (*p).max(held);
            }
            let left: i64 = c
                .query_one(
                    "select count(*) from artex.tasks where status <> 'succeeded'",
                    &[],
                )
                .await
                .expect("counting")
                .get(0);
            if left == 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "{left} tasks left"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    drop(planners_third);
    assert_eq!(repeats(&c).await, (0, 0));
    assert!(
        peak.values().all(|&p| p == 5),
        "peaks {peak:?}: capacity never used whole"
    );
    println!("FIGURE capacity_samples={samples}");
    println!("FIGURE capacity_peak_per_worker={:?}", peak.values().max());
    assert_no_deadlock(&db);
}

#[tokio::test]
async fn a_postgres_outage_re_runs_no_task_and_marks_no_live_worker_gone() {
    let fleet = Fleet::new(&["db", "p1", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    // Through pgbouncer in transaction mode, as a fleet runs: the liveness rules hold
    // with no session per worker.
    let pooler = db.start_pgbouncer(10);
    let (url, listen) = (pooler.url(), pooler.listen_url());
    let c = db.client().await;
    // Leases of 30 s (the default), renewed every 10 s: the outage outlasts both the
    // planner's worker timeout (5 s here) and a renewal interval.
    let lease = ["--lease-ms", "30000"];
    let w1 = fleet.worker("w1", "w1", &url, &lease);
    let w2 = fleet.worker("w2", "w2", &url, &lease);
    let ids = [worker_id(&c, &w1).await, worker_id(&c, &w2).await];
    let _p = fleet.planner("p1", "p1", &url, &["--listen-database-url", &listen]);
    submit(&c, "sleep", serde_json::json!({ "ms": 15000 }), 8).await;
    wait_for("the 8 tasks to run", Duration::from_secs(20), || async {
        let running: i64 = c
            .query_one(
                "select count(*) from artex.tasks where status = 'running'",
                &[],
            )
            .await
            .ok()?
            .get(0);
        (running == 8).then_some(())
    })
    .await;
    drop(c);
    db.stop();
    tokio::time::sleep(Duration::from_secs(20)).await;
    db.start_in_host();
    let c = db.client().await;
    wait_all_done(&c, Duration::from_secs(60)).await;
    let r = c
        .query_one(
            "select count(*) filter (where status = 'succeeded' and retries = 0), \
                    (select count(*) from artex.workers where state = 'gone'), \
                    (select count(*) from artex.workers) \
             from artex.tasks",
            &[],
        )
        .await
        .unwrap();
    let (clean, gone, workers): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(clean, 8, "every task succeeded on its first attempt");
    assert_eq!(gone, 0, "a live worker was declared gone");
    assert_eq!(workers, 2, "a worker registered again");
    assert_eq!(repeats(&c).await, (0, 0));
    for id in &ids {
        let state: String = c
            .query_one("select state::text from artex.workers where id = $1", &[id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(state, "online");
    }
    println!("FIGURE outage_20s_reruns=0 outage_20s_workers_gone=0");
    assert_no_deadlock(&db);
}

#[tokio::test]
async fn a_killed_worker_gets_no_assignment_a_second_after_its_death() {
    let fleet = Fleet::new(&["db", "p1", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    // Through pgbouncer in transaction mode, as a fleet runs: the liveness rules hold
    // with no session per worker.
    let pooler = db.start_pgbouncer(10);
    let (url, listen) = (pooler.url(), pooler.listen_url());
    let c = db.client().await;
    let w1 = fleet.worker("w1", "w1", &url, &[]);
    let w2 = fleet.worker("w2", "w2", &url, &[]);
    let victim = worker_id(&c, &w1).await;
    worker_id(&c, &w2).await;
    let _p = fleet.planner("p1", "p1", &url, &["--listen-database-url", &listen]);
    // A steady trickle: 20 tasks every 50 ms for 6 s, the kill after 2 s.
    let mut killed_at: Option<DateTime<Utc>> = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        submit(&c, "sleep", serde_json::json!({ "ms": 20 }), 20).await;
        if killed_at.is_none() && started.elapsed() > Duration::from_secs(2) {
            w1.signal(Signal::SIGKILL);
            killed_at = Some(
                c.query_one("select clock_timestamp()", &[])
                    .await
                    .unwrap()
                    .get(0),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = killed_at.expect("the kill happened");
    wait_all_done(&c, Duration::from_secs(60)).await;
    let last: Option<DateTime<Utc>> = c
        .query_one(
            "select max(coalesce(assigned_at, at)) from artex.task_transitions \
             where worker = $1 and (to_status = 'assigned' \
                   or (from_status = 'assigned' and to_status = 'running'))",
            &[&victim],
        )
        .await
        .unwrap()
        .get(0);
    let last = last.expect("the victim had assignments before its death");
    let after_ms = (last - killed_at).num_milliseconds();
    assert!(
        after_ms < 1000,
        "the killed worker got an assignment {after_ms} ms after its death"
    );
    assert_eq!(repeats(&c).await.1, 0, "a task succeeded twice");
    println!("FIGURE killed_worker_last_assignment_after_death_ms={after_ms}");
    assert_no_deadlock(&db);
}

#[tokio::test]
async fn a_worker_cut_off_stops_its_handler_before_its_lease_expires() {
    let fleet = Fleet::new(&["db", "p1", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    // Through pgbouncer in transaction mode, as a fleet runs: the liveness rules hold
    // with no session per worker.
    let pooler = db.start_pgbouncer(10);
    let (url, listen) = (pooler.url(), pooler.listen_url());
    let c = db.client().await;
    // Leases of 6 s, given and renewed.
    let w1 = fleet.worker("w1", "w1", &url, &["--lease-ms", "6000"]);
    let cut_id = worker_id(&c, &w1).await;
    let _p = planner_with_6s_leases(&fleet, &url, &listen);
    let task = long_task_running_on(&c, &cut_id).await;
    let w2 = fleet.worker("w2", "w2", &url, &["--lease-ms", "6000"]);
    let rescuer = worker_id(&c, &w2).await;
    fleet.partition("w1");
    let partitioned_at = Instant::now();
    // The lease as the database last had it for w1: its renewals stop reaching it.
    let mut lease_end: Option<DateTime<Utc>> = None;
    loop {
        let r = c
            .query_one(
                "select assigned_to, lease_until from artex.tasks where id = $1",
                &[&task],
            )
            .await
            .unwrap();
        let (holder, until): (Option<String>, Option<DateTime<Utc>>) = (r.get(0), r.get(1));
        if holder.as_deref() != Some(cut_id.as_str()) {
            break;
        }
        lease_end = until;
        assert!(
            partitioned_at.elapsed() < Duration::from_secs(30),
            "the task stayed with the cut-off worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lease_end = lease_end.expect("a lease while w1 held the task");
    wait_all_done(&c, Duration::from_secs(40)).await;
    // When w1 stopped its handler, from its own log (it cannot tell the database).
    let log = w1.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("handler stopped before the lease could expire"))
        .unwrap_or_else(|| panic!("w1 never stopped its handler:\n{log}"));
    let stopped: DateTime<Utc> = line
        .split_whitespace()
        .next()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("no time at the start of: {line}"));
    let rescued: DateTime<Utc> = c
        .query_one(
            "select at from artex.task_transitions \
             where task_id = $1 and to_status = 'running' and worker = $2",
            &[&task, &rescuer],
        )
        .await
        .expect("the rescuer's start")
        .get(0);
    assert!(
        stopped < lease_end,
        "w1 stopped its handler at {stopped}, after its lease ended at {lease_end}"
    );
    assert!(
        lease_end <= rescued,
        "the rescuer started at {rescued}, before w1's lease ended at {lease_end}"
    );
    assert_eq!(
        succeeded_by(&c, task).await,
        [Some(rescuer.clone())],
        "finished once, by the rescuer"
    );
    println!(
        "FIGURE partition_handler_stopped_before_lease_end_ms={} rescue_after_lease_end_ms={}",
        (lease_end - stopped).num_milliseconds(),
        (rescued - lease_end).num_milliseconds()
    );
    // Healed, w1 tells what it did, and its late report of the stopped attempt is refused.
    fleet.heal("w1");
    let status = wait_for(
        "w1's status after the heal",
        Duration::from_secs(30),
        || async {
            let (code, body) = fleet
                .http_get("w1", &fleet.http_addr("w1"), "/status")
                .ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["database_ok"] == true && v["unwritten_outcomes"] == 0).then_some(v)
        },
    )
    .await;
    assert_eq!(status["self_fenced"], 1, "{status}");
    assert_eq!(repeats(&c).await.1, 0);
    assert_no_deadlock(&db);
}

/// A worker on its own host listening on that host's loopback (`--http 127.0.0.1:8080`,
/// the default of a copied unit file): the planner on another host cannot push to it.
/// It is still given work and takes it by polling within the poll bound, says so (its
/// log, `/health`, the roster), and still stops its handler before its lease can expire
/// when its link to PostgreSQL is cut. Through pgbouncer, as a fleet runs.
#[tokio::test]
async fn a_worker_planners_cannot_push_to_polls_for_its_tasks_and_still_fences_itself() {
    let fleet = Fleet::new(&["db", "p1", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    let pooler = db.start_pgbouncer(10);
    let (url, listen) = (pooler.url(), pooler.listen_url());
    let c = db.client().await;
    let w1 = fleet.worker(
        "w1",
        "w1",
        &url,
        &["--http", "127.0.0.1:8080", "--lease-ms", "6000"],
    );
    let id = worker_id(&c, &w1).await;
    let _p = planner_with_6s_leases(&fleet, &url, &listen);
    // At start it warned: its wake address is loopback, its database elsewhere.
    assert!(
        w1.log_text()
            .contains("is a loopback address while its database is on another host"),
        "{}",
        w1.log_text()
    );
    // One task at a time, each started within the poll bound (2 s, plus a planner
    // round) of its submission; the first also waits for the planner to find the
    // worker alive behind a failed push.
    let mut waits_ms = Vec::new();
    for n in 0..6 {
        let task: uuid::Uuid = c
            .query_one(
                "insert into artex.tasks (kind, payload) values ('sleep', '{\"ms\": 10}') \
                 returning id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let waited: f64 = wait_for(
            "the task to finish on w1",
            Duration::from_secs(30),
            || async {
                c.query_opt(
                    "select (extract(epoch from started_at - created_at) * 1000)::float8 from artex.tasks \
                 where id = $1 and status = 'succeeded' and started_at is not null",
                    &[&task],
                )
                .await
                .ok()
                .flatten()
                .map(|r| r.get::<_, f64>(0))
            },
        )
        .await;
        if n > 0 {
            waits_ms.push(waited);
        }
    }
    let worst = waits_ms.iter().copied().fold(0.0, f64::max);
    assert!(
        worst < 3000.0,
        "a task waited {worst:.0} ms for a worker that polls every 2 s at most: {waits_ms:?}"
    );
    let finished_by_w1: i64 = c
        .query_one(
            "select count(*) from artex.task_transitions \
             where to_status = 'succeeded' and worker = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(finished_by_w1, 6);
    // It says so: its log, its /health (ready, with a note), the roster.
    let log = w1.log_text();
    assert!(
        log.contains("planners cannot push wake-ups to 127.0.0.1:8080")
            && log.contains("--wake-addr"),
        "{log}"
    );
    let (code, body) = fleet
        .http_get("w1", "127.0.0.1:8080", "/health")
        .expect("w1's /health from its own host");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(code, 200, "{health}");
    assert_eq!(health["wake_ups"], "unreachable, polling", "{health}");
    assert!(
        health["notes"][0]
            .as_str()
            .unwrap_or_default()
            .contains("127.0.0.1:8080"),
        "{health}"
    );
    let out = std::process::Command::new(common::artex_bin())
        .args(["workers"])
        .env("ARTEX_DATABASE_URL", db.local_url())
        .env("ARTEX_LOG", "warn")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    let row = listed
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("w1 in `artex workers`:\n{listed}"));
    assert!(row.contains("unreachable, polling"), "{listed}");

    // Cut off from PostgreSQL while it runs a task: it stops the handler before its
    // lease can expire, and the task finishes once, elsewhere.
    let task = long_task_running_on(&c, &id).await;
    let w2 = fleet.worker("w2", "w2", &url, &["--lease-ms", "6000"]);
    let rescuer = worker_id(&c, &w2).await;
    fleet.partition("w1");
    wait_all_done(&c, Duration::from_secs(60)).await;
    assert!(
        w1.log_text()
            .contains("handler stopped before the lease could expire"),
        "w1 never stopped its handler:\n{}",
        w1.log_text()
    );
    assert_eq!(
        succeeded_by(&c, task).await,
        [Some(rescuer)],
        "finished once, by the rescuer"
    );
    assert_eq!(repeats(&c).await.1, 0);
    println!(
        "FIGURE unreachable_worker_pickup_worst_ms={worst:.0} pickups_ms={:?}",
        waits_ms
            .iter()
            .map(|w| w.round() as i64)
            .collect::<Vec<_>>()
    );
    assert_no_deadlock(&db);
}

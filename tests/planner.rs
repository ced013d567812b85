//! The planner's actors driven directly through `run_once()`, asserting on their reports
//! (no process, no sleeping): the Assigner respects capacity, kinds and priority; the
//! Reaper takes back expired leases and the tasks of silent workers. How a round spreads
//! load (`assigner::plan`, pure) is unit-tested in actors/src/assigner.rs.

mod common;

use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::{NewTask, ReapParams};
use artex_actors::reaper::Reaper;
use artex_testkit::fuzz;
use common::{count, fixtures, TestDb};
use serde_json::json;

fn config() -> AssignerConfig {
    AssignerConfig {
        actor: "test-planner".into(),
        batch: 100,
        lease_secs: 30.0,
        suspect_after_secs: 10.0,
        shards: (1, Vec::new()),
    }
}

fn reap_params(now: Option<chrono::DateTime<chrono::Utc>>) -> ReapParams {
    ReapParams {
        now,
        worker_timeout_secs: 10.0,
        prune_after_secs: 3600.0,
        batch: 100,
        retry_base_ms: 10.0,
        retry_cap_ms: 100.0,
        judge_liveness: true,
        upload_host_deadline_secs: 600.0,
    }
}

#[tokio::test]
async fn one_assignment_round_fills_free_capacity_in_priority_order() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 3).await;
    fixtures::worker(&db.bb, "w2", &["echo", "sleep"], 2).await;
    let mut tasks: Vec<NewTask> = (0..6)
        .map(|i| NewTask {
            priority: i,
            ..NewTask::new("echo", json!({}))
        })
        .collect();
    tasks.push(NewTask::new("unknown-kind", json!({})));
    let ids = db.bb.operator().submit_many(&tasks, "test").await.unwrap();

    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!(report.free_capacity, 5);
    assert_eq!(report.assigned, 5);
    assert_eq!(report.workers_notified, 2);
    // The lowest priority echo task and the task no worker runs stay pending.
    let low = db.bb.operator().task(ids[0]).await.unwrap();
    assert_eq!(low.status.as_str(), "pending");
    assert_eq!(
        db.bb.operator().task(ids[6]).await.unwrap().status.as_str(),
        "pending"
    );
    for id in &ids[1..6] {
        let t = db.bb.operator().task(*id).await.unwrap();
        assert_eq!(t.status.as_str(), "assigned");
        assert_eq!(t.lease_epoch, 1);
    }
    // Full: a second round assigns nothing.
    let again = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((again.free_capacity, again.assigned), (0, 0));
}

#[tokio::test]
async fn the_reaper_takes_back_expired_leases_and_silent_workers_tasks() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let ids = db
        .bb
        .operator()
        .submit_many(
            &(0..3)
                .map(|_| NewTask {
                    max_retries: Some(0),
                    ..NewTask::new("echo", json!({}))
                })
                .collect::<Vec<_>>(),
            "test",
        )
        .await
        .unwrap();
    Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    let started = common::start_assigned(&db.bb, "w1", 1).await;
    assert_eq!(started.len(), 1);

    // Now: nothing expired, nobody silent.
    let report = Reaper::run_once(&db.bb.planner(), "reaper", &reap_params(None))
        .await
        .unwrap();
    assert_eq!((report.requeued, report.ended), (0, 0));
    assert!(report.workers_gone.is_empty());

    // A minute later: the worker is silent and every lease expired. The running task
    // (no retries left) ends as timeout; the two never started go back to pending.
    let later = chrono::Utc::now() + chrono::Duration::seconds(60);
    let report = Reaper::run_once(&db.bb.planner(), "reaper", &reap_params(Some(later)))
        .await
        .unwrap();
    assert_eq!(report.workers_gone, vec!["w1".to_string()]);
    assert_eq!((report.requeued, report.ended), (2, 1));
    let ran = db.bb.operator().task(started[0].id).await.unwrap();
    assert_eq!(ran.status.as_str(), "timeout");
    assert!(ran.error.unwrap().contains("lease lost by worker w1"));
    for id in ids.iter().filter(|id| **id != started[0].id) {
        let t = db.bb.operator().task(*id).await.unwrap();
        assert_eq!((t.status.as_str(), t.retries), ("pending", 0));
    }
    // A gone worker gets nothing.
    let round = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!(round.assigned, 0);
}

/// After idle, the Assigner's first round is small (its workers start within
/// milliseconds instead of waiting for a 2,000-row write); a round that fills it met a
/// backlog, and the next one takes a full `--batch`. The ramp is for trickles.
#[test]
fn rounds_start_small_after_idle_and_grow() {
    actix::System::new().block_on(async {
        use actix::Actor;
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["echo"], 100_000).await;
        let submit = |n: usize| {
            let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new("echo", json!({}))).collect();
            let bb = db.bb.clone();
            async move { bb.operator().submit_many(&tasks, "test").await.unwrap() }
        };
        submit(1000).await;
        let config = AssignerConfig {
            batch: 2000,
            ..config()
        };
        let assigner = Assigner::new(db.bb.planner(), config, Default::default()).start();
        let rounds = |n: usize| {
            let assigner = assigner.clone();
            async move {
                let mut reports = Vec::new();
                for _ in 0..n {
                    let send = assigner.send(artex_actors::assigner::AssignNow);
                    reports.push(send.await.unwrap().unwrap());
                }
                reports
            }
        };
        let reports = rounds(4).await;
        let sizes: Vec<usize> = reports.iter().map(|r| r.assigned).collect();
        // 128, then the 872 left; a round that finds nothing resets the ramp.
        assert_eq!(sizes, [128, 872, 0, 0]);
        // The scanner runs the next round at once only while a round filled its batch.
        let again: Vec<bool> = reports.iter().map(|r| r.more_may_fit()).collect();
        assert_eq!(again, [true, false, false, false]);
        submit(3000).await;
        let sizes: Vec<usize> = rounds(3).await.iter().map(|r| r.assigned).collect();
        assert_eq!(sizes, [128, 2000, 872]);
        // A trickle never fills the first round: it stays small.
        submit(5).await;
        let sizes: Vec<usize> = rounds(2).await.iter().map(|r| r.assigned).collect();
        assert_eq!(sizes, [5, 0]);
        submit(300).await;
        let sizes: Vec<usize> = rounds(1).await.iter().map(|r| r.assigned).collect();
        assert_eq!(sizes, [128]);
    });
}

/// A worker declared gone keeps its tasks until their leases run out: gone may mean cut
/// off, and a cut-off worker stops its handlers only just before its leases end.
#[tokio::test]
async fn a_gone_workers_tasks_wait_for_their_leases_to_run_out() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    // Leases of 30 s; the worker is gone after 10 s of silence.
    Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!(common::start_assigned(&db.bb, "w1", 1).await.len(), 1);
    let at = |secs| Some(chrono::Utc::now() + chrono::Duration::seconds(secs));
    let report = Reaper::run_once(&db.bb.planner(), "reaper", &reap_params(at(20)))
        .await
        .unwrap();
    assert_eq!(report.workers_gone, vec!["w1".to_string()]);
    assert_eq!((report.requeued, report.ended), (0, 0));
    assert_eq!(
        db.bb.operator().task(id).await.unwrap().status.as_str(),
        "running"
    );
    let report = Reaper::run_once(&db.bb.planner(), "reaper", &reap_params(at(40)))
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    let t = db.bb.operator().task(id).await.unwrap();
    assert_eq!((t.status.as_str(), t.retries), ("pending", 1));
}

/// A worker's wake-up carries the tasks it was given, as its own read would return them,
/// in start order; a big one is left to the read (a plain wake-up). The worker's read
/// then sees the versions the wake-up carried, so a late wake-up is never taken again.
#[tokio::test]
async fn a_wake_up_carries_the_assigned_tasks_and_a_later_read_sees_them() {
    use artex_actors::blackboard::carried::{carries_assignments, parse_carried};
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let mut listener = db
        .bb
        .feed()
        .listen(&["artex_w_w1".to_string()])
        .await
        .unwrap();
    let mut tasks: Vec<NewTask> = (0..4)
        .map(|i| NewTask {
            priority: 10 - i,
            ..NewTask::new("echo", json!({ "n": i }))
        })
        .collect();
    tasks.push(NewTask {
        priority: 0,
        ..NewTask::new("echo", json!({ "big": "x".repeat(2000) }))
    });
    let ids = db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((report.assigned, report.workers_notified), (5, 1));

    let mut carried = Vec::new();
    let mut plain = 0;
    while carried.len() < 4 || plain == 0 {
        let n = listener.recv().await.expect("the session is up");
        if carries_assignments(&n.payload) {
            carried.extend(parse_carried(&n.payload).unwrap());
        } else {
            assert_eq!(n.payload, "", "the big task's plain wake-up");
            plain += 1;
        }
    }
    let got: Vec<_> = carried.iter().map(|c| c.task.id).collect();
    assert_eq!(got, ids[..4], "the small ones, in start order");
    for (c, i) in carried.iter().zip(0..) {
        assert_eq!(c.task.payload, json!({ "n": i }));
        assert_eq!((c.task.epoch, c.task.kind.as_str()), (1, "echo"));
        assert!(c.lease_until_ms > 0.0);
    }
    let read = db
        .bb
        .worker()
        .read_assigned("w1", 10, i64::MAX, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read.tasks.len(),
        5,
        "the read returns all five, the big one too"
    );
    assert!(
        carried.iter().all(|c| read.snapshot.sees(c.xid)),
        "{:?}",
        read.snapshot
    );
    assert!(read.db_clock_ms > 0.0);
}

/// A fair kind's tasks come carried too, each with its priority and limit key, which the
/// worker's local queue takes turns by (migrations/V64; before, their worker got a plain
/// wake-up and read them).
#[tokio::test]
async fn a_fair_kind_s_wake_up_carries_its_tasks_with_their_priority_and_key() {
    use artex_actors::blackboard::carried::{carries_assignments, parse_carried};
    use artex_actors::blackboard::LimitSpec;
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w1", &["fk", "echo"], 10).await;
    let spec = LimitSpec {
        fair: true,
        concurrency: None,
        key_concurrency: None,
        rate_per_sec: None,
    };
    ops.set_kind_limit("fk", &spec, "test").await.unwrap();
    let mut listener = db
        .bb
        .feed()
        .listen(&["artex_w_w1".to_string()])
        .await
        .unwrap();
    let tasks = vec![
        NewTask {
            limit_key: Some("a".into()),
            priority: 5,
            ..NewTask::new("fk", json!({ "n": 0 }))
        },
        NewTask::new("fk", json!({ "n": 1 })),
        NewTask::new("echo", json!({ "n": 2 })),
    ];
    let ids = ops.submit_many(&tasks, "test").await.unwrap();
    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((report.assigned, report.workers_notified), (3, 1));
    let mut carried = Vec::new();
    while carried.len() < 3 {
        let n = listener.recv().await.expect("the session is up");
        assert!(
            carries_assignments(&n.payload),
            "every task carried, no plain wake-up: {:?}",
            n.payload
        );
        carried.extend(parse_carried(&n.payload).unwrap());
    }
    let got: Vec<_> = carried
        .iter()
        .map(|c| {
            (
                c.task.id,
                c.task.kind.as_str(),
                c.task.priority,
                c.task.limit_key.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (ids[0], "fk", 5, Some("a")),
            (ids[1], "fk", 0, None),
            (ids[2], "echo", 0, None)
        ],
        "in start order; a plain kind's task carries no key"
    );
}

/// The worker's outcomes never wait for the worker row an assignment locks (issue 13):
/// with that row locked as a planner's assignment locks it until its commit, the worker
/// records its starts and finishes all the same, and the slots they free are assigned
/// once the lock is gone — never more than the capacity.
#[tokio::test]
async fn outcomes_are_recorded_while_an_assignment_holds_the_worker_row() {
    use artex_actors::blackboard::{AttemptRecord, Outcome, Step};
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 2).await;
    let tasks: Vec<NewTask> = (0..5).map(|_| NewTask::new("echo", json!({}))).collect();
    db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    assert_eq!(
        Assigner::run_once(&db.bb.planner(), &config())
            .await
            .unwrap()
            .assigned,
        2
    );

    let mut planner = db.client().await;
    let assigning = planner.transaction().await.unwrap();
    assigning
        .execute(
            "select 1 from artex.workers where id = 'w1' for update",
            &[],
        )
        .await
        .unwrap();

    let bb = db.bb.clone();
    let recording = tokio::spawn(async move {
        let started = common::start_assigned(&bb, "w1", 10).await;
        let finishes: Vec<AttemptRecord> = started
            .iter()
            .map(|t| AttemptRecord {
                id: t.id,
                epoch: t.epoch,
                retries: t.retries,
                max_retries: t.max_retries,
                step: Step::Finish(Outcome::Succeeded(json!({}))),
                started_ago_ms: None,
                measured: None,
            })
            .collect();
        bb.worker()
            .record("w1", &finishes)
            .await
            .expect("recording finishes")
    });
    // Either the records go through, or one of them waits for a lock: PostgreSQL says so.
    let watcher = db.client().await;
    while !recording.is_finished() {
        let waiting = common::count(
            &watcher,
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
        )
        .await;
        assert_eq!(waiting, 0, "a worker's record waits for its row's lock");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(recording.await.unwrap().len(), 2);
    assigning.rollback().await.unwrap();

    // The two freed slots are filled, and no more.
    let round = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((round.free_capacity, round.assigned), (2, 2));
    let again = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((again.free_capacity, again.assigned), (0, 0));
    // The workers' list shows what it holds after its next heartbeat.
    db.bb.worker().heartbeat("w1", 0, 2).await.unwrap();
    let c = db.client().await;
    let held = common::count(&c, "select held::int8 from artex.workers where id = 'w1'").await;
    assert_eq!(held, 2);
}

/// One random fleet for [`random_limits_are_never_exceeded_and_never_starve_a_task`].
#[derive(Debug, Clone)]
struct LimitCase {
    /// Per kind: (concurrency, key_concurrency), set before (`true`) or after the tasks.
    limits: Vec<(Option<i32>, Option<i32>, bool)>,
    /// (kinds by index, capacity).
    workers: Vec<(Vec<usize>, i32)>,
    /// (kind index, limit key).
    tasks: Vec<(usize, Option<&'static str>)>,
}

const LIMIT_KINDS: [&str; 3] = ["lk0", "lk1", "lk2"];

fn limit_case(rng: &mut fastrand::Rng) -> LimitCase {
    let limits = LIMIT_KINDS
        .iter()
        .map(|_| match rng.u8(0..4) {
            0 => (None, None, true), // no limit
            1 => (Some(rng.i32(1..=6)), None, rng.bool()),
            2 => (None, Some(rng.i32(1..=3)), rng.bool()),
            _ => (Some(rng.i32(1..=6)), Some(rng.i32(1..=3)), rng.bool()),
        })
        .collect();
    let workers = (0..rng.usize(1..=4))
        .map(|_| {
            let mut kinds: Vec<usize> = (0..3).filter(|_| rng.bool()).collect();
            if kinds.is_empty() {
                kinds.push(rng.usize(0..3));
            }
            (kinds, rng.i32(1..=8))
        })
        .collect();
    let tasks = (0..fuzz::len(rng, 40))
        .map(|_| {
            let key = [None, Some("x"), Some("y"), Some("z")][rng.usize(0..4)];
            (rng.usize(0..3), key)
        })
        .collect();
    LimitCase {
        limits,
        workers,
        tasks,
    }
}

async fn check_limit_case(c: &LimitCase) {
    use artex_actors::blackboard::LimitSpec;
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    for (i, (kinds, capacity)) in c.workers.iter().enumerate() {
        let kinds: Vec<&str> = kinds.iter().map(|&k| LIMIT_KINDS[k]).collect();
        fixtures::worker(&db.bb, &format!("w{i}"), &kinds, *capacity).await;
    }
    let set_limits = |before: bool| {
        let ops = ops.clone();
        async move {
            for (k, &(concurrency, key_concurrency, when)) in c.limits.iter().enumerate() {
                if when == before && (concurrency.is_some() || key_concurrency.is_some()) {
                    let spec = LimitSpec {
                        fair: false,
                        concurrency,
                        key_concurrency,
                        rate_per_sec: None,
                    };
                    ops.set_kind_limit(LIMIT_KINDS[k], &spec, "test")
                        .await
                        .unwrap();
                }
            }
        }
    };
    set_limits(true).await;
    let tasks: Vec<NewTask> = c
        .tasks
        .iter()
        .map(|&(k, key)| NewTask {
            limit_key: key.map(String::from),
            ..NewTask::new(LIMIT_KINDS[k], json!({}))
        })
        .collect();
    if !tasks.is_empty() {
        ops.submit_many(&tasks, "test").await.unwrap();
    }
    set_limits(false).await;

    let client = db.client().await;
    let check_held = || async {
        for (k, &(concurrency, key_concurrency, _)) in c.limits.iter().enumerate() {
            let kind = LIMIT_KINDS[k];
            let held = count(
                &client,
                &format!(
                    "select count(*) from artex.tasks where kind = '{kind}'
                     and assigned_to is not null"
                ),
            )
            .await;
            if let Some(limit) = concurrency {
                assert!(
                    held <= i64::from(limit),
                    "{kind}: {held} held, limit {limit}"
                );
            }
            if let Some(limit) = key_concurrency {
                let most = count(
                    &client,
                    &format!(
                        "select coalesce(max(n), 0) from (select count(*) as n from artex.tasks
                         where kind = '{kind}' and assigned_to is not null
                           and limit_key is not null group by limit_key) k"
                    ),
                )
                .await;
                assert!(
                    most <= i64::from(limit),
                    "{kind}: {most} of one key held, limit {limit}"
                );
            }
        }
    };
    // Three planners at once, then again, until a round assigns nothing.
    for round in 0.. {
        assert!(round < 20, "rounds keep assigning: {round}");
        let (boards, cfg) = (
            [db.bb.planner(), db.bb.planner(), db.bb.planner()],
            config(),
        );
        let (a, b, d) = tokio::join!(
            Assigner::run_once(&boards[0], &cfg),
            Assigner::run_once(&boards[1], &cfg),
            Assigner::run_once(&boards[2], &cfg),
        );
        check_held().await;
        if a.unwrap().assigned + b.unwrap().assigned + d.unwrap().assigned == 0 {
            break;
        }
    }
    // Nothing waits without a reason: its kind or its key at the limit, or every worker
    // of its kind full.
    let waiting = client
        .query(
            "select kind, limit_key from artex.tasks where status = 'pending'",
            &[],
        )
        .await
        .unwrap();
    for row in waiting {
        let (kind, key): (String, Option<String>) = (row.get(0), row.get(1));
        let k = LIMIT_KINDS.iter().position(|x| *x == kind).unwrap();
        let (concurrency, key_concurrency, _) = c.limits[k];
        let held_kind = count(
            &client,
            &format!("select count(*) from artex.tasks where kind = '{kind}' and assigned_to is not null"),
        )
        .await;
        let held_key = match &key {
            Some(key) => {
                count(
                    &client,
                    &format!(
                        "select count(*) from artex.tasks where kind = '{kind}'
                         and limit_key = '{key}' and assigned_to is not null"
                    ),
                )
                .await
            }
            None => 0,
        };
        let kind_full = concurrency.is_some_and(|l| held_kind >= i64::from(l));
        let key_full = key.is_some() && key_concurrency.is_some_and(|l| held_key >= i64::from(l));
        let workers_full = count(
            &client,
            &format!(
                "select count(*) from artex.workers w where '{kind}' = any(w.kinds)
                 and w.capacity > (select count(*) from artex.tasks t where t.assigned_to = w.id)"
            ),
        )
        .await
            == 0;
        assert!(
            kind_full || key_full || workers_full,
            "a {kind} task (key {key:?}) waits with {held_kind} of its kind and {held_key} of \
             its key held, limits {concurrency:?}/{key_concurrency:?}, and a worker free"
        );
    }
}

/// Random limits, rosters and backlogs, assigned by three planners at once (issue 25 §2):
/// never more held than a kind's concurrency or a key's key_concurrency, and a task left
/// waiting always has a reason (a limit reached, or no free worker of its kind). Seeded
/// and bounded: `testkit/src/fuzz.rs`.
#[test]
fn random_limits_are_never_exceeded_and_never_starve_a_task() {
    // One thread: the three planners' statements still run at once, each on its own
    // connection, in the database that arbitrates them.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    fuzz::run(
        "planner::limits",
        10,
        limit_case,
        |c| {
            fuzz::shrink_vec(&c.tasks)
                .into_iter()
                .map(|tasks| LimitCase { tasks, ..c.clone() })
                .collect()
        },
        |c| rt.block_on(check_limit_case(c)),
    );
}

/// Reads one `POST /wake` from a fake worker's side of the connection; returns its body.
async fn read_push(sock: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut length = 0;
    loop {
        let mut line = String::new();
        assert!(
            sock.read_line(&mut line).await.unwrap() > 0,
            "the push ended early"
        );
        if line.trim_end().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    sock.read_exact(&mut body).await.unwrap();
    String::from_utf8(body).unwrap()
}

/// Found by the hour-long soak: a planner kept the kept-alive wake-up connection of every
/// worker that died, one descriptor each (in CLOSE_WAIT) for as long as it lived. A
/// connection the worker closes between pushes is now closed by the planner at once, and
/// the next push opens another.
#[tokio::test]
async fn a_wake_up_connection_the_worker_closes_is_closed_by_the_planner_at_once() {
    use artex_actors::blackboard::Push;
    use artex_actors::waker::Waker;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::time::timeout;

    let db = TestDb::new().await;
    let waker = Waker::start(db.bb.planner(), "test-planner").await.unwrap();
    let worker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = worker.local_addr().unwrap().to_string();
    let within = std::time::Duration::from_secs(30);

    waker.greet(&[("w1".to_string(), addr.clone())]);
    let (sock, _) = timeout(within, worker.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    assert_eq!(read_push(&mut sock).await, r#"[""]"#, "a plain wake-up");
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    sock.get_mut().write_all(answer).await.unwrap();
    // The worker's side goes, as a killed process's does (FIN), and no push follows.
    sock.get_mut().shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(within, sock.read_to_end(&mut rest))
        .await
        .expect("the planner closes its side instead of keeping the descriptor")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // The link lives on: the next push reaches the worker over a new connection.
    waker.deliver(vec![Push {
        worker: "w1".into(),
        addr: addr.clone(),
        payloads: vec!["cancel".into()],
        tasks: Vec::new(),
    }]);
    let (sock, _) = timeout(within, worker.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    assert_eq!(read_push(&mut sock).await, r#"["cancel"]"#);
}

/// A worker whose wake-up address stops answering (its port behind a proxy that refuses)
/// is found alive by its heartbeats, given work and polls for it; when the address
/// answers again, pushes go through again and every reader of the roster says so.
#[tokio::test]
async fn a_worker_whose_wake_address_comes_back_is_pushed_to_again() {
    use artex_testkit::proxy::Proxy;
    use common::procs::{http_get, wait_for, worker_id, Proc};
    use std::time::Duration;

    let db = TestDb::new().await;
    let c = db.client().await;
    // The worker's port, known before it starts, so that its wake address can be a proxy
    // in front of it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = format!("127.0.0.1:{port}");
    let proxy = Proxy::start(&http);
    proxy.refuse(true);
    let w = Proc::worker(
        "w",
        &db.url,
        &["--http", &http, "--wake-addr", &proxy.addr()],
    );
    let id = worker_id(&c, &w).await;
    let _p = Proc::planner("p", &db.url, &[]);
    let bb = db.bb.clone();
    let wake_ups = || {
        let (bb, id) = (bb.clone(), id.clone());
        async move {
            let workers = bb.operator().workers(100).await.unwrap();
            workers
                .into_iter()
                .find(|w| w.id == id)
                .map(|w| w.wake_ups.to_string())
        }
    };
    for _ in 0..3 {
        fixtures::task(&db.bb, "echo").await;
    }
    wait_for(
        "the tasks done by polling",
        Duration::from_secs(30),
        || async {
            (count(
                &c,
                "select count(*) from artex.tasks where status = 'succeeded'",
            )
            .await
                == 3)
                .then_some(())
        },
    )
    .await;
    // The planner's first push (its greeting, or a round's wake-up) fails; the worker may
    // have claimed and run the three by its own polls before that.
    wait_for(
        "the planner to find the worker unreachable",
        Duration::from_secs(10),
        || async { (wake_ups().await.as_deref() == Some("unreachable, polling")).then_some(()) },
    )
    .await;
    let health = wait_for(
        "/health to say it polls",
        Duration::from_secs(10),
        || async {
            let (_, body) = http_get(&http, "/health").ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (v["wake_ups"] == "unreachable, polling").then_some(v)
        },
    )
    .await;
    assert_eq!(health["ready"], true, "a note, not a failure: {health}");

    // The address answers again: the planner's probe goes through, the record is cleared,
    // and the worker hears of it with its next heartbeat.
    proxy.refuse(false);
    wait_for(
        "pushes to go through again",
        Duration::from_secs(20),
        || async { (wake_ups().await.as_deref() == Some("pushed")).then_some(()) },
    )
    .await;
    wait_for("/health to say pushed", Duration::from_secs(10), || async {
        let (_, body) = http_get(&http, "/health").ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (v["wake_ups"] == "pushed").then_some(())
    })
    .await;
    // Pushes go over one kept-alive connection: what went up through the proxy counts.
    let pushed_before = proxy.up_bytes();
    for _ in 0..2 {
        fixtures::task(&db.bb, "echo").await;
    }
    wait_for("the new tasks done", Duration::from_secs(30), || async {
        (count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'",
        )
        .await
            == 5)
            .then_some(())
    })
    .await;
    assert!(
        proxy.up_bytes() > pushed_before,
        "no push reached the worker after its address came back"
    );
    assert!(proxy
        .first_lines()
        .iter()
        .all(|l| l.starts_with("POST /wake")));
    assert!(
        w.log_text()
            .contains("planners reach this worker's wake-up address again"),
        "{}",
        w.log_text()
    );
}

/// A round takes a limited kind's tasks in claim order within its keys' room, whether it
/// finds them by the head of the queue (migrations/V29: the limits do not bind there) or
/// by the walk of the keys (they do). Three keys of three tasks at priorities 9, 5 and 1,
/// two of each key at most: a worker with room for four takes two of the first key and
/// two of the second; with room for eight, every key's two (the head of twice eight holds
/// every task). One of each key at most, with room for four: the head of eight yields
/// three, so the round walks the keys, and takes one of each. Three of each key at most,
/// with room for two: the head's first two fit whole, and are taken as they are (V50).
#[tokio::test]
async fn a_round_takes_limited_tasks_in_claim_order_within_their_keys_room() {
    use artex_actors::blackboard::LimitSpec;
    let cases = [
        (4, 2, vec![("a", 2), ("b", 2)]),
        (8, 2, vec![("a", 2), ("b", 2), ("c", 2)]),
        (4, 1, vec![("a", 1), ("b", 1), ("c", 1)]),
        (2, 3, vec![("a", 2)]),
    ];
    for (capacity, key_concurrency, want) in cases {
        let db = TestDb::new().await;
        let ops = db.bb.operator();
        fixtures::worker(&db.bb, "w1", &["lk"], capacity).await;
        let spec = LimitSpec {
            fair: false,
            concurrency: None,
            key_concurrency: Some(key_concurrency),
            rate_per_sec: None,
        };
        ops.set_kind_limit("lk", &spec, "test").await.unwrap();
        let tasks: Vec<NewTask> = [("c", 1), ("a", 9), ("b", 5)]
            .iter()
            .flat_map(|&(key, priority)| {
                (0..3).map(move |_| NewTask {
                    limit_key: Some(key.to_string()),
                    priority,
                    ..NewTask::new("lk", json!({}))
                })
            })
            .collect();
        ops.submit_many(&tasks, "test").await.unwrap();
        let round = Assigner::run_once(&db.bb.planner(), &config())
            .await
            .unwrap();
        assert_eq!(round.assigned, want.iter().map(|w| w.1).sum::<usize>());
        let client = db.client().await;
        let held: Vec<(String, i64)> = client
            .query(
                "select limit_key, count(*) from artex.tasks where assigned_to is not null
                 group by limit_key order by limit_key",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let want: Vec<(String, i64)> = want
            .iter()
            .map(|&(k, n)| (k.to_string(), n as i64))
            .collect();
        assert_eq!(held, want, "capacity {capacity}");
    }
}

/// A round that may not walk the keys (migrations/V37: the Assigner lets one every
/// `WALK_EVERY`) takes what fits of the head of the limited queue, and the next that may
/// walk finds the key beyond it. Keys a, b, c of three tasks at priorities 9, 5 and 1, one
/// of each key at most, a worker with room for three: the head of six holds a and b only.
#[tokio::test]
async fn a_round_that_may_not_walk_takes_what_fits_of_the_head() {
    use artex_actors::assigner::plan;
    use artex_actors::blackboard::{LimitSpec, Round};
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w1", &["lk"], 3).await;
    let spec = LimitSpec {
        fair: false,
        concurrency: None,
        key_concurrency: Some(1),
        rate_per_sec: None,
    };
    ops.set_kind_limit("lk", &spec, "test").await.unwrap();
    let tasks: Vec<NewTask> = [("c", 1), ("a", 9), ("b", 5)]
        .iter()
        .flat_map(|&(key, priority)| {
            (0..3).map(move |_| NewTask {
                limit_key: Some(key.to_string()),
                priority,
                ..NewTask::new("lk", json!({}))
            })
        })
        .collect();
    ops.submit_many(&tasks, "test").await.unwrap();
    let client = db.client().await;
    let held = || async {
        client
            .query(
                "select limit_key from artex.tasks where assigned_to is not null
                 order by limit_key",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect::<Vec<String>>()
    };
    let planner = db.bb.planner();
    for (walk, want) in [(false, vec!["a", "b"]), (true, vec!["a", "b", "c"])] {
        let round = Round {
            actor: "test-planner",
            batch: 100,
            shards: (1, &[]),
            lease_secs: 30.0,
            alive_secs: 600.0,
            unreachable: &[],
            walk,
        };
        planner.dispatch(&round, plan).await.unwrap();
        assert_eq!(held().await, want, "walk: {walk}");
    }
}

#[tokio::test]
async fn a_backlog_s_next_round_plans_by_the_roster_it_kept() {
    use artex_actors::assigner::plan_round;
    use artex_actors::blackboard::{LimitSpec, Round};
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    let planner = db.bb.planner();
    let client = db.client().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 3).await;
    fixtures::worker(&db.bb, "w2", &["echo"], 3).await;
    let tasks: Vec<NewTask> = (0..12).map(|_| NewTask::new("echo", json!({}))).collect();
    ops.submit_many(&tasks, "test").await.unwrap();
    let round = |batch: i64| Round {
        actor: "test-planner",
        batch,
        shards: (1, &[]),
        lease_secs: 30.0,
        alive_secs: 600.0,
        unreachable: &[],
        walk: true,
    };
    const HELD: &str = "select w.id, count(t.id) from artex.workers w
        left join artex.tasks t on t.assigned_to = w.id group by w.id order by w.id";

    // A round cut at its batch: more may fit, and its roster counts what it gave.
    let cut = planner
        .dispatch(&round(2), |c, r| plan_round(c, r, 2))
        .await
        .unwrap();
    assert_eq!(cut.assigned, 2);
    assert!(cut.more_may_fit());
    let kept = cut.roster.expect("the round's roster");
    let counted: i32 = kept.entries.iter().map(|e| e.held).sum();
    assert_eq!(counted, 2, "{kept:?}");

    // Since the read: w2 left, w3 joined. The kept roster's round claims what w1 and w2
    // had room for; the write gives w2 nothing (no longer online), and w3, unread, none.
    client
        .execute(
            "update artex.workers set state = 'gone' where id = 'w2'",
            &[],
        )
        .await
        .unwrap();
    fixtures::worker(&db.bb, "w3", &["echo"], 3).await;
    let next = planner
        .dispatch_kept(&round(100), kept, |c, r| plan_round(c, r, 100))
        .await
        .unwrap();
    assert_eq!(next.limit, 4, "w1's and w2's free slots by the kept roster");
    assert_eq!(next.claimed, 4);
    assert!(!next.limits_in_play);
    let held: Vec<(String, i64)> = common::pairs(&client, HELD).await;
    assert_eq!(held, [("w1".into(), 3), ("w2".into(), 0), ("w3".into(), 0)]);
    let kept = next.roster.expect("the roster, kept on");
    assert!(kept.entries.iter().all(|e| e.id != "w3"), "{kept:?}");

    // A kind limit set meanwhile: the round is read whole, by the limits (and sees w3).
    let spec = LimitSpec {
        fair: false,
        concurrency: Some(2),
        key_concurrency: None,
        rate_per_sec: None,
    };
    ops.set_kind_limit("echo", &spec, "test").await.unwrap();
    let mut stale = kept.clone();
    stale.entries.iter_mut().for_each(|e| e.held = 0); // room by the kept roster
    let limited = planner
        .dispatch_kept(&round(100), stale, |c, r| plan_round(c, r, 100))
        .await
        .unwrap();
    assert_eq!(limited.assigned, 0, "echo holds 3 of its 2 already");
    assert!(limited.limits_in_play);
    let kept = limited.roster.expect("the roster read whole");
    assert!(kept.entries.iter().any(|e| e.id == "w3"), "{kept:?}");
    ops.clear_kind_limit("echo", "test").await.unwrap();

    // A kept roster's claim that finds nothing reads the round whole too: a quiet
    // fleet's report names its idle workers.
    for r in client
        .query("select id from artex.tasks where status = 'pending'", &[])
        .await
        .unwrap()
    {
        fixtures::cancel(&db.bb, r.get(0)).await;
    }
    let mut stale = kept.clone();
    stale.entries.retain(|e| e.id != "w3");
    stale.entries.iter_mut().for_each(|e| e.held = 0);
    let quiet = planner
        .dispatch_kept(&round(100), stale, |c, r| plan_round(c, r, 100))
        .await
        .unwrap();
    assert_eq!(quiet.claimed, 0);
    assert!(!quiet.limits_in_play);
    let read = quiet.roster.expect("the roster read whole");
    assert!(read.entries.iter().any(|e| e.id == "w3"), "{read:?}");
}

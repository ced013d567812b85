//! The planner's actors driven directly through `run_once()`, asserting on their reports
//! (no process, no sleeping): the Assigner respects capacity, kinds and priority; the
//! Reaper takes back expired leases and the tasks of silent workers. How a round spreads
//! load (`assigner::plan`, pure) is unit-tested in actors/src/assigner.rs.
//!
//! # Layout
//! - here: a round's capacity and priority, its ramp after idle, the Reaper, outcomes
//!   under an assignment's row lock, a backlog's kept roster.
//! - `wake_ups`: what a round's wake-up carries, and its pushes' connections.
//! - `limits`: kind and key limits under random fleets and three planners, and how a
//!   round takes a limited kind's tasks (the head of the queue, the walk of the keys).

#[path = "../common/mod.rs"]
mod common;

mod limits;
mod wake_ups;

use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::{NewTask, ReapParams};
use artex_actors::reaper::Reaper;
use common::{fixtures, TestDb};
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

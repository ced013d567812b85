//! Flows that wait for time (issue 37): `for` and `until` timers complete; a signal's
//! timeout fails the wait and cancels its downstream tasks, or lets the flow through
//! with `on_timeout: succeed`; with two planner processes each due wait ends once, and
//! two Schedulers ending the same due waits at once never end one twice; a wait
//! survives its planner's kill and completes under the next planner; waits and kept
//! signals survive a PostgreSQL restart; a Scheduler ends a timer at its time, not at
//! its next pass.

use std::time::Duration;

use artex_actors::blackboard::{FlowSpec, FlowState, TaskStatus};
use artex_actors::scheduler::Scheduler;
use chrono::Utc;
use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::procs::Proc;
use crate::common::{count, TestDb};
use crate::waits::wait_reached;
use crate::{assert_no_double_success, submit_cli, task, wait_flow};

#[tokio::test]
async fn timers_complete_and_a_timeout_fails_the_wait_or_lets_the_flow_through() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let soon = (Utc::now() + chrono::Duration::seconds(1)).to_rfc3339();
    let timers = submit_cli(
        &db.url,
        &json!({"name": "timers", "tasks": [
            {"name": "first", "kind": "echo"},
            {"name": "delay", "wait": {"for": "1s"}, "depends_on": ["first"]},
            {"name": "at", "wait": {"until": soon}},
            {"name": "past", "wait": {"until": "2020-01-01T00:00:00Z"}},
            {"name": "end", "kind": "echo", "depends_on": ["delay", "at", "past"]}]}),
    );
    let fails = submit_cli(
        &db.url,
        &json!({"name": "fails", "tasks": [
            {"name": "approval", "wait": {"signal": "approved", "timeout": "1s"}},
            {"name": "ship", "kind": "echo", "depends_on": ["approval"]}]}),
    );
    let goes_on = submit_cli(
        &db.url,
        &json!({"name": "goes-on", "tasks": [
            {"name": "approval", "wait": {"signal": "approved", "timeout": "1s",
                                          "on_timeout": "succeed"}},
            {"name": "ship", "kind": "echo", "depends_on": ["approval"]}]}),
    );

    let f = wait_flow(
        &db.bb,
        timers,
        FlowState::Succeeded,
        Duration::from_secs(30),
    )
    .await;
    for name in ["delay", "at", "past"] {
        let t = task(&f, name);
        let history = db.bb.operator().transitions(t.id).await.unwrap();
        let last = history.last().unwrap();
        assert_eq!(
            (last.from_status, last.to_status, last.reason.as_deref()),
            (
                Some(TaskStatus::Blocked),
                TaskStatus::Succeeded,
                Some("timer")
            ),
            "{name}"
        );
        assert!(last.actor.starts_with("planner"), "{}", last.actor);
    }
    // A `for` timer starts when its wait is reached, after its upstream task.
    let (first, delay) = (task(&f, "first"), task(&f, "delay"));
    let w = delay.wait.as_ref().unwrap();
    assert!(
        w.reached_at.unwrap() >= first.finished_at.unwrap(),
        "{f:#?}"
    );
    assert_eq!((w.due_at.unwrap() - w.reached_at.unwrap()).num_seconds(), 1);
    assert!(delay.finished_at.unwrap() >= w.due_at.unwrap(), "{f:#?}");

    let f = wait_flow(&db.bb, fails, FlowState::Failed, Duration::from_secs(30)).await;
    let approval = task(&f, "approval");
    assert_eq!(approval.status, TaskStatus::Timeout);
    assert_eq!(
        approval.error.as_deref(),
        Some("no signal 'approved' within 1s")
    );
    let last = db.bb.operator().transitions(approval.id).await.unwrap();
    assert_eq!(last.last().unwrap().reason.as_deref(), Some("timeout"));
    let ship = task(&f, "ship");
    assert_eq!(ship.status, TaskStatus::Canceled);
    let why = db.bb.operator().transitions(ship.id).await.unwrap();
    assert!(
        why.last()
            .unwrap()
            .reason
            .as_deref()
            .unwrap()
            .starts_with("upstream task 'approval'"),
        "{why:?}"
    );
    // A signal after the timeout is refused.
    let (code, _, err) =
        crate::common::run_cli(&db.url, &["flow", "signal", &fails.to_string(), "approved"]);
    assert_eq!(code, 2);
    assert!(err.contains("has ended timeout"), "{err}");

    let f = wait_flow(
        &db.bb,
        goes_on,
        FlowState::Succeeded,
        Duration::from_secs(30),
    )
    .await;
    let approval = task(&f, "approval");
    let last = db.bb.operator().transitions(approval.id).await.unwrap();
    assert_eq!(last.last().unwrap().reason.as_deref(), Some("timeout"));
    assert_eq!(task(&f, "ship").status, TaskStatus::Succeeded);
    assert_no_double_success(&c).await;
}

/// A flow of `n` waits of `for`, without upstream tasks (reached at submission).
fn many_timers(n: usize, delay: &str) -> FlowSpec {
    let tasks: Vec<_> = (0..n)
        .map(|i| json!({"name": format!("t{i}"), "wait": {"for": delay}}))
        .collect();
    serde_json::from_value(json!({"name": "timers", "tasks": tasks})).unwrap()
}

#[tokio::test]
async fn with_two_planner_processes_each_due_wait_ends_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p1 = Proc::planner("planner1", &db.url, &[]);
    let _p2 = Proc::planner("planner2", &db.url, &[]);
    let id = db
        .bb
        .operator()
        .submit_flow(&many_timers(200, "2s"), "test")
        .await
        .unwrap();
    wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(60)).await;
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.task_transitions where kind = 'artex:wait'
             and to_status = 'succeeded'"
        )
        .await,
        200
    );
    assert_no_double_success(&c).await;
}

/// The Scheduler's pass reads when the next slot or wait is due and runs a pass then:
/// with its passes 600 s apart, a `for` timer of 2 s, unseen by its first pass, is ended
/// by the pass timed for it (the next pass would come long after this test's 30 s).
#[test]
fn a_scheduler_ends_a_timer_at_its_time_between_its_passes() {
    actix::System::new().block_on(async {
        use actix::Actor;
        let db = TestDb::new().await;
        let id = db
            .bb
            .operator()
            .submit_flow(&many_timers(1, "2s"), "test")
            .await
            .unwrap();
        let _scheduler = Scheduler::new(
            db.bb.planner(),
            "planner-t".into(),
            Duration::from_secs(600),
            Default::default(),
        )
        .start();
        let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
        let t0 = task(&f, "t0");
        let history = db.bb.operator().transitions(t0.id).await.unwrap();
        let last = history.last().unwrap();
        assert_eq!(
            (last.reason.as_deref(), last.actor.as_str()),
            (Some("timer"), "planner-t")
        );
        assert!(t0.finished_at.unwrap() >= t0.wait.as_ref().unwrap().due_at.unwrap());
    });
}

/// A wait reached announces when it is due (`wait-at:`, V61), and a Scheduler handed
/// that time runs a pass then: its passes 600 s apart and its first pass over before
/// the wait existed, a `for` timer of 500 ms ends within the test's 30 s.
#[test]
fn a_reached_wait_announces_its_due_time_and_the_scheduler_meets_it() {
    actix::System::new().block_on(async {
        use actix::Actor;
        use artex_actors::blackboard::{parse_wait_at, TASKS_CHANNEL};
        use artex_actors::scheduler::WaitDue;
        let db = TestDb::new().await;
        let stats = artex_actors::supervisor::ActorStats::default();
        let scheduler = Scheduler::new(
            db.bb.planner(),
            "planner-t".into(),
            Duration::from_secs(600),
            stats.clone(),
        )
        .start();
        let mut listener = db
            .bb
            .feed()
            .listen(&[TASKS_CHANNEL.to_string()])
            .await
            .unwrap();
        // The Scheduler's first pass, which finds nothing due, is over (counted when its
        // read of the next due time is done): the wait comes after it.
        crate::common::procs::wait_for(
            "the Scheduler's first pass",
            Duration::from_secs(10),
            || async {
                let runs = stats.snapshot().get("scheduler").map_or(0, |c| c.runs);
                (runs >= 1).then_some(())
            },
        )
        .await;
        let id = db
            .bb
            .operator()
            .submit_flow(&many_timers(1, "500ms"), "test")
            .await
            .unwrap();
        let at = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let n = listener.recv().await.expect("the listener ended");
                if let Some(at) = parse_wait_at(&n.payload) {
                    return at;
                }
            }
        })
        .await
        .expect("no wait-at: notification within 10 s");
        let f = db.bb.operator().flow(id).await.unwrap();
        let due = task(&f, "t0").wait.as_ref().unwrap().due_at.unwrap();
        assert_eq!(
            chrono::DateTime::<Utc>::from(at).timestamp_millis(),
            due.timestamp_millis(),
            "the announced time is the wait's due_at, to the millisecond"
        );
        scheduler.do_send(WaitDue(at));
        let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
        let history = db
            .bb
            .operator()
            .transitions(task(&f, "t0").id)
            .await
            .unwrap();
        let last = history.last().unwrap();
        assert_eq!(
            (last.reason.as_deref(), last.actor.as_str()),
            (Some("timer"), "planner-t")
        );
    });
}

/// What the Scheduler times its pass for: the soonest slot of a schedule not paused, or
/// due time of a wait not ended; nothing when there is neither.
#[tokio::test]
async fn the_next_due_is_the_soonest_slot_or_wait_not_paused_or_ended() {
    let db = TestDb::new().await;
    let c = db.client().await;
    assert_eq!(db.bb.planner().next_due_ms().await.unwrap(), None);
    c.batch_execute(
        "insert into artex.schedules (name, cron, kind, created_by, updated_by, next_slot)
         values ('later', '* * * * *', 'echo', 'test', 'test', now() + interval '20 min'),
                ('paused', '* * * * *', 'echo', 'test', 'test', now() + interval '1 min')",
    )
    .await
    .unwrap();
    c.batch_execute("update artex.schedules set paused = true where name = 'paused'")
        .await
        .unwrap();
    due_in_minutes(&db, 20).await;
    db.bb
        .operator()
        .submit_flow(&many_timers(2, "10m"), "test")
        .await
        .unwrap();
    due_in_minutes(&db, 10).await;
    c.batch_execute("update artex.flow_waits set ended_at = now()")
        .await
        .unwrap();
    due_in_minutes(&db, 20).await;
    c.batch_execute("update artex.schedules set next_slot = now() - interval '1 min'")
        .await
        .unwrap();
    let past = db.bb.planner().next_due_ms().await.unwrap().unwrap();
    assert!((-62_000..=-58_000).contains(&past), "{past}");
}

/// Asserts the next slot or wait is due in about `m` minutes (a little less: time passed).
async fn due_in_minutes(db: &TestDb, m: i64) {
    let ms = db
        .bb
        .planner()
        .next_due_ms()
        .await
        .unwrap()
        .expect("something due");
    let want = m * 60_000;
    assert!(
        (want - 2_000..=want).contains(&ms),
        "{ms} ms, expected about {m} min"
    );
}

#[tokio::test]
async fn two_schedulers_ending_the_same_due_waits_at_once_end_each_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for _ in 0..3 {
        db.bb
            .operator()
            .submit_flow(&many_timers(300, "1h"), "test")
            .await
            .unwrap();
    }
    // Both passes see every wait due (their clock two hours ahead), at the same moment.
    let later = Utc::now() + chrono::Duration::hours(2);
    let (a, b) = (db.bb.planner(), db.bb.planner());
    let (ra, rb) = tokio::join!(
        Scheduler::run_once(&a, "planner-a", Some(later)),
        Scheduler::run_once(&b, "planner-b", Some(later)),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // One pass ends at most 1,000: a third finds the rest.
    let rc = Scheduler::run_once(&a, "planner-a", Some(later))
        .await
        .unwrap();
    let ended = ra.waits.len() + rb.waits.len() + rc.waits.len();
    assert_eq!(
        ended,
        900,
        "{} + {} + {}",
        ra.waits.len(),
        rb.waits.len(),
        rc.waits.len()
    );
    assert!(ra.waits.iter().all(|w| w.outcome == "timer"));
    let again = Scheduler::run_once(&a, "planner-a", Some(later))
        .await
        .unwrap();
    assert!(again.waits.is_empty(), "{:?}", again.waits);
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where kind = 'artex:wait' and status = 'succeeded'"
        )
        .await,
        900
    );
    assert_no_double_success(&c).await;
}

#[tokio::test]
async fn a_wait_survives_its_planners_kill_and_ends_under_the_next() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut p1 = Proc::planner("planner1", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let id = submit_cli(
        &db.url,
        &json!({"name": "restart", "tasks": [
            {"name": "first", "kind": "echo"},
            {"name": "delay", "wait": {"for": "3s"}, "depends_on": ["first"]},
            {"name": "approval", "wait": {"signal": "ok"}, "depends_on": ["first"]},
            {"name": "end", "kind": "echo", "depends_on": ["delay", "approval"]}]}),
    );
    wait_reached(&db.bb, id, "delay").await;
    p1.signal(Signal::SIGKILL);
    p1.wait_exit(Duration::from_secs(10));
    // Nothing of the wait lived in the killed process: the next planner ends it, and a
    // signal needs no planner at all.
    let _p2 = Proc::planner("planner2", &db.url, &[]);
    let (code, _, err) = crate::common::run_cli(
        &db.url,
        &["flow", "signal", &id.to_string(), "ok", "--payload", "true"],
    );
    assert_eq!(code, 0, "{err}");
    let f = wait_flow(&db.bb, id, FlowState::Succeeded, Duration::from_secs(30)).await;
    let delay = db
        .bb
        .operator()
        .transitions(task(&f, "delay").id)
        .await
        .unwrap();
    let last = delay.last().unwrap();
    assert_eq!(last.reason.as_deref(), Some("timer"));
    assert_eq!(task(&f, "end").status, TaskStatus::Succeeded);
    assert_no_double_success(&c).await;
}

#[tokio::test]
async fn waits_survive_a_postgres_restart() {
    // A private cluster: restarting the shared one would cut every other test off.
    let private = crate::common::PrivateCluster::start().await;
    let (cluster, url) = (&private.cluster, private.url.clone());
    let _p = Proc::planner("planner", &url, &[]);
    let _w = Proc::worker("worker", &url, &[]);
    let id = submit_cli(
        &url,
        &json!({"name": "restart", "tasks": [
            {"name": "first", "kind": "echo"},
            {"name": "delay", "wait": {"for": "2s"}, "depends_on": ["first"]},
            {"name": "approval", "wait": {"signal": "ok"}, "depends_on": ["first"]},
            {"name": "later", "wait": {"signal": "later"}, "depends_on": ["delay"]},
            {"name": "end", "kind": "gather", "depends_on": ["approval", "later"]}]}),
    );
    // A signal kept for a wait not reached yet, and one reached wait, then the restart.
    let (code, _, err) = crate::common::run_cli(
        &url,
        &["flow", "signal", &id.to_string(), "later", "--payload", "2"],
    );
    assert_eq!(code, 0, "{err}");
    wait_reached(&private.bb, id, "approval").await;
    cluster.restart().unwrap();
    let (code, _, err) = crate::common::run_cli(
        &url,
        &["flow", "signal", &id.to_string(), "ok", "--payload", "1"],
    );
    assert_eq!(code, 0, "{err}");
    let bb = artex_actors::Blackboard::connect(&url, 2).unwrap();
    let f = wait_flow(&bb, id, FlowState::Succeeded, Duration::from_secs(90)).await;
    let end = bb.operator().task(task(&f, "end").id).await.unwrap();
    assert_eq!(
        end.result.unwrap()["upstream"],
        json!({"approval": 1, "later": 2})
    );
    assert_no_double_success(&crate::common::connect(&url).await).await;
}

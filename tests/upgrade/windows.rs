//! The task transfer's windows, each opened on purpose: the new process is held at the
//! `before_take_over` delay point (`ARTEX_DELAYS`, after the old process suspended its
//! resumable tasks and before the take-over's statement), and something happens there:
//! - the wait outlasts two leases: the old process keeps the suspended tasks' leases
//!   (before, nobody renewed them, and the reaper took them back);
//! - the new worker's row is locked meanwhile (as a planner's round does) for two leases:
//!   the new process counts a lease from when it sent the take-over, so after the wait
//!   its tasks looked spent and were stopped by its own fence (before; now a renewal
//!   right after a slow take-over counts them afresh). The take-over also takes that lock
//!   first and counts the lease from then, so that a reaper between its commit and that
//!   renewal does not find it spent; this test cannot tell that part (the renewal is
//!   milliseconds behind the commit, the reaper's sweep 200 ms);
//! - PostgreSQL restarts: the take-over waits for it and is sent again (before, the
//!   upgrade rolled back and the rollback's own take-over failed too: the reaper's).
//!
//! Each time, every task runs on once in the new process (`transfer::assert_ran_on_once`)
//! and the upgrade answers 200 having resumed them all. While the transfer is under way
//! the old worker is `upgrading`: planners assign it nothing more.

use std::time::Duration;

use artex_actors::Blackboard;
use tokio_postgres::Client;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{wait_for, worker_http, worker_id, Proc};
use crate::common::{self, PrivateCluster, TestDb};
use crate::transfer::{assert_ran_on_once, submit_long, wait_checkpointed, wait_ended};
use crate::{curl_upgrade, upgradable_worker, KillAll};

/// Resumable tasks running when the upgrade comes.
const TASKS: usize = 4;
/// Their steps of 100 ms: still running well past the window.
const STEPS: u64 = 120;

/// The log line of a delay point being reached (supervisor::delay_point).
const AT_DELAY: &str = "delay point reached";

/// What a window test runs on.
struct Setup<'a> {
    url: &'a str,
    bb: &'a Blackboard,
    /// `ARTEX_DELAYS` for both generations (only the new one reaches the point).
    delays: &'a str,
    worker_args: &'a [&'a str],
    planner_args: &'a [&'a str],
}

/// Runs an upgrade of a worker holding [`TASKS`] resumable tasks; `in_window` runs once
/// the new process waits at its delay point (with a client and the old worker's id), and
/// the upgrade must then succeed with every task run on once in the new process.
async fn transfer_through<F, Fut>(setup: Setup<'_>, in_window: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let c = common::connect(setup.url).await;
    let keys = Keys::new();
    let bundle = keys.variant_bundles(1).remove(0).0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let _planner = Proc::planner("planner", setup.url, setup.planner_args);
    let mut args = vec!["--concurrency", "8"];
    args.extend_from_slice(setup.worker_args);
    let env = [("ARTEX_DELAYS", setup.delays)];
    let mut gen0 = upgradable_worker("gen0", setup.url, &keys, &args, &env);
    let http = worker_http(&c, &gen0).await;
    let old_worker = worker_id(&c, &gen0).await;
    let old = gen0.pid();
    let ids = submit_long(setup.bb, &file, TASKS, STEPS).await;
    wait_checkpointed(setup.bb, &ids).await;

    let upgrade = std::thread::spawn({
        let bundle = bundle.clone();
        move || curl_upgrade(&http, &bundle, Some(TOKEN), false)
    });
    wait_for(
        "the new process at its delay point",
        Duration::from_secs(60),
        || async { gen0.log_text().contains(AT_DELAY).then_some(()) },
    )
    .await;
    // Mid-transfer: the old worker is out of the planners' rounds.
    let state: String = c
        .query_one(
            "select state::text from artex.workers where id = $1",
            &[&old_worker],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        state, "upgrading",
        "the old worker during the task transfer"
    );
    in_window(c, old_worker).await;

    let (code, body) = tokio::task::spawn_blocking(move || upgrade.join().unwrap())
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}\n{}", gen0.log_text());
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    assert_eq!(body["tasks_resumed"], TASKS, "{body}");
    gen0.wait_exit(Duration::from_secs(60))
        .expect("the first process exits");
    wait_ended(setup.bb, &ids).await;
    assert_ran_on_once(setup.bb, &ids, &file, old, new, &gen0.log_text()).await;
}

#[tokio::test]
async fn a_take_over_held_up_past_two_leases_finds_its_tasks_still_held() {
    let db = TestDb::new().await;
    // The tests' lease is 3 s: the take-over waits 7.
    let setup = Setup {
        url: &db.url,
        bb: &db.bb,
        delays: "before_take_over=7000",
        worker_args: &[],
        planner_args: &[],
    };
    transfer_through(setup, |_, _| async {}).await;
}

#[tokio::test]
async fn a_take_over_waiting_for_the_new_workers_row_counts_its_lease_from_the_lock() {
    let db = TestDb::new().await;
    let setup = Setup {
        url: &db.url,
        bb: &db.bb,
        delays: "before_take_over=1000",
        worker_args: &[],
        // The new worker's heartbeats wait on the lock too: not a silence to reap.
        planner_args: &["--worker-timeout-ms", "30000"],
    };
    transfer_through(setup, |mut c, old_worker| async move {
        let new_worker: String = c
            .query_one(
                "select id from artex.workers where id <> $1 and state = 'online'",
                &[&old_worker],
            )
            .await
            .unwrap()
            .get(0);
        // Two leases and more, from before the take-over is sent until well after.
        let tx = c.transaction().await.unwrap();
        tx.execute(
            "select 1 from artex.workers where id = $1 for update",
            &[&new_worker],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_secs(7)).await;
        tx.commit().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_take_over_across_a_postgres_restart_is_sent_again_and_loses_nothing() {
    let private = PrivateCluster::start().await;
    let cluster = private.cluster.clone();
    // A lease that outlasts the restart (about three seconds).
    let setup = Setup {
        url: &private.url,
        bb: &private.bb,
        delays: "before_take_over=1000",
        worker_args: &["--lease-ms", "15000"],
        planner_args: &[],
    };
    transfer_through(setup, |c, _| async move {
        drop(c);
        tokio::task::spawn_blocking(move || {
            cluster.stop().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            cluster.start().unwrap();
        })
        .await
        .unwrap();
    })
    .await;
}

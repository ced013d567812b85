//! The runtime end to end, with real planner and worker processes on real PostgreSQL:
//! mixed workloads, crashes (kill -9), a PostgreSQL restart, a zombie worker, several
//! planners, graceful stops, NOTIFY and its safety nets, supervision, worker HTTP.
//!
//! # Layout
//! - here: the shared checks (every task finished, none run twice) and a mixed workload
//!   of five thousand tasks through one planner and three workers.
//! - `crashes`: kill -9, a zombie worker, a locked row at renewal, PostgreSQL restarted or
//!   late, a panicking actor.
//! - `planners`: several planners, a stopped planner, NOTIFY and the poll.
//! - `drain`: SIGTERM and the drain deadline.
//! - `worker`: a worker's HTTP, its queue depth, its handlers' retry decisions.

#[path = "../common/mod.rs"]
mod common;

mod crashes;
mod drain;
mod planners;
mod worker;

use std::collections::HashMap;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use common::procs::{wait_for, worker_id, Proc};
use common::{count, TestDb};
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
    // Leases of 15 s, not the tests' 3: each worker's queue grows to ~2,000 tasks here,
    // and a 3 s lease rewrites every held row each second. On a loaded CI machine a
    // worker once went 2.4 s without a renewal (the self-fence's margin is a fifth of the
    // lease), stopped three running `fail` tasks and had their attempts counted, which the
    // exact attempt counts below do not allow for. Losing a lease is the fencing tests'
    // subject, not this one's.
    let workers: Vec<Proc> = (0..3)
        .map(|i| Proc::worker(&format!("worker{i}"), &db.url, &["--lease-ms", "15000"]))
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

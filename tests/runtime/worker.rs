//! A worker as its operator and its handlers see it: health and status over HTTP, a
//! local queue sized to its pace, a handler's say on what follows its failure.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio_postgres::Client;

use super::{assert_no_double_run, wait_all_finished};
use crate::common::procs::{http_get, wait_for, wait_status, worker_http, worker_id, Proc};
use crate::common::{self, count, TestDb};

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

/// A burst after idle deepens every worker's queue at its first full refill, whether it
/// claimed its tasks or a planner's round pushed them, and a worker that never ran a
/// task yet as one idle since its last; and every worker claims the rest of the backlog
/// itself once its outcomes are written, the pushed one too, with no round needed.
/// Each worker idles with a slot offered to new tasks (migrations/V62), which a round
/// cannot fill: a round-fed worker once counted that slot free, never saw its queue
/// starved, and waited for the rounds (whose roster, kept through a backlog, missed
/// its freed slots) at its first refill's size while the other ran deep.
#[tokio::test]
async fn a_burst_deepens_and_feeds_every_workers_queue_whether_claimed_or_pushed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let planner = Proc::planner("planner", &db.url, &[]);
    // Polls never due: every task reaches a worker by a push or its own claim.
    let args = ["--concurrency", "2", "--worker-poll-ms", "600000"];
    let (a, b) = (
        Proc::worker("worker-a", &db.url, &args),
        Proc::worker("worker-b", &db.url, &args),
    );
    let ids = [worker_id(&c, &a).await, worker_id(&c, &b).await];
    wait_for("both workers' offers", Duration::from_secs(30), || async {
        let n = count(&c, "select count(*) from artex.worker_offers").await;
        (n == 2).then_some(())
    })
    .await;
    // Due a second from now: none is born assigned to an offer; they come as a burst.
    c.batch_execute(
        "insert into artex.tasks (kind, payload, run_at)
         select 'sleep', '{\"ms\": 200}', now() + interval '1 second'
         from generate_series(1, 200)",
    )
    .await
    .unwrap();
    // What worker `id` holds now, and has finished: one snapshot.
    let counts = |id: String| {
        let c = &c;
        async move {
            let r = c
                .query_one(
                    "select (select count(*) from artex.tasks where assigned_to = $1),
                            (select count(*) from artex.task_transitions
                             where worker = $1 and to_status = 'succeeded')",
                    &[&id],
                )
                .await
                .unwrap();
            (r.get::<_, i64>(0), r.get::<_, i64>(1))
        }
    };
    // 2 slots and 4 queued (6 held at most) before; 2 + 4 × 8 (the starved queue's
    // growth) after the first refill.
    for id in &ids {
        wait_for(
            &format!("worker {id} to hold more than its shallow queue's 6"),
            Duration::from_secs(10),
            || async { (counts(id.clone()).await.0 >= 20).then_some(()) },
        )
        .await;
    }
    // No more rounds nor pushes: what either worker finishes past what it held and had
    // finished now, its own claims and reads took.
    planner.signal(Signal::SIGSTOP);
    for id in &ids {
        let (held, done) = counts(id.clone()).await;
        wait_for(
            &format!("worker {id} to finish more than the {held} it held without rounds"),
            Duration::from_secs(30),
            || async { (counts(id.clone()).await.1 > done + held).then_some(()) },
        )
        .await;
    }
    planner.signal(Signal::SIGCONT);
    // The claims of pushed workers ran nothing twice.
    wait_all_finished(&c, Duration::from_secs(60)).await;
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

//! The fleet harness (tests/common/fleet.rs) on a real run: PostgreSQL, a planner and two
//! workers each on a host of its own, talking only over the fleet's network; one worker's
//! host cut off and healed. Needs root: it fails, saying so, without it.

mod common;

use std::time::Duration;

use common::fleet::{wait_batch_done as wait_done, Fleet};
use common::procs::{alive, wait_for, worker_id};
use nix::sys::signal::Signal;
use tokio_postgres::Client;

/// Inserts `n` echo tasks of batch `batch` (payload `{"batch": …, "n": …}`).
async fn submit(c: &Client, batch: i32, n: i32) {
    c.execute(
        "insert into artex.tasks (kind, payload) \
         select 'echo', jsonb_build_object('batch', $1::int, 'n', g) \
         from generate_series(1, $2::int) g",
        &[&batch, &n],
    )
    .await
    .expect("submitting echo tasks");
}

/// (tasks that started exactly once, all starts, tasks whose result is their payload).
async fn exactly_once(c: &Client) -> (i64, i64, i64) {
    let r = c
        .query_one(
            "select (select count(*) from (select task_id from artex.task_transitions \
                     where to_status = 'running' group by task_id having count(*) = 1) t), \
                    (select count(*) from artex.task_transitions where to_status = 'running'), \
                    (select count(*) from artex.tasks where result = payload)",
            &[],
        )
        .await
        .expect("counting starts");
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn a_fleet_runs_tasks_over_its_network_and_a_partitioned_worker_comes_back() {
    let fleet = Fleet::new(&["db", "p1", "w1", "w2"]);
    let db = fleet.start_postgres("db").await;
    let c = db.client().await;
    let url = db.url_from_fleet();
    let _planner = fleet.planner("p1", "planner", &url, &[]);
    let w1 = fleet.worker("w1", "w1", &url, &[]);
    let w2 = fleet.worker("w2", "w2", &url, &[]);
    // Registered under the pids the harness holds: `ip netns exec` exec'd artex.
    let w1_id = worker_id(&c, &w1).await;
    let w2_id = worker_id(&c, &w2).await;
    let w2_http = fleet.http_addr("w2");
    let registered: String = c
        .query_one(
            "select http_addr from artex.workers where id = $1",
            &[&w2_id],
        )
        .await
        .expect("w2's row")
        .get(0);
    assert_eq!(registered, w2_http);

    // Everything reaches PostgreSQL over TCP from the three hosts, none by its socket
    // (the planner may still be opening its sessions: wait for them).
    let mut hosts: Vec<String> = ["p1", "w1", "w2"]
        .iter()
        .map(|h| fleet.addr(h).to_string())
        .collect();
    hosts.sort();
    let c2 = &c;
    let hosts2 = &hosts;
    wait_for(
        "the planner and both workers to reach PostgreSQL over the fleet's network",
        Duration::from_secs(20),
        || async move {
            let peers: Vec<String> = c2
                .query(
                    "select distinct host(client_addr) from pg_stat_activity \
                     where backend_type = 'client backend' and client_addr is not null \
                     order by 1",
                    &[],
                )
                .await
                .ok()?
                .iter()
                .map(|r| r.get(0))
                .collect();
            (&peers == hosts2).then_some(())
        },
    )
    .await;

    submit(&c, 1, 200).await;
    wait_done(&c, 1, 200, Duration::from_secs(30)).await;
    assert_eq!(exactly_once(&c).await, (200, 200, 200));

    let (code, body) = fleet
        .http_get("w1", &w2_http, "/status")
        .expect("w2 reachable from w1 before the partition");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("\"pid\":{}", w2.pid())), "{body}");

    fleet.partition("w2");
    let cut = fleet.http_get("w1", &w2_http, "/status");
    assert!(cut.is_err(), "w2 answered w1 while partitioned: {cut:?}");
    // Nothing died: w2 still serves on its own host, and finds the database gone.
    assert!(alive(w2.pid()));
    let (code, body) = fleet
        .http_get("w2", &w2_http, "/status")
        .expect("w2 reachable from its own host");
    assert_eq!(code, 200, "{body}");
    wait_for(
        "w2's /health to report the database unreachable",
        Duration::from_secs(15),
        || async {
            matches!(fleet.http_get("w2", &w2_http, "/health"), Ok((503, _))).then_some(())
        },
    )
    .await;

    // The rest of the fleet goes on without w2.
    submit(&c, 2, 50).await;
    wait_done(&c, 2, 50, Duration::from_secs(30)).await;
    let by_others: i64 = c
        .query_one(
            "select count(*) from artex.task_transitions tr join artex.tasks t \
             on t.id = tr.task_id where (t.payload->>'batch')::int = 2 \
             and tr.to_status = 'running' and tr.worker is distinct from $1",
            &[&w1_id],
        )
        .await
        .expect("counting batch 2's starts")
        .get(0);
    assert_eq!(
        by_others, 0,
        "a task of batch 2 started elsewhere than on w1"
    );

    fleet.heal("w2");
    let body = wait_for(
        "w2 healthy again, seen from w1",
        Duration::from_secs(30),
        || async {
            fleet
                .http_get("w1", &w2_http, "/health")
                .ok()
                .filter(|(code, _)| *code == 200)
                .map(|(_, b)| b)
        },
    )
    .await;
    assert!(body.contains(&format!("\"pid\":{}", w2.pid())), "{body}");
    assert_eq!(exactly_once(&c).await, (250, 250, 250));

    // A frozen database host (every PostgreSQL process stopped) is noticed, and so is its
    // return.
    let w1_http = fleet.http_addr("w1");
    let health = |code: u16| {
        let (fleet, w1_http) = (&fleet, &w1_http);
        move || async move {
            matches!(fleet.http_get("w2", w1_http, "/health"), Ok((c, _)) if c == code)
                .then_some(())
        }
    };
    fleet.signal_host("db", Signal::SIGSTOP);
    wait_for(
        "w1 to find the frozen database",
        Duration::from_secs(15),
        health(503),
    )
    .await;
    fleet.signal_host("db", Signal::SIGCONT);
    wait_for(
        "w1 to find the database back",
        Duration::from_secs(15),
        health(200),
    )
    .await;
}

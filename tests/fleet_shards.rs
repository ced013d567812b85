//! Planner shards on a fleet (tests/common/fleet.rs): PostgreSQL on `db`, two planners
//! with `--shards auto` on `p1` and `p2`, a worker on `w1`. `p2` cut off: within a lease
//! its shards are owned by `p1` and tasks of every key still run; healed: `p2` gets its
//! share back. Needs root: it fails, saying so, without it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::fleet::{wait_batch_done, Fleet};
use common::procs::{wait_for, Proc};
use tokio_postgres::Client;

/// Shards and their lease, short so that the test is: renewed every second.
const SHARD_ARGS: &[&str] = &["--shards", "auto:4", "--shard-lease-ms", "3000"];
/// Keys of the tasks: ten sites, spread over the four shards.
const KEYS: i32 = 10;

/// Inserts `n` echo tasks of batch `batch`, keys `site-0`… round robin.
async fn submit(c: &Client, batch: i32, n: i32) {
    c.execute(
        "insert into artex.tasks (kind, payload, shard_key) \
         select 'echo', jsonb_build_object('batch', $1::int, 'n', g), 'site-' || (g % $3::int) \
         from generate_series(1, $2::int) g",
        &[&batch, &n, &KEYS],
    )
    .await
    .expect("submitting echo tasks");
}

/// The id under which `p` keeps shards (`planner:host:pid:suffix`).
async fn planner_id(c: &Client, p: &Proc) -> String {
    let pattern = format!("planner:%:{}:%", p.pid());
    let pattern = &pattern;
    wait_for(
        &format!("planner pid {} to check in", p.pid()),
        Duration::from_secs(30),
        || async move {
            c.query_opt("select id from artex.planners where id like $1", &[pattern])
                .await
                .ok()
                .flatten()
                .map(|r| r.get::<_, String>(0))
        },
    )
    .await
}

/// How many shards each owner holds with a live lease.
async fn live_owners(c: &Client) -> Option<BTreeMap<String, i64>> {
    let rows = c
        .query(
            "select owner, count(*) from artex.planner_shards \
             where owner is not null and lease_until > now() group by owner",
            &[],
        )
        .await
        .ok()?;
    Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Waits until the owners are exactly `want` (owner → shards).
async fn wait_owners(c: &Client, what: &str, want: &[(&str, i64)], timeout: Duration) {
    let want: BTreeMap<String, i64> = want.iter().map(|(o, n)| (o.to_string(), *n)).collect();
    let want = &want;
    wait_for(what, timeout, || async move {
        live_owners(c).await.filter(|o| o == want).map(|_| ())
    })
    .await;
}

/// The planners that served the tasks of `batch` (the owners of their planner shards,
/// read right after the batch finished, while ownership is steady), and whether every key
/// of the batch went through a single planner. (The history no longer names the planner
/// of an assignment that was followed by a start: since V10 the start row stands for it.)
async fn assigners(c: &Client, batch: i32) -> (Vec<String>, bool) {
    const SERVED: &str = "from artex.tasks t \
         join artex.planner_shards s \
           on s.shard = t.shard % (select count(*) from artex.planner_shards) \
         where (t.payload->>'batch')::int = $1 and t.status = 'succeeded'";
    let planners: Vec<String> = c
        .query(
            &format!("select distinct s.owner {SERVED} and s.owner is not null order by 1"),
            &[&batch],
        )
        .await
        .expect("reading the assignments")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let split: i64 = c
        .query_one(
            &format!(
                "select count(*) from (select t.shard_key {SERVED} \
                 group by t.shard_key having count(distinct s.owner) > 1) k"
            ),
            &[&batch],
        )
        .await
        .expect("reading the keys")
        .get(0);
    (planners, split == 0)
}

#[tokio::test]
async fn a_partitioned_planner_has_its_shards_taken_over_and_gets_them_back_when_healed() {
    let fleet = Fleet::new(&["db", "p1", "p2", "w1"]);
    let db = fleet.start_postgres("db").await;
    let c = db.client().await;
    let url = db.url_from_fleet();
    let p1 = fleet.planner("p1", "p1", &url, SHARD_ARGS);
    let p2 = fleet.planner("p2", "p2", &url, SHARD_ARGS);
    let _w1 = fleet.worker("w1", "w1", &url, &[]);
    let (id1, id2) = (planner_id(&c, &p1).await, planner_id(&c, &p2).await);

    wait_owners(
        &c,
        "the two planners to own two shards each",
        &[(&id1, 2), (&id2, 2)],
        Duration::from_secs(20),
    )
    .await;
    submit(&c, 1, 100).await;
    wait_batch_done(&c, 1, 100, Duration::from_secs(30)).await;
    let (planners, one_each) = assigners(&c, 1).await;
    let mut both = vec![id1.clone(), id2.clone()];
    both.sort();
    assert_eq!(
        planners, both,
        "each planner assigns the keys of its shards"
    );
    assert!(one_each, "a key's tasks were assigned by both planners");

    // p2 cut off: its leases lapse (3 s) and p1 takes its shards.
    fleet.partition("p2");
    wait_owners(
        &c,
        "p1 to own every shard",
        &[(&id1, 4)],
        Duration::from_secs(15),
    )
    .await;
    submit(&c, 2, 100).await;
    wait_batch_done(&c, 2, 100, Duration::from_secs(30)).await;
    let (planners, _) = assigners(&c, 2).await;
    assert_eq!(
        planners,
        std::slice::from_ref(&id1),
        "p2 assigned while cut off"
    );

    // Healed: p2 checks in again and p1 hands its share back.
    fleet.heal("p2");
    wait_owners(
        &c,
        "p2 to get two shards back",
        &[(&id1, 2), (&id2, 2)],
        Duration::from_secs(60),
    )
    .await;
    submit(&c, 3, 100).await;
    wait_batch_done(&c, 3, 100, Duration::from_secs(30)).await;
    let (planners, one_each) = assigners(&c, 3).await;
    assert_eq!(planners.len(), 2, "{planners:?}");
    assert!(one_each, "a key's tasks were assigned by both planners");

    // No task started twice through it all.
    let starts: i64 = c
        .query_one(
            "select count(*) from artex.task_transitions where to_status = 'running'",
            &[],
        )
        .await
        .expect("counting starts")
        .get(0);
    assert_eq!(starts, 300);
}

//! Kind and key limits: never exceeded under random fleets and three planners, and a
//! round's take of a limited kind's tasks by the head of its queue or the walk of its keys.

use artex_actors::assigner::Assigner;
use artex_actors::blackboard::NewTask;
use artex_testkit::fuzz;
use serde_json::json;

use crate::common::{count, fixtures, TestDb};
use crate::config;

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

/// Kind `lk` limited to `key_concurrency` tasks a key, and three tasks of each of the
/// keys c, a and b at priorities 1, 9 and 5 (submitted in that order).
async fn three_keys(db: &TestDb, key_concurrency: i32) {
    let ops = db.bb.operator();
    let spec = artex_actors::blackboard::LimitSpec {
        key_concurrency: Some(key_concurrency),
        ..Default::default()
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
    let cases = [
        (4, 2, vec![("a", 2), ("b", 2)]),
        (8, 2, vec![("a", 2), ("b", 2), ("c", 2)]),
        (4, 1, vec![("a", 1), ("b", 1), ("c", 1)]),
        (2, 3, vec![("a", 2)]),
    ];
    for (capacity, key_concurrency, want) in cases {
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["lk"], capacity).await;
        three_keys(&db, key_concurrency).await;
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
    use artex_actors::blackboard::Round;
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["lk"], 3).await;
    three_keys(&db, 1).await;
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

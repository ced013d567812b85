//! Planner shards with owners (`--shards auto`): the ShardKeeper driven directly through
//! `run_once()` with the database's clock in the test's hands, asserting on its reports
//! and on `artex.planner_shards`. Two keepers split the shards; one that stops renewing
//! loses its shards a lease later and gets its share back when it returns; a stale epoch
//! changes nothing; a planner wishing another shard count is refused (a process too),
//! and a planner stopping gives its shards back at once. The rules alone
//! (`shard_keeper::plan`, the view's self-fencing) are unit-tested in
//! actors/src/shard_keeper.rs; the partition of a real planner in tests/fleet_shards.rs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::NewTask;
use artex_actors::shard_keeper::{KeeperConfig, KeeperReport, ShardKeeper, ShardView};
use artex_actors::{Blackboard, Error};
use chrono::{DateTime, Utc};
use common::procs::{wait_for, Proc};
use common::{fixtures, TestDb};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio_postgres::Client;

const LEASE: Duration = Duration::from_secs(10);

/// A planner's keeper as a test drives it: its config (the clock set per round) and view.
struct Keeper {
    config: KeeperConfig,
    view: ShardView,
}

impl Keeper {
    fn new(id: &str, count: Option<i32>) -> Keeper {
        Keeper {
            config: KeeperConfig {
                planner: id.into(),
                count,
                lease: LEASE,
                now: None,
            },
            view: ShardView::new(),
        }
    }

    /// One round at `now` (the database's clock).
    async fn round(
        &mut self,
        bb: &Blackboard,
        now: DateTime<Utc>,
    ) -> artex_actors::Result<KeeperReport> {
        self.config.now = Some(now);
        ShardKeeper::run_once(&bb.planner(), &self.config, &self.view).await
    }

    /// The shards its Assigner would claim now.
    fn serves(&self) -> Vec<i32> {
        self.view.scope().map(|(_, s)| s).unwrap_or_default()
    }
}

/// Every shard's owner, by shard.
async fn owners(c: &Client) -> BTreeMap<i32, Option<String>> {
    c.query(
        "select shard, owner from artex.planner_shards order by shard",
        &[],
    )
    .await
    .expect("reading the shards")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The shards `owner` owns in the table.
async fn owned_by(c: &Client, owner: &str) -> Vec<i32> {
    owners(c)
        .await
        .into_iter()
        .filter(|(_, o)| o.as_deref() == Some(owner))
        .map(|(s, _)| s)
        .collect()
}

fn secs(s: f64) -> chrono::Duration {
    chrono::Duration::milliseconds((s * 1000.0) as i64)
}

#[tokio::test]
async fn two_keepers_split_the_shards_and_a_silent_one_loses_them_and_gets_them_back() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let t0 = Utc::now();
    let mut a = Keeper::new("planner-a", Some(4));
    let mut b = Keeper::new("planner-b", None);

    // a alone takes every shard; b, arriving, finds none free yet.
    let r = a.round(&db.bb, t0).await.unwrap();
    assert_eq!((r.count, r.planners, r.target), (4, 1, 4));
    assert_eq!(r.owned, [0, 1, 2, 3]);
    assert_eq!(a.serves(), [0, 1, 2, 3]);
    let r = b.round(&db.bb, t0).await.unwrap();
    assert_eq!(
        (r.count, r.planners, r.target),
        (4, 2, 2),
        "auto takes the agreed count"
    );
    assert!(r.owned.is_empty() && b.serves().is_empty());

    // a's next round gives back what is above its share, b's takes it.
    let r = a.round(&db.bb, t0 + secs(1.0)).await.unwrap();
    assert_eq!((r.target, r.released.as_slice()), (2, &[2, 3][..]));
    assert_eq!(a.serves(), [0, 1], "handed-back shards leave the view");
    let r = b.round(&db.bb, t0 + secs(1.0)).await.unwrap();
    let taken: Vec<i32> = r.taken.iter().map(|t| t.shard).collect();
    assert_eq!(taken, [2, 3]);
    assert_eq!(b.serves(), [2, 3]);
    assert_eq!(owned_by(&c, "planner-a").await, [0, 1]);
    assert_eq!(owned_by(&c, "planner-b").await, [2, 3]);

    // b goes silent (cut off). Until its lease ends (t0 + 11 s) a takes nothing of it…
    for t in [4.0, 7.0, 10.5] {
        let r = a.round(&db.bb, t0 + secs(t)).await.unwrap();
        assert!(r.taken.is_empty(), "at +{t}s: {r:?}");
        assert_eq!(r.owned, [0, 1]);
    }
    // …then takes all of it.
    let r = a.round(&db.bb, t0 + secs(11.5)).await.unwrap();
    assert_eq!((r.planners, r.target), (1, 4));
    let taken: Vec<(i32, Option<&str>)> = r
        .taken
        .iter()
        .map(|t| (t.shard, t.from.as_deref()))
        .collect();
    assert_eq!(taken, [(2, Some("planner-b")), (3, Some("planner-b"))]);
    assert_eq!(owned_by(&c, "planner-a").await, [0, 1, 2, 3]);

    // b comes back: it learns it lost its shards, and gets its share back within two
    // rounds (a hands back, b takes).
    let r = b.round(&db.bb, t0 + secs(12.0)).await.unwrap();
    assert_eq!(r.lost, [2, 3]);
    assert!(r.owned.is_empty() && b.serves().is_empty());
    let r = a.round(&db.bb, t0 + secs(13.0)).await.unwrap();
    assert_eq!((r.planners, r.released.as_slice()), (2, &[2, 3][..]));
    let r = b.round(&db.bb, t0 + secs(13.5)).await.unwrap();
    assert_eq!(r.owned, [2, 3]);
    assert_eq!(owned_by(&c, "planner-a").await, [0, 1]);
    assert_eq!(owned_by(&c, "planner-b").await, [2, 3]);
    // Balanced: a round more changes nothing.
    let r = a.round(&db.bb, t0 + secs(14.0)).await.unwrap();
    assert!(r.taken.is_empty() && r.released.is_empty() && r.lost.is_empty());
}

#[tokio::test]
async fn a_stale_epoch_renews_and_gives_back_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let t0 = Utc::now();
    let mut a = Keeper::new("planner-a", Some(2));
    a.round(&db.bb, t0).await.unwrap();
    let held = a.view.held();
    assert_eq!(held.len(), 2);
    let (shard, epoch) = held[0];

    // a's lease lapses, b takes the shard (a new epoch), then b stops and a takes it back
    // (newer still).
    let later = t0 + secs(20.0);
    let taken = db
        .bb
        .planner()
        .take_shards("planner-b", &[shard], 10.0, Some(later))
        .await
        .unwrap();
    assert_eq!(taken[0].epoch, epoch + 1);
    assert_eq!(db.bb.planner().resign_shards("planner-b").await.unwrap(), 1);
    let again = db
        .bb
        .planner()
        .take_shards("planner-a", &[shard], 10.0, Some(later))
        .await
        .unwrap();
    assert_eq!(again[0].epoch, epoch + 2);

    // a renewal or hand-back naming the first epoch is fenced off, even by the owner.
    let renewed = db
        .bb
        .planner()
        .renew_shards("planner-a", &[(shard, epoch)], 10.0, Some(later))
        .await
        .unwrap();
    assert!(renewed.is_empty());
    let released = db
        .bb
        .planner()
        .release_shards("planner-a", &[(shard, epoch)])
        .await
        .unwrap();
    assert!(released.is_empty());
    assert_eq!(owners(&c).await[&shard].as_deref(), Some("planner-a"));
    // So is b, who held the epoch in between.
    let renewed = db
        .bb
        .planner()
        .renew_shards("planner-b", &[(shard, epoch + 1)], 10.0, Some(later))
        .await
        .unwrap();
    assert!(renewed.is_empty());
    // The current epoch renews.
    let renewed = db
        .bb
        .planner()
        .renew_shards("planner-a", &[(shard, epoch + 2)], 10.0, Some(later))
        .await
        .unwrap();
    assert_eq!(renewed, [(shard, epoch + 2)]);
}

#[tokio::test]
async fn a_planner_wishing_another_shard_count_is_refused_while_others_are_live() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let t0 = Utc::now();
    let mut a = Keeper::new("planner-a", Some(4));
    a.round(&db.bb, t0).await.unwrap();

    let mut b = Keeper::new("planner-b", Some(8));
    let refused = b.round(&db.bb, t0 + secs(1.0)).await.unwrap_err();
    assert!(matches!(refused, Error::Refused(_)), "{refused:?}");
    assert!(
        refused.to_string().contains("use 4 planner shards"),
        "{refused}"
    );
    assert_eq!(owners(&c).await.len(), 4, "nothing changed");
    assert!(b.serves().is_empty());

    // Once nobody is live with 4 (a stopped long ago), 8 replaces it, with epochs above
    // every old one.
    let old_max: i64 = c
        .query_one("select max(epoch) from artex.planner_shards", &[])
        .await
        .unwrap()
        .get(0);
    let mut b = Keeper::new("planner-b", Some(8));
    let r = b.round(&db.bb, t0 + secs(60.0)).await.unwrap();
    assert_eq!((r.count, r.owned.len()), (8, 8));
    assert_eq!(owners(&c).await.len(), 8);
    let min: i64 = c
        .query_one("select min(epoch) from artex.planner_shards", &[])
        .await
        .unwrap()
        .get(0);
    assert!(min > old_max, "{min} <= {old_max}");

    // a, which agreed on 4, finds the count changed under it and serves nothing.
    let err = a.round(&db.bb, t0 + secs(61.0)).await.unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err:?}");
    assert!(a.serves().is_empty());
}

#[tokio::test]
async fn the_assigner_claims_only_the_shards_its_keeper_owns() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let t0 = Utc::now();
    let mut a = Keeper::new("planner-a", Some(4));
    let mut b = Keeper::new("planner-b", None);
    a.round(&db.bb, t0).await.unwrap();
    b.round(&db.bb, t0).await.unwrap();
    a.round(&db.bb, t0).await.unwrap();
    b.round(&db.bb, t0).await.unwrap();
    assert_eq!((a.serves(), b.serves()), (vec![0, 1], vec![2, 3]));

    fixtures::worker(&db.bb, "w1", &["echo"], 1000).await;
    let tasks: Vec<NewTask> = (0..40)
        .map(|i| NewTask {
            shard_key: Some(format!("site-{}", i % 10)),
            ..NewTask::new("echo", json!({ "i": i }))
        })
        .collect();
    db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let config = |view: &ShardView| AssignerConfig {
        actor: "test-planner".into(),
        batch: 1000,
        lease_secs: 30.0,
        suspect_after_secs: 10.0,
        shards: view.scope().expect("the keeper owns shards"),
    };
    let count = |sql: &'static str| {
        let c = &c;
        async move { c.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let in_a = count("select count(*) from artex.tasks where shard % 4 in (0, 1)").await;
    assert!(
        in_a > 0 && in_a < 40,
        "the keys fall in both halves: {in_a}"
    );

    let report = Assigner::run_once(&db.bb.planner(), &config(&a.view))
        .await
        .unwrap();
    assert_eq!(report.assigned as i64, in_a);
    assert_eq!(
        count("select count(*) from artex.tasks where status = 'assigned' and shard % 4 not in (0, 1)").await,
        0
    );
    // Each key on one planner: no key has tasks on both sides.
    assert_eq!(
        count(
            "select count(*) from (select shard_key from artex.tasks group by shard_key \
             having count(distinct status) > 1) k"
        )
        .await,
        0
    );
    let report = Assigner::run_once(&db.bb.planner(), &config(&b.view))
        .await
        .unwrap();
    assert_eq!(report.assigned as i64, 40 - in_a);
}

/// The live owners and how many shards each holds.
async fn live_owner_counts(c: &Client) -> Vec<(String, i64)> {
    c.query(
        "select owner, shards from artex.planner_shard_owners \
         where owner is not null and first_lease_end > now()",
        &[],
    )
    .await
    .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    .unwrap_or_default()
}

#[tokio::test]
async fn planner_processes_refuse_another_count_and_give_their_shards_back_on_stop() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let args = ["--shards", "auto:4", "--shard-lease-ms", "6000"];
    let mut p1 = Proc::planner("p1", &db.url, &args);
    let _p2 = Proc::planner("p2", &db.url, &args);
    let c2 = &c;
    wait_for(
        "the two planners to own two shards each",
        Duration::from_secs(30),
        || async move {
            let owners = live_owner_counts(c2).await;
            (owners.len() == 2 && owners.iter().all(|(_, n)| *n == 2)).then_some(())
        },
    )
    .await;

    let mut other = Proc::planner("p3", &db.url, &["--shards", "auto:8"]);
    let status = other
        .wait_exit(Duration::from_secs(15))
        .expect("a planner wishing another shard count exits");
    assert_eq!(status.code(), Some(2), "{}", other.log_text());
    let log = other.log_text();
    assert!(
        log.contains("--shards auto:8") && log.contains("use 4 planner shards"),
        "{log}"
    );

    // p1 stops: its shards are given back at once and p2 takes them, a long lease early.
    p1.signal(Signal::SIGTERM);
    p1.wait_exit(Duration::from_secs(15)).expect("p1 stops");
    assert!(
        p1.log_text().contains("planner shards: given back"),
        "{}",
        p1.log_text()
    );
    wait_for(
        "the remaining planner to own every shard",
        Duration::from_secs(15),
        || async move {
            let owners = live_owner_counts(c2).await;
            (owners.len() == 1 && owners[0].1 == 4).then_some(())
        },
    )
    .await;
}

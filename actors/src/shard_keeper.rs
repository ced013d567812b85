//! The ShardKeeper (`--shards auto`): owns planner shards through leases in the
//! blackboard, so that the live planners share them and a dead planner's shards move to
//! the others once its leases lapse. Every third of a lease, `run_once` checks in (this
//! planner is live), renews the leases it holds (fenced by epoch), hands back what is
//! above its share, and takes unowned or lapsed shards up to its share.
//!
//! The rules:
//! - The shard count N is agreed through the table (see
//!   [`crate::blackboard::agree_count`]); a planner wishing another one is refused.
//! - Share: the live planners of the count, by id; each gets N / P, the first N % P one
//!   more ([`plan`], pure). All compute the same shares from the same rows, so a planner
//!   above its share gives the surplus back (its highest shards) and one below takes free
//!   ones (the lowest): a planner back from a partition gets its share within a round or
//!   two of the others.
//! - Self-fencing, as the workers do with task leases: the Assigner serves the shards of
//!   the [`ShardView`] only until the moment the last renewal was *sent* plus the lease,
//!   less a [`margin`]. The database's clock started the lease later, so a planner cut off
//!   stops claiming before anyone may take its shards: two planners never serve one
//!   shard at once (assignment is compare-and-set anyway; shards keep a business key on
//!   one planner). A hand-back leaves the view before the database, for the same reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};

use crate::blackboard::{PlannerBoard, ShardRow, TakenShard};
use crate::error::{Error, Result};
use crate::supervisor::{guarded, ActorStats};

/// How the keeper keeps shards.
#[derive(Debug, Clone)]
pub struct KeeperConfig {
    /// This planner's id: the shards' owner and its row among the planners.
    pub planner: String,
    /// `auto:N`: the shard count wished; `None` (`auto`) takes the one agreed.
    pub count: Option<i32>,
    /// How long a take or renewal holds a shard (and this planner counts as live).
    pub lease: Duration,
    /// The database's clock for tests; `None` in production.
    pub now: Option<DateTime<Utc>>,
}

/// How long before its estimated lease end a planner stops serving a shard: a fifth of
/// the lease, at most 2 s (as the workers' task leases).
pub fn margin(lease: Duration) -> Duration {
    (lease / 5).min(Duration::from_secs(2))
}

/// What one round should do, from what the check-in saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardPlan {
    /// This planner's share.
    pub target: usize,
    /// (shard, epoch) it owns and keeps: renew.
    pub keep: Vec<(i32, i64)>,
    /// (shard, epoch) it owns above its share: give back.
    pub release: Vec<(i32, i64)>,
    /// Free shards (unowned, or their lease lapsed) to take.
    pub take: Vec<i32>,
}

/// This planner's share of `shards` among the live `planners` (itself counted even when
/// missing): N / P each, one more for the first N % P by id. Every planner computes the
/// same shares, so they sum to N.
pub fn share(me: &str, planners: &[String], shards: usize) -> usize {
    let mut ids: BTreeSet<&str> = planners.iter().map(String::as_str).collect();
    ids.insert(me);
    let rank = ids.iter().position(|id| *id == me).unwrap_or(0);
    let p = ids.len();
    shards / p + usize::from(rank < shards % p)
}

/// The round's plan for `me` (see the module doc); pure, so the rules are tested
/// directly. Shards it owns whose lease lapsed unseen by others are still its own (the
/// epoch says nobody took them): it keeps them.
pub fn plan(me: &str, planners: &[String], shards: &[ShardRow]) -> ShardPlan {
    let target = share(me, planners, shards.len());
    let mut mine: Vec<(i32, i64)> = shards
        .iter()
        .filter(|s| s.owner.as_deref() == Some(me))
        .map(|s| (s.shard, s.epoch))
        .collect();
    mine.sort_unstable();
    let release = mine.split_off(target.min(mine.len()));
    let mut take: Vec<i32> = shards
        .iter()
        .filter(|s| s.owner.is_none() || !s.live)
        .filter(|s| s.owner.as_deref() != Some(me))
        .map(|s| s.shard)
        .collect();
    take.sort_unstable();
    take.truncate(target.saturating_sub(mine.len()));
    ShardPlan {
        target,
        keep: mine,
        release,
        take,
    }
}

/// The shards this planner serves now, shared between the keeper (writes) and the
/// Assigner (reads it each round). Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct ShardView {
    inner: Arc<RwLock<Owned>>,
}

#[derive(Debug, Default)]
struct Owned {
    retired: bool,
    count: Option<i32>,
    shards: BTreeMap<i32, i64>,
    serve_until: Option<Instant>,
}

impl ShardView {
    /// An empty view: no count agreed yet, serving nothing.
    pub fn new() -> Self {
        ShardView::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Owned> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Owned> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// `(count, mine)` for the Assigner's claim at `now`, or `None` when it serves
    /// nothing: no shard, or its leases may be running out (it could not renew them).
    pub fn scope_at(&self, now: Instant) -> Option<(i32, Vec<i32>)> {
        let o = self.read();
        let count = o.count?;
        if o.shards.is_empty() || o.serve_until.is_none_or(|t| now >= t) {
            return None;
        }
        Some((count, o.shards.keys().copied().collect()))
    }

    /// [`ShardView::scope_at`] now.
    pub fn scope(&self) -> Option<(i32, Vec<i32>)> {
        self.scope_at(Instant::now())
    }

    /// The agreed shard count, once agreed.
    pub fn count(&self) -> Option<i32> {
        self.read().count
    }

    /// The (shard, epoch) it holds, served or not.
    pub fn held(&self) -> Vec<(i32, i64)> {
        self.read().shards.iter().map(|(s, e)| (*s, *e)).collect()
    }

    fn agreed(&self, count: i32) {
        self.write().count = Some(count);
    }

    /// The renewal sent before `serve_until` (margin taken) kept exactly `held`.
    fn renewed(&self, held: &[(i32, i64)], serve_until: Instant) {
        let mut o = self.write();
        o.shards = held.iter().copied().collect();
        o.serve_until = Some(serve_until);
    }

    /// Stops serving `shards` (before giving them back).
    fn forget(&self, shards: &[i32]) {
        let mut o = self.write();
        for s in shards {
            o.shards.remove(s);
        }
    }

    /// Taken after this round's renewal was sent: their leases run at least as long.
    fn took(&self, taken: &[TakenShard]) {
        let mut o = self.write();
        for t in taken {
            o.shards.insert(t.shard, t.epoch);
        }
    }

    /// Serves nothing (the count changed under it).
    fn clear(&self) {
        let mut o = self.write();
        o.shards.clear();
        o.serve_until = None;
    }

    /// Serves nothing, for good: the planner is stopping.
    fn retire(&self) {
        self.clear();
        self.write().retired = true;
    }

    /// Whether the planner is stopping (the keeper runs no more rounds).
    pub fn retired(&self) -> bool {
        self.read().retired
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeeperReport {
    /// The agreed shard count.
    pub count: i32,
    /// Live planners sharing the shards (this one included).
    pub planners: usize,
    /// This planner's share.
    pub target: usize,
    /// The shards it owns after the round.
    pub owned: Vec<i32>,
    /// Shards it took.
    pub taken: Vec<TakenShard>,
    /// Shards it gave back (above its share).
    pub released: Vec<i32>,
    /// Shards it held that another planner took (it could not renew in time).
    pub lost: Vec<i32>,
}

/// The ShardKeeper actor.
pub struct ShardKeeper {
    bb: PlannerBoard,
    config: KeeperConfig,
    view: ShardView,
    stats: ActorStats,
}

impl ShardKeeper {
    /// A keeper that publishes what it owns in `view` (give the Assigner a clone).
    pub fn new(bb: PlannerBoard, config: KeeperConfig, view: ShardView, stats: ActorStats) -> Self {
        ShardKeeper {
            bb,
            config,
            view,
            stats,
        }
    }

    /// One round; see the module doc. The first agrees on the shard count (an error if
    /// this planner's wish is refused). Writes what it owns into `view` as it goes.
    pub async fn run_once(
        bb: &PlannerBoard,
        config: &KeeperConfig,
        view: &ShardView,
    ) -> Result<KeeperReport> {
        crate::supervisor::failpoint("shard_keeper");
        let me = config.planner.as_str();
        let lease_secs = config.lease.as_secs_f64();
        // Every lease this round writes starts on the database's clock after this.
        let sent = Instant::now();
        let count = match view.count() {
            Some(n) => n,
            None => {
                let n = bb.agree_shard_count(me, config.count, config.now).await?;
                tracing::info!(planner = %me, shards = n, lease = ?config.lease,
                    "planner shards: count agreed");
                view.agreed(n);
                n
            }
        };
        let board = bb.check_in(me, count, lease_secs, config.now).await?;
        if board.shards.len() != count as usize {
            view.clear();
            return Err(Error::Refused(format!(
                "the blackboard has {} planner shards now, this planner agreed on {count} \
                 when it started: it serves none; restart it",
                board.shards.len()
            )));
        }
        let plan = plan(me, &board.planners, &board.shards);
        let before: Vec<i32> = view.held().into_iter().map(|(s, _)| s).collect();
        let renewed = bb
            .renew_shards(me, &plan.keep, lease_secs, config.now)
            .await?;
        let serve_until = sent + config.lease.saturating_sub(margin(config.lease));
        // The hand-backs leave the view here, before the database lets anyone take them.
        view.renewed(&renewed, serve_until);
        let release: Vec<i32> = plan.release.iter().map(|(s, _)| *s).collect();
        view.forget(&release);
        let released = bb.release_shards(me, &plan.release).await?;
        let taken = bb
            .take_shards(me, &plan.take, lease_secs, config.now)
            .await?;
        view.took(&taken);
        let lost: Vec<i32> = before
            .into_iter()
            .filter(|s| !renewed.iter().any(|(r, _)| r == s) && !release.contains(s))
            .collect();
        let report = KeeperReport {
            count,
            planners: board.planners.len(),
            target: plan.target,
            owned: view.held().into_iter().map(|(s, _)| s).collect(),
            taken,
            released,
            lost,
        };
        log_changes(me, &report);
        Ok(report)
    }

    fn keep(&mut self, ctx: &mut Context<Self>) {
        if self.view.retired() {
            return;
        }
        let (bb, config, view) = (self.bb.clone(), self.config.clone(), self.view.clone());
        // A round stuck on a dead connection must not hold the next ones back: the view
        // expires by itself meanwhile, and a fresh round may find the database again.
        let deadline = config.lease;
        async move {
            let round = ShardKeeper::run_once(&bb, &config, &view);
            guarded("shard_keeper", tokio::time::timeout(deadline, round)).await
        }
        .into_actor(self)
        .map(move |res, act, ctx| match res {
            Ok(Ok(Ok(_))) => act.stats.ran("shard_keeper"),
            Ok(Ok(Err(e))) => {
                act.stats.failed("shard_keeper");
                match e {
                    Error::Refused(_) | Error::Invalid(_) => {
                        tracing::error!(error = %e, "planner shards: serving none")
                    }
                    _ => tracing::warn!(error = %e,
                        "planner shards: round failed; the leases held run out unless a \
                         later round renews them"),
                }
            }
            Ok(Err(_)) => {
                act.stats.failed("shard_keeper");
                tracing::warn!(after = ?deadline, "planner shards: round timed out");
            }
            Err(_) => ctx.stop(),
        })
        .wait(ctx);
    }
}

fn log_changes(me: &str, r: &KeeperReport) {
    if !r.taken.is_empty() {
        let shards: Vec<i32> = r.taken.iter().map(|t| t.shard).collect();
        let from: BTreeSet<&str> = r.taken.iter().filter_map(|t| t.from.as_deref()).collect();
        tracing::info!(planner = %me, shards = ?shards, lapsed_from = ?from, owned = ?r.owned,
            planners = r.planners, "planner shards: took");
    }
    if !r.released.is_empty() {
        tracing::info!(planner = %me, shards = ?r.released, owned = ?r.owned,
            planners = r.planners, share = r.target, "planner shards: handed back above share");
    }
    if !r.lost.is_empty() {
        tracing::warn!(planner = %me, shards = ?r.lost, owned = ?r.owned,
            "planner shards: lost (not renewed in time; another planner took them)");
    }
}

impl Actor for ShardKeeper {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.keep(ctx);
        ctx.run_interval(self.config.lease / 3, |act, ctx| act.keep(ctx));
    }
}

impl Supervised for ShardKeeper {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("shard_keeper");
    }
}

/// The planner is stopping: serve nothing and give every shard back at once (rather
/// than let the leases lapse); no round runs afterwards. Handled between rounds, so a
/// take in flight cannot follow it. Answers with how many shards were given back.
#[derive(Message)]
#[rtype(result = "Result<u64>")]
pub struct Resign;

impl Handler<Resign> for ShardKeeper {
    type Result = ResponseFuture<Result<u64>>;

    fn handle(&mut self, _msg: Resign, _ctx: &mut Context<Self>) -> Self::Result {
        self.view.retire();
        let (bb, me) = (self.bb.clone(), self.config.planner.clone());
        Box::pin(async move { bb.resign_shards(&me).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(shard: i32, owner: Option<&str>, live: bool) -> ShardRow {
        ShardRow {
            shard,
            owner: owner.map(String::from),
            live,
            epoch: 1,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn shares_sum_to_the_count_and_differ_by_one_at_most() {
        let planners = ids(&["a", "b", "c"]);
        let shares: Vec<usize> = ["a", "b", "c"]
            .iter()
            .map(|p| share(p, &planners, 16))
            .collect();
        assert_eq!(shares, [6, 5, 5]);
        // A planner not yet seen counts itself.
        assert_eq!(share("d", &planners, 16), 4);
        assert_eq!(share("a", &[], 16), 16);
        // More planners than shards: some get none.
        assert_eq!(share("c", &planners, 2), 0);
    }

    #[test]
    fn a_planner_takes_free_and_lapsed_shards_up_to_its_share() {
        let shards = vec![
            row(0, Some("a"), true),
            row(1, None, false),
            row(2, Some("b"), false),
            row(3, Some("b"), true),
        ];
        let p = plan("a", &ids(&["a"]), &shards);
        assert_eq!(p.target, 4);
        assert_eq!(p.keep, [(0, 1)]);
        assert_eq!(p.take, [1, 2], "not 3: b's lease still runs");
        let p = plan("a", &ids(&["a", "b"]), &shards);
        assert_eq!((p.target, p.take.as_slice()), (2, &[1][..]));
    }

    #[test]
    fn a_planner_above_its_share_gives_back_its_highest_shards() {
        let shards: Vec<ShardRow> = (0..4).map(|s| row(s, Some("a"), true)).collect();
        let p = plan("a", &ids(&["a", "b"]), &shards);
        assert_eq!(p.keep, [(0, 1), (1, 1)]);
        assert_eq!(p.release, [(2, 1), (3, 1)]);
        assert!(p.take.is_empty());
    }

    #[test]
    fn a_lapsed_shard_nobody_took_is_kept_by_its_owner() {
        let shards = vec![row(0, Some("a"), false), row(1, Some("b"), true)];
        let p = plan("a", &ids(&["a", "b"]), &shards);
        assert_eq!(p.keep, [(0, 1)]);
        assert!(p.take.is_empty());
    }

    #[test]
    fn the_view_serves_only_until_a_margin_before_the_lease_could_end() {
        let view = ShardView::new();
        let t0 = Instant::now();
        assert_eq!(view.scope_at(t0), None, "no count agreed yet");
        view.agreed(4);
        assert_eq!(view.scope_at(t0), None, "no shard owned");
        let lease = Duration::from_secs(10);
        let until = t0 + lease - margin(lease);
        view.renewed(&[(1, 7), (3, 2)], until);
        assert_eq!(view.scope_at(t0), Some((4, vec![1, 3])));
        assert_eq!(
            view.scope_at(until - Duration::from_millis(1)),
            Some((4, vec![1, 3]))
        );
        assert_eq!(view.scope_at(until), None, "self-fenced");
        view.forget(&[1]);
        assert_eq!(view.scope_at(t0), Some((4, vec![3])));
        view.clear();
        assert_eq!(view.scope_at(t0), None);
    }
}

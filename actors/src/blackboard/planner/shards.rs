//! The SQL of planner shards with owners (`--shards auto`, migrations/V6__planner_shards.sql):
//! agreeing on the shard count, a planner's check-in (its liveness, and what it sees of
//! the shards), and the fenced renewals, hand-backs and takes of shard leases. The rules
//! (who should own how many) are in `crate::shard_keeper`; here only what is stored.
//!
//! Time-dependent statements take `$now` (`coalesce($now, now())`) so tests control the
//! clock. Writes go through the durable pool: they are rare (a few per lease), and a take
//! lost in a server crash would let two planners believe they own one shard.

use chrono::{DateTime, Utc};

use super::PlannerBoard;
use crate::blackboard::Tx;
use crate::error::{Error, Result};

/// The shard count of `--shards auto` when the blackboard has none yet: enough for 16
/// planners; it divides the tasks' 1024 shards evenly.
pub const DEFAULT_SHARD_COUNT: i32 = 16;

/// One planner shard as a check-in saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRow {
    /// Its number, `0..N`.
    pub shard: i32,
    /// The planner that owns it, if any (its lease may have lapsed: see `live`).
    pub owner: Option<String>,
    /// Whether the owner's lease still runs.
    pub live: bool,
    /// The fencing epoch: bumped by every take.
    pub epoch: i64,
}

/// What a planner sees when it checks in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardBoard {
    /// The live planners of the same shard count, by id (this one included).
    pub planners: Vec<String>,
    /// Every planner shard, by number.
    pub shards: Vec<ShardRow>,
}

/// A shard taken by this planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenShard {
    /// Its number.
    pub shard: i32,
    /// The new epoch (the fencing token of this ownership).
    pub epoch: i64,
    /// Who owned it before, if anyone (a lapsed lease).
    pub from: Option<String>,
}

/// How the blackboard's shard count and a planner's wish compare; pure, so the rule is
/// tested directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CountAgreement {
    /// The table has this count, and the planner takes it.
    Use(i32),
    /// The table is empty: create this many shards.
    Create(i32),
    /// Nobody is live with the old count: replace the table with this many shards.
    Recount(i32),
}

/// The rule of the shard count: an empty table gets the wished count (else
/// [`DEFAULT_SHARD_COUNT`]); `auto` takes the count there is; `auto:N` must match it,
/// unless nobody is live with another count (no live lease, no live planner of another
/// count): then the table is rebuilt with N. Otherwise the planner is refused, saying so.
pub fn agree_count(
    wanted: Option<i32>,
    existing: i32,
    others_live: bool,
) -> Result<CountAgreement> {
    if let Some(n) = wanted {
        if !(1..=1024).contains(&n) {
            return Err(Error::Invalid(format!(
                "planner shard count {n}: expected 1 to 1024"
            )));
        }
    }
    Ok(match (wanted, existing) {
        (w, 0) => CountAgreement::Create(w.unwrap_or(DEFAULT_SHARD_COUNT)),
        (None, e) => CountAgreement::Use(e),
        (Some(w), e) if w == e => CountAgreement::Use(e),
        (Some(w), _) if !others_live => CountAgreement::Recount(w),
        (Some(w), e) => {
            return Err(Error::Refused(format!(
                "--shards auto:{w}: the live planners use {e} planner shards \
                 (artex.planner_shards); start this one with --shards auto or auto:{e}, or \
                 stop every --shards auto planner first to change the count"
            )))
        }
    })
}

// Shard-count agreement serializes with itself (SHARE ROW EXCLUSIVE conflicts with
// itself), so two planners starting at once with different counts cannot both win; it
// also waits for running renewals and takes, which is brief and happens once per start.
const LOCK_SHARDS: &str = "lock table artex.planner_shards in share row exclusive mode";

// What agreement needs to know: the count there is, the greatest epoch (a rebuilt
// table continues above it, so no stale epoch can match again), and whether anyone is
// live with it — a lease still running, or a live planner registered with another count.
const SHARD_COUNT: &str = "select
        (select count(*)::int4 from artex.planner_shards),
        (select coalesce(max(epoch), 0) from artex.planner_shards),
        exists (select 1 from artex.planner_shards
                where lease_until > coalesce($1::timestamptz, now()))
        or exists (select 1 from artex.planners
                   where live_until > coalesce($1::timestamptz, now())
                     and shard_count <> $2::int4 and id <> $3::text)";

const CLEAR_SHARDS: &str = "delete from artex.planner_shards";

const CREATE_SHARDS: &str = "insert into artex.planner_shards (shard, epoch)
    select s, $2::int8 from generate_series(0, $1::int4 - 1) s";

// A check-in: this planner is live for one more lease (with the count it uses, so that
// planners of another count are not counted in its share), and rows of planners gone
// for an hour are pruned on the way.
const CHECK_IN: &str = "with pruned as (
        delete from artex.planners
        where live_until < coalesce($4::timestamptz, now()) - interval '1 hour' and id <> $1
    )
    insert into artex.planners (id, shard_count, last_seen, live_until)
    values ($1, $2::int4, coalesce($4::timestamptz, now()),
            coalesce($4::timestamptz, now()) + make_interval(secs => $3::float8))
    on conflict (id) do update
    set shard_count = excluded.shard_count, last_seen = excluded.last_seen,
        live_until = excluded.live_until";

// The live planners that share the shards: those of the same count.
const LIVE_PLANNERS: &str = "select id from artex.planners
    where live_until > coalesce($2::timestamptz, now()) and shard_count = $1::int4
    order by id";

const SHARDS: &str = "select shard, owner,
        coalesce(lease_until > coalesce($1::timestamptz, now()), false), epoch
    from artex.planner_shards
    order by shard";

// Renewals are fenced by owner and epoch: a planner whose shard was taken (its lease
// lapsed while it was cut off) renews nothing, and learns so from what is returned. A
// lapsed lease nobody took is still its own (the epoch says nobody served it since).
const RENEW: &str = "update artex.planner_shards s
    set lease_until = coalesce($4::timestamptz, now()) + make_interval(secs => $5::float8)
    from unnest($2::int4[], $3::int8[]) as h(shard, epoch)
    where s.shard = h.shard and s.owner = $1 and s.epoch = h.epoch
    returning s.shard, s.epoch";

// A hand-back (a planner above its share, one stopping): fenced like a renewal; the
// next taker bumps the epoch.
const RELEASE: &str = "update artex.planner_shards s
    set owner = null, lease_until = null
    from unnest($2::int4[], $3::int8[]) as h(shard, epoch)
    where s.shard = h.shard and s.owner = $1 and s.epoch = h.epoch
    returning s.shard";

// A take: only shards nobody owns or whose lease lapsed, locked without waiting (a
// planner taking the same shard right now keeps it), with a new epoch.
const TAKE: &str = "with free as materialized (
        select shard, owner from artex.planner_shards
        where shard = any($2::int4[])
          and (owner is null or lease_until <= coalesce($3::timestamptz, now()))
        order by shard
        for update skip locked
    )
    update artex.planner_shards s
    set owner = $1, epoch = s.epoch + 1,
        lease_until = coalesce($3::timestamptz, now()) + make_interval(secs => $4::float8)
    from free
    where s.shard = free.shard
    returning s.shard, s.epoch, free.owner";

// A planner stopping gives every shard back at once, and leaves the planners' count.
const RESIGN: &str = "with gone as (delete from artex.planners where id = $1)
    update artex.planner_shards set owner = null, lease_until = null where owner = $1";

impl PlannerBoard {
    /// Agrees on the planner shard count for planner `me` wishing `wanted` (`None`: the
    /// one there is); see [`agree_count`]. Creates or rebuilds the shards when the rule
    /// says so. Returns the count.
    pub async fn agree_shard_count(
        &self,
        me: &str,
        wanted: Option<i32>,
        now: Option<DateTime<Utc>>,
    ) -> Result<i32> {
        let client = Tx::new(self.bb.client().await?);
        client.begin().await?;
        client.batch(LOCK_SHARDS).await?;
        let row = client
            .query_one(SHARD_COUNT, &[&now, &wanted.unwrap_or(0), &me])
            .await?;
        let (existing, max_epoch, others_live): (i32, i64, bool) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let agreed = agree_count(wanted, existing, others_live);
        let count = match agreed {
            Err(e) => {
                client.rollback().await;
                return Err(e);
            }
            Ok(CountAgreement::Use(n)) => n,
            Ok(CountAgreement::Create(n)) => {
                client.execute(CREATE_SHARDS, &[&n, &max_epoch]).await?;
                n
            }
            Ok(CountAgreement::Recount(n)) => {
                tracing::warn!(
                    from = existing,
                    to = n,
                    "planner shards: nobody live uses the old count; rebuilding the shards"
                );
                client.batch(CLEAR_SHARDS).await?;
                client
                    .execute(CREATE_SHARDS, &[&n, &(max_epoch + 1)])
                    .await?;
                n
            }
        };
        client.commit().await?;
        Ok(count)
    }

    /// Planner `me`, using `count` shards, is live for `lease_secs` more; answers with
    /// the live planners of that count and every shard's owner.
    pub async fn check_in(
        &self,
        me: &str,
        count: i32,
        lease_secs: f64,
        now: Option<DateTime<Utc>>,
    ) -> Result<ShardBoard> {
        let client = self.bb.client().await?;
        client
            .execute(CHECK_IN, &[&me, &count, &lease_secs, &now])
            .await?;
        let mut board = ShardBoard::default();
        for row in client.query(LIVE_PLANNERS, &[&count, &now]).await? {
            board.planners.push(row.try_get(0)?);
        }
        for row in client.query(SHARDS, &[&now]).await? {
            board.shards.push(ShardRow {
                shard: row.try_get(0)?,
                owner: row.try_get(1)?,
                live: row.try_get(2)?,
                epoch: row.try_get(3)?,
            });
        }
        Ok(board)
    }

    /// Renews `me`'s leases on `held` (shard, epoch) for `lease_secs`; answers with
    /// those still its own.
    pub async fn renew_shards(
        &self,
        me: &str,
        held: &[(i32, i64)],
        lease_secs: f64,
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<(i32, i64)>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (shards, epochs): (Vec<i32>, Vec<i64>) = held.iter().copied().unzip();
        let client = self.bb.client().await?;
        let rows = client
            .query(RENEW, &[&me, &shards, &epochs, &now, &lease_secs])
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Gives back `held` (shard, epoch) of `me`; answers with the shards given back.
    pub async fn release_shards(&self, me: &str, held: &[(i32, i64)]) -> Result<Vec<i32>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (shards, epochs): (Vec<i32>, Vec<i64>) = held.iter().copied().unzip();
        let client = self.bb.client().await?;
        let rows = client.query(RELEASE, &[&me, &shards, &epochs]).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Takes those of `shards` that nobody owns or whose lease lapsed, for `lease_secs`.
    pub async fn take_shards(
        &self,
        me: &str,
        shards: &[i32],
        lease_secs: f64,
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<TakenShard>> {
        if shards.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.bb.client().await?;
        let rows = client
            .query(TAKE, &[&me, &shards, &now, &lease_secs])
            .await?;
        let mut taken: Vec<TakenShard> = rows
            .iter()
            .map(|r| {
                Ok(TakenShard {
                    shard: r.try_get(0)?,
                    epoch: r.try_get(1)?,
                    from: r.try_get(2)?,
                })
            })
            .collect::<Result<_>>()?;
        taken.sort_by_key(|t| t.shard);
        Ok(taken)
    }

    /// Planner `me` stops: gives back every shard it owns and leaves the live planners.
    /// Answers with how many shards it gave back.
    pub async fn resign_shards(&self, me: &str) -> Result<u64> {
        let client = self.bb.client().await?;
        client.execute(RESIGN, &[&me]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_table_gets_the_wished_count_or_the_default() {
        assert_eq!(
            agree_count(Some(8), 0, true).unwrap(),
            CountAgreement::Create(8)
        );
        assert_eq!(
            agree_count(None, 0, false).unwrap(),
            CountAgreement::Create(DEFAULT_SHARD_COUNT)
        );
    }

    #[test]
    fn auto_takes_the_count_there_is_and_auto_n_must_match_it() {
        assert_eq!(agree_count(None, 4, true).unwrap(), CountAgreement::Use(4));
        assert_eq!(
            agree_count(Some(4), 4, true).unwrap(),
            CountAgreement::Use(4)
        );
        let refused = agree_count(Some(8), 4, true).unwrap_err();
        assert!(matches!(refused, Error::Refused(_)), "{refused:?}");
        let msg = refused.to_string();
        assert!(msg.contains("auto:8") && msg.contains("use 4"), "{msg}");
    }

    #[test]
    fn the_count_changes_only_when_nobody_is_live_with_the_old_one() {
        assert_eq!(
            agree_count(Some(8), 4, false).unwrap(),
            CountAgreement::Recount(8)
        );
        assert!(agree_count(Some(0), 0, false).is_err());
        assert!(agree_count(Some(1025), 4, false).is_err());
    }
}

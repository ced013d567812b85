//! Fleet-wide limits per task kind (`artex kind limit`, `/api/v1/kinds/{kind}/limits`):
//! at most N held at once, at most N of one `limit_key`, at most R started per second;
//! and fairness: tasks handed out round-robin across their `limit_key`s
//! (migrations/V43__fair_dispatch.sql).
//! Enforced by the planner round's write under the kind's row lock
//! (migrations/V18__tags_and_limits.sql); set and read here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::OperatorBoard;
use crate::error::{Error, Result};
use crate::submission::check_kind;

/// The limits to set on a kind; at least one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitSpec {
    /// At most this many of the kind's tasks held (assigned or running) at once.
    pub concurrency: Option<i32>,
    /// At most this many of the kind's tasks with one `limit_key` held at once.
    pub key_concurrency: Option<i32>,
    /// At most this many of the kind's tasks started per second (a bucket holding one
    /// second's worth, at least one).
    pub rate_per_sec: Option<f64>,
    /// Hand the kind's tasks out round-robin across their `limit_key`s, so that a key
    /// with many waiting tasks does not hold back one with few.
    pub fair: bool,
}

/// The most a rate may be, per second (the column's check).
pub const MAX_RATE_PER_SEC: f64 = 1_000_000.0;

impl LimitSpec {
    /// Why the limits cannot be set, naming the field (`concurrency`, `key_concurrency`,
    /// `rate`), if they cannot.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.concurrency.is_none()
            && self.key_concurrency.is_none()
            && self.rate_per_sec.is_none()
            && !self.fair
        {
            return Err((
                "concurrency",
                "no limit given; set concurrency, key_concurrency, rate or fair (or clear them)"
                    .into(),
            ));
        }
        for (field, n) in [
            ("concurrency", self.concurrency),
            ("key_concurrency", self.key_concurrency),
        ] {
            if let Some(n) = n.filter(|&n| n < 1) {
                return Err((field, format!("{n}; expected a positive number of tasks")));
            }
        }
        if let Some(r) = self
            .rate_per_sec
            .filter(|r| !(r.is_finite() && *r > 0.0 && *r <= MAX_RATE_PER_SEC))
        {
            return Err((
                "rate",
                format!("{r} per second; expected more than 0 and at most {MAX_RATE_PER_SEC}"),
            ));
        }
        Ok(())
    }
}

/// A kind's limits as they stand, with what they count now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindLimit {
    /// The kind.
    pub kind: String,
    /// At most this many held at once, fleet-wide.
    pub concurrency: Option<i32>,
    /// At most this many of one `limit_key` held at once.
    pub key_concurrency: Option<i32>,
    /// At most this many started per second.
    pub rate_per_sec: Option<f64>,
    /// Handed out round-robin across their `limit_key`s.
    pub fair: bool,
    /// The kind's tasks held now (assigned or running) that count against the limits.
    pub held: i64,
    /// When the limits were last set.
    pub updated_at: DateTime<Utc>,
    /// Who set them.
    pub updated_by: String,
}

/// A rate as given: `N/s`, `N/m` or `N/h` (N may have a fraction), per second.
pub fn parse_rate(s: &str) -> std::result::Result<f64, String> {
    let bad = || {
        format!("{s:?}; expected a number of tasks per second, minute or hour, e.g. 100/s, 30/m, 1000/h")
    };
    let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
    let n: f64 = n.trim().parse().map_err(|_| bad())?;
    let per = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        _ => return Err(bad()),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(bad());
    }
    Ok(n / per)
}

/// A rate per second as `parse_rate` reads it back.
pub fn rate_text(per_sec: f64) -> String {
    if per_sec >= 1.0 {
        format!("{}/s", trim(per_sec))
    } else if per_sec * 60.0 >= 1.0 {
        format!("{}/m", trim(per_sec * 60.0))
    } else {
        format!("{}/h", trim(per_sec * 3600.0))
    }
}

fn trim(x: f64) -> String {
    let s = format!("{:.3}", x);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

// Every kind's limits, and how many of its tasks are held and counted (through the
// partial index `tasks_held_limited`: only held tasks of limited kinds are in it).
const KIND_LIMITS: &str = "select l.kind, l.concurrency, l.key_concurrency, l.rate_per_sec,
        (select count(*) from artex.tasks t
         where t.kind = l.kind and t.assigned_to is not null and t.limited),
        l.updated_at, l.updated_by, l.fair
    from artex.kind_limits l
    where $1::text is null or l.kind = $1
    order by l.kind";

// One statement: the limits, and the kind's tasks already held marked so that they
// count from now on (the assignment marks the ones it gives out; held tasks are at most
// the fleet's capacity). A fresh bucket is full (one second's worth, at least one token).
const SET_KIND_LIMIT: &str = "with set as (
        insert into artex.kind_limits as l
            (kind, concurrency, key_concurrency, rate_per_sec, tokens, refilled_at, updated_by,
             fair)
        values ($1, $2, $3, $4, greatest(coalesce($4, 0), 1), now(), $5, $6)
        on conflict (kind) do update set
            concurrency = excluded.concurrency, key_concurrency = excluded.key_concurrency,
            rate_per_sec = excluded.rate_per_sec, fair = excluded.fair,
            tokens = case when l.rate_per_sec is null then excluded.tokens
                          else least(l.tokens, excluded.tokens) end,
            updated_at = now(), updated_by = excluded.updated_by
        returning 1
    )
    update artex.tasks t set limited = true
    from artex.set_context($5, 'limits set') ctx
    where ctx and t.kind = $1 and t.assigned_to is not null and not t.limited";

const CLEAR_KIND_LIMIT: &str = "delete from artex.kind_limits where kind = $1";

// The kind's waiting tasks (not yet held, not ended) marked as limited (`$2` true) when
// its limits are set, or unmarked when they are cleared, so that they wait where the
// limits are checked (or where the claim finds them again). In batches of 5,000 by id
// after `$3`, each its own short transaction; returns the batch's last id.
const MARK_WAITING: &str = "with batch as (
        select id from artex.tasks
        where kind = $1 and ($3::uuid is null or id > $3) and limited <> $2
          and finished_at is null and assigned_to is null
        order by id limit 5000
    ),
    marked as (
        update artex.tasks t set limited = $2
        from artex.set_context($4, 'limits changed') ctx, batch
        where ctx and t.id = batch.id and t.limited <> $2 and t.assigned_to is null
        returning 1
    )
    select max(id::text)::uuid, (select count(*) from marked) from batch";

impl OperatorBoard {
    /// Every kind's limits (or `kind`'s), in kind order.
    pub async fn kind_limits(&self, kind: Option<&str>) -> Result<Vec<KindLimit>> {
        let client = self.bb.client().await?;
        let rows = client.query(KIND_LIMITS, &[&kind]).await?;
        rows.iter()
            .map(|r| {
                Ok(KindLimit {
                    kind: r.try_get(0)?,
                    concurrency: r.try_get(1)?,
                    key_concurrency: r.try_get(2)?,
                    rate_per_sec: r.try_get(3)?,
                    held: r.try_get(4)?,
                    updated_at: r.try_get(5)?,
                    updated_by: r.try_get(6)?,
                    fair: r.try_get(7)?,
                })
            })
            .collect()
    }

    /// Sets `kind`'s limits (replacing any it had), as `actor`. They hold for every
    /// assignment from the commit on; a planner round in flight at that instant may
    /// still give out what the old limits allowed.
    pub async fn set_kind_limit(
        &self,
        kind: &str,
        spec: &LimitSpec,
        actor: &str,
    ) -> Result<KindLimit> {
        check_kind(kind).map_err(|e| Error::Invalid(format!("kind: {e}")))?;
        spec.check()
            .map_err(|(field, e)| Error::Invalid(format!("{field}: {e}")))?;
        let client = self.bb.client().await?;
        client
            .execute(
                SET_KIND_LIMIT,
                &[
                    &kind,
                    &spec.concurrency,
                    &spec.key_concurrency,
                    &spec.rate_per_sec,
                    &actor,
                    &spec.fair,
                ],
            )
            .await?;
        drop(client);
        self.mark_waiting(kind, true, actor).await?;
        let mut set = self.kind_limits(Some(kind)).await?;
        set.pop().ok_or_else(|| {
            Error::Invalid(format!(
                "the limits of kind {kind:?} were removed meanwhile"
            ))
        })
    }

    /// Removes `kind`'s limits, as `actor`; false if it had none.
    pub async fn clear_kind_limit(&self, kind: &str, actor: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        let cleared = client.execute(CLEAR_KIND_LIMIT, &[&kind]).await? > 0;
        drop(client);
        self.mark_waiting(kind, false, actor).await?;
        Ok(cleared)
    }

    /// Marks (or unmarks) `kind`'s waiting tasks as limited, in batches; how many.
    async fn mark_waiting(&self, kind: &str, limited: bool, actor: &str) -> Result<u64> {
        let client = self.bb.client().await?;
        let mut after: Option<Uuid> = None;
        let mut marked = 0u64;
        loop {
            let row = client
                .query_one(MARK_WAITING, &[&kind, &limited, &after, &actor])
                .await?;
            let (last, n): (Option<Uuid>, i64) = (row.try_get(0)?, row.try_get(1)?);
            marked += n as u64;
            match last {
                Some(last) => after = Some(last),
                None => return Ok(marked),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_per_second_minute_and_hour() {
        assert_eq!(parse_rate("100/s"), Ok(100.0));
        assert_eq!(parse_rate("30/m"), Ok(0.5));
        assert_eq!(parse_rate("3600/h"), Ok(1.0));
        assert_eq!(parse_rate(" 2.5 / s "), Ok(2.5));
        for bad in ["", "100", "100/d", "-1/s", "0/s", "x/s", "inf/s", "NaN/s"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} accepted");
        }
        for r in [100.0, 0.5, 1.0 / 3600.0] {
            assert_eq!(
                parse_rate(&rate_text(r)).map(|x| (x * 1e6).round()),
                Ok((r * 1e6).round())
            );
        }
    }

    #[test]
    fn a_limit_names_what_is_wrong() {
        assert_eq!(LimitSpec::default().check().unwrap_err().0, "concurrency");
        let spec = |c, k, r| LimitSpec {
            fair: false,
            concurrency: c,
            key_concurrency: k,
            rate_per_sec: r,
        };
        assert_eq!(
            spec(Some(0), None, None).check().unwrap_err().0,
            "concurrency"
        );
        assert_eq!(
            spec(None, Some(-1), None).check().unwrap_err().0,
            "key_concurrency"
        );
        assert_eq!(spec(None, None, Some(0.0)).check().unwrap_err().0, "rate");
        assert_eq!(
            spec(None, None, Some(f64::NAN)).check().unwrap_err().0,
            "rate"
        );
        assert!(spec(Some(5), Some(2), Some(100.0)).check().is_ok());
    }
}

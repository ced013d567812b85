//! A worker's hold on its tasks: lease renewals, of the tasks it holds and of those
//! assigned to it that it has not read, and checkpoints, which are progress and so
//! record a start not written yet. Every write names the lease epoch the worker holds: a
//! worker that lost its lease changes nothing.

use uuid::Uuid;

use super::WorkerBoard;
use crate::error::Result;

/// What a renewal did with a lease the worker still holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Renewal {
    /// Extended to the renewal's length from the statement's `now()`.
    Renewed,
    /// Not written: more than three quarters of the renewal's length was left, and not
    /// more than all of it.
    Kept {
        /// What was left, seconds from the statement's `now()`.
        left_secs: f64,
    },
    /// Not written: a write of the worker's own held its row (not waited for).
    Locked,
}

impl Renewal {
    /// What is left of the lease after a renewal of length `lease`, from the statement's
    /// `now()`; `None` when the row was locked (nothing learnt).
    pub fn left(&self, lease: std::time::Duration) -> Option<std::time::Duration> {
        match self {
            Renewal::Renewed => Some(lease),
            Renewal::Kept { left_secs } => {
                Some(std::time::Duration::try_from_secs_f64(*left_secs).unwrap_or_default())
            }
            Renewal::Locked => None,
        }
    }
}

// Renewals skip the rows locked by the worker's own batch of outcomes in flight (which
// locks them in another order: waiting here deadlocked the two), and the row a handler's
// checkpoint holds for a moment. Such a row is still the worker's (reported locked: held,
// not renewed); the worker renews it again a tick later. The others are renewed under
// their lock, their holder and epoch checked on the latest version.
//
// A lease with more than three quarters of the renewal's length left, and not more than
// all of it, is not written (`Renewal::Kept`, with what it has left): a task assigned
// since the last tick (every third of the lease) has nearly all of its lease, and
// rewriting its row was a row version and a row lock per held task per tick for nothing,
// the lock in the way of the batch of outcomes that ends it (W1's renewals took 0.5 s a
// worker). Such a lease has at least five twelfths of it left at the next tick; the
// self-fence's margin is a fifth. A lease longer than the renewal's (the planner's
// assignment lease is longer than the worker's) is cut to it, as every renewal did
// before: a worker's lease is what it says.
//
// The tasks assigned to the worker that it has not read yet (its memory budget, or its
// queue, holds them back: eight 50 MB payloads are read one at a time) are renewed too,
// through the holder's index, by the same rule: the worker that holds them is alive, and
// a lease that ran out while a task waited its turn sent it back to the queue with a
// retry counted, until its retries ran out without it ever starting. Their epochs are
// checked when the worker reads them.
const RENEW: &str = "with asked as materialized (
        select t.id, t.lease_until not between now() + make_interval(secs => $2::float8 * 0.75)
                                         and now() + make_interval(secs => $2::float8) as due,
               extract(epoch from t.lease_until - now())::float8 as left_s
        from artex.tasks t join unnest($3::uuid[], $4::int8[]) as v(id, epoch) on t.id = v.id
        where t.lease_epoch = v.epoch and t.assigned_to = $1
          and t.status::text in ('assigned', 'running')
    ),
    lockable as materialized (
        select id from artex.tasks
        where id = any(array(select id from asked where due))
        for update skip locked
    ),
    renewed as (
        update artex.tasks t
        set lease_until = now() + make_interval(secs => $2::float8)
        from lockable l, unnest($3::uuid[], $4::int8[]) as v(id, epoch)
        where t.id = l.id and t.id = v.id and t.lease_epoch = v.epoch and t.assigned_to = $1
          and t.status::text in ('assigned', 'running')
        returning t.id
    ),
    unread as materialized (
        select id from artex.tasks
        where assigned_to = $1 and status::text = 'assigned' and id <> all($3::uuid[])
          and lease_until not between now() + make_interval(secs => $2::float8 * 0.75)
                                  and now() + make_interval(secs => $2::float8)
        for update skip locked
    ),
    waiting as (
        update artex.tasks t
        set lease_until = now() + make_interval(secs => $2::float8)
        from unread u
        where t.id = u.id and t.assigned_to = $1 and t.status::text = 'assigned'
    )
    select id, 'renewed', $2::float8 from renewed
    union all
    select id, 'kept', left_s from asked where not due
    union all
    select id, 'locked', null from asked
    where due and id not in (select id from lockable)";

// A checkpoint is progress, so the task has started: it records the start if that was
// not written yet.
const CHECKPOINT: &str = "update artex.tasks t set checkpoint = $3, status = 'running'
    from (select artex.set_context(assigned_to, 'started') from artex.tasks where id = $1) ctx(ok)
    where ctx.ok and t.id = $1 and t.lease_epoch = $2 and t.status in ('assigned', 'running')
    returning t.id";

impl WorkerBoard {
    /// Extends the leases of the tasks the worker holds, and of those assigned to it that
    /// it has not read (without waiting for the WAL flush; with nothing `held`, only
    /// those), where they are due (see [`Renewal`]). Returns the ids still held, each
    /// with what became of its lease. A missing id was taken away.
    pub async fn renew_leases(
        &self,
        worker: &str,
        held: &[(Uuid, i64)],
        lease_secs: f64,
    ) -> Result<Vec<(Uuid, Renewal)>> {
        let ids: Vec<Uuid> = held.iter().map(|h| h.0).collect();
        let epochs: Vec<i64> = held.iter().map(|h| h.1).collect();
        let client = self.bb.relaxed_client().await?;
        let rows = client
            .relaxed(RENEW, &[&worker, &lease_secs, &ids, &epochs])
            .await?;
        rows.iter()
            .map(|r| {
                let what: &str = r.try_get(1)?;
                let renewal = match what {
                    "renewed" => Renewal::Renewed,
                    "kept" => Renewal::Kept {
                        left_secs: r.try_get(2)?,
                    },
                    _ => Renewal::Locked,
                };
                Ok((r.try_get(0)?, renewal))
            })
            .collect()
    }

    /// Saves a running task's progress, durably. False if the lease was lost.
    pub async fn save_checkpoint(
        &self,
        id: Uuid,
        epoch: i64,
        checkpoint: &serde_json::Value,
    ) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(client
            .query_opt(CHECKPOINT, &[&id, &epoch, checkpoint])
            .await?
            .is_some())
    }
}

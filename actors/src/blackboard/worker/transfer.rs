//! The blackboard's side of a hot upgrade's **task transfer**: the new process takes over
//! the tasks the old one held (fenced by the epoch each was held at, bumping it so the old
//! one can write nothing more), and the tasks assigned to the old one and not started
//! move over. The history's reasons keep their words ("handed over by/to …"): readers of
//! the history and the feed match on them.

use super::attempts::{decode_assigned, AssignedTask};
use super::WorkerBoard;
use crate::error::Result;
use uuid::Uuid;

// Task transfer: moves held tasks from one worker to another, fenced by the epoch each was
// held at, and bumps the epoch so the previous holder can write nothing more. Zero rows
// for a task means a conflict (the reaper took it, or it was canceled): it stays where
// the blackboard says it is.
// - The new holder's row is locked first, if it has one (the counters' trigger locks it
//   anyway, after the rows are written), and the lease is counted from the clock once it
//   is had: a take-over that waited for that lock (a planner's round holds it) no longer
//   starts with a lease already spent by the wait.
// - Again is fine: a task already taken at the next epoch by the same worker is returned
//   as taken (its lease extended, no history written), so a take-over whose answer was
//   lost with its connection can be sent again.
const TAKE_OVER: &str = "with target as materialized (
        select count(*) from (select from artex.workers w where w.id = $2 for update) locked
    )
    update artex.tasks t
    set assigned_to = $2, lease_epoch = v.epoch + 1,
        lease_until = clock_timestamp() + make_interval(secs => $3::float8)
    from target, artex.set_context($2, 'handed over by ' || $1) ctx,
         unnest($4::uuid[], $5::int8[]) as v(id, epoch)
    where ctx and t.id = v.id
      and ((t.assigned_to = $1 and t.lease_epoch = v.epoch)
           or (t.assigned_to = $2 and t.lease_epoch = v.epoch + 1))
      and t.status::text in ('assigned', 'running')
    returning t.id, t.kind, t.payload, t.lease_epoch, t.retries, t.max_retries, t.timeout_ms,
              t.checkpoint, t.flow_id,
              coalesce(t.payload_bytes, octet_length(t.payload::text))::bigint,
              (extract(epoch from t.lease_until - clock_timestamp()) * 1000)::float8,
              t.priority, t.limit_key, t.traceparent";

const MOVE_ASSIGNED: &str = "with moved as (
        update artex.tasks t
        set assigned_to = $2, lease_epoch = t.lease_epoch + 1,
            lease_until = now() + make_interval(secs => $3::float8)
        from artex.set_context($1, 'handed over to ' || $2) ctx
        where ctx and t.assigned_to = $1 and t.status = 'assigned' and t.id <> all($4::uuid[])
        returning t.id
    )
    select count(*), (select count(pg_notify(w.channel, '')) from artex.workers w
                      where w.id = $2 and exists (select 1 from moved))
    from moved";

impl WorkerBoard {
    /// Takes over running tasks that worker `from` held at the given epochs; returns the
    /// ones taken, with their saved checkpoints (the blackboard's, which is the truth).
    pub async fn take_over(
        &self,
        from: &str,
        to: &str,
        tasks: &[(Uuid, i64)],
        lease_secs: f64,
    ) -> Result<Vec<AssignedTask>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = tasks.iter().map(|t| t.0).collect();
        let epochs: Vec<i64> = tasks.iter().map(|t| t.1).collect();
        let client = self.bb.client().await?;
        let rows = client
            .query(TAKE_OVER, &[&from, &to, &lease_secs, &ids, &epochs])
            .await?;
        decode_assigned(rows).await
    }

    /// Moves every task assigned to `from` over to `to`, except the ones in `running`
    /// (whose handlers run in `from`, their start perhaps not written yet), and wakes
    /// `to`. Returns how many moved.
    pub async fn move_assigned(
        &self,
        from: &str,
        to: &str,
        lease_secs: f64,
        running: &[Uuid],
    ) -> Result<i64> {
        let client = self.bb.client().await?;
        let row = client
            .query_one(MOVE_ASSIGNED, &[&from, &to, &lease_secs, &running])
            .await?;
        Ok(row.try_get(0)?)
    }
}

//! The planner's statements for wake-ups pushed over HTTP (migrations/V14): the secret
//! that authenticates them, a worker's address, the recall of tasks whose wake-up could
//! not be delivered, and the record of a worker pushes do not reach (migrations/V23).

use uuid::Uuid;

use super::PlannerBoard;
use crate::error::Result;

/// A wake-up to push to one worker (`POST /wake` on its HTTP port): what its NOTIFY
/// would have carried, and the tasks it announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// The worker.
    pub worker: String,
    /// Where it takes pushes (`host:port`).
    pub addr: String,
    /// The payloads, in order: tasks carried (see `blackboard::carried`), empty ("look
    /// again") or `cancel`.
    pub payloads: Vec<String>,
    /// The tasks just assigned to it that this push announces: if it cannot be
    /// delivered, those not started yet go back to `pending` ([`PlannerBoard::recall`]).
    pub tasks: Vec<Uuid>,
}

const WAKE_ADDR: &str = "select wake_addr from artex.workers where id = $1 and state <> 'gone'";

// Tasks assigned to a worker whose wake-up could not be delivered, and not started by it
// since, go back to `pending` (compare-and-set on `assigned` and the holder: a start the
// worker wrote first wins, and then the task stays its). Their `run_at` is left alone,
// so they keep their place in the queue.
const RECALL: &str = "update artex.tasks t set status = 'pending'
    from artex.set_context($1, 'wake-up not delivered to worker ' || $2) ctx
    where ctx and t.id = any($3::uuid[]) and t.status::text = 'assigned'
      and t.assigned_to = $2
    returning t.id";

// A push to the worker failed: when pushes first failed is kept (the first failure of a
// run of them). Says whether the worker has been heard from since that first failure:
// alive, only unreachable, it takes its tasks by polling.
const WAKE_FAILED: &str = "update artex.workers
    set wake_failed_at = coalesce(wake_failed_at, now())
    where id = $1
    returning state = 'online' and last_seen > wake_failed_at";

// Whether a worker whose pushes fail has been heard from since they began to; no row
// for a worker that is gone (or deleted).
const HEARD_SINCE_WAKE_FAILED: &str = "select coalesce(last_seen > wake_failed_at, false)
    from artex.workers where id = $1 and state <> 'gone'";

// A push went through.
const WAKE_DELIVERED: &str =
    "update artex.workers set wake_failed_at = null where id = $1 and wake_failed_at is not null";

impl PlannerBoard {
    /// Records that a push to `worker` failed (since when, if it already had); says
    /// whether the worker has been heard from since its pushes began to fail (alive and
    /// only unreachable: it polls) — false for a worker that died, or that is unknown.
    pub async fn wake_failed(&self, worker: &str) -> Result<bool> {
        let client = self.bb.client().await?;
        Ok(match client.query_opt(WAKE_FAILED, &[&worker]).await? {
            Some(r) => r.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
            None => false,
        })
    }

    /// Whether `worker`, whose pushes fail, has been heard from since they began to;
    /// `None` when it is gone (or unknown): there is nothing left to probe.
    pub async fn heard_since_wake_failed(&self, worker: &str) -> Result<Option<bool>> {
        let client = self.bb.client().await?;
        Ok(
            match client
                .query_opt(HEARD_SINCE_WAKE_FAILED, &[&worker])
                .await?
            {
                Some(r) => Some(r.try_get(0)?),
                None => None,
            },
        )
    }

    /// Records that a push to `worker` went through: it is reachable.
    pub async fn wake_delivered(&self, worker: &str) -> Result {
        let client = self.bb.client().await?;
        client.execute(WAKE_DELIVERED, &[&worker]).await?;
        Ok(())
    }

    /// The bearer token of wake-up pushes (`artex.blackboard.wake_secret`).
    pub async fn wake_secret(&self) -> Result<String> {
        self.bb.wake_secret().await
    }

    /// Where `worker` takes pushes, if it does (and is not gone).
    pub async fn wake_addr(&self, worker: &str) -> Result<Option<String>> {
        let client = self.bb.client().await?;
        Ok(match client.query_opt(WAKE_ADDR, &[&worker]).await? {
            Some(r) => r.try_get(0)?,
            None => None,
        })
    }

    /// Gives back to `pending` the tasks of `tasks` still assigned to `worker` and not
    /// started (its wake-up could not be delivered); returns them.
    pub async fn recall(&self, actor: &str, worker: &str, tasks: &[Uuid]) -> Result<Vec<Uuid>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.bb.client().await?;
        client
            .query(RECALL, &[&actor, &worker, &tasks])
            .await?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }
}

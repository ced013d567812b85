//! The planner's statements for wake-ups pushed over HTTP (migrations/V14): the secret
//! that authenticates them, a worker's address, and the recall of tasks whose wake-up
//! could not be delivered.

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

impl PlannerBoard {
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

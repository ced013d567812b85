//! A running task's progress, as its worker writes it: the latest value of each task in
//! one statement, at most once a second (the worker's throttle: `worker/progress.rs`),
//! fenced like every write of a worker, and announced on [`PROGRESS_CHANNEL`] for
//! `/events`. The columns are in no index and no status changes: a HOT update that
//! writes no history row (migrations/V18__progress_and_retry_policies.sql).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::WorkerBoard;
use crate::error::Result;

/// The NOTIFY channel on which written progress is announced, one notification per task
/// (payload: a [`ProgressEvent`] as JSON). Not durable: a listener that is away misses
/// them, and the row keeps only the latest value.
pub const PROGRESS_CHANNEL: &str = "artex_progress";

/// The longest progress message kept, in characters; a longer one is cut.
pub const MAX_PROGRESS_MESSAGE_CHARS: usize = 200;

/// One task's latest progress, to write.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressNote {
    /// Task id.
    pub id: Uuid,
    /// The fencing token of the attempt that reported it.
    pub epoch: i64,
    /// 0 to 1.
    pub fraction: f32,
    /// What the handler said with it.
    pub message: Option<String>,
}

/// Progress as announced on [`PROGRESS_CHANNEL`] and streamed by `/events` (`event:
/// progress`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressEvent {
    /// Task id.
    pub task_id: Uuid,
    /// Its kind.
    pub kind: String,
    /// 0 to 1.
    pub progress: f32,
    /// What the handler said with it.
    pub message: Option<String>,
    /// When it was written.
    pub at: DateTime<Utc>,
}

/// The progress write, taking the rows' locks as `$lock` says.
macro_rules! progress_sql {
    ($lock:literal) => {
        concat!(
            "with lockable as materialized (
                select id from artex.tasks where id = any($2::uuid[]) order by id
                for update ",
            $lock,
            "
            ),
            written as (
                update artex.tasks t
                set progress = v.fraction, progress_message = v.message, progress_at = now()
                from lockable l, unnest($2::uuid[], $3::int8[], $4::float4[], $5::text[])
                         as v(id, epoch, fraction, message)
                where t.id = l.id and t.id = v.id and t.lease_epoch = v.epoch
                  and t.assigned_to = $1 and t.status::text in ('assigned', 'running')
                returning t.id, t.kind, t.progress, t.progress_message, t.progress_at
            )
            select w.id, pg_notify('artex_progress', json_build_object(
                       'task_id', w.id, 'kind', w.kind, 'progress', w.progress,
                       'message', w.progress_message, 'at', w.progress_at)::text) is not null
            from written w"
        )
    };
}

// The periodic write skips rows locked by the worker's own batch of outcomes in flight
// (as renewals do: the two lock in different orders); the worker keeps their values for
// its next write. Fenced: the holder and the epoch on the latest version. Through the
// relaxed pool (`synchronous_commit = off`): progress lost in a crash is progress the
// next write, or the outcome, supersedes. One notification per row: payloads differ, so
// PostgreSQL folds none of them.
const PROGRESS: &str = progress_sql!("skip locked");

// The last values of finished tasks, written just before their outcomes: it waits for a
// periodic write holding a row (which never waits itself), so the last value is the one
// kept. Locks in id order, as operators' controls do.
const LAST_PROGRESS: &str = progress_sql!("");

impl WorkerBoard {
    /// Writes the latest progress of tasks `worker` holds, in one statement; returns the
    /// ids written. A task missing from the answer was taken away from the worker, or
    /// (unless `last`) its row was locked by a write in flight, which is not waited for:
    /// its value can be written again. `last`: the values of tasks whose outcomes the
    /// worker writes next, which wait for such a lock.
    pub async fn save_progress(
        &self,
        worker: &str,
        notes: &[ProgressNote],
        last: bool,
    ) -> Result<Vec<Uuid>> {
        if notes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = notes.iter().map(|n| n.id).collect();
        let epochs: Vec<i64> = notes.iter().map(|n| n.epoch).collect();
        let fractions: Vec<f32> = notes.iter().map(|n| n.fraction).collect();
        let messages: Vec<Option<&str>> = notes.iter().map(|n| n.message.as_deref()).collect();
        let client = self.bb.relaxed_client().await?;
        let rows = client
            .relaxed(
                if last { LAST_PROGRESS } else { PROGRESS },
                &[&worker, &ids, &epochs, &fractions, &messages],
            )
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }
}

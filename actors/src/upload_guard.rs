//! The upload guard, run by the Reaper at each sweep: a task bound to a host (its
//! uploaded file lies on that host's disk) waits for a worker there; once every worker of
//! that host has been gone past `--upload-host-deadline-ms`, no worker can ever read the
//! file, and the task fails with a reason that says so instead of staying pending for
//! ever. Tasks of uploads on shared storage (`--upload-shared`) carry no host and are
//! never touched.

use crate::blackboard::{PlannerBoard, ReapParams, StrandedTask};
use crate::error::Result;

/// One pass: fails the stranded tasks (at most `params.batch`) and returns them. Only
/// while the reaper may judge liveness: a worker marked gone by a reaper that could not
/// see the database is not evidence that its host is gone.
pub async fn run_once(
    bb: &PlannerBoard,
    actor: &str,
    params: &ReapParams,
) -> Result<Vec<StrandedTask>> {
    if !params.judge_liveness {
        return Ok(Vec::new());
    }
    let failed = bb
        .fail_stranded(
            actor,
            params.upload_host_deadline_secs,
            params.now,
            params.batch,
        )
        .await?;
    for t in &failed {
        tracing::warn!(task = %t.id, host = %t.host, error = %t.error,
            "task failed: the only host holding its file is gone");
    }
    Ok(failed)
}

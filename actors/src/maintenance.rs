//! The Maintenance actor: keeps the one history bounded. Every interval it makes the
//! history's time partitions ahead (so inserts never land in the default partition),
//! drops whole partitions past the retention (never a big DELETE; a live consumer that
//! still needs one holds it back for up to one more retention, then gets 410), and
//! deletes finished tasks past the retention that no unfinished flow needs, in bounded
//! batches. After the retention was shortened, the partition holding now is still as wide
//! as the old retention made it (a day at the default): its rows past the new retention
//! are deleted by row, in batches, until it can go whole (V22). It also analyzes
//! artex's tables when the server forgot their statistics (after a crash or a failover),
//! so that autovacuum sees their dead rows again. The retention is a setting in the
//! blackboard (`artex.event_retention.keep`, `--history-retention`, `artex events
//! retention --set`), so every planner agrees; the SQL is in `blackboard/maintenance.rs`
//! and V10.

use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};

use crate::blackboard::MaintenanceBoard;
use crate::error::Result;
use crate::supervisor::{guarded, ActorStats};

/// Finished tasks deleted per statement: a few thousand rows (and their dependency
/// edges) keep each transaction short.
const TASK_BATCH: i32 = 2_000;

/// History rows deleted per statement from a partition made before the retention was
/// shortened (narrow rows, no dependants).
const HISTORY_BATCH: i32 = 5_000;

/// How long one run may spend deleting finished tasks (and, as long again, history rows): it goes on while batches come back
/// full, so it keeps up with the finishing rate (measured ~4,000 deletions/s on a loaded
/// 2-core host, ~110 bytes of WAL each), and a backlog (the first run after upgrading a
/// database that never pruned) drains over several runs instead of one long one.
const TASK_BUDGET: Duration = Duration::from_secs(60);

/// What one run of the maintenance did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// History partitions made.
    pub partitions_made: Vec<String>,
    /// History partitions dropped (past the retention).
    pub partitions_dropped: Vec<String>,
    /// History rows deleted one by one: past the retention, in a partition made wider
    /// before the retention was shortened.
    pub history_rows_pruned: u64,
    /// Finished tasks deleted (past the retention).
    pub tasks_pruned: u64,
    /// Tables analyzed because the server had forgotten their statistics.
    pub tables_analyzed: Vec<String>,
}

/// The Maintenance actor.
pub struct Maintenance {
    bb: MaintenanceBoard,
    interval: Duration,
    stats: ActorStats,
}

impl Maintenance {
    /// Maintenance every `interval`.
    pub fn new(bb: MaintenanceBoard, interval: Duration, stats: ActorStats) -> Self {
        Maintenance {
            bb,
            interval,
            stats,
        }
    }

    /// One run; `now` moves the clock for tests (the database's by default).
    pub async fn run_once(
        bb: &MaintenanceBoard,
        now: Option<DateTime<Utc>>,
    ) -> Result<MaintenanceReport> {
        crate::supervisor::failpoint("maintenance");
        let partitions_made = bb.make_history_partitions(now).await?;
        if !partitions_made.is_empty() {
            tracing::info!(partitions = ?partitions_made, "history: partitions made ahead");
        }
        let partitions_dropped = bb.drop_history_partitions(now).await?;
        if !partitions_dropped.is_empty() {
            tracing::info!(partitions = ?partitions_dropped, "history: partitions past the retention dropped");
        }
        let history_rows_pruned =
            drain(HISTORY_BATCH, |batch| bb.prune_history_rows(now, batch)).await?;
        if history_rows_pruned > 0 {
            tracing::info!(
                rows = history_rows_pruned,
                "history rows past a shortened retention deleted"
            );
        }
        let tasks_pruned = drain(TASK_BATCH, |batch| bb.prune_finished_tasks(now, batch)).await?;
        if tasks_pruned > 0 {
            tracing::info!(
                tasks = tasks_pruned,
                "finished tasks past the retention deleted"
            );
        }
        let tables_analyzed = bb.analyze_forgotten_tables().await?;
        if !tables_analyzed.is_empty() {
            tracing::info!(
                tables = ?tables_analyzed,
                "analyzed tables whose statistics the server forgot (a crash, a failover)"
            );
        }
        Ok(MaintenanceReport {
            partitions_made,
            partitions_dropped,
            history_rows_pruned,
            tasks_pruned,
            tables_analyzed,
        })
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        let bb = self.bb.clone();
        async move { guarded("maintenance", Maintenance::run_once(&bb, None)).await }
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Ok(Ok(_)) => act.stats.ran("maintenance"),
                Ok(Err(e)) => {
                    act.stats.failed("maintenance");
                    tracing::warn!(error = %e, "maintenance failed; retrying next interval");
                }
                Err(_) => ctx.stop(),
            })
            .wait(ctx);
    }
}

/// Deletes in batches of `batch` while batches come back full, for [`TASK_BUDGET`] at
/// most; returns how many rows went.
async fn drain<F, Fut>(batch: i32, mut delete: F) -> Result<u64>
where
    F: FnMut(i32) -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    let started = Instant::now();
    loop {
        let n = delete(batch).await?;
        total += n;
        if n < batch as u64 || started.elapsed() >= TASK_BUDGET {
            return Ok(total);
        }
    }
}

impl Actor for Maintenance {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.run(ctx);
        ctx.run_interval(self.interval, |act, ctx| act.run(ctx));
    }
}

impl Supervised for Maintenance {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.restarted("maintenance");
    }
}

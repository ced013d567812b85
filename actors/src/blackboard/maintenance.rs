//! Maintenance's statements: the schema (apply migrations, read and check what was
//! applied), keeping the history bounded (partitions made ahead and dropped past the
//! retention, finished tasks pruned with them), and statistics the server forgot.
//!
//! Every statement here is one transaction, [`MaintenanceBoard::migrate`]'s too: each
//! step of a migration run takes a transaction-scoped lock (see `migrate.rs`), so
//! migrating works through a transaction pooler as well.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::migrate::{
    applied_from, apply_all, check_range, needed, Applied, MigrationReport, SchemaMismatch,
    SchemaStatus, READ_APPLIED,
};
use super::Blackboard;
use crate::error::Result;

const SET_RETENTION: &str = "update artex.event_retention
    set keep = make_interval(secs => $1::float8)";

// The partitions of history up to three slices ahead of `$1` (V10's function: it moves
// rows the default partition caught, and takes an advisory lock so planners never race).
const MAKE_PARTITIONS: &str =
    "select p from artex.make_history_partitions(coalesce($1::timestamptz, now()), null) p";

// Whole partitions past the retention, oldest first, unless a live consumer still needs
// them (for up to one more retention); raises `pruned_*` past each.
const DROP_PARTITIONS: &str =
    "select p from artex.drop_history_partitions(coalesce($1::timestamptz, now())) p";

// History rows past the retention in partitions wider than a slice now is (made before
// the retention was shortened), oldest first, at most `$2`; a live consumer holds back
// what it has not read as it holds partitions back (V22).
const PRUNE_HISTORY_ROWS: &str =
    "select artex.prune_history_rows(coalesce($1::timestamptz, now()), $2::int4)";

// Finished tasks past the retention that no unfinished flow needs, oldest first, at most
// `$2` (and flows left empty); none while another process prunes (V68: every planner runs
// the maintenance, and two prunes at once deadlocked).
const PRUNE_TASKS: &str =
    "select artex.prune_finished_tasks(coalesce($1::timestamptz, now()), $2::int4)";

// artex's own tables (not the history's partitions) whose statistics know of no vacuum
// and no analyze: PostgreSQL forgets its statistics after a crash and on a standby's
// promotion, and autovacuum then counts dead rows from zero. Only tables this role may
// analyze (it owns them, or is a superuser): another would be skipped with a warning at
// every run.
const STATS_FORGOTTEN: &str = "select c.relname::text
    from pg_stat_all_tables s join pg_class c on c.oid = s.relid
    where s.schemaname = 'artex' and c.relkind = 'r' and not c.relispartition
      and pg_has_role(c.relowner, 'USAGE')
      and s.last_vacuum is null and s.last_autovacuum is null
      and s.last_analyze is null and s.last_autoanalyze is null
    order by 1";

/// Maintenance's handle on the blackboard: see the [module](self).
#[derive(Debug, Clone)]
pub struct MaintenanceBoard {
    pub(super) bb: Blackboard,
}

impl MaintenanceBoard {
    /// Applies every migration not yet applied. Safe to call from several processes at once.
    /// Refuses a database contracted beyond this build (and so applies nothing there), and
    /// one whose applied migrations were edited.
    pub async fn migrate(&self) -> Result<MigrationReport> {
        apply_all(self.bb.client().await?.unbounded()).await
    }

    /// The migrations the database applied, oldest first; `None` when it was never
    /// migrated. Reads only.
    pub async fn applied_migrations(&self) -> Result<Option<Vec<Applied>>> {
        let client = self.bb.client().await?;
        match client.query(READ_APPLIED, &[]).await {
            Ok(rows) => Ok(Some(applied_from(&rows))),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Checks that this build runs against the database's schema (see [`check_range`]);
    /// planners, workers and one-shot commands call it at start instead of migrating.
    /// Reads only: a refused process leaves the database as it found it.
    pub async fn check_schema(&self) -> Result<SchemaStatus> {
        let applied = self
            .applied_migrations()
            .await?
            .ok_or(SchemaMismatch::NoSchema)?;
        Ok(check_range(&applied, &needed())?)
    }

    /// Sets how long history (the feed's events, finished tasks) is kept, and how long
    /// a silent consumer counts as live.
    pub async fn set_event_retention(&self, keep: Duration) -> Result {
        let client = self.bb.client().await?;
        client
            .execute(SET_RETENTION, &[&keep.as_secs_f64()])
            .await?;
        Ok(())
    }

    /// Makes the history's partitions up to three slices ahead of `now` (the database's
    /// clock by default); returns the partitions made.
    pub async fn make_history_partitions(&self, now: Option<DateTime<Utc>>) -> Result<Vec<String>> {
        let client = self.bb.client().await?;
        let rows = client.query(MAKE_PARTITIONS, &[&now]).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Drops the history's partitions past the retention (V10's `drop_history_partitions`);
    /// returns the partitions dropped.
    pub async fn drop_history_partitions(&self, now: Option<DateTime<Utc>>) -> Result<Vec<String>> {
        let client = self.bb.client().await?;
        let rows = client.query(DROP_PARTITIONS, &[&now]).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Deletes up to `batch` history rows past the retention that whole partitions do not
    /// take in time: those of a partition made wider before the retention was shortened
    /// (V22's `prune_history_rows`); returns how many.
    pub async fn prune_history_rows(&self, now: Option<DateTime<Utc>>, batch: i32) -> Result<u64> {
        self.prune(PRUNE_HISTORY_ROWS, now, batch).await
    }

    /// Deletes up to `batch` finished tasks past the retention that no unfinished flow
    /// needs; returns how many (0 while another process prunes: it leaves them to it).
    pub async fn prune_finished_tasks(
        &self,
        now: Option<DateTime<Utc>>,
        batch: i32,
    ) -> Result<u64> {
        self.prune(PRUNE_TASKS, now, batch).await
    }

    /// Analyzes artex's tables whose statistics the server forgot (after a crash, a
    /// failover, a restore) and returns their names. `ANALYZE` estimates their dead rows
    /// again, so autovacuum sees the dead rows left before: without it, a fleet that
    /// fails over more often than autovacuum's thresholds fill never vacuums its tasks
    /// (the fleet-topology soak's tables grew 1.5× in an hour). Once per table and
    /// forgetting: an analyzed table has a time of its last analyze.
    pub async fn analyze_forgotten_tables(&self) -> Result<Vec<String>> {
        let client = self.bb.client().await?;
        let names: Vec<String> = client
            .query(STATS_FORGOTTEN, &[])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<std::result::Result<_, _>>()?;
        if !names.is_empty() {
            let tables: Vec<String> = names
                .iter()
                .map(|n| format!("artex.{}", super::sql::quote_ident(n)))
                .collect();
            client
                .batch(&format!("analyze {}", tables.join(", ")))
                .await?;
        }
        Ok(names)
    }

    /// Runs one of the pruning statements (`$1` the clock, `$2` the batch); returns the
    /// count it answers.
    async fn prune(&self, sql: &str, now: Option<DateTime<Utc>>, batch: i32) -> Result<u64> {
        let client = self.bb.client().await?;
        let n: i64 = client.query_one(sql, &[&now, &batch]).await?.try_get(0)?;
        Ok(n as u64)
    }
}

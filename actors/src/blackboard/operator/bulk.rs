//! Bulk actions: retry, cancel or delete every task a [`TaskFilter`] matches, in batches
//! of [`BULK_BATCH`], each its own short transaction, with who and why recorded per task.

use uuid::Uuid;

use super::tasks::TaskFilter;
use super::OperatorBoard;
use crate::blackboard::tasks::TaskStatus;
use crate::error::Result;

/// What a bulk action does to every task a [`TaskFilter`] matches (`artex tasks retry|
/// cancel|delete`, `POST /api/v1/tasks/bulk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BulkAction {
    /// A new task for each failed, timed-out or canceled one outside a flow (as `retry`).
    Retry,
    /// Each unfinished task ends `canceled`; a running handler is told.
    Cancel,
    /// Each finished task outside a flow is deleted, and the deletion recorded in
    /// `artex.task_deletions` (its history stays).
    Delete,
}

impl BulkAction {
    /// Its name, as the API and the CLI take it.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }
}

impl std::str::FromStr for BulkAction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "retry" => Ok(BulkAction::Retry),
            "cancel" => Ok(BulkAction::Cancel),
            "delete" => Ok(BulkAction::Delete),
            _ => Err(format!("{s:?}; expected retry, cancel or delete")),
        }
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BulkReport {
    /// The action.
    pub action: BulkAction,
    /// Tasks the filter matched (a dry run: counted, nothing changed).
    pub matched: u64,
    /// Tasks changed: retried (a new task each), canceled or deleted. A matched task the
    /// action does not apply to (a retry of a succeeded task, a cancel of an ended one,
    /// a task of a flow for retry and delete) is left as it is.
    pub changed: u64,
    /// Transactions it took, each of at most [`BULK_BATCH`] tasks.
    pub batches: u64,
    /// Nothing was changed: `matched` is what the action would look at.
    pub dry_run: bool,
}

/// A bulk action's tasks per transaction: each batch's locks are held for one short
/// statement, never for the whole action.
pub const BULK_BATCH: i64 = 500;

// A bulk action's batches, each its own transaction, on the ids of one page of the
// filter's matches (newest first, below the last batch's smallest id, so that tasks the
// action makes, being newer, are never visited). The statements are the single-task
// controls' (flows.rs, CANCEL; tasks.rs, RETRY), over a list of ids.
const BULK_CANCEL: &str = "with target as materialized (
        select id from artex.tasks where id = any($3::uuid[])
          and status not in ('succeeded', 'failed', 'timeout', 'canceled')
        order by id for update
    )
    update artex.tasks t set status = 'canceled'
    from artex.set_context($1, $2) ctx, target
    where ctx and t.id = target.id
    returning t.id";

const BULK_RETRY: &str = "insert into artex.tasks
        (id, kind, payload, priority, max_retries, timeout_ms, shard_key, tags, limit_key)
    select artex.uuid_v7(), o.kind, o.payload, o.priority, o.max_retries, o.timeout_ms,
           o.shard_key, o.tags, o.limit_key
    from artex.set_context($1, $2) ctx, artex.tasks o
    where ctx and o.id = any($3::uuid[]) and o.status in ('failed', 'timeout', 'canceled')
      and o.flow_id is null
    order by o.id
    returning id";

// The history of a deleted task stays (it is the audit trail); the deletion itself is
// recorded beside it, with who and why.
const BULK_DELETE: &str = "with doomed as materialized (
        select id from artex.tasks where id = any($3::uuid[])
          and status in ('succeeded', 'failed', 'timeout', 'canceled') and flow_id is null
        order by id for update
    ),
    gone as (
        delete from artex.tasks t using doomed where t.id = doomed.id
        returning t.id, t.kind, t.status
    )
    insert into artex.task_deletions (task_id, kind, status, actor, reason)
    select id, kind, status, $1, $2 from gone
    returning task_id";

impl OperatorBoard {
    /// Applies `action` to every task `filter` matches (its `after` and `limit` aside),
    /// in batches of [`BULK_BATCH`], each its own short transaction, recording `actor`
    /// and `reason` for each task; with `dry_run`, only counts the matches.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &TaskFilter,
        actor: &str,
        reason: Option<&str>,
        dry_run: bool,
    ) -> Result<BulkReport> {
        let status = filter.status.map(TaskStatus::as_str);
        let mut report = BulkReport {
            action,
            matched: 0,
            changed: 0,
            batches: 0,
            dry_run,
        };
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        let mut conds = filter.conditions(&mut next);
        let filter_sql = if conds.is_empty() {
            "true".to_string()
        } else {
            conds.join(" and ")
        };
        let client = self.bb.client().await?;
        if dry_run {
            let sql = format!("select count(*) from artex.tasks where {filter_sql}");
            let row = client.query_one(&sql, &filter.params(&status)).await?;
            report.matched = row.try_get::<_, i64>(0)? as u64;
            return Ok(report);
        }
        let (below, limit) = (next(), next());
        conds.push(format!("(${below}::uuid is null or id < ${below})"));
        let page = format!(
            "select id from ({}) p",
            filter.newest_first(&conds, &format!("${limit}"))
        );
        let write = match action {
            BulkAction::Retry => BULK_RETRY,
            BulkAction::Cancel => BULK_CANCEL,
            BulkAction::Delete => BULK_DELETE,
        };
        let default_reason = format!("bulk {} by operator", action.as_str());
        let reason = reason.unwrap_or(&default_reason);
        let mut cursor: Option<Uuid> = None;
        loop {
            let mut params = filter.params(&status);
            params.push(&cursor);
            params.push(&BULK_BATCH);
            let ids: Vec<Uuid> = client
                .query(&page, &params)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<std::result::Result<_, _>>()?;
            let Some(&last) = ids.last() else {
                break;
            };
            report.matched += ids.len() as u64;
            report.batches += 1;
            report.changed += client.query(write, &[&actor, &reason, &ids]).await?.len() as u64;
            if (ids.len() as i64) < BULK_BATCH {
                break;
            }
            cursor = Some(last);
        }
        Ok(report)
    }
}

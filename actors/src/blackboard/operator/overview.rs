//! What the HTTP API shows about the whole cluster: the workers' roster as stored, and
//! statistics (tasks by status, recent throughput and latency). Every read is bounded
//! whatever the tables hold: capped counts walked on an index, and a sample of at most
//! [`RECENT_SAMPLE`] recently finished tasks (migrations/V8__api_indexes.sql; read
//! from the history since V69).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::OperatorBoard;
use crate::blackboard::sql::{Param, WALKED};
use crate::blackboard::{TaskStatus, WorkerState};
use crate::error::Result;

/// A worker as the blackboard knows it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    /// `host:pid:suffix`.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i32,
    /// Build version.
    pub version: String,
    /// sha256 of the binary it runs, once it has hashed it (`None` before, and for
    /// workers of builds older than V8).
    pub binary_sha256: Option<String>,
    /// Its HTTP address.
    pub http_addr: Option<String>,
    /// online, draining, upgrading or gone.
    pub state: WorkerState,
    /// The kinds it runs.
    pub kinds: Vec<String>,
    /// Tasks it holds at once: its handler slots and its local queue.
    pub capacity: i32,
    /// Tasks it runs at once: its handler slots (`None`: a worker of a build that does
    /// not say, before V48).
    pub slots: Option<i32>,
    /// Tasks it holds (assigned or running), kept by the database.
    pub held: i32,
    /// Tasks it reported running at its last heartbeat.
    pub inflight: i32,
    /// Registered.
    pub started_at: DateTime<Utc>,
    /// Last heartbeat.
    pub last_seen: DateTime<Utc>,
    /// Where planners push its wake-ups (`None`: it LISTENs).
    pub wake_addr: Option<String>,
    /// How wake-ups reach it: `pushed`; `unreachable, polling` (planners' pushes fail
    /// and it has been heard from since: it is given work and polls for it);
    /// `unreachable` (not heard from since: it gets nothing); `notify` (it LISTENs).
    pub wake_ups: &'static str,
    /// Since when planners' pushes fail to reach it (migrations/V23).
    pub wake_unreachable_since: Option<DateTime<Utc>>,
}

/// How wake-ups reach a worker (see [`WorkerView::wake_ups`]).
pub fn wake_ups(
    wake_addr: Option<&str>,
    failed_at: Option<DateTime<Utc>>,
    last_seen: DateTime<Utc>,
) -> &'static str {
    match (wake_addr, failed_at) {
        (None, _) => "notify",
        (Some(_), None) => "pushed",
        (Some(_), Some(at)) if last_seen > at => crate::worker::WAKE_UPS_POLLING,
        (Some(_), Some(_)) => "unreachable",
    }
}

/// Counts per status stop at this many (an index walk of at most this many entries each).
pub const STATUS_COUNT_CAP: i64 = 100_000;

/// The recent statistics read at most this many finished tasks, the most recent first.
pub const RECENT_SAMPLE: i64 = 100_000;

/// Percentiles of a duration, milliseconds (`None` without any task to measure).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Tasks measured.
    pub tasks: i64,
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// The longest.
    pub max: Option<f64>,
}

/// Tasks finished in one minute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinuteCount {
    /// The minute's start.
    pub minute: DateTime<Utc>,
    /// Tasks finished in it (any outcome).
    pub finished: i64,
    /// Their mean run time (`finished_at - started_at`), ms; `None` without any. A mean,
    /// not a median: one sort per minute doubled the statistics' cost at 1,000,000 tasks
    /// (`scripts/bench.sh`, `dash`), the mean rides along the count.
    #[serde(default)]
    pub run_avg_ms: Option<f64>,
    /// Their mean wait (`started_at - created_at`), ms; `None` without any.
    #[serde(default)]
    pub queue_avg_ms: Option<f64>,
}

/// How long the oldest runnable task has waited.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Backlog {
    /// When the oldest pending task whose time has come became runnable (the later of
    /// its creation and its `run_at`); `None` when nothing waits.
    pub oldest_due_at: Option<DateTime<Utc>>,
    /// Its wait so far, ms.
    pub age_ms: Option<f64>,
}

/// Tasks finished over the last minutes.
#[derive(Debug, Clone, Serialize)]
pub struct RecentStats {
    /// The window, minutes.
    pub window_minutes: u32,
    /// Tasks finished in the window and read (at most the sample, [`RECENT_SAMPLE`] by
    /// default).
    pub finished: i64,
    /// More finished in the window than were read: the figures cover `since` to now.
    pub sampled: bool,
    /// Where the figures start: the window's start, or the oldest task read.
    pub since: DateTime<Utc>,
    /// Tasks finished per minute, averaged from `since` to now.
    pub throughput_per_minute: f64,
    /// Finished per minute, oldest first; minutes without any are 0.
    pub per_minute: Vec<MinuteCount>,
    /// Finished per kind, by outcome (succeeded, failed, timeout, canceled).
    pub by_kind: BTreeMap<String, BTreeMap<String, i64>>,
    /// From creation to the last start (`started_at - created_at`: waiting, and any
    /// retry backoff), over the tasks that started.
    pub queue_ms: Percentiles,
    /// From the last start to the end (`finished_at - started_at`).
    pub run_ms: Percentiles,
}

/// Statistics of the whole blackboard.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// When they were read (the database's clock).
    pub at: DateTime<Utc>,
    /// Tasks per status, each counted up to [`STATUS_COUNT_CAP`].
    pub by_status: BTreeMap<String, i64>,
    /// The statuses whose count reached the cap: at least that many.
    pub capped: Vec<String>,
    /// The cap.
    pub status_count_cap: i64,
    /// The oldest runnable task's wait.
    pub backlog: Backlog,
    /// Recently finished tasks.
    pub recent: RecentStats,
}

/// The roster, by id. `$1`: at most this many.
const WORKERS: &str = "select id, host, pid, version, binary_sha256, http_addr, state::text,
        kinds, capacity, held, inflight, started_at, last_seen, wake_addr, wake_failed_at,
        slots
    from artex.workers order by id limit $1";

/// Per status, at most `$1` entries each (of `tasks_listed`, or of the held set
/// `tasks_holder` for assigned and running: see [`TaskStatus::list_condition`]): one
/// capped subquery per status, each naming its status, so that each is planned as a walk
/// of that status's entries (a plan made for any status would walk the primary key,
/// filtering, which for a rare status is the whole table).
fn status_counts_sql() -> String {
    TaskStatus::ALL
        .iter()
        .map(|s| {
            format!(
                "select '{s}'::text, (select count(*) from (select 1 from artex.tasks
                     where {} order by id limit $1) x)",
                s.list_condition(&format!("'{s}'"))
            )
        })
        .collect::<Vec<_>>()
        .join(" union all ")
}

/// The most recent `$2` tasks finished in the last `$1` seconds before `$3` (now by
/// default), and what they say. Read back from the history's end (V69: no index of
/// finish times): its feed index walked backwards from its end down to the position of
/// the window's start less five minutes (`artex.feed_position_at`, found once: the rows
/// of a transaction that waited before it wrote are dated earlier than their position),
/// each terminal transition's task by its id; the latest first in the feed's order.
/// Run by `Conn::walked_one`: a plan made for a third of the history (what PostgreSQL
/// guesses of a subquery's bound) would scan it all and sort it.
const RECENT: &str = "with recent as materialized (
        select t.kind, t.status::text as status, t.created_at, t.started_at, t.finished_at
        from artex.task_history h
        join artex.tasks t on t.id = h.task_id
        where h.xid >= (select artex.feed_position_at(coalesce($3::timestamptz, now())
                            - make_interval(secs => $1::float8) - interval '5 minutes'))
          and h.to_status in ('succeeded', 'failed', 'timeout', 'canceled')
          and t.finished_at > coalesce($3::timestamptz, now()) - make_interval(secs => $1::float8)
          and t.finished_at <= coalesce($3::timestamptz, now())
        order by h.xid desc, h.id desc limit $2
    ),
    queue as (select extract(epoch from started_at - created_at)::float8 * 1000 as ms
              from recent where started_at is not null),
    run as (select extract(epoch from finished_at - started_at)::float8 * 1000 as ms
            from recent where started_at is not null)
    select coalesce($3::timestamptz, now()),
        (select count(*) from recent),
        (select min(finished_at) from recent),
        coalesce((select jsonb_agg(jsonb_build_object('minute', m, 'finished', n,
                                               'run_avg_ms', r, 'queue_avg_ms', q) order by m)
                  from (select date_trunc('minute', finished_at) m, count(*) n,
                          avg(extract(epoch from finished_at - started_at)::float8 * 1000) r,
                          avg(extract(epoch from started_at - created_at)::float8 * 1000) q
                        from recent group by 1) a), '[]'),
        coalesce((select jsonb_object_agg(kind, c)
                  from (select kind, jsonb_object_agg(status, n) c
                        from (select kind, status, count(*) n from recent group by 1, 2) b
                        group by kind) d), '{}'),
        (select jsonb_build_object('tasks', count(*),
                'p50', percentile_cont(0.5) within group (order by ms),
                'p95', percentile_cont(0.95) within group (order by ms),
                'p99', percentile_cont(0.99) within group (order by ms),
                'max', max(ms)) from queue),
        (select jsonb_build_object('tasks', count(*),
                'p50', percentile_cont(0.5) within group (order by ms),
                'p95', percentile_cont(0.95) within group (order by ms),
                'p99', percentile_cont(0.99) within group (order by ms),
                'max', max(ms)) from run)";

/// The oldest pending task whose time has come, by id (ids are time-ordered): a walk of
/// `tasks_listed` from its oldest pending entry, stopping at the first due one (it
/// passes over delayed tasks not yet due). `$1`: now (the database's clock by default).
const BACKLOG: &str = "select coalesce($1::timestamptz, now()),
        (select greatest(created_at, run_at) from artex.tasks
         where listed = 'pending' and run_at <= coalesce($1::timestamptz, now())
         order by id limit 1)";

impl OperatorBoard {
    /// At most `limit` workers, by id.
    pub async fn workers(&self, limit: i64) -> Result<Vec<WorkerView>> {
        let client = self.bb.client().await?;
        let rows = client.query(WORKERS, &[&limit]).await?;
        rows.iter()
            .map(|r| {
                Ok(WorkerView {
                    id: r.try_get(0)?,
                    host: r.try_get(1)?,
                    pid: r.try_get(2)?,
                    version: r.try_get(3)?,
                    binary_sha256: r.try_get(4)?,
                    http_addr: r.try_get(5)?,
                    state: r.try_get::<_, String>(6)?.parse()?,
                    kinds: r.try_get(7)?,
                    capacity: r.try_get(8)?,
                    slots: r.try_get(15)?,
                    held: r.try_get(9)?,
                    inflight: r.try_get(10)?,
                    started_at: r.try_get(11)?,
                    last_seen: r.try_get(12)?,
                    wake_addr: r.try_get(13)?,
                    wake_ups: wake_ups(
                        r.try_get::<_, Option<&str>>(13)?,
                        r.try_get(14)?,
                        r.try_get(12)?,
                    ),
                    wake_unreachable_since: r.try_get(14)?,
                })
            })
            .collect()
    }

    /// Tasks by status (capped), and what the tasks finished in the last
    /// `window_minutes` before `now` (the database's clock by default) say.
    pub async fn stats(&self, window_minutes: u32, now: Option<DateTime<Utc>>) -> Result<Stats> {
        self.stats_sampled(window_minutes, now, RECENT_SAMPLE).await
    }

    /// As [`OperatorBoard::stats`], reading at most `sample` (1 to [`RECENT_SAMPLE`]) recently
    /// finished tasks: the cost of the recent figures is linear in it (at 1,000,000 tasks
    /// a sample of 20,000 costs a fifth of the default's), which a page refreshed at every
    /// event cares about.
    pub async fn stats_sampled(
        &self,
        window_minutes: u32,
        now: Option<DateTime<Utc>>,
        sample: i64,
    ) -> Result<Stats> {
        let sample = sample.clamp(1, RECENT_SAMPLE);
        let client = self.bb.client().await?;
        let mut by_status = BTreeMap::new();
        let mut capped = Vec::new();
        for r in client
            .query(&status_counts_sql(), &[&STATUS_COUNT_CAP])
            .await?
        {
            let status: String = r.try_get(0)?;
            let n: i64 = r.try_get(1)?;
            if n >= STATUS_COUNT_CAP {
                capped.push(status.clone());
            }
            by_status.insert(status, n);
        }
        debug_assert_eq!(by_status.len(), TaskStatus::ALL.len());
        let r = client.query_one(BACKLOG, &[&now]).await?;
        let clock: DateTime<Utc> = r.try_get(0)?;
        let oldest_due_at: Option<DateTime<Utc>> = r.try_get(1)?;
        let backlog = Backlog {
            oldest_due_at,
            age_ms: oldest_due_at.map(|t| {
                ((clock - t).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0).max(0.0)
            }),
        };
        let window_secs = f64::from(window_minutes) * 60.0;
        let r = client
            .walked_one(RECENT, &[&window_secs, &sample, &now])
            .await?;
        let at: DateTime<Utc> = r.try_get(0)?;
        let finished: i64 = r.try_get(1)?;
        let oldest: Option<DateTime<Utc>> = r.try_get(2)?;
        let per_minute: Vec<MinuteCount> = from_json(r.try_get(3)?)?;
        let by_kind = from_json(r.try_get(4)?)?;
        let queue_ms = from_json(r.try_get(5)?)?;
        let run_ms = from_json(r.try_get(6)?)?;
        let window_start = at - chrono::Duration::seconds(i64::from(window_minutes) * 60);
        let sampled = finished >= sample;
        let since = match (sampled, oldest) {
            (true, Some(oldest)) => oldest,
            _ => window_start,
        };
        let span_minutes = ((at - since).num_milliseconds() as f64 / 60_000.0).max(1.0 / 60.0);
        Ok(Stats {
            at,
            by_status,
            capped,
            status_count_cap: STATUS_COUNT_CAP,
            backlog,
            recent: RecentStats {
                window_minutes,
                finished,
                sampled,
                since,
                throughput_per_minute: finished as f64 / span_minutes,
                per_minute: every_minute(per_minute, since, at),
                by_kind,
                queue_ms,
                run_ms,
            },
        })
    }
}

impl OperatorBoard {
    /// PostgreSQL's plans for the other listings the HTTP API makes (the roster, the
    /// statistics, a flow's tasks, a task's history), by name, one line per node: the
    /// tests show each walks an index.
    pub async fn explain_overview(&self) -> Result<Vec<(&'static str, Vec<String>)>> {
        let client = self.bb.client().await?;
        let id = uuid::Uuid::nil();
        let limit = 1001i64;
        let window = 900.0f64;
        let none: Option<DateTime<Utc>> = None;
        let by_status = status_counts_sql();
        let no_id: Option<uuid::Uuid> = None;
        let reads: [(&'static str, &str, Vec<&dyn Param>); 8] = [
            ("stats: backlog", BACKLOG, vec![&none]),
            ("events: head", crate::blackboard::feed::FEED_HEAD, vec![]),
            ("flows", super::flow_list::FLOWS_PAGE, vec![&no_id, &limit]),
            ("workers", WORKERS, vec![&limit]),
            ("stats: by status", &by_status, vec![&STATUS_COUNT_CAP]),
            ("flow", super::flows::FLOW, vec![&id]),
            ("flow: tasks", super::flows::FLOW_TASKS, vec![&id]),
            (
                "task: transitions",
                crate::blackboard::tasks::TRANSITIONS,
                vec![&id],
            ),
        ];
        let mut plans = Vec::new();
        for (name, sql, params) in reads {
            let rows = client.query(&format!("explain {sql}"), &params).await?;
            plans.push((name, plan_lines(&rows)?));
        }
        // Planned as it runs: in `walked_one`'s transaction.
        let explain = format!("explain {RECENT}");
        let params: [&dyn Param; 3] = [&window, &RECENT_SAMPLE, &none];
        let rows = client
            .alone(WALKED, client.query(&explain, &params))
            .await?;
        plans.push(("stats: recent", plan_lines(&rows)?));
        Ok(plans)
    }
}

/// An `explain`'s answer, one line per node.
fn plan_lines(rows: &[tokio_postgres::Row]) -> Result<Vec<String>> {
    Ok(rows
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| {
        crate::error::Error::Invalid(format!(
            "statistics: unexpected JSON from the database: {e}"
        ))
    })
}

/// `counted`, with a 0 for every minute from `since`'s to `until`'s without a count.
fn every_minute(
    counted: Vec<MinuteCount>,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<MinuteCount> {
    use chrono::DurationRound;
    let minute = chrono::Duration::minutes(1);
    let (Ok(mut m), Ok(last)) = (since.duration_trunc(minute), until.duration_trunc(minute)) else {
        return counted;
    };
    let mut out = Vec::new();
    let mut counted = counted.into_iter().peekable();
    while m <= last {
        let (finished, run_avg_ms, queue_avg_ms) = match counted.peek() {
            Some(c) if c.minute == m => counted
                .next()
                .map(|c| (c.finished, c.run_avg_ms, c.queue_avg_ms))
                .unwrap_or((0, None, None)),
            _ => (0, None, None),
        };
        out.push(MinuteCount {
            minute: m,
            finished,
            run_avg_ms,
            queue_avg_ms,
        });
        m += minute;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn every_minute_of_the_window_is_listed() {
        let t = |h, m, s| Utc.with_ymd_and_hms(2026, 1, 1, h, m, s).unwrap();
        let counted = vec![MinuteCount {
            minute: t(10, 1, 0),
            finished: 7,
            run_avg_ms: Some(3.0),
            queue_avg_ms: None,
        }];
        let all = every_minute(counted, t(9, 59, 30), t(10, 2, 10));
        let got: Vec<(u32, i64)> = all
            .iter()
            .map(|c| (chrono::Timelike::minute(&c.minute), c.finished))
            .collect();
        assert_eq!(got, [(59, 0), (0, 0), (1, 7), (2, 0)]);
    }
}

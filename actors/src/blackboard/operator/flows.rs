//! An operator's statements on flows: submit one (every task, dependency and counter in
//! one transaction), read one whole or its counts, and pause, resume or cancel a task or a
//! whole flow (each under the flow's row lock).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::OperatorBoard;
use crate::blackboard::flows::{
    Control, ControlReport, ControlTarget, FlowSpec, FlowState, FlowTaskView, FlowView, WaitView,
};
use crate::blackboard::{TaskStatus, Tx};
use crate::error::{Error, Result};
use crate::submission::WAIT_KIND;

const INSERT_FLOW: &str = "insert into artex.flows (id, name) values ($1, $2)";

const INSERT_FLOW_TASKS: &str = "insert into artex.tasks
        (id, kind, status, payload, priority, max_retries, timeout_ms, shard_key, flow_id,
         flow_task)
    select v.id, v.kind, v.status::artex.task_status, v.payload, v.priority,
           coalesce(v.max_retries, artex.default_max_retries(v.kind)), v.timeout_ms, v.shard_key, $3, v.name
    from artex.set_context($1, $2) ctx,
         unnest($4::uuid[], $5::text[], $6::text[], $7::jsonb[], $8::int4[], $9::int4[],
                $10::int4[], $11::text[], $12::text[])
           as v(id, name, kind, payload, priority, max_retries, timeout_ms, shard_key, status)
    where ctx";

const INSERT_DEPENDENCIES: &str = "insert into artex.task_dependencies (task_id, depends_on)
    select * from unnest($1::uuid[], $2::uuid[])";

const INSERT_WAITS: &str = "insert into artex.task_waits (task_id, upstream_left)
    select * from unnest($1::uuid[], $2::int4[])";

// A flow's waits (V40): what each waits for; then those without upstream tasks are
// reached at once (their timers start).
const INSERT_FLOW_WAITS: &str = "insert into artex.flow_waits
        (task_id, flow_id, signal, until, wait_for, timeout, on_timeout, spec)
    select v.id, $1, v.signal, v.until, make_interval(secs => v.wait_for),
           make_interval(secs => v.timeout), v.on_timeout, v.spec
    from unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::float8[], $6::float8[],
                $7::text[], $8::jsonb[])
           as v(id, signal, until, wait_for, timeout, on_timeout, spec)";

const REACH_WAITS: &str = "select artex.reach_waits($1::uuid[])";

pub(crate) const FLOW: &str = "select name, created_at from artex.flows where id = $1";

pub(crate) const FLOW_TASKS: &str = "select t.id, t.flow_task, t.kind, t.status::text, t.retries,
        t.started_at, t.finished_at, t.error,
        coalesce((select array_agg(u.flow_task order by u.flow_task)
                  from artex.task_dependencies d join artex.tasks u on u.id = d.depends_on
                  where d.task_id = t.id), '{}'),
        w.spec, w.reached_at, w.due_at, g.received_at, g.actor
    from artex.tasks t
    left join artex.flow_waits w on w.task_id = t.id
    left join artex.flow_signals g on g.flow_id = w.flow_id and g.name = w.signal
    where t.flow_id = $1
    order by t.id";

const TARGET: &str = "select exists (select 1 from artex.tasks where id = $1),
        exists (select 1 from artex.flows where id = $1)";

// Each control locks its tasks in id order first (as the flow trigger does) so that it
// cannot deadlock with completions and cascades in the same flow. `{col}` is `id` (one
// task) or `flow_id` (a flow).
const PAUSE: &str = "with target as materialized (
        select id from artex.tasks where {col} = $3 and status in ('pending', 'blocked')
        order by id for update
    )
    update artex.tasks t set status = 'paused'
    from artex.set_context($1, $2) ctx, target
    where ctx and t.id = target.id
    returning t.id, t.status::text";

// Resume takes the upstream counters' locks before the tasks' (the order the promotion
// trigger takes them in), and reads the counters through those locks: a completion that
// committed a moment ago is seen, one in flight is waited for. Without this, a task
// resumed while its last upstream task commits could go back to `blocked` for good.
const RESUME_LOCK_WAITS: &str = "select w.task_id from artex.task_waits w
    where w.task_id in (select id from artex.tasks where {col} = $1 and status = 'paused')
    order by w.task_id for update";

const RESUME: &str = "with target as materialized (
        select id from artex.tasks where {col} = $3 and status = 'paused'
        order by id for update
    )
    update artex.tasks t
    set status = case when exists (select 1 from artex.task_waits w
                                   where w.task_id = t.id and w.upstream_left > 0)
                           -- A wait (V40) is never runnable: blocked until it ends.
                           or exists (select 1 from artex.flow_waits fw where fw.task_id = t.id)
                      then 'blocked'::artex.task_status else 'pending' end
    from artex.set_context($1, $2) ctx, target
    where ctx and t.id = target.id
    returning t.id, t.status::text";

// A control of a whole flow (pause, resume, cancel) first locks the flow's row, in a
// statement of its own, so that the control reads its snapshot once no upload's task is
// joining the flow: each such join holds the row `for key share` (uploads.rs, LOCK_FLOW)
// from before it reads the flow's state until it commits. A task that joined before is
// seen (canceled, paused or resumed with the rest); one joining after waits, then finds
// the flow over (held paused), paused (held paused with it) or running (pending). The
// lock inside the control's statement would not do: under READ COMMITTED a statement
// keeps its first snapshot whatever it waits for. The flow's row comes before its
// tasks' and their upstream counters': nothing locks a flow's row while it holds one of
// those, so this order adds no deadlock.
const LOCK_FLOW_TO_CONTROL: &str = "select 1 from artex.flows where id = $1 for update";

// Canceling a held task wakes its worker (the flow trigger notifies the worker's
// channel), which stops the handler; its outcome, if any, is fenced off.
const CANCEL: &str = "with target as materialized (
        select id from artex.tasks where {col} = $3
          and status not in ('succeeded', 'failed', 'timeout', 'canceled')
        order by id for update
    )
    update artex.tasks t set status = 'canceled'
    from artex.set_context($1, $2) ctx, target
    where ctx and t.id = target.id
    returning t.id, t.status::text";

const STATUS_COUNTS: &str = "select status::text, count(*) from artex.tasks
    where {col} = $1 group by 1 order by 1";

fn past_tense(c: Control) -> &'static str {
    match c {
        Control::Pause => "paused",
        Control::Resume => "resumed",
        Control::Cancel => "canceled",
    }
}

impl OperatorBoard {
    /// Validates `spec` and inserts it in one transaction: the flow, its tasks (`pending`
    /// without upstream tasks, `blocked` otherwise), their dependencies and upstream
    /// counters. Nothing is inserted if anything is wrong. Returns the flow id.
    pub async fn submit_flow(&self, spec: &FlowSpec, actor: &str) -> Result<Uuid> {
        let deps = spec.validate()?;
        let flow = Uuid::now_v7();
        let ids: Vec<Uuid> = spec.tasks.iter().map(|_| Uuid::now_v7()).collect();
        let names: Vec<&str> = spec.tasks.iter().map(|t| t.name.as_str()).collect();
        let kinds: Vec<&str> = spec
            .tasks
            .iter()
            .map(|t| match t.wait {
                Some(_) => WAIT_KIND,
                None => t.kind.as_str(),
            })
            .collect();
        let payloads: Vec<&serde_json::Value> = spec.tasks.iter().map(|t| &t.payload).collect();
        let priorities: Vec<i32> = spec.tasks.iter().map(|t| t.priority).collect();
        let max_retries: Vec<Option<i32>> = spec.tasks.iter().map(|t| t.max_retries).collect();
        let timeouts: Vec<Option<i32>> = spec.tasks.iter().map(|t| t.timeout_ms).collect();
        let shard_keys: Vec<Option<&str>> =
            spec.tasks.iter().map(|t| t.shard_key.as_deref()).collect();
        // A wait is blocked until it ends: never runnable.
        let statuses: Vec<&str> = deps
            .iter()
            .zip(&spec.tasks)
            .map(|(d, t)| {
                if d.is_empty() && t.wait.is_none() {
                    "pending"
                } else {
                    "blocked"
                }
            })
            .collect();
        let waits = FlowWaits::of(spec, &ids)?;
        let (mut dep_task, mut dep_on) = (Vec::new(), Vec::new());
        let (mut wait_task, mut wait_left) = (Vec::new(), Vec::new());
        for (i, d) in deps.iter().enumerate() {
            for &j in d {
                dep_task.push(ids[i]);
                dep_on.push(ids[j]);
            }
            if !d.is_empty() {
                wait_task.push(ids[i]);
                wait_left.push(d.len() as i32);
            }
        }
        let reason = format!("submitted in flow '{}'", spec.name);
        let tx = Tx::new(self.bb.client().await?);
        tx.begin().await?;
        tx.execute(INSERT_FLOW, &[&flow, &spec.name]).await?;
        tx.execute(
            INSERT_FLOW_TASKS,
            &[
                &actor,
                &reason,
                &flow,
                &ids,
                &names,
                &kinds,
                &payloads,
                &priorities,
                &max_retries,
                &timeouts,
                &shard_keys,
                &statuses,
            ],
        )
        .await?;
        if !dep_task.is_empty() {
            tx.execute(INSERT_DEPENDENCIES, &[&dep_task, &dep_on])
                .await?;
            tx.execute(INSERT_WAITS, &[&wait_task, &wait_left]).await?;
        }
        if !waits.ids.is_empty() {
            tx.execute(
                INSERT_FLOW_WAITS,
                &[
                    &flow,
                    &waits.ids,
                    &waits.signals,
                    &waits.until,
                    &waits.wait_for,
                    &waits.timeout,
                    &waits.on_timeout,
                    &waits.specs,
                ],
            )
            .await?;
            tx.execute(REACH_WAITS, &[&waits.ids]).await?;
        }
        tx.commit().await?;
        Ok(flow)
    }

    /// A flow with each task's name, id and status, and its overall state; or
    /// `FlowNotFound`.
    pub async fn flow(&self, id: Uuid) -> Result<FlowView> {
        let client = self.bb.client().await?;
        let Some(row) = client.query_opt(FLOW, &[&id]).await? else {
            return Err(Error::FlowNotFound(id));
        };
        let name: String = row.try_get(0)?;
        let created_at: DateTime<Utc> = row.try_get(1)?;
        let tasks = client
            .query(FLOW_TASKS, &[&id])
            .await?
            .iter()
            .map(|r| {
                Ok(FlowTaskView {
                    id: r.try_get(0)?,
                    name: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    status: r.try_get::<_, String>(3)?.parse()?,
                    retries: r.try_get(4)?,
                    started_at: r.try_get(5)?,
                    finished_at: r.try_get(6)?,
                    error: r.try_get(7)?,
                    depends_on: r.try_get(8)?,
                    wait: match r.try_get::<_, Option<serde_json::Value>>(9)? {
                        Some(spec) => Some(WaitView {
                            spec,
                            reached_at: r.try_get(10)?,
                            due_at: r.try_get(11)?,
                            signal_received_at: r.try_get(12)?,
                            signal_from: r.try_get(13)?,
                        }),
                        None => None,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut counts = BTreeMap::new();
        for t in &tasks {
            *counts.entry(t.status.as_str().to_string()).or_insert(0) += 1;
        }
        Ok(FlowView {
            id,
            name,
            created_at,
            state: FlowState::of(tasks.iter().map(|t| t.status)),
            counts,
            tasks,
        })
    }

    /// Whether `id` names a task or a flow; `Invalid` if neither.
    pub async fn control_target(&self, id: Uuid) -> Result<ControlTarget> {
        let client = self.bb.client().await?;
        let row = client.query_one(TARGET, &[&id]).await?;
        match (row.try_get::<_, bool>(0)?, row.try_get::<_, bool>(1)?) {
            (true, _) => Ok(ControlTarget::Task(id)),
            (false, true) => Ok(ControlTarget::Flow(id)),
            (false, false) => Err(Error::Invalid(format!("no task or flow with id {id}"))),
        }
    }

    /// Applies an operator control to a task or to every task of a flow, recording
    /// `actor` and `reason` in each task's audit trail. A control that changes nothing
    /// (resume a succeeded task, cancel an ended flow, …) is refused with `Refused`,
    /// saying what the tasks' statuses are.
    pub async fn control(
        &self,
        control: Control,
        id: Uuid,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<ControlReport> {
        let target = self.control_target(id).await?;
        let col = match target {
            ControlTarget::Task(_) => "id",
            ControlTarget::Flow(_) => "flow_id",
        };
        let default_reason = format!("{} by operator", past_tense(control));
        let reason = reason.unwrap_or(&default_reason);
        let tx = Tx::new(self.bb.client().await?);
        tx.begin().await?;
        if let ControlTarget::Flow(flow) = target {
            tx.query(LOCK_FLOW_TO_CONTROL, &[&flow]).await?;
        }
        let sql = match control {
            Control::Pause => PAUSE,
            Control::Resume => {
                tx.query(&RESUME_LOCK_WAITS.replace("{col}", col), &[&id])
                    .await?;
                RESUME
            }
            Control::Cancel => CANCEL,
        };
        let rows = tx
            .query(&sql.replace("{col}", col), &[&actor, &reason, &id])
            .await?;
        let changed = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get::<_, String>(1)?.parse()?)))
            .collect::<Result<Vec<(Uuid, TaskStatus)>>>()?;
        if control == Control::Resume && !changed.is_empty() {
            // A resumed wait whose upstream tasks have succeeded is reached: its timer
            // starts, a signal kept while it was paused completes it.
            let ids: Vec<Uuid> = changed.iter().map(|(id, _)| *id).collect();
            tx.execute(REACH_WAITS, &[&ids]).await?;
        }
        if changed.is_empty() {
            let counts: Vec<String> = tx
                .query(&STATUS_COUNTS.replace("{col}", col), &[&id])
                .await?
                .iter()
                .map(|r| {
                    Ok(format!(
                        "{} {}",
                        r.try_get::<_, i64>(1)?,
                        r.try_get::<_, String>(0)?
                    ))
                })
                .collect::<Result<_>>()?;
            tx.rollback().await;
            return Err(Error::Refused(match target {
                ControlTarget::Task(_) => format!(
                    "cannot {} task {id}: it is {}; {} applies to {}",
                    control.as_str(),
                    counts
                        .first()
                        .and_then(|c| c.split_once(' '))
                        .map(|(_, s)| s)
                        .unwrap_or("gone"),
                    control.as_str(),
                    control.applies_to()
                ),
                ControlTarget::Flow(_) => format!(
                    "cannot {} flow {id}: none of its tasks is affected ({}); {} applies to {}",
                    control.as_str(),
                    if counts.is_empty() {
                        "it has no tasks".to_string()
                    } else {
                        counts.join(", ")
                    },
                    control.as_str(),
                    control.applies_to()
                ),
            }));
        }
        tx.commit().await?;
        Ok(ControlReport {
            control,
            target,
            changed,
        })
    }
}

/// A flow's waits as the insert takes them, one array per column.
#[derive(Default)]
struct FlowWaits {
    ids: Vec<Uuid>,
    signals: Vec<Option<String>>,
    until: Vec<Option<DateTime<Utc>>>,
    wait_for: Vec<Option<f64>>,
    timeout: Vec<Option<f64>>,
    on_timeout: Vec<&'static str>,
    specs: Vec<serde_json::Value>,
}

impl FlowWaits {
    /// The waits of `spec`, whose tasks have the ids `ids`.
    fn of(spec: &FlowSpec, ids: &[Uuid]) -> Result<FlowWaits> {
        let mut w = FlowWaits::default();
        for (t, id) in spec.tasks.iter().zip(ids) {
            let Some(ws) = &t.wait else { continue };
            let wait = ws
                .resolve()
                .map_err(|e| Error::Invalid(format!("task '{}': wait: {e}", t.name)))?;
            w.ids.push(*id);
            w.signals.push(wait.signal);
            w.until.push(wait.until);
            w.wait_for.push(wait.wait_for.map(|d| d.as_secs_f64()));
            w.timeout.push(wait.timeout.map(|d| d.as_secs_f64()));
            w.on_timeout.push(wait.on_timeout.as_str());
            w.specs.push(serde_json::to_value(ws).unwrap_or_default());
        }
        Ok(w)
    }
}

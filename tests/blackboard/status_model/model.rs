//! The model: what the rules (SPEC §1, the migrations) say each step does to a task row,
//! written from the rules and not from the trigger's code: legal or refused, by which
//! rule, and the row, the history rows and the workers' counters after it.

use std::collections::BTreeMap;

use chrono::Duration as Span;
use serde_json::json;

use super::*;

impl Model {
    /// The `new` row the before-update trigger returns for `n` (what the statement wrote)
    /// at `now`, or why it refuses; then the table's check constraints.
    fn trigger(&self, mut n: Row, now: Ts) -> Result<Row, Refusal> {
        let old = &self.row;
        n.updated_at = now;
        if n.lease_epoch < old.lease_epoch {
            return Err(vec!["fencing token of task"]);
        }
        if n.status == old.status {
            // Not a transition: a renewal, a checkpoint, or a handover, which fences the
            // previous holder off.
            if n.assigned_to != old.assigned_to && n.lease_epoch == old.lease_epoch {
                n.lease_epoch = old.lease_epoch + 1;
            }
        } else {
            // A write from `assigned` straight to an outcome that says when the handler
            // started is that start and that outcome (V3); a start time it does not say
            // (NULL) says nothing.
            let ran = old.status == St::Assigned
                && !matches!(n.status, St::Assigned | St::Running | St::Canceled)
                && n.started_at.is_some()
                && n.started_at != old.started_at;
            let was = if ran { St::Running } else { old.status };
            if !(legal(old.status, n.status) || (ran && legal(was, n.status))) {
                return Err(vec!["illegal task transition"]);
            }
            if ran && n.started_at.is_some_and(|t| t > now) {
                return Err(vec!["cannot have started in the future"]);
            }
            // A retry past the budget ends the task for good.
            if n.status == St::Pending && was.held() && n.retries > n.max_retries {
                n.status = if was == St::Assigned || n.error.is_none() {
                    St::Timeout
                } else {
                    St::Failed
                };
            }
            match n.status {
                St::Assigned => {
                    if n.assigned_to.is_none() || n.lease_until.is_none() {
                        return Err(vec!["needs assigned_to and lease_until"]);
                    }
                    n.lease_epoch = old.lease_epoch + 1;
                }
                St::Running => {
                    if n.assigned_to != old.assigned_to {
                        return Err(vec!["is assigned to"]);
                    }
                    if n.started_at == old.started_at || n.started_at.is_some_and(|t| t > now) {
                        n.started_at = Some(now);
                    }
                }
                _ => {
                    n.assigned_to = None;
                    n.lease_until = None;
                }
            }
            if n.status.terminal() {
                n.finished_at = Some(now);
            }
        }
        let mut broken = Vec::new();
        if n.status.held() != n.assigned_to.is_some() {
            broken.push("holder_only_while_held");
        }
        if n.status.held() != n.lease_until.is_some() {
            broken.push("lease_only_while_held");
        }
        if n.retries > n.max_retries + 1 {
            broken.push("retries_within_budget");
        }
        if n.retries < 0 {
            broken.push("tasks_retries_check");
        }
        if n.max_retries < 0 {
            broken.push("tasks_max_retries_check");
        }
        if n.assigned_to.as_deref() == Some("") {
            broken.push("tasks_assigned_to_check");
        }
        if n.error.as_deref() == Some("") {
            broken.push("tasks_error_check");
        }
        if broken.is_empty() {
            Ok(n)
        } else {
            Err(broken)
        }
    }

    /// The history rows the after-update trigger writes for `old → n` (V10): none for an
    /// assignment or a write that moves nothing; the assignment's own row when it ends
    /// unstarted; the start and the outcome of a task that ran in one write.
    fn history_rows(&self, n: &Row, now: Ts, ctx: &Ctx) -> Vec<Hist> {
        let old = &self.row;
        let moved = n.status != old.status && n.status != St::Assigned;
        let handed =
            n.status == old.status && n.assigned_to != old.assigned_to && n.assigned_to.is_some();
        if !moved && !handed {
            return Vec::new();
        }
        let ran = old.status == St::Assigned
            && !matches!(n.status, St::Assigned | St::Running | St::Canceled)
            && n.started_at.is_some()
            && n.started_at != old.started_at;
        let actor = ctx.actor.clone().unwrap_or_else(|| self.user.clone());
        let worker = n.assigned_to.clone().or_else(|| old.assigned_to.clone());
        let or_error = |to: St, from_running: bool| {
            ctx.reason.clone().or_else(|| {
                (matches!(to, St::Failed | St::Pending) && from_running)
                    .then(|| n.error.clone())
                    .flatten()
            })
        };
        let mut rows = Vec::new();
        if old.status == St::Assigned && n.status != St::Running && !ran {
            rows.push(Hist {
                from: Some(St::Pending),
                to: St::Assigned,
                reason: Some("assigned".into()),
                actor: actor.clone(),
                worker: old.assigned_to.clone(),
                lease_epoch: old.lease_epoch,
                at: old.updated_at,
                assigned_at: None,
            });
        }
        let reason = if old.status == n.status {
            ctx.reason.clone().or(Some("handed over".into()))
        } else if ran {
            Some("started".into())
        } else if old.status == St::Assigned && n.status == St::Running {
            ctx.reason.clone().or(Some("started".into()))
        } else {
            or_error(n.status, old.status == St::Running)
        };
        rows.push(Hist {
            from: Some(old.status),
            to: if ran { St::Running } else { n.status },
            reason,
            actor: actor.clone(),
            worker: worker.clone(),
            lease_epoch: n.lease_epoch,
            at: if ran {
                n.started_at.expect("a task that ran says when it started")
            } else {
                now
            },
            assigned_at: (old.status == St::Assigned && (ran || n.status == St::Running))
                .then_some(old.updated_at),
        });
        if ran {
            rows.push(Hist {
                from: Some(St::Running),
                to: n.status,
                reason: or_error(n.status, true),
                actor,
                worker,
                lease_epoch: n.lease_epoch,
                at: now,
                assigned_at: None,
            });
        }
        rows
    }

    /// Applies a matched write at `now`: the row, its history and the held counters
    /// (V12: gains to `workers.taken` of a registered worker, losses to
    /// `worker_released`).
    pub(super) fn apply(&mut self, change: &Change, now: Ts) -> Result<(), Refusal> {
        let n = self.trigger((change.new)(now), now)?;
        let rows = self.history_rows(&n, now, &change.ctx);
        let old = &self.row;
        let mut delta: BTreeMap<String, i64> = BTreeMap::new();
        if old.status.held() && (!n.status.held() || n.assigned_to != old.assigned_to) {
            *delta.entry(old.assigned_to.clone().unwrap()).or_default() -= 1;
        }
        if n.status.held() && (!old.status.held() || n.assigned_to != old.assigned_to) {
            *delta.entry(n.assigned_to.clone().unwrap()).or_default() += 1;
        }
        for (w, d) in delta {
            if d > 0 {
                if let Some(t) = self.taken.get_mut(&w) {
                    *t += d;
                }
            } else if d < 0 {
                *self.released.entry(w).or_default() -= d;
            }
        }
        self.history.extend(rows);
        self.row = n;
        Ok(())
    }

    /// What the database must make of `op` on the current row.
    pub(super) fn expect(&self, op: &Op) -> Expect {
        let old = self.row.clone();
        let held_by = |w: &str| old.status.held() && old.assigned_to.as_deref() == Some(w);
        let changed = |ctx: Ctx, f: Box<dyn Fn(Ts) -> Row>| Expect::Changed(Change { new: f, ctx });
        let ctx = |actor: &str, reason: Option<&str>| Ctx {
            actor: Some(actor.to_string()),
            reason: reason.map(str::to_string),
        };
        match op {
            Op::Raw(r) => {
                let r = r.clone();
                let c = match r.context {
                    Some((a, reason)) => ctx(a, reason),
                    None => Ctx::default(),
                };
                changed(
                    c,
                    Box::new(move |now| {
                        let mut n = old.clone();
                        if let Some(s) = r.status {
                            n.status = s;
                        }
                        if let Some(h) = r.holder {
                            n.assigned_to = h.map(str::to_string);
                        }
                        if let Some(l) = r.lease_secs {
                            n.lease_until = l.map(|s| now + Span::seconds(s));
                        }
                        if let Some(d) = r.epoch_delta {
                            n.lease_epoch = old.lease_epoch + d;
                        }
                        if let Some(d) = r.retries_delta {
                            n.retries = old.retries + d;
                        }
                        if let Some(m) = r.max_retries {
                            n.max_retries = m;
                        }
                        if let Some(e) = r.error {
                            n.error = e.map(str::to_string);
                        }
                        if let Some(s) = r.started_ago_ms {
                            n.started_at = s.map(|ms| now - Span::milliseconds(ms));
                        }
                        n
                    }),
                )
            }
            Op::Assign { worker, secs } => {
                if old.status != St::Pending {
                    return Expect::Unmatched;
                }
                let (w, secs) = (worker.to_string(), *secs);
                changed(
                    ctx("planner", Some("assigned")),
                    Box::new(move |now| Row {
                        status: St::Assigned,
                        assigned_to: Some(w.clone()),
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::Record {
                worker,
                epoch,
                step,
                started_ago_ms,
            } => {
                let exhausted = old.retries + 1 > old.max_retries;
                let (status, result, error, failed, delay_ms) = match *step {
                    StepKind::Start => (St::Running, None, None, false, 0),
                    StepKind::Succeeded => (St::Succeeded, Some(json!({"ok": 1})), None, false, 0),
                    StepKind::Failed { retry_in_ms } => (
                        if exhausted { St::Failed } else { St::Pending },
                        None,
                        Some("boom"),
                        true,
                        retry_in_ms,
                    ),
                    StepKind::TimedOut { retry_in_ms } => (
                        if exhausted { St::Timeout } else { St::Pending },
                        None,
                        Some("ran past 5s"),
                        true,
                        retry_in_ms,
                    ),
                    StepKind::Released => (St::Pending, None, None, false, 0),
                    StepKind::Discarded => {
                        (St::Failed, None, Some("discarded: bad input"), true, 0)
                    }
                    StepKind::Snoozed { delay_ms } => (
                        St::Pending,
                        None,
                        Some("snoozed for a while"),
                        false,
                        delay_ms,
                    ),
                };
                let matched = old.lease_epoch == epoch.of(old.lease_epoch)
                    && old.assigned_to.as_deref() == Some(*worker)
                    && (old.status == St::Running
                        || (old.status == St::Assigned
                            && (started_ago_ms.is_some() || status == St::Pending)));
                if !matched {
                    return Expect::Unmatched;
                }
                let ago = *started_ago_ms;
                changed(
                    ctx(worker, None),
                    Box::new(move |now| Row {
                        status,
                        result: result.clone(),
                        error: error.map(str::to_string).or_else(|| old.error.clone()),
                        retries: old.retries + i32::from(failed),
                        run_at: if status == St::Pending {
                            now + Span::milliseconds(delay_ms)
                        } else {
                            old.run_at
                        },
                        started_at: match ago {
                            Some(ms) if old.status == St::Assigned => {
                                Some(now - Span::milliseconds(ms))
                            }
                            _ => old.started_at,
                        },
                        ..old.clone()
                    }),
                )
            }
            Op::Renew {
                worker,
                epoch,
                secs,
            } => {
                if !(held_by(worker) && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let secs = *secs;
                let Expect::Changed(change) = changed(
                    Ctx::default(),
                    Box::new(move |now| Row {
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                ) else {
                    unreachable!()
                };
                Expect::Renewal { secs, change }
            }
            Op::Checkpoint { epoch, n } => {
                if !(old.status.held() && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let n = *n;
                changed(
                    Ctx {
                        actor: old.assigned_to.clone(),
                        reason: Some("started".into()),
                    },
                    Box::new(move |_| Row {
                        checkpoint: Some(json!({ "done": n })),
                        status: St::Running,
                        ..old.clone()
                    }),
                )
            }
            Op::Release { worker, spare } => {
                if *spare
                    || old.status != St::Assigned
                    || old.assigned_to.as_deref() != Some(*worker)
                {
                    return Expect::Unmatched;
                }
                changed(
                    ctx(worker, Some("draining")),
                    Box::new(move |_| Row {
                        status: St::Pending,
                        ..old.clone()
                    }),
                )
            }
            Op::TakeOver {
                from,
                to,
                epoch,
                secs,
            } => {
                // Sent again after its answer was lost: `to` holds the task at the next
                // epoch of the one named; its lease is extended, nothing else changes.
                if held_by(to) && matches!(epoch, Epoch::Stale) {
                    let secs = *secs;
                    return changed(
                        ctx(to, Some(&format!("handed over by {from}"))),
                        Box::new(move |now| Row {
                            lease_until: Some(now + Span::seconds(secs)),
                            ..old.clone()
                        }),
                    );
                }
                if !(held_by(from) && old.lease_epoch == epoch.of(old.lease_epoch)) {
                    return Expect::Unmatched;
                }
                let (to_w, secs) = (to.to_string(), *secs);
                changed(
                    ctx(to, Some(&format!("handed over by {from}"))),
                    Box::new(move |now| Row {
                        assigned_to: Some(to_w.clone()),
                        lease_epoch: old.lease_epoch + 1,
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::MoveAssigned {
                from,
                to,
                spare,
                secs,
            } => {
                if *spare || old.status != St::Assigned || old.assigned_to.as_deref() != Some(*from)
                {
                    return Expect::Unmatched;
                }
                let (to_w, secs) = (to.to_string(), *secs);
                changed(
                    ctx(from, Some(&format!("handed over to {to}"))),
                    Box::new(move |now| Row {
                        assigned_to: Some(to_w.clone()),
                        lease_epoch: old.lease_epoch + 1,
                        lease_until: Some(now + Span::seconds(secs)),
                        ..old.clone()
                    }),
                )
            }
            Op::Control { control, reason } => {
                let (to, applies, done) = match control {
                    Ctl::Pause => (
                        St::Paused,
                        matches!(old.status, St::Pending | St::Blocked),
                        "paused",
                    ),
                    // No flow, so nothing upstream to wait on: back to pending.
                    Ctl::Resume => (St::Pending, old.status == St::Paused, "resumed"),
                    Ctl::Cancel => (St::Canceled, !old.status.terminal(), "canceled"),
                };
                if !applies {
                    return Expect::Unmatched;
                }
                let reason = reason
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{done} by operator"));
                changed(
                    ctx("op", Some(&reason)),
                    Box::new(move |_| Row {
                        status: to,
                        ..old.clone()
                    }),
                )
            }
        }
    }
}

//! What the checker proves in every reachable state (`always`), and what it must reach
//! at least once (`sometimes`) so that the proof is not vacuous.
//!
//! "No task is lost" and "a drain ends" are liveness: stateright checks `eventually` only
//! at the ends of paths, and may miss a counterexample where paths join (its own FIXME).
//! So they are checked as an `always` property instead, at every state the clock's
//! horizon stops: from there, with no more faults, the protocol's own steps run in a
//! fixed fair order (a partition heals; the reaper, planners and workers act; the clock
//! moves when nothing else is left) and must end every task and finish the upgrade.

use stateright::Property;

use crate::actions::Action;
use crate::model::Protocol;
use crate::state::{Doing, Seen, State, Status};

/// The properties, by name.
pub mod names {
    /// No two handlers of one task run at once (leases and the fence).
    pub const NO_OVERLAP: &str = "no two executions of a task overlap";
    /// Every write a worker made that the blackboard accepted named the row's epoch.
    pub const FENCING: &str = "every accepted write names the task's current epoch";
    /// A transferred task resumes from its checkpoint.
    pub const NO_RESTART: &str = "a transferred task never starts again from scratch";
    /// Every task ends and the drain ends, once faults stop.
    pub const RECOVERS: &str = "no task is lost and the drain ends, once faults stop";
    /// Only transitions the status machine allows.
    pub const STATUS_MACHINE: &str = "every status change is one the trigger allows";
}

/// Every property of the model.
pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(names::NO_OVERLAP, |m: &Protocol, s: &State| {
            (0..s.tasks.len()).all(|t| s.executions(t, |h| m.executing(s, h)).count() <= 1)
        }),
        Property::always(names::FENCING, |_, s: &State| !s.ghost.stale_write),
        Property::always(names::NO_RESTART, |m: &Protocol, s: &State| {
            no_restart(m, s)
        }),
        Property::always(names::STATUS_MACHINE, |_, s: &State| {
            !s.ghost.illegal_transition
        }),
        Property::always(names::RECOVERS, |m: &Protocol, s: &State| {
            s.now < m.bound.horizon || recovers(m, s).is_ok()
        }),
        Property::sometimes("an upgrade completes", |_, s: &State| {
            s.phase == crate::state::Phase::Done
        }),
        Property::sometimes("the reaper rescues a task", |_, s: &State| {
            s.ghost.seen & Seen::RESCUE != 0
        }),
        Property::sometimes(
            "a transferred task resumes from its checkpoint",
            |_, s: &State| s.ghost.seen & Seen::RESUMED != 0,
        ),
        Property::sometimes("a worker cut off stops a handler itself", |_, s: &State| {
            s.ghost.seen & Seen::SELF_FENCED != 0
        }),
        Property::sometimes("a stale write is fenced off", |_, s: &State| {
            s.ghost.seen & Seen::FENCED_OFF != 0
        }),
        Property::sometimes("every task succeeds", |_, s: &State| {
            s.tasks.iter().all(|t| t.status == Status::Succeeded)
        }),
    ]
}

/// Every execution of a task suspended for the transfer starts at least from the
/// checkpoint it was suspended at.
fn no_restart(m: &Protocol, s: &State) -> bool {
    (0..s.tasks.len()).all(|t| {
        let Some(at) = s.ghost.suspended_at[t] else {
            return true;
        };
        s.executions(t, |h| m.executing(s, h))
            .all(|h| match h.what {
                Doing::Running { from, .. } => from >= at,
                _ => true,
            })
    })
}

/// How many steps the recovery check's continuation may take.
const RECOVERY_STEPS: usize = 400;

/// From `s`, with no more faults, the protocol's steps in a fixed fair order: every task
/// must end and the upgrade (if begun) finish. `Err` says where it got stuck.
pub fn recovers(m: &Protocol, s: &State) -> Result<(), String> {
    let mut s = s.clone();
    let mut actions = Vec::new();
    let mut path = Vec::new();
    for _ in 0..RECOVERY_STEPS {
        let key = hash(&s);
        let known = m
            .recovered
            .lock()
            .map(|k| k.contains(&key))
            .unwrap_or(false);
        if known || (s.all_ended() && s.upgrade_settled()) {
            if let Ok(mut k) = m.recovered.lock() {
                k.extend(path);
            }
            return Ok(());
        }
        path.push(key);
        if s.now >= recovery_clock_limit(m) {
            break;
        }
        actions.clear();
        m.enabled(&s, true, &mut actions);
        actions.retain(|a| !a.is_fault() && !matches!(a, Action::Spawn));
        actions.sort_by_key(rank);
        let next = actions.iter().find_map(|a| m.step(&s, a));
        match next {
            Some(n) => s = n,
            None => break,
        }
    }
    Err(format!(
        "stuck at clock {} with tasks {:?}, upgrade {:?}",
        s.now,
        s.tasks
            .iter()
            .map(|t| (t.status, t.holder))
            .collect::<Vec<_>>(),
        s.phase
    ))
}

/// How far past the horizon the continuation's clock may run: ten leases, more than any
/// recovery needs (a lease to run out, a retry, an upgrade's steps).
fn recovery_clock_limit(m: &Protocol) -> u8 {
    m.bound
        .horizon
        .saturating_add(m.bound.lease.saturating_mul(10))
        .min(200)
}

fn hash(s: &State) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// The continuation's order: what unblocks others first, the clock last.
fn rank(a: &Action) -> u8 {
    match a {
        Action::Heal { .. } => 0,
        Action::MarkGone { .. } => 1,
        Action::Push { .. } | Action::Probe { .. } => 2,
        Action::RecordOutcome { .. } => 3,
        Action::Work { .. } => 4,
        Action::RecordStart { .. } => 5,
        Action::Suspend { .. } => 6,
        Action::Read { .. } => 7,
        Action::Reclaim { .. } => 8,
        Action::MarkUpgrading
        | Action::MoveAssigned
        | Action::TakeOver
        | Action::DrainRelease
        | Action::DrainEnd => 9,
        Action::Claim { .. }
        | Action::Assign { .. }
        | Action::WorkerClaim { .. }
        | Action::Born { .. } => 10,
        Action::Renew { .. } => 11,
        Action::Checkpoint { .. } => 12,
        Action::Fence { .. } => 13,
        Action::Spawn | Action::Crash { .. } | Action::Partition { .. } => 14,
        Action::Tick => 15,
    }
}

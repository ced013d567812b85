//! The protocol as a `stateright` model: its bound, the guards a broken variant turns
//! off, the initial state, which steps are enabled where, and the properties checked.

use stateright::{Model, Property};

use crate::actions::Action;
use crate::properties;
use crate::state::{Doing, Ghost, Held, Phase, Proc, Role, Row, State, Status, WorkerState};

/// How big a world the checker explores, and its clock's units.
#[derive(Clone, Debug)]
pub struct Bound {
    /// Planner processes (each runs rounds, pushes and the reaper's sweeps).
    pub planners: u8,
    /// Worker processes at the start, the upgraded one among them (with `upgrade`).
    pub workers: u8,
    /// Tasks, all pending at the start.
    pub tasks: u8,
    /// Whether one hot upgrade happens (the first worker is upgraded; its new process is
    /// one more worker slot).
    pub upgrade: bool,
    /// Worker crashes the environment may make.
    pub crashes: u8,
    /// Partitions the environment may make (a worker cut off, then healed).
    pub partitions: u8,
    /// The clock stops here: every state at it is checked for recovery.
    pub horizon: u8,
    /// A lease's length.
    pub lease: u8,
    /// How long before its lease's end a worker stops a handler (the fence's margin).
    pub margin: u8,
    /// How far a worker's clock may be off the blackboard's, in units.
    pub skew: u8,
    /// Units of work a task needs.
    pub work: u8,
    /// `max_retries` of every task.
    pub max_retries: u8,
}

impl Bound {
    /// The bound CI checks: see docs/model.md for why these numbers.
    pub fn ci() -> Bound {
        Bound {
            planners: 2,
            workers: 3,
            tasks: 1,
            upgrade: true,
            crashes: 1,
            partitions: 1,
            horizon: 7,
            lease: 4,
            margin: 2,
            skew: 1,
            work: 2,
            max_retries: 1,
        }
    }
}

/// The protocol's guards, each of which a broken variant may turn off to show that the
/// checker then finds a counterexample. All on: the protocol as artex runs it.
#[derive(Clone, Debug)]
pub struct Guards {
    /// `RECLAIM` takes back only leases that ran out (`lease_until < now()`).
    pub reaper_waits_for_lease: bool,
    /// `RECLAIM` takes back unstarted assignments too (`status in ('assigned',
    /// 'running')`), not only running tasks.
    pub reaper_takes_unstarted: bool,
    /// Every write of a worker names its epoch (`where lease_epoch = $n`).
    pub writes_name_epoch: bool,
    /// The new process resumes a taken-over task from the checkpoint `TAKE_OVER` returns.
    pub resume_from_checkpoint: bool,
    /// When a failed push recalls the task it announced, if it is still `assigned`
    /// (`RECALL`): artex recalls only when the push was refused, the worker's process
    /// being gone ([`Recall::WhenRefused`]); [`Recall::Always`], what artex did before,
    /// can overlap two executions (docs/model.md).
    pub recall: Recall,
}

/// When a failed push sends its task back to `pending` (waker.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recall {
    /// Never: a failed push only makes the worker unreachable for the planner; its
    /// tasks come back through their leases.
    Never,
    /// When the push was refused: no process listens at the worker's address, so none
    /// runs its handlers (a worker cut off, or slow to answer, keeps its tasks).
    WhenRefused,
    /// On any failure, a worker cut off after it read the task too.
    Always,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            reaper_waits_for_lease: true,
            reaper_takes_unstarted: true,
            writes_name_epoch: true,
            resume_from_checkpoint: true,
            recall: Recall::WhenRefused,
        }
    }
}

/// The model: the protocol within a bound, with its guards.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// The bound.
    pub bound: Bound,
    /// The guards (all on for the real protocol).
    pub guards: Guards,
    /// Whether the `sometimes` flags are kept (`Ghost::seen`): each one splits states
    /// that differ only in what happened before, so the exhaustive check runs without
    /// them and a check of its own shows they are reached.
    pub witness: bool,
    /// States (by hash) from which the recovery check's continuation is known to end
    /// every task and the drain: continuations from nearby states meet there.
    pub recovered: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<u64>>>,
}

/// Epochs past this are outside the explored space (a bound on re-assignments that the
/// horizon would reach anyway; `within_boundary`).
pub const EPOCH_CAP: u8 = 8;

impl Protocol {
    /// The protocol as artex runs it, within `bound`.
    pub fn new(bound: Bound) -> Protocol {
        Protocol {
            bound,
            guards: Guards::default(),
            witness: true,
            recovered: Default::default(),
        }
    }

    /// The first state: every task pending, every worker online and connected, the
    /// upgrade's new process not started yet.
    pub fn initial(&self) -> State {
        let b = &self.bound;
        let tasks = (0..b.tasks)
            .map(|_| Row {
                status: Status::Pending,
                holder: None,
                epoch: 0,
                lease_until: 0,
                retries: 0,
                checkpoint: 0,
            })
            .collect();
        let mut procs: Vec<Proc> = (0..b.workers)
            .map(|i| Proc {
                role: if b.upgrade && i == 0 {
                    Role::Old
                } else {
                    Role::Plain
                },
                state: WorkerState::Online,
                alive: true,
                connected: true,
                draining: false,
                held: vec![None; b.tasks as usize],
            })
            .collect();
        if b.upgrade {
            procs.push(Proc {
                role: Role::New,
                state: WorkerState::Unregistered,
                alive: false,
                connected: true,
                draining: false,
                held: vec![None; b.tasks as usize],
            });
        }
        State {
            now: 0,
            tasks,
            procs,
            claims: vec![None; b.planners as usize],
            pushes: vec![None; b.planners as usize],
            unreachable: vec![0; b.planners as usize],
            phase: Phase::Idle,
            crashes_left: b.crashes,
            partitions_left: b.partitions,
            ghost: Ghost {
                suspended_at: vec![None; b.tasks as usize],
                ..Ghost::default()
            },
        }
    }

    /// The moment by which the fence of a handler whose lease ends at `known_end` (by
    /// what its worker knows) has stopped it at the latest, on the blackboard's clock:
    /// the margin before the end, late by the skew.
    pub fn fence_deadline(&self, known_end: u8) -> i16 {
        i16::from(known_end) - i16::from(self.bound.margin) + i16::from(self.bound.skew)
    }

    /// Whether the handler of `h` may still run its code at the clock's `now`: its
    /// `Fenced` future polls it only until the fence's deadline (by its worker's clock,
    /// which may be late by the skew).
    pub fn executing(&self, s: &State, h: &Held) -> bool {
        matches!(h.what, Doing::Running { .. })
            && i16::from(s.now) <= self.fence_deadline(h.known_end)
    }

    /// Whether the clock may move on: no live handler has reached its fence's deadline.
    pub fn clock_may_move(&self, s: &State) -> bool {
        s.procs.iter().filter(|p| p.alive).all(|p| {
            p.held.iter().flatten().all(|h| {
                !matches!(h.what, Doing::Running { .. })
                    || i16::from(s.now) < self.fence_deadline(h.known_end)
            })
        })
    }

    /// The steps enabled in `s`; with `past_horizon`, the clock may run past the
    /// horizon (the recovery check's continuation).
    pub fn enabled(&self, s: &State, past_horizon: bool, out: &mut Vec<Action>) {
        if (past_horizon || s.now < self.bound.horizon) && self.clock_may_move(s) {
            out.push(Action::Tick);
        }
        self.planner_actions(s, out);
        self.insert_actions(s, out);
        self.worker_actions(s, out);
        self.upgrade_actions(s, out);
        self.fault_actions(s, out);
    }

    fn planner_actions(&self, s: &State, out: &mut Vec<Action>) {
        for p in 0..s.pushes.len() {
            let pu = p as u8;
            if s.pushes[p].is_some() {
                out.push(Action::Push { p: pu });
                continue;
            }
            if s.claims[p].is_some() {
                out.push(Action::Assign { p: pu });
                continue;
            }
            for (t, row) in s.tasks.iter().enumerate() {
                let locked = s.claims.iter().flatten().any(|c| usize::from(c.0) == t);
                if row.status != Status::Pending || row.epoch >= EPOCH_CAP || locked {
                    continue;
                }
                for (w, proc) in s.procs.iter().enumerate() {
                    if proc.state == WorkerState::Online && s.unreachable[p] & (1 << w) == 0 {
                        out.push(Action::Claim {
                            p: pu,
                            t: t as u8,
                            w: w as u8,
                        });
                    }
                }
            }
        }
        for p in 0..s.unreachable.len() {
            for (w, proc) in s.procs.iter().enumerate() {
                if s.unreachable[p] & (1 << w) != 0 && proc.reaches_db() {
                    out.push(Action::Probe {
                        p: p as u8,
                        w: w as u8,
                    });
                }
            }
        }
        for (t, row) in s.tasks.iter().enumerate() {
            let kept = row.status == Status::Assigned && !self.guards.reaper_takes_unstarted;
            let expired = row.lease_until < s.now || !self.guards.reaper_waits_for_lease;
            if row.status.held() && expired && !kept {
                out.push(Action::Reclaim { t: t as u8 });
            }
        }
        for (w, proc) in s.procs.iter().enumerate() {
            let silent = !proc.reaches_db();
            if silent && !matches!(proc.state, WorkerState::Gone | WorkerState::Unregistered) {
                out.push(Action::MarkGone { w: w as u8 });
            }
        }
    }

    /// A task never assigned may be born assigned to any registered worker (V62): the
    /// insert's view of the worker's row may be older than its state. (The model's tasks
    /// are there from the start: one never assigned stands for one being inserted.)
    fn insert_actions(&self, s: &State, out: &mut Vec<Action>) {
        for (t, row) in s.tasks.iter().enumerate() {
            // A row a planner's round has locked was committed before: not an insert.
            let locked = s.claims.iter().flatten().any(|c| usize::from(c.0) == t);
            if row.status != Status::Pending || row.epoch != 0 || locked {
                continue;
            }
            for (w, proc) in s.procs.iter().enumerate() {
                if proc.state != WorkerState::Unregistered {
                    out.push(Action::Born {
                        w: w as u8,
                        t: t as u8,
                    });
                }
            }
        }
    }

    fn worker_actions(&self, s: &State, out: &mut Vec<Action>) {
        for (w, proc) in s.procs.iter().enumerate() {
            if !proc.alive {
                continue;
            }
            let wu = w as u8;
            for (t, row) in s.tasks.iter().enumerate() {
                let tu = t as u8;
                let mine_now = row.status == Status::Assigned && row.holder == Some(wu);
                if let Some(h) = &proc.held[t] {
                    self.held_actions(s, proc, h, wu, tu, out);
                }
                let locked = s.claims.iter().flatten().any(|c| usize::from(c.0) == t);
                let claimable = row.status == Status::Pending && row.epoch < EPOCH_CAP && !locked;
                if proc.connected
                    && !proc.draining
                    && proc.state == WorkerState::Online
                    && claimable
                {
                    out.push(Action::WorkerClaim { w: wu, t: tu });
                }
                let unread = proc.held[t].as_ref().is_none_or(|h| h.epoch != row.epoch);
                if proc.connected && !proc.draining && mine_now && unread {
                    out.push(Action::Read { w: wu, t: tu });
                }
            }
            if proc.connected && self.renewed(s, w).is_some() {
                out.push(Action::Renew { w: wu });
            }
        }
    }

    /// The steps of the process `proc` (worker `w`) about the task `t` it holds as `h`.
    fn held_actions(&self, s: &State, proc: &Proc, h: &Held, w: u8, t: u8, out: &mut Vec<Action>) {
        match h.what {
            Doing::Running {
                progress,
                start_written,
                ..
            } => {
                let executing = self.executing(s, h);
                if executing {
                    out.push(Action::Work { w, t });
                }
                if proc.connected && progress + 1 < self.bound.work && executing {
                    out.push(Action::Checkpoint { w, t });
                }
                if proc.connected && !start_written {
                    out.push(Action::RecordStart { w, t });
                }
                if i16::from(s.now) >= self.fence_deadline(h.known_end) {
                    out.push(Action::Fence { w, t });
                }
                if s.phase == Phase::Suspending && proc.role == Role::Old {
                    out.push(Action::Suspend { t });
                }
            }
            Doing::Done { .. } if proc.connected => out.push(Action::RecordOutcome { w, t }),
            Doing::Done { .. } | Doing::Suspended => {}
        }
    }

    fn upgrade_actions(&self, s: &State, out: &mut Vec<Action>) {
        let (Some(old), Some(new)) = (s.proc_of(Role::Old), s.proc_of(Role::New)) else {
            return;
        };
        let (o, n) = (&s.procs[old], &s.procs[new]);
        match s.phase {
            Phase::Idle
                if o.alive && !o.draining && o.state == WorkerState::Online && n.connected =>
            {
                out.push(Action::Spawn)
            }
            Phase::Spawned if o.reaches_db() => out.push(Action::MarkUpgrading),
            Phase::Suspending if o.reaches_db() => {
                let running = o
                    .held
                    .iter()
                    .flatten()
                    .any(|h| matches!(h.what, Doing::Running { .. }));
                if !running {
                    out.push(Action::MoveAssigned);
                }
            }
            Phase::Moved if n.reaches_db() => out.push(Action::TakeOver),
            Phase::TakenOver if o.reaches_db() => out.push(Action::DrainRelease),
            Phase::Draining if o.reaches_db() && o.held.iter().all(Option::is_none) => {
                out.push(Action::DrainEnd)
            }
            _ => {}
        }
    }

    fn fault_actions(&self, s: &State, out: &mut Vec<Action>) {
        let upgrading = !s.upgrade_settled();
        for (w, proc) in s.procs.iter().enumerate() {
            let wu = w as u8;
            let in_upgrade = upgrading && proc.role != Role::Plain;
            if s.crashes_left > 0 && proc.alive && !in_upgrade {
                out.push(Action::Crash { w: wu });
            }
            if s.partitions_left > 0 && proc.alive && proc.connected {
                out.push(Action::Partition { w: wu });
            }
            if proc.alive && !proc.connected {
                out.push(Action::Heal { w: wu });
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.enabled(state, false, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        self.step(last, &action)
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.tasks.iter().all(|t| t.epoch <= EPOCH_CAP)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

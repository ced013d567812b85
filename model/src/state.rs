//! What the model holds: the blackboard's rows as the protocol reads and writes them (a
//! task's status, holder, fencing token, lease and checkpoint; a worker's state), each
//! process's own memory (what it runs, at which epoch, until when it thinks its lease
//! lasts), the planners' pushes in flight, the upgrade's step, the faults left, and a
//! few ghost facts the properties need (a ghost changes nothing the protocol reads).

/// A task's status, as `artex.task_status` has it (the ones the protocol moves through).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Runnable: a planner round may assign it.
    Pending,
    /// Given to a worker (`assigned_to`), its start not written yet.
    Assigned,
    /// Its start is written.
    Running,
    /// Ended with a result.
    Succeeded,
    /// Ended without one, for good (`failed` or `timeout`: retries spent).
    Failed,
}

impl Status {
    /// Held by a worker: `assigned` or `running`.
    pub fn held(self) -> bool {
        matches!(self, Status::Assigned | Status::Running)
    }

    /// Ended for good.
    pub fn ended(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }
}

/// Whether the status machine's trigger allows `from → to`: `artex.transition_allowed`
/// for the statuses the model uses (`failed` standing for `failed` and `timeout`).
pub fn transition_allowed(from: Status, to: Status) -> bool {
    use Status::*;
    from == to
        || match from {
            Pending => matches!(to, Assigned | Failed),
            Assigned => matches!(to, Running | Pending | Failed),
            Running => matches!(to, Succeeded | Failed | Pending),
            Succeeded | Failed => false,
        }
}

/// One row of `artex.tasks`, the columns the protocol reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    /// `status`.
    pub status: Status,
    /// `assigned_to`: NULL unless assigned or running.
    pub holder: Option<u8>,
    /// `lease_epoch`: the fencing token, bumped at every assignment and take-over.
    pub epoch: u8,
    /// `lease_until`, on the blackboard's clock.
    pub lease_until: u8,
    /// `retries`: failed attempts counted.
    pub retries: u8,
    /// `checkpoint`: the progress saved (0: none).
    pub checkpoint: u8,
}

/// A worker's `state` in `artex.workers` (`None` before it registered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkerState {
    /// Not registered yet (the upgrade's new process before it starts).
    Unregistered,
    /// Offered work by planner rounds.
    Online,
    /// The old process of an upgrade: out of the rounds.
    Upgrading,
    /// Draining: out of the rounds.
    Draining,
    /// Marked gone by the reaper, or by its own drain.
    Gone,
}

/// What a worker process holds of one task, in its own memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    /// The epoch it holds the task at: every write it makes names it.
    pub epoch: u8,
    /// Until when it knows its lease runs (the `lease_until` its read or last renewal
    /// returned, on the blackboard's clock; its own clock may be off by the skew).
    pub known_end: u8,
    /// What the task is doing there.
    pub what: Doing,
}

/// A held task's stage in its worker process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Doing {
    /// Its handler runs: started from checkpoint `from`, now at `progress`; whether its
    /// start has been written (`record_attempts` with the start, or a checkpoint).
    Running {
        /// Where this execution started.
        from: u8,
        /// Its progress so far.
        progress: u8,
        /// The start (or a checkpoint) is written.
        start_written: bool,
    },
    /// The handler ended; its outcome waits for the next batch.
    Done {
        /// Succeeded (else: failed, stopped by the fence).
        succeeded: bool,
    },
    /// Stopped at a checkpoint for the task transfer; kept (and renewed) until the new
    /// process takes it over.
    Suspended,
}

/// Which process of the hot upgrade a worker slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// An ordinary worker process.
    Plain,
    /// The process that is upgraded (it transfers its tasks and drains).
    Old,
    /// The process the upgrade spawns (it takes the tasks over).
    New,
}

/// One worker process: its row's state in the blackboard and its own memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Proc {
    /// Its part in the upgrade.
    pub role: Role,
    /// `workers.state`.
    pub state: WorkerState,
    /// The process runs (not crashed, not exited, spawned).
    pub alive: bool,
    /// It reaches the blackboard (no partition).
    pub connected: bool,
    /// It takes no new work (a task transfer or a drain began).
    pub draining: bool,
    /// What it holds, by task.
    pub held: Vec<Option<Held>>,
}

impl Proc {
    /// Whether the process can run a statement now.
    pub fn reaches_db(&self) -> bool {
        self.alive && self.connected
    }
}

/// Where the one hot upgrade is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not begun.
    Idle,
    /// The new process runs and registered (hello, ready, the listener pass).
    Spawned,
    /// The old process is marked `upgrading` and suspends its resumable tasks.
    Suspending,
    /// Its unstarted tasks moved to the new process.
    Moved,
    /// The new process took the suspended tasks over (`TakenOver`); the old drains.
    TakenOver,
    /// The old process gave back what it had not started and is marked `draining`.
    Draining,
    /// The old process wrote its last outcomes, is marked gone and exited.
    Done,
}

/// Facts the properties need that the protocol does not hold (each a flag that only
/// ever goes up, so it adds few states).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The checkpoint each task was suspended at for the transfer, if it was.
    pub suspended_at: Vec<Option<u8>>,
    /// A write naming an epoch that was not the row's was accepted.
    pub stale_write: bool,
    /// A step made a status change `artex.transition_allowed` refuses.
    pub illegal_transition: bool,
    /// Flags of what happened (see [`Seen`]).
    pub seen: u8,
}

/// The flags of [`Ghost::seen`]: interesting things that happened, for the `sometimes`
/// properties that show the model is not vacuous.
pub struct Seen;

impl Seen {
    /// The reaper took a lease back.
    pub const RESCUE: u8 = 1;
    /// A transferred task was resumed from a checkpoint above zero.
    pub const RESUMED: u8 = 2;
    /// A worker cut off from the blackboard stopped a handler itself.
    pub const SELF_FENCED: u8 = 4;
    /// A write was refused for naming an old epoch.
    pub const FENCED_OFF: u8 = 8;
    /// A push failed and its tasks were recalled.
    pub const RECALLED: u8 = 16;
}

/// The whole model's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The blackboard's clock (`now()`).
    pub now: u8,
    /// `artex.tasks`.
    pub tasks: Vec<Row>,
    /// The worker processes.
    pub procs: Vec<Proc>,
    /// Each planner's round between its read and its write: (task claimed and locked,
    /// worker chosen).
    pub claims: Vec<Option<(u8, u8)>>,
    /// Each planner's push in flight (worker, task), made after its round committed.
    pub pushes: Vec<Option<(u8, u8)>>,
    /// Each planner's workers whose last push failed (a bit per worker): offered nothing
    /// until a probe answers.
    pub unreachable: Vec<u8>,
    /// The upgrade's step.
    pub phase: Phase,
    /// Crashes left to happen.
    pub crashes_left: u8,
    /// Partitions left to happen.
    pub partitions_left: u8,
    /// What the properties need.
    pub ghost: Ghost,
}

impl State {
    /// Whether every task ended.
    pub fn all_ended(&self) -> bool {
        self.tasks.iter().all(|t| t.status.ended())
    }

    /// Whether the upgrade is not under way: not begun, or done.
    pub fn upgrade_settled(&self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Done)
    }

    /// The index of the process with `role`, if any.
    pub fn proc_of(&self, role: Role) -> Option<usize> {
        self.procs.iter().position(|p| p.role == role)
    }

    /// The handlers of task `t` whose code may run now: live processes, `executing`
    /// telling whether each one's fence still lets it run.
    pub fn executions<'a>(
        &'a self,
        t: usize,
        executing: impl Fn(&Held) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Held> + 'a {
        self.procs
            .iter()
            .filter(|p| p.alive)
            .filter_map(move |p| p.held[t].as_ref())
            .filter(move |h| executing(h))
    }
}

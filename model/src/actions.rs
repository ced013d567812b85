//! The model's steps. Each one is one transaction of the real protocol (or a step of a
//! process's own memory that runs no statement), and says which SQL it stands for in
//! [`Action::statement`]; `statements.rs` keeps the hash of that SQL beside it.

use crate::statements::Sql;

/// One step of one actor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The blackboard's clock moves on by one unit.
    Tick,
    /// Planner `p`'s round, its read: the roster and the claim of task `t`, pending, for
    /// worker `w`, online (`artex.dispatch_round`, `for update skip locked`: the row stays
    /// locked by `p` until its write). A round behind a cut round claims by the roster the
    /// planner kept (`artex.claim_head`, V55), read up to 250 ms before: `w` was online
    /// then. That adds no state: a worker gone since the read is the interleaving `Claim`,
    /// `MarkGone`, `Assign`, whose write gives it nothing.
    Claim { p: u8, t: u8, w: u8 },
    /// Planner `p`'s round, its write in the same transaction: the claimed task to the
    /// chosen worker if its row, locked now, is still `online` (`artex.assign_and_wake`:
    /// compare-and-set on `pending`, the epoch bumped, a fresh lease); its push is made
    /// after the commit.
    Assign { p: u8 },
    /// Planner `p` pushes the wake-up of its last round (`waker`); one that fails marks
    /// the worker unreachable for this planner, and one refused (the worker's process is
    /// gone) recalls the task if it is still `assigned` there (`RECALL`).
    Push { p: u8 },
    /// Planner `p` probes worker `w`, unreachable for it, and gets an answer.
    Probe { p: u8, w: u8 },
    /// The reaper takes task `t` back: its lease expired (`RECLAIM`).
    Reclaim { t: u8 },
    /// The reaper marks a silent worker `gone` (`MARK_GONE`).
    MarkGone { w: u8 },
    /// Worker `w` claims task `t`, pending, for itself in its read (`artex.claim_and_read`,
    /// V46): if its own row is `online` and no planner's claim holds the task's row (`for
    /// update skip locked`); the epoch bumped, a fresh lease. The read that follows in the
    /// same statement is the `Read` step (apart here: that only adds interleavings).
    WorkerClaim { w: u8, t: u8 },
    /// Task `t`, inserted and never assigned (epoch 0), is born assigned to worker `w`
    /// at its insert (`tasks_before_insert`, V62): it took the slot `w` offered while
    /// online (`artex.offer_slot`). The insert reads `w`'s row without a lock, from its
    /// snapshot, so `w` may have changed state since: any registered state is taken. The
    /// epoch bumped, a fresh lease.
    Born { w: u8, t: u8 },
    /// Worker `w` reads task `t` assigned to it (`artex.read_assigned`, or the same rows
    /// carried by its wake-up) and starts its handler from the checkpoint read.
    Read { w: u8, t: u8 },
    /// The handler of `t` in `w` does the rest of its work and ends (no statement), its
    /// outcome waiting for the next batch.
    Work { w: u8, t: u8 },
    /// The handler does one unit of its work (not the last) and saves its progress
    /// (`CHECKPOINT`, fenced by its epoch).
    Checkpoint { w: u8, t: u8 },
    /// The start of `t` is written after the fact (`artex.record_attempts`, a start).
    RecordStart { w: u8, t: u8 },
    /// The outcome of `t` is written (`artex.record_attempts`, an outcome).
    RecordOutcome { w: u8, t: u8 },
    /// Worker `w` renews the leases it holds and those assigned to it that it has not read
    /// (`RENEW`); the ones it lost are stopped at once.
    Renew { w: u8 },
    /// The fence of `w` stops the handler of `t`: its lease ends within the margin, by its
    /// own clock, late by the skew at worst (no statement; the failed attempt is written
    /// later). A fast clock stops it sooner, which only shortens an execution: the model
    /// takes the latest moment, the one that matters for overlaps.
    Fence { w: u8, t: u8 },
    /// A fault: worker process `w` dies; what it held in memory is gone.
    Crash { w: u8 },
    /// A fault: worker `w` cannot reach the blackboard (nor planners reach it).
    Partition { w: u8 },
    /// The partition of `w` ends; a worker marked gone meanwhile registers again
    /// (`REGISTER`).
    Heal { w: u8 },
    /// Upgrade: the new process starts and registers (`REGISTER`); hello, ready, the
    /// listener pass.
    Spawn,
    /// Upgrade: the old process marks itself `upgrading` (`SET_STATE`) and stops taking
    /// work.
    MarkUpgrading,
    /// Upgrade: the old process stops the handler of `t` at a checkpoint, saving it
    /// (`CHECKPOINT`; past the deadline, or cut off, the last saved one stands).
    Suspend { t: u8 },
    /// Upgrade: what is assigned to the old process and not held there moves to the new
    /// one (`MOVE_ASSIGNED`).
    MoveAssigned,
    /// Upgrade: the new process takes the suspended tasks over at their epochs and resumes
    /// them from their checkpoints (`TAKE_OVER`); the old one forgets them (`TransferDone`).
    TakeOver,
    /// Upgrade: the old process drains: marks itself `draining` (`SET_STATE`) and gives
    /// back what is assigned to it and not held (`RELEASE_ASSIGNED`).
    DrainRelease,
    /// Upgrade: the old process, holding nothing, gives back what is still assigned to it
    /// (`RELEASE_ASSIGNED`: a task born assigned to it since its release, V62), is marked
    /// gone (`SET_STATE`) and exits.
    DrainEnd,
}

impl Action {
    /// The name of the action, as `statements.rs` lists it.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Tick => "Tick",
            Action::Claim { .. } => "Claim",
            Action::Assign { .. } => "Assign",
            Action::Push { .. } => "Push",
            Action::Probe { .. } => "Probe",
            Action::Reclaim { .. } => "Reclaim",
            Action::MarkGone { .. } => "MarkGone",
            Action::WorkerClaim { .. } => "WorkerClaim",
            Action::Born { .. } => "Born",
            Action::Read { .. } => "Read",
            Action::Work { .. } => "Work",
            Action::Checkpoint { .. } => "Checkpoint",
            Action::RecordStart { .. } => "RecordStart",
            Action::RecordOutcome { .. } => "RecordOutcome",
            Action::Renew { .. } => "Renew",
            Action::Fence { .. } => "Fence",
            Action::Crash { .. } => "Crash",
            Action::Partition { .. } => "Partition",
            Action::Heal { .. } => "Heal",
            Action::Spawn => "Spawn",
            Action::MarkUpgrading => "MarkUpgrading",
            Action::Suspend { .. } => "Suspend",
            Action::MoveAssigned => "MoveAssigned",
            Action::TakeOver => "TakeOver",
            Action::DrainRelease => "DrainRelease",
            Action::DrainEnd => "DrainEnd",
        }
    }

    /// A fault the environment makes (not a step the protocol takes).
    pub fn is_fault(&self) -> bool {
        matches!(self, Action::Crash { .. } | Action::Partition { .. })
    }
}

// The SQL each action stands for, with the sha256 of its text as the source holds it
// (whitespace collapsed). `tests/statements.rs` recomputes them: when one differs, the
// statement changed and the action beside it must be reviewed against it, then its
// hash updated. An action with none runs no statement (a process's own memory, a fault,
// the clock).

/// `Claim`: the planner round's read (roster and claim), with the head of the limited
/// tasks' queue it reads (V50) and the head of the others' it locks (V51); or, by a
/// roster kept, the claim alone (V55).
pub const CLAIM_SQL: &[Sql] = &[
    Sql::function(
        "dispatch_round",
        "333a331bee9a56f3cb7ee3e30d2dd932616a7f70d97ab012e56871c488d8928c",
    ),
    Sql::function(
        "claim_head",
        "b9e1c706e9c26ac78e9bb0675cd4005cb72023b14ec6bc5a706d27a79b33068f",
    ),
    Sql::function(
        "limited_head",
        "038e9edcccb1d3cc6f6b8e5c3ec2a10d40b4ee7dc2299c563a7f7f9ba2f5c04d",
    ),
    Sql::function(
        "runnable_head",
        "fedff6b302fba8b11a34913f409c009980d125b39f36e51b439e87466a4f8933",
    ),
];
/// `Assign`: the planner round's write (assignments under the workers' row locks, the
/// fencing tokens, wake-ups).
pub const ASSIGN_SQL: &[Sql] = &[Sql::function(
    "assign_and_wake",
    "16181419695e8a105d6da98e06a85b372e407edcc460c6f47f2f9939d526150a",
)];
/// `Push`: a failed push records when pushes began to fail, and recalls unstarted tasks.
pub const PUSH_SQL: &[Sql] = &[
    Sql::constant(
        WAKE_RS,
        "WAKE_FAILED",
        "2e9184f1c0d8b94a11ebf8632e4e45a4b401de2fe9ae436d5f05c51111f80fdf",
    ),
    Sql::constant(
        WAKE_RS,
        "RECALL",
        "243092e6f79415829966d2c9b625ee83d009872f203389aede7072f3fad44f27",
    ),
];
/// `Probe`: a push (a probe) answered clears the record.
pub const PROBE_SQL: &[Sql] = &[Sql::constant(
    WAKE_RS,
    "WAKE_DELIVERED",
    "176e66b23fb379f99ef0c0ce7e876bcbba57a647f0c8e89bded23c1ffb3ac1d1",
)];
/// `Reclaim`: the reaper's sweep of expired leases.
pub const RECLAIM_SQL: &[Sql] = &[Sql::constant(
    REAP_RS,
    "RECLAIM",
    "f4f67bee57cae50b79a4eafbb0eab41af46ce53d000f0ce107eb57fa527b93ea",
)];
/// `MarkGone`: the reaper's sweep of silent workers.
pub const MARK_GONE_SQL: &[Sql] = &[Sql::constant(
    REAP_RS,
    "MARK_GONE",
    "84546af60fe3748e2afa6124d008d3a17669562d64ad8b3d6e969e76e342dd53",
)];
/// `WorkerClaim`: a worker's claim in its read (V46; V47 only adds the snapshot row's
/// `no_room`, which changes no row), the head of the queue locked by `runnable_head`
/// (V51), as the round's. V62 gives the worker's offered slot back first when tasks wait:
/// slots are not in the model, and no task's row changes. V71's read leaves out the
/// (task, epoch) pairs the worker knows, as `Read` does. V72's look whether a task waits
/// (`runnable_waiting_for`, which writes nothing) gives the answers of the `exists` it
/// replaces, read by the runnable queue's index.
pub const WORKER_CLAIM_SQL: &[Sql] = &[
    Sql::function(
        "claim_and_read_unknown",
        "ed141ca5391f792ea179dbea7f35a10a5650b533b265db1eea1d02ab66fb35cc",
    ),
    Sql::function(
        "runnable_head",
        "fedff6b302fba8b11a34913f409c009980d125b39f36e51b439e87466a4f8933",
    ),
    Sql::function(
        "runnable_waiting_for",
        "51532d33a31b545625fcd4501619706169e7f375d1b6e497f280861e2e56bf22",
    ),
];
/// `Born`: an insert that takes a worker's offered slot (V62), and the offer itself (whose
/// look whether a task waits is `runnable_waiting_for` since V72: the same answers).
pub const BORN_SQL: &[Sql] = &[
    Sql::function(
        "tasks_before_insert",
        "443c02cd8735f4b5cdff67c56d6a5edf86d9ab3c7637019ffd0a47e484494302",
    ),
    Sql::function(
        "offer_slot",
        "99db081a96cf51422939b081aa8ee48c6ac82b355279fbcf0dd036d48849689d",
    ),
    Sql::function(
        "runnable_waiting_for",
        "51532d33a31b545625fcd4501619706169e7f375d1b6e497f280861e2e56bf22",
    ),
];
/// `Read`: a worker's read of its assignments (V51 only sets a planner setting on it).
/// V71 leaves out the (task, epoch) pairs the worker knows: the model's read takes a task
/// only at an epoch the worker does not hold.
pub const READ_SQL: &[Sql] = &[Sql::function(
    "read_assigned_unknown",
    "d15a15d8b233e15d5490b35c9e414cbb6bf8d91c9afaef81ad8aaefc892fc0e0",
)];
/// `Checkpoint` and `Suspend`: a handler's saved progress, fenced by its epoch.
pub const CHECKPOINT_SQL: &[Sql] = &[Sql::constant(
    LEASES_RS,
    "CHECKPOINT",
    "c756de45bcea0aa8eb55ae510b77dc9a33cb8adc78008f3249d384f843b093ee",
)];
/// `RecordStart` and `RecordOutcome`: the batch of starts and outcomes, and the status
/// an outcome ends in. V73 only changes how the update reaches its rows (the batch's ids
/// by key, hashed against the outcomes; the holder's test written so that no index
/// serves it) and reads each row as it was (a lateral lookup by key on the statement's
/// snapshot, for the join it had): the same compare-and-set on id, epoch and holder,
/// the same history. V74 adds only an answer (whether the planners must hear of the
/// write), which changes no row.
pub const RECORD_SQL: &[Sql] = &[
    Sql::function(
        "record_attempts",
        "38e47430dbe545de663df4f305d42068cdbcb251f60dfce59b326d6635c04754",
    ),
    Sql::function(
        "attempt_status",
        "f1982dbd3c34fd4c13155671da21235b8974aba06b45a510a4c8c2aa22829fd4",
    ),
];
/// `Renew`: lease renewals, of held tasks and of those assigned and not read yet.
pub const RENEW_SQL: &[Sql] = &[Sql::constant(
    LEASES_RS,
    "RENEW",
    "a8f0907b6a7242186651d095cb8b57d76f19cc9636e75e0ee7cd7d035b3782db",
)];
/// `Heal` and `Spawn`: a worker's heartbeat, and its registration (again). (V62: the
/// heartbeat's `held`, for display, leaves the offered slot out.)
pub const REGISTER_SQL: &[Sql] = &[
    Sql::constant(
        WORKER_RS,
        "HEARTBEAT",
        "dd6e7308311a4fce63736780a67fe60e6095ddbe70e23f02c66f618854174c43",
    ),
    Sql::constant(
        WORKER_RS,
        "REGISTER",
        "00b88b8dc7e3052ab2555463b715f78ca1d623919ad8912933427012aef7a7d3",
    ),
];
/// `MarkUpgrading`: a worker's state.
pub const SET_STATE_SQL: &[Sql] = &[Sql::constant(
    WORKER_RS,
    "SET_STATE",
    "c2238d0fcfe416ecccab162be097ea4641a8e4a6861fd02c6c921196b93bb88e",
)];
/// `MoveAssigned`: unstarted tasks to the new process.
pub const MOVE_SQL: &[Sql] = &[Sql::constant(
    TRANSFER_RS,
    "MOVE_ASSIGNED",
    "eeee058687818074dc975f74f27fba5c483b497a75a3ddf98570fb496b262f53",
)];
/// `TakeOver`: suspended tasks taken over by the new process.
pub const TAKE_OVER_SQL: &[Sql] = &[Sql::constant(
    TRANSFER_RS,
    "TAKE_OVER",
    "3dbf531c38d302177e1f1ced9c6c7ad7035563a2eb96a612887a7126cc64116a",
)];
/// `DrainRelease`: the drain's state and the release of what was not started (V62:
/// with the slot the worker offered, which is not in the model). `DrainEnd`: the same
/// release again, once every outcome is written (V62: a task born assigned to it after
/// the first), then its state, gone.
pub const DRAIN_SQL: &[Sql] = &[
    Sql::constant(
        WORKER_RS,
        "SET_STATE",
        "c2238d0fcfe416ecccab162be097ea4641a8e4a6861fd02c6c921196b93bb88e",
    ),
    Sql::constant(
        ATTEMPTS_RS,
        "WITHDRAW_OFFERS",
        "b003c505b4aded50619c2336906bf82b64879401b3c0c213630c7a2d2be4e3e5",
    ),
    Sql::constant(
        ATTEMPTS_RS,
        "RELEASE_ASSIGNED",
        "dfd72bc05f4fe3bd398bebf396bb8c831ce42620bfeb1c7123ecff29236234c0",
    ),
];
/// The status machine every step's status change is checked against
/// (`state::transition_allowed`).
pub const STATUS_MACHINE_SQL: &[Sql] = &[Sql::function(
    "transition_allowed",
    "a0fcc987b48a54ed8731549f041956a03f992652523869a97f31514024193c08",
)];

const WAKE_RS: &str = "actors/src/blackboard/planner/wake.rs";
const REAP_RS: &str = "actors/src/blackboard/planner/reap.rs";
const ATTEMPTS_RS: &str = "actors/src/blackboard/worker/attempts.rs";
const LEASES_RS: &str = "actors/src/blackboard/worker/leases.rs";
const WORKER_RS: &str = "actors/src/blackboard/worker/mod.rs";
const TRANSFER_RS: &str = "actors/src/blackboard/worker/transfer.rs";

impl Action {
    /// The SQL this action stands for (empty: it runs none).
    pub fn statements(&self) -> &'static [Sql] {
        match self {
            Action::Claim { .. } => CLAIM_SQL,
            Action::Assign { .. } => ASSIGN_SQL,
            Action::Push { .. } => PUSH_SQL,
            Action::Probe { .. } => PROBE_SQL,
            Action::Reclaim { .. } => RECLAIM_SQL,
            Action::MarkGone { .. } => MARK_GONE_SQL,
            Action::WorkerClaim { .. } => WORKER_CLAIM_SQL,
            Action::Born { .. } => BORN_SQL,
            Action::Read { .. } => READ_SQL,
            Action::Checkpoint { .. } | Action::Suspend { .. } => CHECKPOINT_SQL,
            Action::RecordStart { .. } | Action::RecordOutcome { .. } => RECORD_SQL,
            Action::Renew { .. } => RENEW_SQL,
            Action::Heal { .. } | Action::Spawn => REGISTER_SQL,
            Action::MarkUpgrading => SET_STATE_SQL,
            Action::DrainEnd => DRAIN_SQL,
            Action::MoveAssigned => MOVE_SQL,
            Action::TakeOver => TAKE_OVER_SQL,
            Action::DrainRelease => DRAIN_SQL,
            Action::Tick
            | Action::Work { .. }
            | Action::Fence { .. }
            | Action::Crash { .. }
            | Action::Partition { .. } => &[],
        }
    }
}

/// Every action's SQL, by the action's name (and the status machine's), for the test
/// that recomputes the hashes.
pub const ALL_SQL: &[(&str, &[Sql])] = &[
    ("Claim", CLAIM_SQL),
    ("Assign", ASSIGN_SQL),
    ("Push", PUSH_SQL),
    ("Probe", PROBE_SQL),
    ("Reclaim", RECLAIM_SQL),
    ("MarkGone", MARK_GONE_SQL),
    ("WorkerClaim", WORKER_CLAIM_SQL),
    ("Born", BORN_SQL),
    ("Read", READ_SQL),
    ("Checkpoint, Suspend", CHECKPOINT_SQL),
    ("RecordStart, RecordOutcome", RECORD_SQL),
    ("Renew", RENEW_SQL),
    ("Heal, Spawn", REGISTER_SQL),
    ("MarkUpgrading", SET_STATE_SQL),
    ("MoveAssigned", MOVE_SQL),
    ("TakeOver", TAKE_OVER_SQL),
    ("DrainRelease, DrainEnd", DRAIN_SQL),
    (
        "the status machine (state::transition_allowed)",
        STATUS_MACHINE_SQL,
    ),
];

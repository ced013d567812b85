//! A worker's statements, and the boundary the connection budget routes through a pooler.
//! This file: register, heartbeat and state (its [`WorkerState`]), its binary's digest;
//! `attempts.rs`: read what was assigned to it, record starts and outcomes in batches,
//! release what it will not run, read a flow task's upstream results; `leases.rs`: renew
//! leases, save checkpoints; `progress.rs`: handlers' progress, throttled by the worker and
//! written in batches; `transfer.rs`: a hot upgrade's task transfer; `uploads.rs`: files
//! received in chunks, recorded with their task, and swept. Every write to a task names
//! the lease epoch the worker holds: a worker that lost its lease changes nothing.
//!
//! # Sessions and transactions
//! Every statement of [`WorkerBoard`] is **one transaction** on a pooled connection and
//! leaves no session state behind it (a transaction pooler carries them all), except
//! [`WorkerBoard::listen_session`]: a LISTEN, which needs a **session** (a connection of
//! its own for as long as it listens). Only workers without a push address use it (see
//! `waker`). Heartbeats, lease renewals and wake-ups ([`WorkerBoard::heartbeat`],
//! [`WorkerBoard::renew_leases`], the wake-ups after [`WorkerBoard::record`]) go through
//! the relaxed pool and commit with `set local synchronous_commit = off` in their own
//! transaction (`sql.rs`).

mod attempts;
mod leases;
mod progress;
mod transfer;
mod uploads;

pub(crate) use attempts::HOT_CALLS;
pub use attempts::{AssignedRead, AssignedTask, AttemptRecord, Outcome, Recorded, Step};
pub use leases::Renewal;
pub use progress::{ProgressEvent, ProgressNote, MAX_PROGRESS_MESSAGE_CHARS, PROGRESS_CHANNEL};
pub use uploads::{NewUpload, UploadRow};

use serde::{Deserialize, Serialize};

use super::{Blackboard, ListenSession};
use crate::error::{Error, Result};

/// The worker's handle on the blackboard: only the statements a worker process runs
/// (its actor, its handlers' context, its uploads, its side of a hot upgrade). Made by
/// [`Blackboard::worker`]; see the [module](self) for which need a session.
#[derive(Debug, Clone)]
pub struct WorkerBoard {
    pub(super) bb: Blackboard,
}

/// A worker's state in the roster, mirroring the `artex.worker_state` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Takes work: the planner assigns to it.
    Online,
    /// Finishing what it runs and taking nothing new (graceful stop).
    Draining,
    /// Handing its work over to a new process (hot upgrade).
    Upgrading,
    /// Stopped, or declared gone by the reaper (its tasks were taken back).
    Gone,
}

impl WorkerState {
    /// Every state, in the order of the enum.
    pub const ALL: [WorkerState; 4] = [
        WorkerState::Online,
        WorkerState::Draining,
        WorkerState::Upgrading,
        WorkerState::Gone,
    ];

    /// The name used in the database and in `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Online => "online",
            WorkerState::Draining => "draining",
            WorkerState::Upgrading => "upgrading",
            WorkerState::Gone => "gone",
        }
    }
}

impl std::fmt::Display for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WorkerState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        WorkerState::ALL
            .into_iter()
            .find(|w| w.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown worker state '{s}'; expected one of: {}",
                    WorkerState::ALL.map(|w| w.as_str()).join(", ")
                ))
            })
    }
}

/// What a heartbeat reads back from the worker's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Its state: [`WorkerState::Gone`] means the reaper gave this worker up and took its
    /// tasks back.
    pub state: WorkerState,
    /// A planner's wake-up pushes fail to reach it (migrations/V23): it takes its tasks
    /// by polling.
    pub wake_unreachable: bool,
}

/// How a worker introduces itself.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Unique per process: `host:pid:suffix`.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i32,
    /// Its build version.
    pub version: String,
    /// Where its HTTP server listens.
    pub http_addr: Option<String>,
    /// The NOTIFY channel it listens on for assignments.
    pub channel: String,
    /// The kinds it runs.
    pub kinds: Vec<String>,
    /// How many tasks it holds at once: its handler slots and its local queue.
    pub capacity: i32,
    /// How many tasks it runs at once (its handler slots; `None`: not said). Where its
    /// capacity is larger, planners keep a place of its queue for a fair kind's key
    /// that holds no task (migrations/V48).
    pub slots: Option<i32>,
    /// The `application_name` of its LISTEN session: while no backend with that name
    /// exists (the process died, its host is cut off) planners give it nothing. `None`
    /// for a worker without a session (a tool, a simulation).
    pub session: Option<String>,
    /// The lease it renews, milliseconds: assignments to it get the same. `None`: the
    /// planner's `--assign-lease-ms`.
    pub lease_ms: Option<i32>,
    /// Where planners push its wake-ups (`host:port`; see migrations/V14); `None` for a
    /// worker woken by NOTIFY on its channel.
    pub wake_addr: Option<String>,
}

// Registering adds capacity: wake the planners.
const REGISTER: &str = "with r as (insert into artex.workers
        (id, host, pid, version, http_addr, channel, kinds, capacity, session, lease_ms,
         wake_addr, slots, state, last_seen)
    values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'online', now())
    on conflict (id) do update set
        version = excluded.version, http_addr = excluded.http_addr, channel = excluded.channel,
        kinds = excluded.kinds, capacity = excluded.capacity, session = excluded.session,
        lease_ms = excluded.lease_ms, wake_addr = excluded.wake_addr, slots = excluded.slots,
        wake_failed_at = null, state = 'online', last_seen = now()
    returning 1)
    select pg_notify('artex_tasks', '') from r";

// An empty batch of outcomes (`warm_connections`): every part of the write planned and
// run on no row.
const WARM: &str = "select count(*) from artex.record_attempts($1, '{}', '{}', '{}', '{}',
    '{}', '{}', '{}', '{}')";

// A heartbeat also writes the worker's capacity ($3), which moves with its local queue's
// depth; when it grows, the planners are woken: there are free slots to fill. It refreshes
// `held`, shown in the workers' list, from the two counters the planners read (see
// migrations/V12__held_released_apart.sql), less the slot it offers to new tasks (V62),
// which the planners count as taken.
const HEARTBEAT: &str = "with before as (select capacity from artex.workers where id = $1),
    beat as (
        update artex.workers w set last_seen = now(), inflight = $2, capacity = $3,
            held = least(greatest(w.taken - coalesce(
                (select r.released from artex.worker_released r where r.worker = w.id), 0)
                - (select count(*) from artex.worker_offers o where o.worker = w.id),
                0), 2147483647)::int4
        where id = $1
        returning state::text, wake_failed_at is not null as unreachable
    )
    select beat.state, case when $3 > before.capacity then pg_notify('artex_tasks', '') end,
           beat.unreachable
    from beat, before";

// The blackboard's id (migrations/V13__blackboard_identity.sql). In a database copied from
// another (its `made_in` is not this database's oid) it is first replaced by a new one, so
// that the copy never passes for its source. Concurrent starts on a fresh copy: the first
// update wins; the others wait for its row, find it made here, and change nothing.
const RENEW_COPIED_ID: &str =
    "update artex.blackboard b set id = gen_random_uuid(), made_in = d.oid,
        created_at = now()
    from pg_database d
    where d.datname = current_database() and b.made_in <> d.oid
    returning b.id";

const BLACKBOARD_ID: &str = "select id from artex.blackboard";

// A new address: whether pushes reach it is not known yet.
const SET_WAKE_ADDR: &str =
    "update artex.workers set wake_addr = $2, wake_failed_at = null where id = $1";

const SET_BINARY: &str = "update artex.workers set binary_sha256 = $2 where id = $1";

const SET_STATE: &str = "update artex.workers set state = $2::text::artex.worker_state,
        last_seen = now()
    where id = $1";

// The retry policies of the kinds a worker runs and which of them are fair (by primary
// key: a few rows).
const KIND_POLICIES: &str = "select k.kind, k.retry_backoff, k.retry_base_ms, k.retry_cap_ms,
        k.retry_max_attempts, coalesce(l.fair, false)
    from artex.kinds k left join artex.kind_limits l on l.kind = k.kind
    where k.kind = any($1::text[]) and (k.retry_backoff is not null or l.fair)";

/// What a worker applies per kind, as the blackboard says: the retry policies of those
/// that have one (migrations/V18) and the kinds that are fair (V43: its local queue takes
/// their tasks by turns, `worker::turns`).
#[derive(Debug, Clone, Default)]
pub struct KindPolicies {
    /// Retry policies by kind.
    pub retry: std::collections::HashMap<String, crate::retry::RetryPolicy>,
    /// The fair kinds.
    pub fair: std::collections::HashSet<String>,
}

impl WorkerBoard {
    /// The policies of `kinds` (see [`KindPolicies`]).
    pub async fn kind_policies(&self, kinds: &[String]) -> Result<KindPolicies> {
        let client = self.bb.client().await?;
        let rows = client.query(KIND_POLICIES, &[&kinds]).await?;
        let mut policies = KindPolicies::default();
        for r in &rows {
            let kind: String = r.try_get(0)?;
            if let Some(p) = super::inputs::policy_from_row(r, 1)? {
                policies.retry.insert(kind.clone(), p);
            }
            if r.try_get(5)? {
                policies.fair.insert(kind);
            }
        }
        Ok(policies)
    }

    /// A LISTEN session on `channels` that reconnects by itself (see [`ListenSession`]):
    /// the worker's wake-ups. A session: a connection of its own, not a pooler's.
    pub fn listen_session<S: AsRef<str>>(
        &self,
        owner: impl Into<String>,
        channels: &[S],
    ) -> ListenSession {
        self.bb.listen_session(owner, channels)
    }

    /// Sends the wake-ups of a hot-path write right after its commit (see
    /// [`Blackboard::wake`]).
    pub(crate) fn wake(&self, channels: &[&str]) {
        self.bb.wake(channels)
    }

    /// The bearer token planners' wake-up pushes carry (`POST /wake`).
    pub async fn wake_secret(&self) -> Result<String> {
        self.bb.wake_secret().await
    }

    /// Sets where planners push the worker's wake-ups (`None`: nowhere; it polls).
    pub async fn set_wake_addr(&self, worker: &str, addr: Option<&str>) -> Result {
        let client = self.bb.client().await?;
        client.execute(SET_WAKE_ADDR, &[&worker, &addr]).await?;
        Ok(())
    }

    /// Inserts or revives the worker's row as [`WorkerState::Online`].
    pub async fn register_worker(&self, r: &Registration) -> Result {
        let client = self.bb.client().await?;
        client
            .execute(
                REGISTER,
                &[
                    &r.id,
                    &r.host,
                    &r.pid,
                    &r.version,
                    &r.http_addr,
                    &r.channel,
                    &r.kinds,
                    &r.capacity,
                    &r.session,
                    &r.lease_ms,
                    &r.wake_addr,
                    &r.slots,
                ],
            )
            .await?;
        Ok(())
    }

    /// Runs a written batch's statement, empty and rolled back, once on each connection
    /// of the pool, so that a burst's first outcomes do not pay for each server process's
    /// first look at the tasks table, its indexes and triggers and the functions the
    /// write calls (10–20 ms of server CPU on a fresh connection, measured; 0.5 ms warm).
    /// It changes nothing: an empty batch writes no row, and the transaction is rolled
    /// back. The first error (no connection within the pool's wait, a failed statement)
    /// is returned; the caller goes on without the warm-up, whose cost the first real
    /// writes then pay as before.
    pub async fn warm_connections(&self, worker: &str) -> Result {
        let mut conns = Vec::with_capacity(self.bb.limits.pool_size);
        for _ in 0..self.bb.limits.pool_size {
            conns.push(self.bb.client().await?);
        }
        let warm = |conn| async move {
            let tx = crate::blackboard::Tx::new(conn);
            let (begun, warmed) =
                futures_util::future::join(tx.begin(), tx.query(WARM, &[&worker])).await;
            tx.rollback().await;
            begun.and(warmed.map(drop))
        };
        futures_util::future::join_all(conns.into_iter().map(warm))
            .await
            .into_iter()
            .collect()
    }

    /// Refreshes `last_seen` and sets the worker's `capacity` (without waiting for the
    /// WAL flush; a grown capacity wakes the planners); returns what the row holds (see
    /// [`Beat`]), or `None` if the row was deleted. A capacity below what the worker
    /// holds is fine: it is assigned nothing until it holds less.
    pub async fn heartbeat(
        &self,
        worker: &str,
        inflight: i32,
        capacity: i32,
    ) -> Result<Option<Beat>> {
        let client = self.bb.relaxed_client().await?;
        client
            .relaxed(HEARTBEAT, &[&worker, &inflight, &capacity.max(1)])
            .await?
            .first()
            .map(|r| {
                Ok(Beat {
                    state: r.try_get::<_, &str>(0)?.parse()?,
                    wake_unreachable: r.try_get(2)?,
                })
            })
            .transpose()
    }

    /// Sets the worker's state.
    pub async fn set_worker_state(&self, worker: &str, state: WorkerState) -> Result {
        let client = self.bb.client().await?;
        client
            .execute(SET_STATE, &[&worker, &state.as_str()])
            .await?;
        Ok(())
    }

    /// The blackboard's identity, made when the database was migrated: upload folders
    /// and uploads are keyed by it, so that deployments on one host never take each
    /// other's. A database copied from another gets an id of its own here, once (logged).
    pub async fn blackboard_id(&self) -> Result<uuid::Uuid> {
        let client = self.bb.client().await?;
        if let Some(row) = client.query_opt(RENEW_COPIED_ID, &[]).await? {
            let id: uuid::Uuid = row.try_get(0)?;
            tracing::warn!(blackboard = %id, "this database is a copy of another blackboard's \
                (its id was made in another database): it has an id of its own from now on");
            return Ok(id);
        }
        Ok(client.query_one(BLACKBOARD_ID, &[]).await?.try_get(0)?)
    }

    /// Records the sha256 (64 lowercase hex digits) of the binary worker `id` runs.
    pub async fn set_worker_binary(&self, id: &str, sha256: &str) -> Result {
        let client = self.bb.client().await?;
        client.execute(SET_BINARY, &[&id, &sha256]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::WorkerState;

    #[test]
    fn a_worker_state_reads_back_what_it_writes() {
        for state in WorkerState::ALL {
            assert_eq!(state.as_str().parse::<WorkerState>().unwrap(), state);
            assert_eq!(state.to_string(), state.as_str());
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::Value::from(state.as_str())
            );
        }
    }

    #[test]
    fn an_unknown_worker_state_is_refused_with_the_ones_expected() {
        let e = "Online".parse::<WorkerState>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown worker state 'Online'; expected one of: online, draining, upgrading, gone"
        );
    }
}

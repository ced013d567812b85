//! Fixtures: the rows a test starts from, made the way the runtime makes them (through
//! the blackboard's role handles) wherever a real path exists; [`raw`] holds the few
//! states no API produces, in plain SQL, in one place.
//!
//! Plain SQL stays in a test (not here) where the write is what the test is about: the
//! status machine's trigger and the schema's constraints (`tests/blackboard/`), plain-SQL
//! submission, concurrent sessions racing, migrations, injected faults, and bulk data
//! made in the database for plans and load.

use artex_actors::assigner::{Assigner, AssignerConfig};
use artex_actors::blackboard::{AssignReport, Control, NewTask, Registration};
use artex_actors::Blackboard;
use uuid::Uuid;

/// A worker's registration as a tool would make it: host and version `test`, pid 1, no
/// HTTP address, no LISTEN session nor push address, the planner's lease, its slots not
/// said (so no place of it is kept for a fair kind's idle key).
pub fn registration(id: &str, kinds: &[&str], capacity: i32) -> Registration {
    Registration {
        id: id.into(),
        host: "test".into(),
        pid: 1,
        version: "test".into(),
        http_addr: None,
        channel: format!("artex_w_{id}"),
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
        capacity,
        slots: None,
        session: None,
        lease_ms: None,
        wake_addr: None,
    }
}

/// Registers worker `id` (see [`registration`]), online, declaring `kinds` (which makes
/// them known kinds) with room for `capacity` tasks.
pub async fn worker(bb: &Blackboard, id: &str, kinds: &[&str], capacity: i32) {
    register(bb, &registration(id, kinds, capacity)).await;
}

/// Registers `r` as a worker's start-up does.
pub async fn register(bb: &Blackboard, r: &Registration) {
    bb.worker()
        .register_worker(r)
        .await
        .unwrap_or_else(|e| panic!("registering worker {}: {e}", r.id));
}

/// Submits a task of `kind` with an empty payload, as an operator would; its id.
pub async fn task(bb: &Blackboard, kind: &str) -> Uuid {
    bb.operator()
        .submit(&NewTask::new(kind, serde_json::json!({})), "test")
        .await
        .unwrap_or_else(|e| panic!("submitting a {kind} task: {e}"))
}

/// Cancels task (or flow) `id`, as an operator would.
pub async fn cancel(bb: &Blackboard, id: Uuid) {
    bb.operator()
        .control(Control::Cancel, id, "test", None)
        .await
        .unwrap_or_else(|e| panic!("canceling {id}: {e}"));
}

/// One planner round over every shard: pending tasks assigned to the workers with room
/// for them (leases of 60 s), as the planner's assigner does.
pub async fn assign(bb: &Blackboard) -> AssignReport {
    let config = AssignerConfig {
        actor: "test-planner".into(),
        batch: 1000,
        lease_secs: 60.0,
        suspect_after_secs: 60.0,
        shards: (1, Vec::new()),
    };
    Assigner::run_once(&bb.planner(), &config)
        .await
        .expect("an assigner round")
}

/// States no API produces, written in plain SQL.
pub mod raw {
    use tokio_postgres::Client;
    use uuid::Uuid;

    /// A flow holding one task `blocked` with nothing upstream: unfinished and running
    /// for as long as the test wants (were it paused, the flow would be paused; a real
    /// upstream task would run and end it). Returns (flow, the held task).
    pub async fn held_flow(c: &Client) -> (Uuid, Uuid) {
        let flow: Uuid = c
            .query_one(
                "insert into artex.flows (name) values ('f') returning id",
                &[],
            )
            .await
            .expect("a flow")
            .get(0);
        let held: Uuid = c
            .query_one(
                "insert into artex.tasks (kind, status, flow_id, flow_task)
                 values ('echo', 'blocked', $1, 'held') returning id",
                &[&flow],
            )
            .await
            .expect("its held task")
            .get(0);
        (flow, held)
    }

    /// A complete upload of one byte at `path` on `host`, recorded for `task`: a file
    /// another worker received (recording one through the API submits a task bound to
    /// this host, which its workers would run).
    pub async fn upload(c: &Client, id: Uuid, host: &str, path: &str, task: Uuid) {
        c.execute(
            "insert into artex.uploads (id, host, path, size, sha256, chunks, task_id)
             values ($1, $2, $3, 1, repeat('a', 64), 1, $4)",
            &[&id, &host, &path, &task],
        )
        .await
        .unwrap_or_else(|e| panic!("upload {id}: {e}"));
    }

    /// A worker row of `host` in `state` (`online`, `gone`, …), last seen `ago` (an SQL
    /// interval: `'1 hour'`) in the past, declaring `{digest}`: a fleet's history, which
    /// only time makes.
    pub async fn worker_seen(c: &Client, id: &str, host: &str, state: &str, ago: &str) {
        c.execute(
            "insert into artex.workers (id, host, pid, version, channel, kinds, capacity,
                                        state, last_seen)
             values ($1, $2, 1, 't', 'ch', '{digest}', 1, $3::text::artex.worker_state,
                     now() - $4::text::interval)",
            &[&id, &host, &state, &ago],
        )
        .await
        .unwrap_or_else(|e| panic!("worker {id}: {e}"));
    }

    /// A pending task bound to `host` (an upload's task; `None`: bound nowhere) with
    /// `payload`: only an upload's completion makes one, on the worker that received it.
    pub async fn task_on_host(
        c: &Client,
        kind: &str,
        payload: &serde_json::Value,
        host: Option<&str>,
    ) -> Uuid {
        c.query_one(
            "insert into artex.tasks (kind, payload, host) values ($1, $2, $3) returning id",
            &[&kind, payload, &host],
        )
        .await
        .expect("a task bound to a host")
        .get(0)
    }
}

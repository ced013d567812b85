//! The soak's faults: a schedule drawn from the seed before the run (so a failing seed
//! replays the same faults at the same times), each fault started at its time in a task
//! of its own, so that they overlap; faults on one target wait for each other (a host is
//! not frozen while it is being killed), faults on different targets do not.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use artex::dev_db::ClusterState;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::topology::Topology;
use crate::world::World;
use crate::{FaultRecord, Settings, Soak};

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// kill -9 of a role's process, started again after the hold.
    Kill9(&'static str),
    /// A hot upgrade of w3 with a good bundle, or a bad one that must roll back.
    Upgrade { good: bool },
    /// PostgreSQL shut down immediately (SIGQUIT: a crash) and started again.
    PgRestart,
    /// PostgreSQL stopped for the hold (20 s), then started.
    PgStop,
    /// A worker host's link cut for the hold.
    Partition(&'static str),
    /// A worker host frozen (SIGSTOP) past its lease, for the hold.
    Freeze(&'static str),
    /// w3's upload folder filled for the hold.
    DiskFull,
    /// The fleet topology's primary fails over: its host killed (`cut` false), or its
    /// link cut; the old primary comes back as a standby.
    Failover { cut: bool },
    /// The fleet topology's pgbouncer in front of the primary stopped for the hold.
    PoolerRestart,
    /// The fleet topology's read replica's host down for the hold.
    ReplicaLoss,
}

impl Fault {
    fn name(&self) -> &'static str {
        match self {
            Fault::Kill9(_) => "kill9",
            Fault::Upgrade { good: true } => "upgrade",
            Fault::Upgrade { good: false } => "bad-upgrade",
            Fault::PgRestart => "pg-restart",
            Fault::PgStop => "pg-stop",
            Fault::Partition(_) => "partition",
            Fault::Freeze(_) => "freeze",
            Fault::DiskFull => "disk-full",
            Fault::Failover { cut: false } => "failover-kill",
            Fault::Failover { cut: true } => "failover-cut",
            Fault::PoolerRestart => "pgbouncer-restart",
            Fault::ReplicaLoss => "replica-loss",
        }
    }

    /// What it hits; faults on one target wait for each other.
    fn target(&self) -> &'static str {
        match self {
            Fault::Kill9(r) | Fault::Partition(r) | Fault::Freeze(r) => r,
            Fault::Upgrade { .. } => "w3",
            Fault::PgRestart | Fault::PgStop => "postgres",
            Fault::Failover { .. } | Fault::PoolerRestart => "postgres",
            Fault::ReplicaLoss => "replica",
            Fault::DiskFull => "w3-disk",
        }
    }
}

/// A fault at its time, with how long it holds.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Seconds into the run.
    pub at: f64,
    /// What.
    pub fault: Fault,
    /// How long it holds (a restart's delay, a cut's length), seconds.
    pub hold: f64,
}

/// The faults on artex's processes and how often each comes (relative weights): those
/// before the database's faults in a mix, then those after (the order the first faults
/// are drawn from, so a seed replays as before).
const PROCESS_FAULTS: [(Fault, u32); 5] = [
    (Fault::Kill9("w2"), 3),
    (Fault::Kill9("p2"), 2),
    (Fault::Kill9("w3"), 1),
    (Fault::Upgrade { good: true }, 3),
    (Fault::Upgrade { good: false }, 1),
];
/// See [`PROCESS_FAULTS`].
const HOST_FAULTS: [(Fault, u32); 5] = [
    (Fault::Partition("w1"), 1),
    (Fault::Partition("w2"), 1),
    (Fault::Freeze("w1"), 1),
    (Fault::Freeze("w2"), 1),
    (Fault::DiskFull, 1),
];
/// The database's faults on one PostgreSQL server.
const SINGLE_FAULTS: [(Fault, u32); 2] = [(Fault::PgRestart, 1), (Fault::PgStop, 1)];
/// The database's faults in the fleet topology: a 20 s stop of the primary is a failover
/// there, and failovers, pooler restarts and the replica's loss come in.
const FLEET_FAULTS: [(Fault, u32); 5] = [
    (Fault::PgRestart, 1),
    (Fault::Failover { cut: false }, 1),
    (Fault::Failover { cut: true }, 1),
    (Fault::PoolerRestart, 1),
    (Fault::ReplicaLoss, 1),
];

/// The faults of a run in `topology`, with their weights.
fn mix(topology: Topology) -> Vec<(Fault, u32)> {
    let database: &[(Fault, u32)] = match topology {
        Topology::Single => &SINGLE_FAULTS,
        Topology::Fleet => &FLEET_FAULTS,
    };
    [&PROCESS_FAULTS[..], database, &HOST_FAULTS[..]].concat()
}

/// A fault every 9 s on average (exponential gaps, at least 1 s), from 20 s into the
/// run to 25 s before its end. The first ones are one of each kind, in a seeded order,
/// so that even a short run meets every fault; the rest are drawn by weight.
pub fn schedule(settings: &Settings) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(settings.seed);
    let mix = mix(settings.topology);
    let total: u32 = mix.iter().map(|m| m.1).sum();
    let end = settings.length().as_secs_f64() - 25.0;
    let mut at = 20.0;
    let mut plan = Vec::new();
    let mut first: Vec<Fault> = Vec::new();
    for (f, _) in &mix {
        if !first.iter().any(|g| g.name() == f.name()) {
            first.push(*f);
        }
    }
    rng.shuffle(&mut first);
    loop {
        at += (-9.0 * (1.0 - rng.f64()).ln()).max(1.0);
        if at >= end {
            break;
        }
        let mut pick = rng.u32(..total);
        let fault = if plan.len() < first.len() {
            first[plan.len()]
        } else {
            mix.iter()
                .find(|(_, w)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .map(|m| m.0)
                .expect("a fault of the mix")
        };
        let hold = match fault {
            Fault::Kill9(_) => 0.5 + rng.f64() * 2.5,
            Fault::Upgrade { .. } | Fault::PgRestart => 0.0,
            Fault::PgStop => 20.0,
            Fault::Partition(_) => 5.0 + rng.f64() * 10.0,
            // Past the 3 s lease: the task is given to another worker while it is frozen.
            Fault::Freeze(_) => 5.0 + rng.f64() * 3.0,
            Fault::DiskFull => 10.0 + rng.f64() * 10.0,
            // At least until the standby is promoted (a cut), or the crashed node is
            // started again (a kill).
            Fault::Failover { .. } | Fault::ReplicaLoss => 10.0 + rng.f64() * 10.0,
            Fault::PoolerRestart => 1.0 + rng.f64() * 2.0,
        };
        plan.push(Planned { at, fault, hold });
    }
    plan
}

/// Starts the schedule: a task that starts each fault at its time.
pub fn start(soak: &Arc<Soak>, world: &Arc<World>, plan: Vec<Planned>) -> JoinHandle<()> {
    let (soak, world) = (soak.clone(), world.clone());
    tokio::spawn(async move {
        let locks: HashMap<&'static str, Arc<tokio::sync::Mutex<()>>> = plan
            .iter()
            .map(|p| (p.fault.target(), Arc::default()))
            .collect();
        let mut running = Vec::new();
        for p in plan {
            let wait = p.at - soak.now();
            if wait > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            if soak.load_stopped() {
                break;
            }
            let (s, w, lock) = (soak.clone(), world.clone(), locks[p.fault.target()].clone());
            running.push(tokio::spawn(async move {
                let _held = lock.lock().await;
                let from = s.now();
                let outcome = match tokio::time::timeout(
                    Duration::from_secs(180),
                    apply(&s, &w, p.fault, p.hold),
                )
                .await
                {
                    Ok(o) => o,
                    Err(_) => {
                        s.violation(
                            "faults are undone",
                            format!("{:?} did not finish in 3 minutes", p.fault),
                        );
                        "timed out".to_string()
                    }
                };
                eprintln!(
                    "SOAK fault {:.1}s–{:.1}s {} {}: {outcome}",
                    from,
                    s.now(),
                    p.fault.name(),
                    p.fault.target()
                );
                s.faults.lock().unwrap().push(FaultRecord {
                    kind: p.fault.name(),
                    target: p.fault.target().to_string(),
                    from,
                    to: s.now(),
                    outcome,
                });
            }));
        }
        for r in running {
            if let Err(e) = r.await {
                soak.violation("faults are undone", format!("a fault's task failed: {e}"));
            }
        }
    })
}

/// Waits for the faults in flight to be undone (no new one starts once the load stops).
pub async fn finish(faults: JoinHandle<()>) {
    let _ = faults.await;
}

/// Does `fault`, holds it, undoes it; says what came of it.
async fn apply(soak: &Soak, world: &Arc<World>, fault: Fault, hold: f64) -> String {
    let hold_for = Duration::from_secs_f64(hold);
    match fault {
        Fault::Kill9(role) => {
            let pid = world.kill9(soak, role);
            tokio::time::sleep(hold_for).await;
            world.restart(role);
            format!("killed pid {pid}, started again as pid {}", world.pid(role))
        }
        Fault::Upgrade { good } => {
            // The good bundle w3 does not run now: the one it runs is answered
            // "unchanged" (the same binary), which upgrades nothing.
            let pick = world.next_good();
            let bundle = if good {
                world.good[pick].clone()
            } else {
                world.bad.clone()
            };
            // A w3 just started again (after a kill) binds its port once it has
            // registered: an upgrade is sent to a w3 that serves.
            if !serving_w3(world).await {
                soak.violation("hot upgrades", "w3 did not answer /health for 60 s");
            }
            let old = world.pid("w3");
            // The old process exits once it has handed over: not a failure to restart.
            world.hold("w3", true);
            let (code, body) = upgrade(world, &bundle).await;
            world.hold("w3", false);
            let status = body["status"].as_str().unwrap_or("").to_string();
            let error = body["error"].as_str().unwrap_or("").to_string();
            match (good, code) {
                (true, 200) if status == "unchanged" => {
                    soak.violation(
                        "hot upgrades",
                        format!("the running binary was sent: {body}"),
                    );
                    format!("unchanged: {body}")
                }
                (true, 200) => match body["new_pid"].as_i64() {
                    Some(new) => {
                        world.upgraded("w3", new as i32);
                        world.runs_good(pick);
                        format!("pid {old} upgraded to pid {new}")
                    }
                    None => {
                        soak.violation("hot upgrades", format!("200 without a new pid: {body}"));
                        format!("200 without a new pid: {body}")
                    }
                },
                (false, 200) => {
                    soak.violation(
                        "hot upgrades",
                        format!("a bundle that exits was taken: {body}"),
                    );
                    format!("taken: {body}")
                }
                (_, 0) => {
                    soak.violation(
                        "hot upgrades",
                        format!("no answer from w3's /upgrade: {body}"),
                    );
                    format!("no answer: {body}")
                }
                (_, 500) if status == "rolled_back" => {
                    if good {
                        soak.count("good upgrade rolled back");
                    }
                    format!("rolled back: {error}")
                }
                (_, code) => format!("answered {code}: {body}"),
            }
        }
        Fault::PgRestart if world.db.single().is_none() => world.db.crash_primary_postgres().await,
        Fault::PgRestart => {
            let db = world.db.single().expect("one server");
            if let Ok(ClusterState::Running(pid)) = db.cluster.status() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGQUIT);
                for _ in 0..600 {
                    if !crate::common::procs::alive(pid as i32) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            start_postgres(world).await
        }
        Fault::PgStop => {
            let w = world.clone();
            let stopped = tokio::task::spawn_blocking(move || {
                w.db.single().is_some_and(|db| db.cluster.stop().is_ok())
            })
            .await;
            tokio::time::sleep(hold_for).await;
            format!("stopped ({stopped:?}); {}", start_postgres(world).await)
        }
        Fault::Partition(role) => {
            world.fleet.partition(role);
            tokio::time::sleep(hold_for).await;
            world.fleet.heal(role);
            format!("cut for {hold:.1} s")
        }
        Fault::Freeze(role) => {
            let pid = world.pid(role);
            let from = soak.now();
            world.fleet.signal_host(role, Signal::SIGSTOP);
            tokio::time::sleep(hold_for).await;
            let to = soak.now();
            world.fleet.signal_host(role, Signal::SIGCONT);
            soak.frozen.lock().unwrap().push((pid, from, to));
            format!("pid {pid} frozen for {:.1} s", to - from)
        }
        Fault::Failover { cut } => match world.db.failover(&world.fleet, cut, hold_for).await {
            Ok(outcome) => outcome,
            Err(e) => {
                soak.violation("failovers", e.clone());
                e
            }
        },
        Fault::PoolerRestart => world.db.restart_pooler(hold_for).await,
        Fault::ReplicaLoss => world.db.lose_replica(&world.fleet, hold_for).await,
        Fault::DiskFull => {
            let filler = world.uploads.join("soak-filler");
            let f = filler.clone();
            let filled = tokio::task::spawn_blocking(move || fill(&f))
                .await
                .unwrap_or(0);
            tokio::time::sleep(hold_for).await;
            let _ = std::fs::remove_file(&filler);
            format!("filled with {} MiB for {hold:.1} s", filled / (1024 * 1024))
        }
    }
}

/// Starts PostgreSQL again in its host.
async fn start_postgres(world: &Arc<World>) -> String {
    let w = world.clone();
    let start = move || w.db.single().expect("one server").start_in_host();
    match tokio::task::spawn_blocking(start).await {
        Ok(()) => "started again".into(),
        Err(_) => "did not start (see postgres.log)".into(),
    }
}

/// Writes `file` until the disk is full; returns the bytes written.
fn fill(file: &std::path::Path) -> u64 {
    let Ok(mut f) = std::fs::File::create(file) else {
        return 0;
    };
    let block = vec![0u8; 1024 * 1024];
    let mut n = 0u64;
    while f.write_all(&block).is_ok() {
        n += block.len() as u64;
    }
    n
}

/// `curl -T bundle` to w3's `/upgrade` from host `cl`: (status, body).
async fn upgrade(world: &Arc<World>, bundle: &std::path::Path) -> (u16, Value) {
    let url = format!("http://{}/upgrade", world.w3_http());
    let auth = format!("Authorization: Bearer {}", world.upgrade_token());
    let bundle = bundle.to_string_lossy().into_owned();
    let w = world.clone();
    let out = tokio::task::spawn_blocking(move || {
        w.fleet.exec(
            "cl",
            "curl",
            &[
                "-sS",
                "--max-time",
                "120",
                "-w",
                "\n%{http_code}",
                "-H",
                &auth,
                "-T",
                &bundle,
                &url,
            ],
        )
    })
    .await
    .expect("the curl thread");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code: u16 = code.trim().parse().unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or_else(|_| {
        Value::String(format!(
            "{body} {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    });
    (code, body)
}

/// Waits (up to 60 s) until w3 answers `/health` from host `cl`.
async fn serving_w3(world: &Arc<World>) -> bool {
    for _ in 0..120 {
        let w = world.clone();
        let answer =
            tokio::task::spawn_blocking(move || w.fleet.http_get("cl", &w.w3_http(), "/health"))
                .await
                .expect("the curl thread");
        if answer.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

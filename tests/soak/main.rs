//! The soak (issue 25 §1): faults together, for as long as asked. A fleet of network
//! namespaces (PostgreSQL, two planners, three workers, a client host) and `artex serve`
//! run a steady mix of tasks, flows, uploads, unique and scheduled tasks under a kind
//! limit, with operators' cancels and pauses, API readers and an `/events` consumer,
//! while a seeded schedule of overlapping faults hits them: kill -9 of workers and
//! planners, hot upgrades (good bundles, and bad ones that must roll back), PostgreSQL
//! immediate restarts and 20 s stops, a worker host's link cut, SIGSTOP past the lease,
//! a full upload disk. The invariants are checked while it runs and at the end; a report
//! (invariants, faults with their times, figures and an SVG picture) is written to the
//! output folder, and any broken invariant fails the run.
//!
//! Run by `scripts/soak.sh [--minutes N] [--seed S] [--out DIR]` (ignored by the plain
//! suite: `scripts/test.sh` calls that script for 3 minutes). Needs root (namespaces,
//! a tmpfs mount).
//!
//! # Layout
//! - `world`: the fleet, its processes and the restarts a supervisor would make.
//! - `load`: the steady mix and the readers; every acknowledged submission is recorded.
//! - `faults`: the seeded schedule and each fault's doing and undoing.
//! - `checks`: the invariants, while it runs and at the end.
//! - `report`: report.md, faults.tsv, samples.tsv and soak.svg.

#[path = "../common/mod.rs"]
mod common;

mod checks;
mod faults;
mod load;
mod report;
mod topology;
mod world;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// What a run is asked for: `ARTEX_SOAK_MINUTES`, `ARTEX_SOAK_SEED`, `ARTEX_SOAK_OUT`,
/// `ARTEX_SOAK_TOPOLOGY`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long the load and the faults run (the drain and the checks come after).
    pub minutes: f64,
    /// The fault schedule's and the load's seed: the same seed, the same schedule.
    pub seed: u64,
    /// Where the report goes.
    pub out: PathBuf,
    /// Where the blackboard lives (`single` unless asked).
    pub topology: topology::Topology,
}

impl Settings {
    fn from_env() -> Settings {
        let minutes = std::env::var("ARTEX_SOAK_MINUTES")
            .ok()
            .map(|m| {
                m.parse::<f64>()
                    .ok()
                    .filter(|m| *m >= 1.0)
                    .unwrap_or_else(|| panic!("ARTEX_SOAK_MINUTES={m}: expected minutes >= 1"))
            })
            .unwrap_or(3.0);
        let seed = std::env::var("ARTEX_SOAK_SEED")
            .ok()
            .map(|s| {
                s.parse::<u64>()
                    .unwrap_or_else(|_| panic!("ARTEX_SOAK_SEED={s}: expected a number"))
            })
            .unwrap_or_else(|| fastrand::u64(..u64::from(u32::MAX)));
        let out = std::env::var("ARTEX_SOAK_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| std::env::temp_dir().join(format!("artex-soak-{seed}")));
        let topology = std::env::var("ARTEX_SOAK_TOPOLOGY")
            .map(|t| {
                topology::Topology::parse(&t).unwrap_or_else(|e| panic!("ARTEX_SOAK_TOPOLOGY={e}"))
            })
            .unwrap_or(topology::Topology::Single);
        Settings {
            minutes,
            seed,
            out,
            topology,
        }
    }

    /// The run's length.
    pub fn length(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }

    /// From when memory and descriptors must stay flat: the tenth minute, or a third of
    /// a shorter run.
    pub fn warm_up(&self) -> Duration {
        Duration::from_secs_f64((self.minutes * 60.0 / 3.0).min(600.0))
    }

    /// The history's retention: long enough for the checkers, short enough that a run
    /// prunes (a sixth of the run, 1 to 15 minutes).
    pub fn retention_minutes(&self) -> u64 {
        ((self.minutes / 6.0).round() as u64).clamp(1, 15)
    }
}

/// What a submission expects of its task.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// Any final status.
    Ends,
    /// Succeeded, its result's `sha256` this (an upload's digest).
    Digest(String),
}

/// An acknowledged task (its submission committed), until it is seen final.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Seconds into the run it was acknowledged.
    pub at: f64,
    /// Its kind.
    pub kind: String,
    /// What it must end as.
    pub expect: Expect,
    /// The final status it was seen in.
    pub ended: Option<String>,
}

/// One broken invariant: when and what.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Seconds into the run.
    pub at: f64,
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub what: String,
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// Its kind (`kill9`, `upgrade`, …).
    pub kind: &'static str,
    /// What it hit.
    pub target: String,
    /// Seconds into the run it began and ended (undone).
    pub from: f64,
    /// See `from`.
    pub to: f64,
    /// What came of it (e.g. "rolled back: …").
    pub outcome: String,
}

/// One sample of the run's figures.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds into the run.
    pub at: f64,
    /// Tasks that succeeded per second since the previous sample.
    pub throughput: Option<f64>,
    /// p99 of submit-to-finish latency of the short kinds finished since the last sample, ms.
    pub p99_ms: Option<f64>,
    /// Tasks waiting (pending or assigned).
    pub backlog: Option<i64>,
    /// PostgreSQL client backends.
    pub backends: Option<i64>,
    /// Bytes of the tasks table and the history, indexes included.
    pub table_bytes: Option<i64>,
    /// (role, pid, RSS in KiB, open descriptors) of each long-lived process.
    pub procs: Vec<(String, i32, u64, usize)>,
}

/// Everything the parts of the run share.
pub struct Soak {
    /// The run's settings.
    pub settings: Settings,
    started: Instant,
    /// Acknowledged tasks by id.
    pub acked: Mutex<HashMap<Uuid, Acked>>,
    /// Acknowledged flows, and whether each was seen finished.
    pub flows: Mutex<HashMap<Uuid, bool>>,
    /// Broken invariants.
    pub violations: Mutex<Vec<Violation>>,
    /// Faults as they happened.
    pub faults: Mutex<Vec<FaultRecord>>,
    /// Samples over time.
    pub samples: Mutex<Vec<Sample>>,
    /// When each pid was killed (kill -9), seconds into the run.
    pub deaths: Mutex<HashMap<i32, f64>>,
    /// Windows during which a pid was frozen (SIGSTOP): (pid, from, to).
    pub frozen: Mutex<Vec<(i32, f64, f64)>>,
    /// Counters of what the load did (submissions refused, API answers by status, …).
    pub counters: Mutex<std::collections::BTreeMap<String, u64>>,
    /// How far the feed consumer's events were compared with the history.
    pub feed_checked: Mutex<Option<(u64, i64)>>,
    /// Set when the load must stop submitting.
    pub stop_load: AtomicBool,
    /// Set when everything must stop (the end of the run).
    pub stop_all: AtomicBool,
}

impl Soak {
    fn new(settings: Settings) -> Soak {
        Soak {
            settings,
            started: Instant::now(),
            acked: Mutex::default(),
            flows: Mutex::default(),
            violations: Mutex::default(),
            faults: Mutex::default(),
            samples: Mutex::default(),
            deaths: Mutex::default(),
            frozen: Mutex::default(),
            counters: Mutex::default(),
            feed_checked: Mutex::default(),
            stop_load: AtomicBool::new(false),
            stop_all: AtomicBool::new(false),
        }
    }

    /// Seconds into the run.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Records a broken invariant (and says so at once on stderr).
    pub fn violation(&self, invariant: &'static str, what: impl Into<String>) {
        let v = Violation {
            at: self.now(),
            invariant,
            what: what.into(),
        };
        eprintln!(
            "SOAK VIOLATION at {:.1}s [{}]: {}",
            v.at, v.invariant, v.what
        );
        self.violations.lock().unwrap().push(v);
    }

    /// Adds one to a counter.
    pub fn count(&self, name: &str) {
        *self
            .counters
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert(0) += 1;
    }

    /// The flows not seen finished yet.
    pub fn open_flows(&self) -> Vec<Uuid> {
        self.flows
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, done)| !**done)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether the load must stop.
    pub fn load_stopped(&self) -> bool {
        self.stop_load.load(Ordering::Relaxed)
    }

    /// Whether the run is over.
    pub fn over(&self) -> bool {
        self.stop_all.load(Ordering::Relaxed)
    }
}

/// Sleeps `d`, waking early when the run is over; false then.
pub async fn pause(soak: &Soak, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if soak.over() {
            return false;
        }
        tokio::time::sleep((end - Instant::now()).min(Duration::from_millis(250))).await;
    }
    !soak.over()
}

#[tokio::test]
#[ignore = "hours-long; run by scripts/soak.sh"]
async fn soak() {
    let settings = Settings::from_env();
    std::fs::create_dir_all(&settings.out).expect("the report folder");
    eprintln!(
        "SOAK seed={} minutes={} topology={} out={} \
         (replay: scripts/soak.sh --seed {} --minutes {} --topology {})",
        settings.seed,
        settings.minutes,
        settings.topology.name(),
        settings.out.display(),
        settings.seed,
        settings.minutes,
        settings.topology.name()
    );
    let soak = Arc::new(Soak::new(settings.clone()));
    let world = Arc::new(world::World::start(&soak).await);
    eprintln!("SOAK fleet up at {:.1}s", soak.now());

    let load = load::start(&soak, &world).await;
    let checkers = checks::start(&soak, &world, &load.feed);
    let schedule = faults::schedule(&settings);
    let faults = faults::start(&soak, &world, schedule);

    tokio::time::sleep(settings.length()).await;
    eprintln!("SOAK load and faults stop at {:.1}s", soak.now());
    soak.stop_load.store(true, Ordering::Relaxed);
    faults::finish(faults).await;
    world.heal_everything().await;
    load.finish().await;
    checks::drain(&soak, &world).await;
    soak.stop_all.store(true, Ordering::Relaxed);
    for c in checkers {
        let _ = c.await;
    }
    let feed = load.feed.clone();
    let _ = load.consumer.await;
    checks::at_end(&soak, &world, &feed).await;
    world.keep_logs(&settings.out.join("logs"));
    let report = report::write(&soak);
    eprintln!("SOAK report: {}", report.display());
    let violations = soak.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "{} invariant(s) broken (seed {}); see {}:\n{}",
        violations.len(),
        settings.seed,
        report.display(),
        violations
            .iter()
            .take(30)
            .map(|v| format!("{:.1}s [{}] {}", v.at, v.invariant, v.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

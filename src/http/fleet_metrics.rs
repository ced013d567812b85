//! `artex serve`'s fleet-wide `/metrics`: one call of the blackboard's
//! `artex.fleet_metrics` per `--metrics-every` (5 s) at most, however many scrapers ask
//! (the first to find the figures stale reads them while the others wait for its answer),
//! written in Prometheus' text format. docs/metrics.md lists every metric.

use std::sync::Arc;
use std::time::{Duration, Instant};

use artex_actors::blackboard::{FleetSample, OperatorBoard};
use artex_actors::metrics::{Exposition, Type};
use tokio::sync::Mutex;

/// A read of the fleet: when, and its lines.
type Read = (Instant, Arc<String>);

/// The last read of the fleet, shared by every scrape of this process.
#[derive(Clone)]
pub struct FleetMetrics {
    every: Duration,
    last: Arc<Mutex<Option<Read>>>,
}

impl FleetMetrics {
    /// Reads of the fleet serve scrapes for `every`.
    pub fn new(every: Duration) -> Self {
        FleetMetrics {
            every,
            last: Arc::default(),
        }
    }

    /// The fleet's lines: read now if the last read is older than `every` (one read at
    /// a time: concurrent scrapes wait for it and share it), else the last read's.
    pub async fn text(&self, bb: &OperatorBoard) -> Arc<String> {
        let mut last = self.last.lock().await;
        if let Some((at, text)) = last.as_ref() {
            if at.elapsed() < self.every {
                return text.clone();
            }
        }
        let started = Instant::now();
        let read = bb.fleet_metrics().await;
        let took = started.elapsed();
        let text = Arc::new(match read {
            Ok(samples) => render(&samples, took),
            Err(e) => {
                tracing::warn!(error = %e, "/metrics: reading the fleet");
                let mut out = Exposition::new();
                out.single(UP, Type::Gauge, UP_HELP, 0.0);
                out.finish()
            }
        });
        *last = Some((Instant::now(), text.clone()));
        text
    }
}

const UP: &str = "artex_fleet_metrics_up";
const UP_HELP: &str = "1 if the last read of the fleet from the blackboard succeeded.";

/// A family of the fleet: its name, type, help, and the sample's `metric` in
/// `artex.fleet_metrics`, with the name of its `label` column if it has one.
struct Family {
    name: &'static str,
    kind: Type,
    help: &'static str,
    metric: &'static str,
    label: Option<&'static str>,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "artex_fleet_tasks",
        kind: Type::Gauge,
        help: "Unfinished tasks by kind and status (pending, blocked and paused counted up to 100,000 per status).",
        metric: "tasks",
        label: Some("status"),
    },
    Family {
        name: "artex_fleet_oldest_runnable_age_seconds",
        kind: Type::Gauge,
        help: "How long the oldest pending task of the kind whose time has come has waited (0: none waits).",
        metric: "oldest_runnable_age_seconds",
        label: None,
    },
    Family {
        name: "artex_fleet_tasks_ended_total",
        kind: Type::Counter,
        help: "Tasks ended by kind and outcome, counted from the history (artex.kind_outcomes).",
        metric: "ended",
        label: Some("outcome"),
    },
    Family {
        name: "artex_fleet_workers",
        kind: Type::Gauge,
        help: "Workers in the roster by state.",
        metric: "workers",
        label: Some("state"),
    },
    Family {
        name: "artex_fleet_kind_workers",
        kind: Type::Gauge,
        help: "Online workers that run the kind.",
        metric: "kind_workers",
        label: None,
    },
    Family {
        name: "artex_kind_paused",
        kind: Type::Gauge,
        help: "1 for each paused kind (artex kind pause): its tasks stay pending.",
        metric: "kind_paused",
        label: None,
    },
    Family {
        name: "artex_fleet_kind_limit_concurrency",
        kind: Type::Gauge,
        help: "The kind's fleet-wide concurrency limit (artex kind limit).",
        metric: "limit_concurrency",
        label: None,
    },
    Family {
        name: "artex_fleet_kind_limit_key_concurrency",
        kind: Type::Gauge,
        help: "The kind's concurrency limit per limit_key.",
        metric: "limit_key_concurrency",
        label: None,
    },
    Family {
        name: "artex_fleet_kind_limit_rate_per_second",
        kind: Type::Gauge,
        help: "The kind's rate limit, tasks started per second.",
        metric: "limit_rate_per_second",
        label: None,
    },
    Family {
        name: "artex_fleet_kind_limit_held",
        kind: Type::Gauge,
        help: "The kind's tasks held now (assigned or running) that count against its limits.",
        metric: "limit_held",
        label: None,
    },
    Family {
        name: "artex_fleet_counts_capped",
        kind: Type::Gauge,
        help: "1 for a status whose count reached the cap (100,000): at least that many.",
        metric: "counts_capped",
        label: Some("status"),
    },
];

/// The fleet's samples in the text format, with how long their read took.
pub fn render(samples: &[FleetSample], took: Duration) -> String {
    let mut out = Exposition::new();
    out.single(UP, Type::Gauge, UP_HELP, 1.0);
    out.single(
        "artex_fleet_metrics_read_seconds",
        Type::Gauge,
        "How long the last read of the fleet from the blackboard took.",
        took.as_secs_f64(),
    );
    for f in FAMILIES {
        out.family(f.name, f.kind, f.help);
        for s in samples.iter().filter(|s| s.metric == f.metric) {
            let mut labels = Vec::with_capacity(2);
            if let Some(kind) = &s.kind {
                labels.push(("kind", kind.as_str()));
            }
            if let (Some(name), Some(value)) = (f.label, &s.label) {
                labels.push((name, value.as_str()));
            }
            out.sample(f.name, &labels, s.value);
        }
    }
    out.finish()
}

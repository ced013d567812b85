//! Prometheus' text exposition format, written by hand for the few shapes artex needs:
//! [`Exposition`] writes families (`# HELP`, `# TYPE`, samples with escaped labels), and
//! [`Counter`], [`Histogram`] and [`ByKind`] are lock-free instruments the hot paths
//! bump (an atomic add each) and a scrape reads. Serve, workers and planners all write
//! their `/metrics` through this one module (docs/metrics.md lists what each exposes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The content type of the text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's type, as `# TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// Only goes up (resets at a restart).
    Counter,
    /// Any value.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        }
    }
}

/// A `/metrics` body being written: families one after another, each with its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty body.
    pub fn new() -> Self {
        Exposition::default()
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines. Its samples follow.
    pub fn family(&mut self, name: &str, kind: Type, help: &str) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.name()
        );
        self
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Type, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The samples of one histogram (`_bucket{le}` cumulative, `_sum`, `_count`) with
    /// `labels`; its family is started by the caller.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0;
        for (bound, n) in h.bounds.iter().zip(&h.counts) {
            cumulative += n;
            self.bucket(name, labels, &number(*bound), cumulative);
        }
        cumulative += h.counts.last().copied().unwrap_or(0);
        self.bucket(name, labels, "+Inf", cumulative);
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    fn bucket(&mut self, name: &str, labels: &[(&str, &str)], le: &str, n: u64) {
        let _ = write!(self.out, "{name}_bucket");
        write_labels(&mut self.out, labels, Some(le));
        let _ = writeln!(self.out, " {n}");
    }

    /// Appends lines written elsewhere in this format.
    pub fn raw(&mut self, text: &str) -> &mut Self {
        self.out.push_str(text);
        self
    }

    /// The body.
    pub fn finish(self) -> String {
        self.out
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
    }
    out.push('}');
}

/// A label value as the format wants it: backslash, double quote and newline escaped.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A sample value: integers without a fraction, `NaN` and `±Inf` as the format spells them.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A counter: one atomic add per event.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Its value now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Bucket bounds for waits and run times, seconds: 5 ms to an hour.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Bucket bounds for a planner's rounds, seconds: 1 ms to 10 s.
pub const ROUND_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A histogram of durations: a count per bucket (not cumulative: each observation is
/// one atomic add in one bucket) and the sum in microseconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, and one past the last (`+Inf`).
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

/// What a [`Histogram`] holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds, seconds.
    pub bounds: &'static [f64],
    /// Observations per bucket, not cumulative; one more than `bounds` (`+Inf`).
    pub counts: Vec<u64>,
    /// Sum of the observations, seconds.
    pub sum: f64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (seconds, increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.partition_point(|b| *b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Its buckets and sum now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// One instrument per task kind, made on a kind's first event: a read lock and an
/// atomic add afterwards (kinds are few and fixed by the handlers a process runs, so the
/// label stays bounded).
#[derive(Debug)]
pub struct ByKind<T> {
    make: fn() -> T,
    kinds: RwLock<BTreeMap<String, Arc<T>>>,
}

impl<T> ByKind<T> {
    /// Empty; `make` builds a kind's instrument.
    pub fn new(make: fn() -> T) -> Self {
        ByKind {
            make,
            kinds: RwLock::new(BTreeMap::new()),
        }
    }

    /// The instrument of `kind`.
    pub fn of(&self, kind: &str) -> Arc<T> {
        if let Some(t) = self.kinds.read().ok().and_then(|m| m.get(kind).cloned()) {
            return t;
        }
        let mut kinds = match self.kinds.write() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        };
        kinds
            .entry(kind.to_string())
            .or_insert_with(|| Arc::new((self.make)()))
            .clone()
    }

    /// Every kind's instrument, by kind.
    pub fn all(&self) -> Vec<(String, Arc<T>)> {
        let kinds = match self.kinds.read() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        };
        kinds.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

pub mod parse;
pub mod planner;

#[cfg(test)]
mod tests;

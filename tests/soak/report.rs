//! The soak's report: `report.md` (the invariants, the figures, the faults), `faults.tsv`
//! and `samples.tsv` (the raw series), and `soak.svg`: throughput, latency p99, RSS and
//! backlog over time, each fault a band across the panels, coloured by kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::{Sample, Soak};

/// The invariants the report lists, in order (a violation names one of them).
const INVARIANTS: [&str; 15] = [
    "0 acknowledged tasks lost",
    "0 succeeded twice",
    "0 overlapping executions",
    "every flow finished",
    "uploads run once with their file",
    "unique keys",
    "kind limits",
    "schedules fire once",
    "feed once and in order",
    "memory flat",
    "descriptors flat",
    "backends within the budget",
    "history bounded by the retention",
    "no deadlock",
    "api answers",
];

/// Writes every file; returns the path of report.md.
pub fn write(soak: &Soak) -> PathBuf {
    let out = &soak.settings.out;
    let samples = soak.samples.lock().unwrap().clone();
    let mut faults = soak.faults.lock().unwrap().clone();
    faults.sort_by(|a, b| a.from.total_cmp(&b.from));
    let violations = soak.violations.lock().unwrap().clone();
    let counters = soak.counters.lock().unwrap().clone();

    let mut tsv = String::from("from_s\tto_s\tfault\ttarget\toutcome\n");
    for f in &faults {
        let _ = writeln!(
            tsv,
            "{:.1}\t{:.1}\t{}\t{}\t{}",
            f.from, f.to, f.kind, f.target, f.outcome
        );
    }
    let _ = std::fs::write(out.join("faults.tsv"), tsv);
    let mut tsv =
        String::from("at_s\ttasks_per_s\tp99_ms\tbacklog\tbackends\ttable_bytes\tprocesses\n");
    for s in &samples {
        let opt = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_default();
        let procs: Vec<String> = s
            .procs
            .iter()
            .map(|(r, pid, rss, fds)| format!("{r}:{pid}:{rss}KiB:{fds}fd"))
            .collect();
        let _ = writeln!(
            tsv,
            "{:.1}\t{}\t{}\t{}\t{}\t{}\t{}",
            s.at,
            opt(s.throughput),
            opt(s.p99_ms),
            s.backlog.map(|v| v.to_string()).unwrap_or_default(),
            s.backends.map(|v| v.to_string()).unwrap_or_default(),
            s.table_bytes.map(|v| v.to_string()).unwrap_or_default(),
            procs.join(" ")
        );
    }
    let _ = std::fs::write(out.join("samples.tsv"), tsv);
    let _ = std::fs::write(out.join("soak.svg"), svg(&samples, &faults));

    let acked = soak.acked.lock().unwrap();
    let mut ended: BTreeMap<String, u64> = BTreeMap::new();
    for a in acked.values() {
        *ended
            .entry(a.ended.clone().unwrap_or_else(|| "unfinished".into()))
            .or_insert(0) += 1;
    }
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(f.kind).or_insert(0) += 1;
    }
    let mut md = String::new();
    let verdict = if violations.is_empty() {
        "PASSED"
    } else {
        "FAILED"
    };
    let _ = writeln!(md, "# artex soak: {verdict}\n");
    let _ = writeln!(
        md,
        "Seed {} · {} minutes of load and faults · topology {} · retention {} min · replay: \
         `scripts/soak.sh --seed {} --minutes {} --topology {}`\n",
        soak.settings.seed,
        soak.settings.minutes,
        soak.settings.topology.name(),
        soak.settings.retention_minutes(),
        soak.settings.seed,
        soak.settings.minutes,
        soak.settings.topology.name()
    );
    let _ = writeln!(md, "![throughput, latency, memory, backlog](soak.svg)\n");
    let _ = writeln!(md, "## Invariants\n\n| invariant | broken |\n|---|---|");
    for inv in INVARIANTS {
        let n = violations.iter().filter(|v| v.invariant == inv).count();
        let _ = writeln!(
            md,
            "| {inv} | {} |",
            if n == 0 {
                "no".to_string()
            } else {
                format!("**{n} times**")
            }
        );
    }
    if !violations.is_empty() {
        let _ = writeln!(md, "\n### Violations\n");
        for v in violations.iter().take(200) {
            let _ = writeln!(md, "- {:.1} s [{}] {}", v.at, v.invariant, v.what);
        }
    }
    let _ = writeln!(md, "\n## Figures\n");
    let _ = writeln!(
        md,
        "- acknowledged tasks: {} ({})",
        acked.len(),
        fmt_map(&ended)
    );
    let (flows, finished) = {
        let f = soak.flows.lock().unwrap();
        (f.len(), f.values().filter(|d| **d).count())
    };
    let _ = writeln!(md, "- flows: {flows} ({finished} finished)");
    let thr: Vec<f64> = samples.iter().filter_map(|s| s.throughput).collect();
    let p99: Vec<f64> = samples.iter().filter_map(|s| s.p99_ms).collect();
    if !thr.is_empty() {
        let _ = writeln!(
            md,
            "- tasks succeeded per second: mean {:.0}, max {:.0}",
            thr.iter().sum::<f64>() / thr.len() as f64,
            thr.iter().cloned().fold(0.0, f64::max)
        );
    }
    if !p99.is_empty() {
        let mut sorted = p99.clone();
        sorted.sort_by(f64::total_cmp);
        let _ = writeln!(
            md,
            "- submit-to-finish p99 of short tasks per 5 s: median {:.0} ms, worst {:.0} ms",
            sorted[sorted.len() / 2],
            sorted[sorted.len() - 1]
        );
    }
    for (k, v) in &counters {
        let _ = writeln!(md, "- {k}: {v}");
    }
    let _ = writeln!(
        md,
        "\n## Faults ({}: {})\n",
        faults.len(),
        fmt_map(&by_kind)
    );
    let _ = writeln!(
        md,
        "| from s | to s | fault | target | outcome |\n|---|---|---|---|---|"
    );
    for f in &faults {
        let _ = writeln!(
            md,
            "| {:.1} | {:.1} | {} | {} | {} |",
            f.from,
            f.to,
            f.kind,
            f.target,
            f.outcome.replace('|', "/")
        );
    }
    let path = out.join("report.md");
    let _ = std::fs::write(&path, md);
    path
}

fn fmt_map<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Samples further apart than this (seconds) are not joined by a line.
const MAX_SAMPLE_GAP: f64 = 12.0;

/// The colour of a fault kind's band.
fn colour(kind: &str) -> &'static str {
    match kind {
        "kill9" => "#d62728",
        "upgrade" => "#2ca02c",
        "bad-upgrade" => "#98df8a",
        "pg-restart" => "#9467bd",
        "pg-stop" => "#8c564b",
        "partition" => "#ff7f0e",
        "freeze" => "#1f77b4",
        "disk-full" => "#7f7f7f",
        _ => "#bcbd22",
    }
}

/// Four panels over time: tasks/s, p99 ms, RSS MiB per process role, backlog.
fn svg(samples: &[Sample], faults: &[crate::FaultRecord]) -> String {
    const W: f64 = 1000.0;
    const PANEL: f64 = 150.0;
    const LEFT: f64 = 70.0;
    const TOP: f64 = 40.0;
    const GAP: f64 = 30.0;
    let end = samples.last().map(|s| s.at).unwrap_or(1.0).max(1.0);
    let x = |t: f64| LEFT + (t / end) * (W - LEFT - 20.0);
    let mut rss: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in samples {
        for (role, _, kib, _) in &s.procs {
            rss.entry(role.clone())
                .or_default()
                .push((s.at, *kib as f64 / 1024.0));
        }
    }
    // (title, its lines: each a list of (at, value)).
    type Panel<'a> = (&'a str, Vec<Vec<(f64, f64)>>);
    let series: Vec<Panel> = vec![
        (
            "tasks succeeded / s",
            vec![samples
                .iter()
                .filter_map(|s| s.throughput.map(|v| (s.at, v)))
                .collect()],
        ),
        (
            "p99 submit→finish, ms (short tasks)",
            vec![samples
                .iter()
                .filter_map(|s| s.p99_ms.map(|v| (s.at, v)))
                .collect()],
        ),
        (
            "RSS, MiB (p1 p2 w1 w2 w3 serve)",
            rss.values().cloned().collect(),
        ),
        (
            "backlog (pending + assigned)",
            vec![samples
                .iter()
                .filter_map(|s| s.backlog.map(|v| (s.at, v as f64)))
                .collect()],
        ),
    ];
    let height = TOP + 4.0 * (PANEL + GAP) + 60.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">artex soak: {} faults over {:.1} minutes</text>\n",
        faults.len(),
        end / 60.0
    );
    let lines = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    ];
    for (i, (title, lines_of)) in series.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL + GAP);
        let max = lines_of
            .iter()
            .flatten()
            .map(|p| p.1)
            .fold(0.0, f64::max)
            .max(1.0);
        let y = |v: f64| top + PANEL - (v / max) * PANEL;
        for f in faults {
            let (a, b) = (x(f.from), x(f.to.max(f.from + end / 500.0)));
            let _ = writeln!(
                svg,
                "<rect x=\"{a:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{PANEL}\" fill=\"{}\" fill-opacity=\"0.25\"/>",
                b - a,
                colour(f.kind)
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{PANEL}\" fill=\"none\" stroke=\"#444\"/>\n\
             <text x=\"{LEFT}\" y=\"{:.1}\">{title}</text>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{max:.0}</text>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">0</text>",
            W - LEFT - 20.0,
            top - 4.0,
            LEFT - 4.0,
            top + 10.0,
            LEFT - 4.0,
            top + PANEL
        );
        for (j, points) in lines_of.iter().enumerate() {
            // A gap in the samples (PostgreSQL away, a process restarted) is a gap in
            // the line, not a slope across it.
            for run in points.chunk_by(|a, b| b.0 - a.0 <= MAX_SAMPLE_GAP) {
                let path: Vec<String> = run
                    .iter()
                    .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                    .collect();
                let _ = writeln!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" points=\"{}\"/>",
                    lines[j % lines.len()],
                    path.join(" ")
                );
            }
        }
    }
    let axis = TOP + 4.0 * (PANEL + GAP) - GAP + 14.0;
    let step = if end > 1800.0 {
        600.0
    } else if end > 300.0 {
        60.0
    } else {
        30.0
    };
    let mut t = 0.0;
    while t <= end {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{axis:.1}\" text-anchor=\"middle\">{}:{:02}</text>",
            x(t),
            t as u64 / 60,
            t as u64 % 60
        );
        t += step;
    }
    let mut lx = LEFT;
    for kind in [
        "kill9",
        "upgrade",
        "bad-upgrade",
        "pg-restart",
        "pg-stop",
        "partition",
        "freeze",
        "disk-full",
    ] {
        let _ = writeln!(
            svg,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\" fill-opacity=\"0.5\"/><text x=\"{:.1}\" y=\"{:.1}\">{kind}</text>",
            axis + 14.0,
            colour(kind),
            lx + 16.0,
            axis + 24.0
        );
        lx += 110.0;
    }
    svg.push_str("</svg>\n");
    svg
}

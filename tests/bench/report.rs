//! What the bench prints: one `RESULT name=value unit` line per figure (the names and
//! units of the bash bench before it, so earlier figures stay comparable), `# …` lines
//! of context, and a progress line on stderr while a long workload runs.

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// `RESULT name=value unit`.
pub fn result(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("RESULT {name}={value} {unit}");
}

/// `x` with `decimals` decimals (the bash bench's `calc`).
pub fn fixed(x: f64, decimals: usize) -> String {
    format!("{x:.decimals$}")
}

/// The median of `v` (the upper of the middle two when their count is even); `v` is not
/// empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The host as a part begins: the machine's CPU ticks so far, all of them and the
/// hypervisor's steal (/proc/stat's first line; zeros where it cannot be read), and its
/// pace ([`host_pace_ns`]). [`Host::print_since`] reports the part.
pub struct Host {
    total: u64,
    steal: u64,
    pace: f64,
}

impl Host {
    pub fn now() -> Host {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|t| t.parse().ok())
            .collect();
        Host {
            total: ticks.iter().sum(),
            steal: ticks.get(7).copied().unwrap_or(0),
            pace: host_pace_ns(),
        }
    }

    /// After `part`: the share of the machine's CPU time the hypervisor took away since
    /// `self` (steal), and the slower of the host's paces before and after. A part whose
    /// host was busy elsewhere runs slower at the same code, and these tell the two apart.
    pub fn print_since(&self, part: &str) {
        let after = Host::now();
        let total = after.total.saturating_sub(self.total);
        let steal = after.steal.saturating_sub(self.steal);
        let pct = 100.0 * steal as f64 / total.max(1) as f64;
        println!(
            "# {part}: the host's steal {}% of the CPU time; its pace {} / {} ns (before / after)",
            fixed(pct, 1),
            fixed(self.pace, 2),
            fixed(after.pace, 2)
        );
        result(&format!("host_steal_pct_{part}"), fixed(pct, 1), "%");
        let pace = fixed(self.pace.max(after.pace), 2);
        result(&format!("host_pace_ns_{part}"), pace, "ns");
    }
}

/// The host's pace: nanoseconds one core takes for a fixed piece of arithmetic, the
/// median of five tries. The same code runs it in the same time on an idle host; on
/// this shared one it took up to twice as long when the neighbours were busy, which
/// steal alone did not show.
fn host_pace_ns() -> f64 {
    let tries = (0..5)
        .map(|_| {
            let t = Instant::now();
            let mut x: u64 = 1;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
            }
            t.elapsed().as_secs_f64() * 1e9 / 1e6
        })
        .collect();
    median(tries)
}

/// How many times a part repeats its measurement: `var` when it is set (at least 1),
/// else once with --quick and three times otherwise. A burst lasts about a second, and
/// what the host's two cores do in that second moves one burst's figures by a quarter.
pub fn repeats(var: &str, quick: bool) -> usize {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&r| r > 0)
            .unwrap_or_else(|| panic!("{var}={v}: expected a whole number, at least 1")),
        Err(_) if quick => 1,
        Err(_) => 3,
    }
}

/// The ceilings the limit part measured, by which throughput figures are divided (none
/// when `limit` did not run).
#[derive(Debug, Default, Clone, Copy)]
pub struct Ceilings {
    /// Jobs/s at 1 job a transaction.
    pub one: Option<f64>,
    /// Jobs/s at 100 jobs a transaction.
    pub hundred: Option<f64>,
    /// The 1-client claim + done latency, ms.
    pub floor_ms: Option<f64>,
}

impl Ceilings {
    /// A throughput figure, and the same as a fraction of both ceilings.
    pub fn throughput(&self, name: &str, tasks_per_s: f64) {
        let rate = fixed(tasks_per_s, 0);
        result(name, &rate, "tasks/s");
        // As the bash did: the ratio of the printed (rounded) figures.
        let rate: f64 = rate.parse().unwrap_or(tasks_per_s);
        if let (Some(one), Some(hundred)) = (self.one, self.hundred) {
            result(
                &format!("{name}_vs_limit_1_per_tx"),
                fixed(rate / one, 3),
                "ratio",
            );
            result(
                &format!("{name}_vs_limit_100_per_tx"),
                fixed(rate / hundred, 3),
                "ratio",
            );
        }
    }
}

/// The progress line of a workload: tasks done of all, and the rate since the last line.
/// Rewritten in place on a terminal, one line every few seconds otherwise (a log).
pub struct Progress {
    label: String,
    total: u64,
    last: (Instant, u64),
    tty: bool,
}

impl Progress {
    pub fn new(label: &str, total: u64) -> Progress {
        Progress {
            label: label.to_string(),
            total,
            last: (Instant::now(), 0),
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// `done` tasks finished so far.
    pub fn show(&mut self, done: u64) {
        let (at, before) = self.last;
        let secs = at.elapsed().as_secs_f64().max(0.001);
        let rate = done.saturating_sub(before) as f64 / secs;
        self.last = (Instant::now(), done);
        let line = format!(
            "# {}: {done}/{} tasks done, {} tasks/s",
            self.label,
            self.total,
            fixed(rate, 0)
        );
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r{line}\x1b[K");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// The workload ended: the line is left as it stands.
    pub fn end(&mut self) {
        if self.tty && self.last.1 > 0 {
            eprintln!();
        }
    }
}

/// ARTEX_BENCH_PROFILE=1: whether pg_stat_statements is loaded for the parts to print
/// the statements that cost the time (it slows PostgreSQL down a little).
pub fn profiling() -> bool {
    std::env::var("ARTEX_BENCH_PROFILE").as_deref() == Ok("1")
}

/// With ARTEX_BENCH_PROFILE=1, forgets what pg_stat_statements counted in `c`'s database.
pub async fn profile_reset(c: &tokio_postgres::Client) {
    if profiling() {
        c.batch_execute(crate::sql::PROFILE_RESET)
            .await
            .expect("pg_stat_statements_reset");
    }
}

/// With ARTEX_BENCH_PROFILE=1, the statements that cost the time in `c`'s database since
/// its last reset, per `tasks` tasks.
pub async fn profile_print(c: &tokio_postgres::Client, label: &str, tasks: u32) {
    if !profiling() {
        return;
    }
    println!("# pg_stat_statements, {label} (nested = run by a trigger):");
    println!(
        "#   calls | per task | total ms | mean ms | plans | plan ms | WAL bytes per task | rows per task | statement"
    );
    let rows = c
        .query(crate::sql::PROFILE_TOP, &[&(tasks as i32)])
        .await
        .expect("pg_stat_statements");
    for r in rows {
        println!("#   {}", r.get::<_, String>(0));
    }
}

/// Where the cluster's CPU went between two readings of
/// [`crate::rig::Rig::pg_cpu_by_process`], per task, by what each process is (clients
/// by database and application name: a pool's connections together, each LISTEN
/// session apart), largest first. A process that came and went between the readings is
/// in `exited`.
pub fn cpu_split_print(
    label: &str,
    before: &[(u32, String, f64)],
    after: &[(u32, String, f64)],
    tasks: u32,
) {
    let mut by_what: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
    for (pid, what, s) in after {
        let was = before
            .iter()
            .find(|(p, w, _)| p == pid && w == what)
            .map_or(0.0, |b| b.2);
        let e = by_what.entry(what.as_str()).or_default();
        e.0 += s - was;
        e.1 += 1;
    }
    let total: f64 = by_what.values().map(|v| v.0).sum();
    let mut rows: Vec<_> = by_what.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    println!(
        "# PostgreSQL CPU by process, {label}: {} us per task in all",
        fixed(total * 1e6 / f64::from(tasks), 1)
    );
    for (what, (s, n)) in rows.iter().filter(|r| r.1 .0 > 0.0) {
        println!(
            "#   {} us per task ({}%) | {n} process(es) | {what}",
            fixed(s * 1e6 / f64::from(tasks), 1),
            fixed(100.0 * s / total.max(f64::MIN_POSITIVE), 0),
        );
    }
}

/// With ARTEX_BENCH_PROFILE=1, samples what artex's statements in database `db` are doing
/// (from the instant `from` on, every 2 ms, from a connection of its own) until
/// [`Activity::print`]: how often 0, 1, 2 … of them ran at once, and what the running
/// ones waited on. Says whether a run keeps PostgreSQL's cores busy or leaves them idle
/// between statements.
/// The sampling's own statements count in the run's PostgreSQL CPU.
pub struct Activity(Option<Sampling>);

/// The sampler's stop and what it will have sampled: one list of what each active
/// statement did, per sample.
type Sampling = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Vec<Vec<String>>>,
);

impl Activity {
    pub async fn start(rig: &crate::rig::Rig, db: &str, from: tokio::time::Instant) -> Activity {
        if !profiling() {
            return Activity(None);
        }
        let c = rig.client(db).await;
        let db = db.to_string();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let samples = tokio::spawn(async move {
            tokio::time::sleep_until(from).await;
            let mut out: Vec<Vec<String>> = Vec::new();
            while stopped.try_recv().is_err() {
                let row = c
                    .query_one(crate::sql::ACTIVITY_SAMPLE, &[&db])
                    .await
                    .expect("pg_stat_activity");
                out.push(row.get(0));
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            // The idle end (the drain's last poll) left out.
            while out.last().is_some_and(Vec::is_empty) {
                out.pop();
            }
            out
        });
        Activity(Some((stop, samples)))
    }

    pub async fn print(self, label: &str) {
        let Some((stop, samples)) = self.0 else {
            return;
        };
        let _ = stop.send(());
        let samples = samples.await.expect("the sampler");
        let n = samples.len().max(1) as f64;
        let mut at_once = std::collections::BTreeMap::<usize, usize>::new();
        let mut doing = std::collections::BTreeMap::<&str, usize>::new();
        for s in &samples {
            *at_once.entry(s.len().min(4)).or_default() += 1;
            for what in s {
                *doing.entry(what).or_default() += 1;
            }
        }
        let at_once: Vec<String> = at_once
            .iter()
            .map(|(k, v)| {
                let k = if *k == 4 {
                    "4+".to_string()
                } else {
                    k.to_string()
                };
                format!("{k}: {}%", fixed(*v as f64 * 100.0 / n, 0))
            })
            .collect();
        let mut doing: Vec<(&str, usize)> = doing.into_iter().collect();
        doing.sort_by_key(|d| std::cmp::Reverse(d.1));
        let doing: Vec<String> = doing
            .iter()
            .take(12)
            .map(|(w, v)| format!("{w} {}", fixed(*v as f64 / n, 2)))
            .collect();
        println!(
            "# artex statements running at once, {label} ({} samples): {}",
            samples.len(),
            at_once.join(", ")
        );
        println!(
            "#   on average per sample (the first 12): {}",
            doing.join(", ")
        );
    }
}

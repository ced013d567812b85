//! Supervision: every actor runs under actix's `Supervisor`, and its periodic work runs
//! through [`guarded`], which turns a panic into a logged, counted restart instead of a
//! dead thread. Counters are shared so `/metrics` and tests can read them.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;

/// Counters of one process's actors: restarts after panics, failed runs (e.g. the
/// database was unreachable), completed runs.
#[derive(Debug, Default, Clone)]
pub struct ActorStats {
    inner: Arc<Mutex<BTreeMap<&'static str, Counts>>>,
}

/// One actor's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Runs that finished.
    pub runs: u64,
    /// Runs that returned an error.
    pub errors: u64,
    /// Restarts by the supervisor after a panic.
    pub restarts: u64,
}

impl ActorStats {
    fn bump(&self, actor: &'static str, f: impl FnOnce(&mut Counts)) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(actor).or_default());
    }

    /// Counts a finished run.
    pub fn ran(&self, actor: &'static str) {
        self.bump(actor, |c| c.runs += 1);
    }

    /// Counts a failed run.
    pub fn failed(&self, actor: &'static str) {
        self.bump(actor, |c| c.errors += 1);
    }

    /// Counts a restart.
    pub fn restarted(&self, actor: &'static str) {
        self.bump(actor, |c| c.restarts += 1);
    }

    /// A copy of every actor's counters.
    pub fn snapshot(&self) -> BTreeMap<&'static str, Counts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The counters as `/metrics` shows them (a worker's and a planner's alike):
    /// `artex_actor_restarts_total` and `artex_actor_errors_total` by actor.
    pub fn write_metrics(&self, out: &mut crate::metrics::Exposition) {
        use crate::metrics::Type;
        let snapshot = self.snapshot();
        for (name, help, count) in [
            (
                "artex_actor_restarts_total",
                "Actor restarts after a panic.",
                (|c: &Counts| c.restarts) as fn(&Counts) -> u64,
            ),
            ("artex_actor_errors_total", "Actor runs that failed.", |c| {
                c.errors
            }),
        ] {
            out.family(name, Type::Counter, help);
            for (actor, c) in &snapshot {
                out.sample(name, &[("actor", actor)], count(c) as f64);
            }
        }
    }
}

/// Runs `fut`, catching a panic: `Err(message)` then, after logging it. The caller stops
/// its actor so the supervisor restarts it with fresh state.
pub async fn guarded<F: Future>(actor: &'static str, fut: F) -> Result<F::Output, String> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(out) => Ok(out),
        Err(panic) => {
            let msg = panic_message(&*panic);
            tracing::error!(actor, panic = %msg, "actor panicked; the supervisor restarts it");
            Err(msg)
        }
    }
}

/// The text of a panic payload.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".into()
    }
}

/// Fault injection for tests of supervision: when `$ARTEX_FAILPOINTS` (comma-separated)
/// names `point`, the first call in this process panics. Costs one lookup otherwise.
pub fn failpoint(point: &'static str) {
    use std::collections::HashSet;
    use std::sync::OnceLock;
    static ARMED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        let names = std::env::var("ARTEX_FAILPOINTS").unwrap_or_default();
        Mutex::new(
            names
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        )
    });
    let fire = armed
        .lock()
        .map(|mut set| set.remove(point))
        .unwrap_or(false);
    if fire {
        panic!("failpoint '{point}' fired (ARTEX_FAILPOINTS)");
    }
}

/// Delay injection for tests of the windows between two steps (a task transfer's
/// suspend and take-over, a connect and a registration): when `$ARTEX_DELAYS`
/// (comma-separated `point=milliseconds`) names `point`, the first call in this process
/// waits that long, and says so in the log first (a test waits for that line to open its
/// fault in the window). Costs one lookup otherwise.
pub async fn delay_point(point: &'static str) {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static ARMED: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        Mutex::new(parse_delays(
            &std::env::var("ARTEX_DELAYS").unwrap_or_default(),
        ))
    });
    let ms = armed.lock().ok().and_then(|mut m| m.remove(point));
    if let Some(ms) = ms {
        tracing::warn!(point, ms, "delay point reached: waiting (ARTEX_DELAYS)");
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        tracing::warn!(point, "delay point passed");
    }
}

/// `point=ms,point=ms`; an entry that does not parse is named in the log and skipped.
fn parse_delays(text: &str) -> std::collections::HashMap<String, u64> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|entry| {
            let parsed = entry
                .split_once('=')
                .and_then(|(p, ms)| Some((p.trim().to_string(), ms.trim().parse().ok()?)));
            if parsed.is_none() {
                tracing::warn!(entry, "ARTEX_DELAYS: not point=milliseconds; ignored");
            }
            parsed
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_delays;

    #[test]
    fn delays_are_read_as_point_equals_milliseconds_and_bad_entries_skipped() {
        let d = parse_delays(" before_take_over=1500, bad, x=y ,after_move=0,");
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d["before_take_over"], 1500);
        assert_eq!(d["after_move"], 0);
        assert!(parse_delays("").is_empty());
    }
}

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

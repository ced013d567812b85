//! What `/health` says about the database: the result of a real round trip made every
//! [`PROBE_EVERY`] through the process's own pool, each bounded by [`PROBE_DEADLINE`] —
//! unless the process's own statements were answered within the last [`PROBE_EVERY`]
//! (a worker's heartbeats and polls are): a thousand workers do not ping the database a
//! thousand times a second to say what their work already shows.
//! A server that hangs (SIGSTOP, a dead network) or has no connection left for us turns
//! `/health` 503 within [`STALE_AFTER`], and back to 200 at the first answer after.
//! The round trip asks the server who it is, so `/health` also says which host the
//! process writes to (after a failover, the new primary's).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use artex_actors::Blackboard;

/// How often the database is asked.
pub const PROBE_EVERY: Duration = Duration::from_millis(1_000);
/// How long one question may take before it counts as no answer.
pub const PROBE_DEADLINE: Duration = Duration::from_millis(2_000);
/// The server's name (`/health`'s `database_host`) is asked at least every this many
/// probes, even while the process's own statements show that the database answers.
const HOST_EVERY: u32 = 5;
/// With no answer for this long, the process is not ready.
pub const STALE_AFTER: Duration = Duration::from_millis(3_000);

#[derive(Debug)]
struct Last {
    answered: Instant,
    error: Option<String>,
    /// `host:port` of the server that answered last.
    host: Option<String>,
}

/// The database's health as this process sees it; cheap to clone.
#[derive(Clone, Debug)]
pub struct DbProbe(Arc<Mutex<Last>>);

impl DbProbe {
    /// Starts probing `bb` (on the current actix/tokio runtime) until every clone is
    /// dropped. It counts as answered at start: the caller has just used the database.
    pub fn start(bb: Blackboard) -> DbProbe {
        let probe = DbProbe(Arc::new(Mutex::new(Last {
            answered: Instant::now(),
            error: None,
            host: None,
        })));
        let weak: Weak<Mutex<Last>> = Arc::downgrade(&probe.0);
        actix::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_EVERY);
            let mut ticks: u32 = 0;
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // The process's own statements answered within the last tick say the
                // database answers; the server's name is asked every HOST_EVERY ticks.
                ticks += 1;
                let known = weak
                    .upgrade()
                    .is_some_and(|l| l.lock().unwrap_or_else(|p| p.into_inner()).host.is_some());
                let answer = if known
                    && !ticks.is_multiple_of(HOST_EVERY)
                    && bb.last_answer().is_some_and(|ago| ago < PROBE_EVERY)
                {
                    // The server its newest connection reached (a failover condemns the
                    // old ones, so that is the new primary).
                    Ok(bb.last_server())
                } else {
                    match tokio::time::timeout(PROBE_DEADLINE, bb.database_host()).await {
                        Ok(Ok(host)) => Ok(Some(host)),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no answer within {PROBE_DEADLINE:?}")),
                    }
                };
                let Some(last) = weak.upgrade() else { return };
                let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                match answer {
                    Ok(host) => {
                        last.answered = Instant::now();
                        last.error = None;
                        if host.is_some() {
                            last.host = host;
                        }
                    }
                    Err(e) => last.error = Some(e),
                }
            }
        });
        probe
    }

    /// `host:port` of the database server that answered last (the primary this process
    /// writes to), if any did.
    pub fn host(&self) -> Option<String> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        last.host.clone()
    }

    /// `Ok` if the database answered recently; otherwise why not.
    pub fn verdict(&self) -> Result<(), String> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let silent = last.answered.elapsed();
        if silent <= STALE_AFTER {
            return Ok(());
        }
        Err(format!(
            "database: no answer for {:.1} s ({})",
            silent.as_secs_f64(),
            last.error.as_deref().unwrap_or("still waiting")
        ))
    }
}

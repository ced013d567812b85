//! Whether the replica of `--read-database-url` may serve reads: checked every
//! [`CHECK_EVERY`] in the background, so that a read never waits on a replica that is
//! down. A replica that does not answer within [`CHECK_TIMEOUT`], that is no longer a
//! standby (promoted), or that has not replayed what the primary had written
//! `--read-max-lag` ago serves nothing until a check finds it well again: reads go to
//! the primary, and each such read is counted by why (`/metrics`). A read the replica
//! fails for want of a connection marks it unreachable at once.
//!
//! "Behind" is measured on the primary's WAL positions, not on clocks: each check notes
//! the primary's position, and the replica is lagging when it has not replayed the
//! newest position noted at least `max_lag` ago. A primary that writes nothing leaves
//! nothing to replay, so an idle pair never looks behind.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use artex_actors::blackboard::{OperatorBoard, Replica, ReplicaLag, WalPosition};
use artex_actors::metrics::{Exposition, Type};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// How often the replica is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a check may take: a replica slower than this to answer is unreachable.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the last check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Not checked yet: it serves reads (a failed read sends them to the primary).
    Unknown,
    /// It serves reads.
    Ok,
    /// It has not replayed what the primary had written `--read-max-lag` ago.
    Lagging,
    /// It did not answer (down, cut off, refusing connections).
    Unreachable,
    /// It answers but replays nothing: promoted, or a primary of its own.
    NotAStandby,
}

/// Why a read the replica would have served went to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// See [`ReplicaState::Unreachable`].
    Unreachable,
    /// See [`ReplicaState::Lagging`].
    Lagging,
    /// See [`ReplicaState::NotAStandby`].
    NotAStandby,
    /// The replica cancelled the read to replay WAL that conflicted with it.
    Conflict,
}

impl Fallback {
    /// Every reason, in the order of `/metrics`.
    pub const ALL: [Fallback; 4] = [
        Fallback::Unreachable,
        Fallback::Lagging,
        Fallback::NotAStandby,
        Fallback::Conflict,
    ];

    /// The `reason` label of `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Fallback::Unreachable => "unreachable",
            Fallback::Lagging => "lagging",
            Fallback::NotAStandby => "not_a_standby",
            Fallback::Conflict => "conflict",
        }
    }
}

/// The replica's state as `/health` and `/api/v1/replica` show it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaHealth {
    /// What the last check found.
    pub state: ReplicaState,
    /// Whether reads go to it now.
    pub serves_reads: bool,
    /// `--read-max-lag`, ms.
    pub max_lag_ms: u64,
    /// Its lag at the last check that reached it.
    pub lag: Option<ReplicaLag>,
    /// Why it is unreachable (the last error), when it is.
    pub error: Option<String>,
    /// When it was last checked.
    pub checked_at: Option<DateTime<Utc>>,
    /// Reads sent to the primary instead, by reason, since this process started.
    pub fallbacks: Fallbacks,
}

impl ReplicaHealth {
    /// What `/health`'s notes say of a replica that serves no reads now.
    pub fn note(&self) -> Option<String> {
        let why = match self.state {
            ReplicaState::Unknown | ReplicaState::Ok => return None,
            ReplicaState::Lagging => format!(
                "it has not replayed what the primary wrote {} ms ago (--read-max-lag)",
                self.max_lag_ms
            ),
            ReplicaState::Unreachable => format!(
                "it is unreachable: {}",
                self.error.as_deref().unwrap_or("no answer")
            ),
            ReplicaState::NotAStandby => "it is no standby (promoted?)".to_string(),
        };
        Some(format!("replica: reads go to the primary: {why}"))
    }

    /// Its lines of `/metrics`, in Prometheus' text format.
    pub fn metrics(&self) -> String {
        let mut out = Exposition::new();
        out.single(
            "artex_replica_serves_reads",
            Type::Gauge,
            "1 if reads go to the replica of --read-database-url now.",
            f64::from(u8::from(self.serves_reads)),
        );
        if let Some(ms) = self.lag.as_ref().and_then(|l| l.lag_ms) {
            out.single(
                "artex_replica_lag_seconds",
                Type::Gauge,
                "How old what the replica shows is, at the last check.",
                ms / 1000.0,
            );
        }
        let fallbacks = "artex_replica_read_fallbacks_total";
        out.family(
            fallbacks,
            Type::Counter,
            "Reads sent to the primary instead of the replica, by reason.",
        );
        for why in Fallback::ALL {
            out.sample(
                fallbacks,
                &[("reason", why.label())],
                self.fallbacks.of(why) as f64,
            );
        }
        out.finish()
    }
}

/// Reads sent to the primary instead of the replica, by reason.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Fallbacks {
    /// See [`Fallback::Unreachable`].
    pub unreachable: u64,
    /// See [`Fallback::Lagging`].
    pub lagging: u64,
    /// See [`Fallback::NotAStandby`].
    pub not_a_standby: u64,
    /// See [`Fallback::Conflict`].
    pub conflict: u64,
}

impl Fallbacks {
    /// The reads sent to the primary for `why`.
    pub fn of(&self, why: Fallback) -> u64 {
        match why {
            Fallback::Unreachable => self.unreachable,
            Fallback::Lagging => self.lagging,
            Fallback::NotAStandby => self.not_a_standby,
            Fallback::Conflict => self.conflict,
        }
    }
}

/// The replica's health, shared by the API's handlers and its checker.
#[derive(Debug)]
pub struct Health {
    max_lag: Duration,
    seen: Mutex<Seen>,
    fallbacks: [AtomicU64; 4],
}

#[derive(Debug)]
struct Seen {
    state: ReplicaState,
    lag: Option<ReplicaLag>,
    error: Option<String>,
    checked_at: Option<DateTime<Utc>>,
    /// The primary's positions noted at each check, oldest first: kept back to the
    /// newest one at least `max_lag` old.
    noted: VecDeque<(Instant, WalPosition)>,
}

impl Health {
    /// A replica not yet checked, which may be `max_lag` behind.
    pub fn new(max_lag: Duration) -> Self {
        Health {
            max_lag,
            seen: Mutex::new(Seen {
                state: ReplicaState::Unknown,
                lag: None,
                error: None,
                checked_at: None,
                noted: VecDeque::new(),
            }),
            fallbacks: Default::default(),
        }
    }

    /// Checks `replica` against `primary` every [`CHECK_EVERY`] until `health` is
    /// dropped. Call within the runtime.
    pub fn watch(health: &Arc<Health>, primary: OperatorBoard, replica: Replica) {
        let weak: Weak<Health> = Arc::downgrade(health);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(health) = weak.upgrade() else {
                    return;
                };
                // The primary's position first: a primary that does not answer says
                // nothing about the replica (reads fail there either way).
                let primary_lsn =
                    match tokio::time::timeout(CHECK_TIMEOUT, primary.written_position()).await {
                        Ok(Ok(lsn)) => lsn,
                        _ => continue,
                    };
                let lag = tokio::time::timeout(CHECK_TIMEOUT, replica.lag_behind(primary_lsn))
                    .await
                    .unwrap_or_else(|_| {
                        Err(artex_actors::Error::Timeout {
                            what: "checking the replica",
                            after: CHECK_TIMEOUT,
                        })
                    });
                health.checked(Instant::now(), primary_lsn, lag.map_err(|e| e.to_string()));
            }
        });
    }

    /// Records a check made at `now`: the primary was at `primary_lsn`, and the
    /// replica answered `lag` (or the error).
    pub fn checked(&self, now: Instant, primary_lsn: WalPosition, lag: Result<ReplicaLag, String>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.noted.push_back((now, primary_lsn));
        // Keep the newest position at least max_lag old, and what came after it.
        while seen
            .noted
            .get(1)
            .is_some_and(|&(at, _)| now.duration_since(at) >= self.max_lag)
        {
            seen.noted.pop_front();
        }
        let before = seen.state;
        seen.checked_at = Some(Utc::now());
        match lag {
            Err(e) => {
                seen.state = ReplicaState::Unreachable;
                seen.error = Some(e);
            }
            Ok(lag) => {
                let due = seen
                    .noted
                    .front()
                    .filter(|&&(at, _)| now.duration_since(at) >= self.max_lag)
                    .map(|&(_, lsn)| lsn);
                seen.state = match (lag.in_recovery, lag.replay_lsn, due) {
                    (false, _, _) => ReplicaState::NotAStandby,
                    (true, Some(replayed), Some(due)) if replayed < due => ReplicaState::Lagging,
                    (true, None, Some(_)) => ReplicaState::Lagging,
                    _ => ReplicaState::Ok,
                };
                seen.error = None;
                seen.lag = Some(lag);
            }
        }
        if seen.state != before {
            match seen.state {
                ReplicaState::Ok => tracing::info!("the replica serves reads again"),
                state => tracing::warn!(
                    ?state,
                    error = seen.error.as_deref().unwrap_or(""),
                    "reads go to the primary: the replica cannot serve them"
                ),
            }
        }
    }

    /// A read on the replica failed for want of a connection: it is unreachable until
    /// a check reaches it.
    pub fn lost(&self, error: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.state != ReplicaState::Unreachable {
            tracing::warn!(error, "reads go to the primary: the replica is unreachable");
        }
        seen.state = ReplicaState::Unreachable;
        seen.error = Some(error.to_string());
    }

    /// Why reads may not go to the replica now, if they may not.
    pub fn unusable(&self) -> Option<Fallback> {
        match self.seen.lock().unwrap_or_else(|p| p.into_inner()).state {
            ReplicaState::Unknown | ReplicaState::Ok => None,
            ReplicaState::Lagging => Some(Fallback::Lagging),
            ReplicaState::Unreachable => Some(Fallback::Unreachable),
            ReplicaState::NotAStandby => Some(Fallback::NotAStandby),
        }
    }

    /// Counts a read sent to the primary for `why`.
    pub fn fell_back(&self, why: Fallback) {
        self.fallbacks[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The reads sent to the primary, by reason.
    pub fn fallbacks(&self) -> Fallbacks {
        let n = |why: Fallback| self.fallbacks[why as usize].load(Ordering::Relaxed);
        Fallbacks {
            unreachable: n(Fallback::Unreachable),
            lagging: n(Fallback::Lagging),
            not_a_standby: n(Fallback::NotAStandby),
            conflict: n(Fallback::Conflict),
        }
    }

    /// The state as `/health` shows it.
    pub fn view(&self) -> ReplicaHealth {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        ReplicaHealth {
            state: seen.state,
            serves_reads: matches!(seen.state, ReplicaState::Unknown | ReplicaState::Ok),
            max_lag_ms: u64::try_from(self.max_lag.as_millis()).unwrap_or(u64::MAX),
            lag: seen.lag.clone(),
            error: seen.error.clone(),
            checked_at: seen.checked_at,
            fallbacks: self.fallbacks(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(in_recovery: bool, replayed: u64) -> Result<ReplicaLag, String> {
        Ok(ReplicaLag {
            in_recovery,
            primary_lsn: WalPosition::from(0),
            replay_lsn: in_recovery.then(|| WalPosition::from(replayed)),
            lag_bytes: None,
            lag_ms: None,
            last_replayed_commit_at: None,
            at: Utc::now(),
        })
    }

    /// Behind is "has not replayed what the primary had max_lag ago": a replica that
    /// stops replaying turns lagging max_lag after the primary wrote past it, not
    /// before, and serves again once it has caught up; an idle primary never makes it
    /// lag; errors and a promoted replica are said so, and a check that reaches it
    /// again clears them.
    #[test]
    fn the_state_follows_the_checks() {
        let h = Health::new(Duration::from_secs(5));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let lsn = WalPosition::from;
        h.checked(at(0), lsn(100), lag(true, 100));
        assert_eq!(h.view().state, ReplicaState::Ok);
        // The primary writes on; the replica stays at 100.
        for s in 1..5 {
            h.checked(at(s), lsn(100 + s * 10), lag(true, 100));
            assert_eq!(h.view().state, ReplicaState::Ok, "at {s} s");
        }
        h.checked(at(5), lsn(150), lag(true, 100));
        assert_eq!(
            h.view().state,
            ReplicaState::Ok,
            "what it lacks is not 5 s old"
        );
        h.checked(at(6), lsn(160), lag(true, 100));
        assert_eq!(h.view().state, ReplicaState::Lagging);
        assert_eq!(h.unusable(), Some(Fallback::Lagging));
        h.checked(at(7), lsn(170), lag(true, 165));
        assert_eq!(
            h.view().state,
            ReplicaState::Ok,
            "replayed what was there 5 s ago"
        );
        // An idle primary: the replica has everything.
        for s in 8..30 {
            h.checked(at(s), lsn(170), lag(true, 170));
        }
        assert_eq!(h.view().state, ReplicaState::Ok);
        h.checked(at(30), lsn(170), Err("connection refused".into()));
        let v = h.view();
        assert_eq!(
            (v.state, v.serves_reads, v.error.as_deref()),
            (ReplicaState::Unreachable, false, Some("connection refused"))
        );
        h.checked(at(31), lsn(170), lag(false, 0));
        assert_eq!(h.unusable(), Some(Fallback::NotAStandby));
        h.checked(at(32), lsn(170), lag(true, 170));
        assert_eq!((h.view().state, h.view().error), (ReplicaState::Ok, None));
        h.lost("connection reset");
        assert_eq!(h.unusable(), Some(Fallback::Unreachable));
        h.fell_back(Fallback::Unreachable);
        h.fell_back(Fallback::Conflict);
        h.fell_back(Fallback::Conflict);
        let f = h.fallbacks();
        assert_eq!((f.unreachable, f.lagging, f.conflict), (1, 0, 2));
        let v = h.view();
        assert_eq!(
            v.note().as_deref(),
            Some("replica: reads go to the primary: it is unreachable: connection reset")
        );
        let metrics = v.metrics();
        for line in [
            "artex_replica_serves_reads 0",
            "artex_replica_read_fallbacks_total{reason=\"unreachable\"} 1",
            "artex_replica_read_fallbacks_total{reason=\"conflict\"} 2",
            "artex_replica_read_fallbacks_total{reason=\"not_a_standby\"} 0",
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "{line} not in:\n{metrics}"
            );
        }
    }
}

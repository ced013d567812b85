//! Per-kind retry policies (pure): how long a failed attempt of a kind waits before its
//! retry — exponential, linear or fixed backoff from a base, capped — and how many
//! attempts a task of the kind gets when its submission states none. Stored on
//! `artex.kinds` (migrations/V18); the worker applies [`RetryPolicy::delay_ms`] and the
//! reaper the SQL function `artex.policy_delay_ms`, which computes the same (a test
//! compares them). A kind without a policy keeps the fleet's default: exponential from
//! `--retry-base-ms` to `--retry-cap-ms`, with jitter.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::submission::MAX_RETRIES;

/// The longest base or cap a policy takes: 30 days, in milliseconds.
pub const MAX_BACKOFF_MS: i64 = 30 * 24 * 3600 * 1000;

/// The most attempts a policy gives a task: the first and [`MAX_RETRIES`] retries.
pub const MAX_ATTEMPTS: i32 = MAX_RETRIES + 1;

/// How the wait grows with each failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backoff {
    /// base·2^n after the n-th retry's failure (n from 0).
    Exponential,
    /// base·(n+1).
    Linear,
    /// base, every time.
    Fixed,
}

impl Backoff {
    /// Every backoff, as named.
    pub const ALL: [Backoff; 3] = [Backoff::Exponential, Backoff::Linear, Backoff::Fixed];

    /// Its name: `exponential`, `linear` or `fixed` (also in `artex.kinds`).
    pub fn as_str(self) -> &'static str {
        match self {
            Backoff::Exponential => "exponential",
            Backoff::Linear => "linear",
            Backoff::Fixed => "fixed",
        }
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backoff {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Backoff::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| format!("unknown backoff '{s}'; expected exponential, linear or fixed"))
    }
}

/// A kind's retry policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// How the wait grows.
    pub backoff: Backoff,
    /// The first wait, milliseconds (1 to [`MAX_BACKOFF_MS`]).
    pub base_ms: i64,
    /// No wait is longer, milliseconds (at least `base_ms`, at most [`MAX_BACKOFF_MS`]).
    pub cap_ms: i64,
    /// Attempts a task of the kind gets when its submission states no `max_retries`
    /// (`max_retries` = this − 1); `None`: the default of 3 retries. A task that states
    /// its own keeps it.
    pub max_attempts: Option<i32>,
}

/// A policy field that is out of range: which, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRefusal {
    /// `base`, `cap` or `max_attempts`.
    pub field: &'static str,
    /// What was wrong, and what is expected.
    pub message: String,
}

impl fmt::Display for PolicyRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl RetryPolicy {
    /// The wait after a failed attempt when `retries` attempts had failed before it
    /// (0 after the first attempt), milliseconds: exact, no jitter (an operator who asks
    /// for 200 ms gets 200 ms).
    pub fn delay_ms(&self, retries: i32) -> i64 {
        let n = i64::from(retries.max(0));
        let d = match self.backoff {
            Backoff::Fixed => self.base_ms,
            Backoff::Linear => self.base_ms.saturating_mul(n + 1),
            // 2^n overflows past n = 62; the cap (at most 30 days) is reached long before.
            Backoff::Exponential => self.base_ms.saturating_mul(1i64 << n.min(40)),
        };
        d.min(self.cap_ms)
    }

    /// The retry budget it gives a submission that states none.
    pub fn default_max_retries(&self) -> Option<i32> {
        self.max_attempts.map(|n| n - 1)
    }

    /// Refuses values out of range, naming the field.
    pub fn check(&self) -> Result<(), PolicyRefusal> {
        let refuse = |field, message: String| Err(PolicyRefusal { field, message });
        if !(1..=MAX_BACKOFF_MS).contains(&self.base_ms) {
            return refuse(
                "base",
                format!("{} ms; expected 1 ms to 30 days", self.base_ms),
            );
        }
        if !(self.base_ms..=MAX_BACKOFF_MS).contains(&self.cap_ms) {
            return refuse(
                "cap",
                format!(
                    "{} ms; expected at least the base ({} ms) and at most 30 days",
                    self.cap_ms, self.base_ms
                ),
            );
        }
        if let Some(n) = self
            .max_attempts
            .filter(|n| !(1..=MAX_ATTEMPTS).contains(n))
        {
            return refuse(
                "max_attempts",
                format!("{n}; expected 1 to {MAX_ATTEMPTS} (the first attempt and up to {MAX_RETRIES} retries)"),
            );
        }
        Ok(())
    }
}

impl fmt::Display for RetryPolicy {
    /// `exponential 1000 ms .. 600000 ms, 5 attempts`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backoff {
            Backoff::Fixed => write!(f, "fixed {} ms", self.base_ms)?,
            b => write!(f, "{b} {} ms .. {} ms", self.base_ms, self.cap_ms)?,
        }
        if let Some(n) = self.max_attempts {
            write!(f, ", {n} attempts")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(backoff: Backoff, base_ms: i64, cap_ms: i64) -> RetryPolicy {
        RetryPolicy {
            backoff,
            base_ms,
            cap_ms,
            max_attempts: None,
        }
    }

    #[test]
    fn each_backoff_grows_as_named_and_stops_at_the_cap() {
        let delays = |p: &RetryPolicy| (0..6).map(|n| p.delay_ms(n)).collect::<Vec<_>>();
        assert_eq!(
            delays(&policy(Backoff::Exponential, 100, 1000)),
            [100, 200, 400, 800, 1000, 1000]
        );
        assert_eq!(
            delays(&policy(Backoff::Linear, 100, 450)),
            [100, 200, 300, 400, 450, 450]
        );
        assert_eq!(delays(&policy(Backoff::Fixed, 200, 200)), [200; 6]);
        // Far past any cap, no overflow.
        let p = policy(Backoff::Exponential, MAX_BACKOFF_MS, MAX_BACKOFF_MS);
        assert_eq!(p.delay_ms(i32::MAX), MAX_BACKOFF_MS);
        assert_eq!(policy(Backoff::Linear, 7, 100).delay_ms(-3), 7);
    }

    #[test]
    fn out_of_range_values_are_refused_naming_the_field() {
        let field = |p: RetryPolicy| p.check().err().map(|r| r.field);
        assert_eq!(field(policy(Backoff::Fixed, 0, 10)), Some("base"));
        assert_eq!(field(policy(Backoff::Fixed, 10, 9)), Some("cap"));
        assert_eq!(
            field(policy(Backoff::Fixed, 10, MAX_BACKOFF_MS + 1)),
            Some("cap")
        );
        let with = |n| RetryPolicy {
            max_attempts: Some(n),
            ..policy(Backoff::Linear, 10, 20)
        };
        assert_eq!(field(with(0)), Some("max_attempts"));
        assert_eq!(field(with(MAX_ATTEMPTS + 1)), Some("max_attempts"));
        assert_eq!(field(with(MAX_ATTEMPTS)), None);
        assert_eq!(with(3).default_max_retries(), Some(2));
        assert_eq!("linear".parse(), Ok(Backoff::Linear));
        assert!("steady"
            .parse::<Backoff>()
            .unwrap_err()
            .contains("exponential, linear or fixed"));
    }
}

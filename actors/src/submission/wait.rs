//! The rules on a flow's waits: a task that is a wait names no kind and carries no
//! payload or handler settings; its [`WaitSpec`] is exactly one of a signal (with an
//! optional timeout and what a timeout does), a time (`until`, RFC 3339) or a delay
//! (`for`), each well formed. Pure: [`WaitSpec::resolve`] turns the text into a [`Wait`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::task::check_kind;
use super::{Field, FlowTaskSpec};

/// The kind a wait's task row has (a wait is never handed to a worker; the name only
/// shows what the row is). No submitted task may have it.
pub const WAIT_KIND: &str = "artex:wait";

/// The longest delay or timeout: 100 years (as `unique_for`).
const MAX_WAIT: Duration = Duration::from_secs(36_500 * 86_400);

/// What a flow task waits for, as submitted: `{"signal": "approved", "timeout": "24h"}`,
/// `{"until": "2026-12-24T18:00:00Z"}` or `{"for": "1h"}`.
///
/// ```
/// use artex_actors::submission::{OnTimeout, WaitSpec};
/// let spec: WaitSpec =
///     serde_json::from_str(r#"{"signal": "approved", "timeout": "24h"}"#).unwrap();
/// let wait = spec.resolve().unwrap();
/// assert_eq!(wait.signal.as_deref(), Some("approved"));
/// assert_eq!(wait.timeout, Some(std::time::Duration::from_secs(86_400)));
/// assert_eq!(wait.on_timeout, OnTimeout::Fail);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitSpec {
    /// The signal's name (`artex flow signal FLOW NAME`): letters, digits and `._:-`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// With a signal: how long after the wait is reached it times out (`24h`, `30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// With a timeout: `fail` (the default: the wait ends `timeout`, its downstream tasks
    /// are canceled) or `succeed` (the flow goes on without the signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
    /// A time (RFC 3339) at which the wait succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// A delay after the wait is reached (`1h`, `90s`, `7d`) at which it succeeds.
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
}

/// What a timed-out signal wait does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// It ends `timeout`: a failure of the flow; its downstream tasks are canceled.
    #[default]
    Fail,
    /// It succeeds without a result: the flow goes on.
    Succeed,
}

impl OnTimeout {
    /// Its name, as a flow file and the database write it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Fail => "fail",
            OnTimeout::Succeed => "succeed",
        }
    }
}

/// A [`WaitSpec`] checked and read: exactly one of `signal`, `until`, `wait_for`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The signal it waits for.
    pub signal: Option<String>,
    /// The time it waits until.
    pub until: Option<DateTime<Utc>>,
    /// The delay it waits, from when it is reached.
    pub wait_for: Option<Duration>,
    /// A signal wait's timeout, from when it is reached.
    pub timeout: Option<Duration>,
    /// What a timeout does.
    pub on_timeout: OnTimeout,
}

/// `90s`, `15m`, `24h`, `7d` (also `1500ms`): a positive delay of at most 100 years.
pub fn parse_wait_duration(s: &str) -> std::result::Result<Duration, String> {
    let expected = "expected a number with a unit (ms, s, m, h or d), e.g. 90s, 15m, 24h, 7d";
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: {expected}"))?;
    let unit_secs: u64 = match unit {
        "ms" => 0,
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: {expected}")),
    };
    let d = if unit_secs == 0 {
        Some(Duration::from_millis(n))
    } else {
        n.checked_mul(unit_secs).map(Duration::from_secs)
    };
    match d {
        Some(d) if d.is_zero() => Err(format!("{s:?}: must be longer than zero")),
        Some(d) if d <= MAX_WAIT => Ok(d),
        _ => Err(format!("{s:?}: at most 36500d (100 years)")),
    }
}

impl WaitSpec {
    /// Checks the wait and reads its times; the error says which part is wrong and what
    /// is expected (`until: "tomorrow" is not an RFC 3339 time …`).
    pub fn resolve(&self) -> std::result::Result<Wait, String> {
        let given: Vec<&str> = [
            ("signal", self.signal.is_some()),
            ("until", self.until.is_some()),
            ("for", self.for_.is_some()),
        ]
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
        if given.len() != 1 {
            let got = if given.is_empty() {
                "none".to_string()
            } else {
                given.join(" and ")
            };
            return Err(format!(
                "expected one of signal (with an optional timeout), until or for; got {got}"
            ));
        }
        if let Some(signal) = &self.signal {
            check_kind(signal).map_err(|e| format!("signal: {e}"))?;
        }
        let until = self
            .until
            .as_deref()
            .map(|u| {
                DateTime::parse_from_rfc3339(u)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| {
                        format!(
                            "until: {u:?} is not an RFC 3339 time ({e}); expected e.g. \
                             2026-12-24T18:00:00Z"
                        )
                    })
            })
            .transpose()?;
        let wait_for = self
            .for_
            .as_deref()
            .map(|d| parse_wait_duration(d).map_err(|e| format!("for: {e}")))
            .transpose()?;
        let timeout = self
            .timeout
            .as_deref()
            .map(|d| parse_wait_duration(d).map_err(|e| format!("timeout: {e}")))
            .transpose()?;
        if timeout.is_some() && self.signal.is_none() {
            return Err(
                "timeout: only a signal's wait times out; a timer (until, for) ends by itself"
                    .into(),
            );
        }
        let on_timeout = match self.on_timeout.as_deref() {
            None | Some("fail") => OnTimeout::Fail,
            Some("succeed") => OnTimeout::Succeed,
            Some(other) => {
                return Err(format!(
                    "on_timeout: {other:?}; expected \"fail\" or \"succeed\""
                ))
            }
        };
        if self.on_timeout.is_some() && timeout.is_none() {
            return Err("on_timeout: needs a timeout (a wait without one never times out)".into());
        }
        Ok(Wait {
            signal: self.signal.clone(),
            until,
            wait_for,
            timeout,
            on_timeout,
        })
    }
}

/// The first thing wrong with a flow task that is a wait, and the field it is about:
/// the wait itself, or a handler's field it must not have.
pub(super) fn wait_rules(
    t: &FlowTaskSpec,
    w: &WaitSpec,
) -> std::result::Result<(), (Field, String)> {
    let no = |field: Field, what: &str| {
        Err((
            field,
            format!(
                "a wait has no {what} (no worker runs it); remove {}",
                field.as_str()
            ),
        ))
    };
    if !t.kind.is_empty() {
        return no(Field::Kind, "kind");
    }
    if !(t.payload.is_null() || t.payload == Value::Object(Default::default())) {
        return Err((
            Field::Payload,
            "a wait has no payload: its result is the signal's payload; remove payload".into(),
        ));
    }
    if t.priority != 0 {
        return no(Field::Priority, "priority");
    }
    if t.max_retries.is_some() {
        return no(Field::MaxRetries, "retries");
    }
    if t.timeout_ms.is_some() {
        return Err((
            Field::TimeoutMs,
            "a wait has no handler timeout; a signal's wait takes wait.timeout".into(),
        ));
    }
    if t.shard_key.is_some() {
        return no(Field::ShardKey, "shard key");
    }
    w.resolve().map(|_| ()).map_err(|e| (Field::Wait, e))
}

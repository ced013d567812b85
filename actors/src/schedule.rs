//! What a schedule is and every rule on it (pure, no SQL): a name, a cron expression read
//! in an IANA time zone, and the task each of its slots submits. A *slot* is an instant
//! the expression matches; each slot fires at most once (the planner's Scheduler, see
//! `crate::scheduler`). [`Cadence`] is the parsed expression in its zone: the slots due
//! between the first one not yet dealt with and now, under a [`CatchUp`] rule for slots
//! missed while no planner ran.
//!
//! Cron expressions are parsed by `croner` (five fields, minute resolution, Vixie-cron
//! semantics: a day matches when its day of month *or* its day of week does, as soon as
//! one of them is restricted; `@hourly`, `@daily`… nicknames; `L`, `W`, `#`), time zones
//! by `chrono-tz` (the IANA database built in, so a host without `/usr/share/zoneinfo`
//! fires the same slots as one with it). Slots are computed in the zone's wall clock, so
//! `0 9 * * *` in Europe/Berlin is 09:00 there in winter and in summer; a wall-clock time
//! a DST change skips or repeats follows croner's rules (a skipped fixed time fires at the
//! first instant after the gap, a repeated one once).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

use crate::submission::{NewTask, MAX_KIND_BYTES};

/// The longest cron expression accepted, in bytes.
pub const MAX_CRON_BYTES: usize = 200;

/// At most this many slots fire in one pass for one schedule (`--catch-up all` after a
/// long outage): a pass is one transaction, kept short; the rest fire in the next passes.
pub const MAX_SLOTS_PER_PASS: usize = 1000;

/// A slot is "due now" for `--catch-up none` while it is at most this old: the Scheduler
/// looks every second, so a slot it reaches later than this was missed (no planner ran,
/// or the database was away), and `none` skips it.
pub const ON_TIME: TimeDelta = TimeDelta::seconds(30);

/// What happens to the slots missed while no planner ran (or while the database was
/// away): the slots between the first one not yet dealt with and the latest one due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Skip them: only a slot due now (at most [`ON_TIME`] ago) fires.
    None,
    /// Fire only the latest of them (the default): a job that sums up "since last time"
    /// runs once, not once per missed slot.
    #[default]
    Last,
    /// Fire each of them, oldest first, at most [`MAX_SLOTS_PER_PASS`] per pass.
    All,
}

impl CatchUp {
    /// Its name, as the CLI, the API and the table spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::Last => "last",
            CatchUp::All => "all",
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CatchUp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(CatchUp::None),
            "last" => Ok(CatchUp::Last),
            "all" => Ok(CatchUp::All),
            _ => Err(format!(
                "{s:?} is not a catch-up rule; expected none, last or all"
            )),
        }
    }
}

/// Why `name` is not a schedule name, or `Ok`: the rule of kind names (letters, digits
/// and `. _ : -`, starting with a letter or digit, at most 100 bytes), so that a name
/// needs no quoting in a URL path, a shell or the tasks' unique keys.
pub fn check_name(name: &str) -> Result<(), String> {
    crate::submission::check_kind(name).map_err(|why| {
        why.replace("is not a kind name", "is not a schedule name")
            .replace(
                &format!("at most {MAX_KIND_BYTES} bytes allowed"),
                &format!("at most {MAX_KIND_BYTES} bytes allowed for a schedule name"),
            )
    })
}

/// A schedule to add: its name, when its slots are, and the task each slot submits.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Unique; the rule of kind names ([`check_name`]).
    pub name: String,
    /// The cron expression (see [`Cadence::parse`]).
    pub cron: String,
    /// The IANA time zone it is read in (`UTC` by default).
    pub timezone: String,
    /// The task each slot submits: kind, payload, priority, retries, timeout, shard key
    /// (its `run_at`, `unique_key` and `unique_for` are the slot's own, so must be unset).
    pub task: NewTask,
    /// Slots missed while no planner ran.
    pub catch_up: CatchUp,
}

/// Why a schedule is refused: the field (as the API names it: `name`, `cron`,
/// `timezone`, `run_at`, …) and what is wrong with it, and what is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRefusal {
    /// The field.
    pub field: &'static str,
    /// Why, without the field's name (each surface names it its own way).
    pub why: String,
}

impl NewSchedule {
    /// Checks the schedule's own rules (name, expression, time zone, and that the task
    /// leaves the slot's options unset); the task's rules are a submission's
    /// ([`crate::submission::Submission`]), which every surface checks as for `submit`.
    /// Returns the parsed expression.
    pub fn check(&self) -> Result<Cadence, ScheduleRefusal> {
        let refuse = |field: &'static str, why: String| ScheduleRefusal { field, why };
        check_name(&self.name).map_err(|why| refuse("name", why))?;
        let cadence = Cadence::parse(&self.cron, &self.timezone)
            .map_err(|(field, why)| refuse(field, why))?;
        let slot_owned = "is the slot's own (each slot's task runs at its slot, under the \
                          key schedule:<name>:<slot>); leave it unset";
        if self.task.run_at.is_some() {
            return Err(refuse("run_at", slot_owned.into()));
        }
        if self.task.unique_key.is_some() {
            return Err(refuse("unique_key", slot_owned.into()));
        }
        if self.task.unique_for.is_some() {
            return Err(refuse("unique_for", slot_owned.into()));
        }
        Ok(cadence)
    }
}

/// A cron expression in a time zone, parsed: what computes a schedule's slots.
#[derive(Debug, Clone)]
pub struct Cadence {
    cron: Cron,
    tz: Tz,
}

/// The slots of one pass of a schedule (see [`Cadence::due`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The slots to fire now, oldest first.
    pub fire: Vec<DateTime<Utc>>,
    /// Slots that were due but are skipped by the catch-up rule.
    pub skipped: bool,
    /// The first slot not dealt with after this pass: later than now, or (catch-up `all`
    /// past [`MAX_SLOTS_PER_PASS`]) the next one to fire. `None`: the expression matches
    /// no instant any more (e.g. a year's last slot has passed).
    pub next: Option<DateTime<Utc>>,
}

impl Cadence {
    /// Parses `cron` (five fields: minute, hour, day of month, month, day of week; or a
    /// nickname such as `@hourly`) and `timezone` (an IANA name such as `Europe/Berlin`,
    /// or `UTC`). The error says which of the two is wrong (`Err((field, why))`, the
    /// field `cron` or `timezone`) and what was expected. An expression that matches no
    /// instant from now on (`0 0 30 2 *`) is refused too.
    pub fn parse(cron: &str, timezone: &str) -> Result<Cadence, (&'static str, String)> {
        let cadence = Cadence::read(cron, timezone)?;
        if cadence.next_after(Utc::now()).is_none() {
            return Err((
                "cron",
                format!("{cron:?} matches no time from now on; expected an expression with a future slot"),
            ));
        }
        Ok(cadence)
    }

    /// As [`Cadence::parse`], without refusing an expression that has no slot left: a
    /// stored schedule's, read by the Scheduler.
    pub fn read(cron: &str, timezone: &str) -> Result<Cadence, (&'static str, String)> {
        let tz = parse_time_zone(timezone).map_err(|why| ("timezone", why))?;
        let cron = parse_cron(cron).map_err(|why| ("cron", why))?;
        Ok(Cadence { cron, tz })
    }

    /// The time zone's IANA name (`UTC` for UTC), as stored.
    pub fn time_zone(&self) -> &'static str {
        self.tz.name()
    }

    /// The first slot strictly after `t`; `None` if the expression matches no later
    /// instant.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|s| s.with_timezone(&Utc))
    }

    /// The first slot at or after `t`.
    fn at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // croner reads whole seconds: a slot in the second `t` falls in but before it is
        // not "at or after" it.
        let t = match t.with_nanosecond(0) {
            Some(whole) if whole < t => whole + TimeDelta::seconds(1),
            _ => t,
        };
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|s| s.with_timezone(&Utc))
    }

    /// The latest slot at or before `t`.
    fn at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|s| s.with_timezone(&Utc))
    }

    /// The slots due at `now` when every slot before `first` has been dealt with (fired
    /// or skipped), under `catch_up`, and the first slot left after them.
    pub fn due(&self, first: DateTime<Utc>, now: DateTime<Utc>, catch_up: CatchUp) -> Due {
        let Some(first) = self.at_or_after(first) else {
            return Due {
                fire: Vec::new(),
                skipped: false,
                next: None,
            };
        };
        if first > now {
            return Due {
                fire: Vec::new(),
                skipped: false,
                next: Some(first),
            };
        }
        if catch_up == CatchUp::All {
            let mut fire = Vec::new();
            let mut slot = Some(first);
            while let Some(s) = slot.filter(|s| *s <= now && fire.len() < MAX_SLOTS_PER_PASS) {
                fire.push(s);
                slot = self.next_after(s);
            }
            return Due {
                fire,
                skipped: false,
                next: slot,
            };
        }
        // `first <= now`, so the latest slot at or before now exists and is >= first.
        let latest = self.at_or_before(now).unwrap_or(first);
        let on_time = catch_up == CatchUp::Last || now - latest <= ON_TIME;
        let fire: Vec<_> = if on_time { vec![latest] } else { Vec::new() };
        Due {
            skipped: latest > first || fire.is_empty(),
            fire,
            next: self.next_after(now),
        }
    }
}

/// `timezone` as an IANA zone, or why not.
fn parse_time_zone(timezone: &str) -> Result<Tz, String> {
    if timezone.is_empty() {
        return Err(
            "must not be empty; expected an IANA time zone such as Europe/Berlin or UTC".into(),
        );
    }
    Tz::from_str(timezone).map_err(|_| {
        format!(
            "{timezone:?} is not a time zone; expected an IANA name such as Europe/Berlin, \
             America/New_York or UTC (names are case-sensitive)"
        )
    })
}

/// `cron` parsed: five fields (no seconds, no year), or a nickname.
fn parse_cron(cron: &str) -> Result<Cron, String> {
    if cron.trim().is_empty() {
        return Err("must not be empty; expected five fields such as '*/5 * * * *'".into());
    }
    if cron.len() > MAX_CRON_BYTES {
        return Err(format!(
            "{} bytes long, at most {MAX_CRON_BYTES} allowed",
            cron.len()
        ));
    }
    let parser = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build();
    parser.parse(cron).map_err(|e| {
        format!(
            "{cron:?} is not a cron expression ({e}); expected five fields: minute hour \
             day-of-month month day-of-week, e.g. '*/5 * * * *' or '0 9 * * MON-FRI', or \
             @hourly, @daily, @weekly, @monthly, @yearly"
        )
    })
}

/// How long a slot's unique key holds after its task finished: far longer than any
/// pass, restart or failover, so that a slot whose task exists never fires again even
/// if its schedule's position were lost (the row lock is the guarantee in between).
pub const SLOT_KEY_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// The unique key of a slot's task: `schedule:<name>:<slot, RFC 3339 UTC>`. While a task
/// with it exists (finished within the window too), the slot cannot fire again.
pub fn slot_key(name: &str, slot: DateTime<Utc>) -> String {
    format!(
        "schedule:{name}:{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn bad_expressions_and_zones_say_which_field_and_what_was_expected() {
        let (field, why) = Cadence::parse("61 * * * *", "UTC").unwrap_err();
        assert_eq!(field, "cron");
        assert!(why.contains("five fields"), "{why}");
        let (field, _) = Cadence::parse("* * * *", "UTC").unwrap_err();
        assert_eq!(field, "cron");
        // Seconds are not a sixth field here: minute resolution.
        let (field, _) = Cadence::parse("*/10 * * * * *", "UTC").unwrap_err();
        assert_eq!(field, "cron");
        let (field, why) = Cadence::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(field, "timezone");
        assert!(why.contains("Europe/Berlin"), "{why}");
        let (field, why) = Cadence::parse("0 0 30 2 *", "UTC").unwrap_err();
        assert_eq!(field, "cron");
        assert!(why.contains("no time"), "{why}");
        assert!(Cadence::parse("@hourly", "Europe/Berlin").is_ok());
    }

    #[test]
    fn slots_are_read_on_the_zones_wall_clock() {
        let c = Cadence::parse("0 9 * * *", "Europe/Berlin").unwrap();
        // Winter: UTC+1; summer: UTC+2.
        assert_eq!(
            c.next_after(at("2026-01-10T00:00:00Z")),
            Some(at("2026-01-10T08:00:00Z"))
        );
        assert_eq!(
            c.next_after(at("2026-07-10T00:00:00Z")),
            Some(at("2026-07-10T07:00:00Z"))
        );
    }

    #[test]
    fn catch_up_all_fires_each_missed_slot_oldest_first_and_bounded() {
        let c = Cadence::parse("0 * * * *", "UTC").unwrap();
        let d = c.due(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-01T13:00:10Z"),
            CatchUp::All,
        );
        assert_eq!(
            d.fire,
            ["10:00", "11:00", "12:00", "13:00"]
                .map(|h| at(&format!("2026-03-01T{h}:00Z")))
                .to_vec()
        );
        assert_eq!(d.next, Some(at("2026-03-01T14:00:00Z")));
        let every_minute = Cadence::parse("* * * * *", "UTC").unwrap();
        let start = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        let d = every_minute.due(start, start + TimeDelta::days(2), CatchUp::All);
        assert_eq!(d.fire.len(), MAX_SLOTS_PER_PASS);
        // The rest is left for the next passes, starting where this one stopped.
        assert_eq!(
            d.next,
            Some(start + TimeDelta::minutes(MAX_SLOTS_PER_PASS as i64))
        );
    }

    #[test]
    fn catch_up_last_fires_the_latest_missed_slot_only() {
        let c = Cadence::parse("0 * * * *", "UTC").unwrap();
        let d = c.due(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-01T13:05:00Z"),
            CatchUp::Last,
        );
        assert_eq!(d.fire, vec![at("2026-03-01T13:00:00Z")]);
        assert!(d.skipped);
        assert_eq!(d.next, Some(at("2026-03-01T14:00:00Z")));
    }

    #[test]
    fn catch_up_none_fires_only_a_slot_due_now() {
        let c = Cadence::parse("0 * * * *", "UTC").unwrap();
        let late = c.due(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-01T13:05:00Z"),
            CatchUp::None,
        );
        assert!(late.fire.is_empty());
        assert!(late.skipped);
        assert_eq!(late.next, Some(at("2026-03-01T14:00:00Z")));
        let now = c.due(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-01T13:00:10Z"),
            CatchUp::None,
        );
        assert_eq!(now.fire, vec![at("2026-03-01T13:00:00Z")]);
        // Nothing missed: the slot due now fires under every rule.
        let d = c.due(
            at("2026-03-01T13:00:00Z"),
            at("2026-03-01T13:00:02Z"),
            CatchUp::None,
        );
        assert_eq!(d.fire, vec![at("2026-03-01T13:00:00Z")]);
        assert!(!d.skipped);
    }

    #[test]
    fn a_slot_just_before_the_first_moment_is_not_due() {
        let c = Cadence::parse("*/10 * * * *", "UTC").unwrap();
        let after = at("2026-03-01T10:10:00.5Z");
        let d = c.due(after, at("2026-03-01T10:10:01Z"), CatchUp::All);
        assert!(d.fire.is_empty(), "{d:?}");
        assert_eq!(d.next, Some(at("2026-03-01T10:20:00Z")));
    }

    #[test]
    fn nothing_is_due_before_the_first_slot() {
        let c = Cadence::parse("*/5 * * * *", "UTC").unwrap();
        let d = c.due(
            at("2026-03-01T10:05:00Z"),
            at("2026-03-01T10:04:59Z"),
            CatchUp::All,
        );
        assert!(d.fire.is_empty());
        assert_eq!(d.next, Some(at("2026-03-01T10:05:00Z")));
    }

    #[test]
    fn a_slots_key_names_the_schedule_and_the_slot_in_utc() {
        assert_eq!(
            slot_key("nightly", at("2026-03-01T10:05:00+01:00")),
            "schedule:nightly:2026-03-01T09:05:00Z"
        );
    }

    #[test]
    fn names_follow_the_kind_rule() {
        assert!(check_name("nightly-report.v2").is_ok());
        let why = check_name("a b").unwrap_err();
        assert!(why.contains("schedule name"), "{why}");
        assert!(check_name("").is_err());
    }
}

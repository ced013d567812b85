//! Assignments carried by the wake-up: the planner's NOTIFY to a worker holds the tasks
//! it was just given (what a read of them would return), so the worker starts them
//! without a read of its own — one round trip fewer between an insert and a handler.
//! Big tasks are not carried; their worker gets a plain wake-up and reads them.
//!
//! A notification says what the blackboard held when it was sent, and it may be handled
//! after the worker's own reads saw more. Each carried task names the transaction that
//! wrote the row version it was taken from (`xmin`), and each read says the snapshot it
//! saw (`pg_current_snapshot()`): a carried task whose version the worker's latest read
//! could already see is left to the reads (that read took it, or saw it gone, or left it
//! for the next), so a task is never taken twice, however late its notification.

use uuid::Uuid;

use super::AssignedTask;
use crate::error::{Error, Result};
use crate::trace::TraceParent;

/// The snapshot one read of a worker's assignments saw (`xmin:xmax:xip,…`, 64-bit
/// transaction ids); the read's clock rides beside it in `AssignedRead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSnapshot {
    xmin: u64,
    xmax: u64,
    xip: Vec<u64>,
}

impl ReadSnapshot {
    /// Parses `pg_current_snapshot()`'s text form.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || Error::Invalid(format!("snapshot '{text}'; expected xmin:xmax:xip,…"));
        let mut parts = text.split(':');
        let (Some(xmin), Some(xmax), Some(xip), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let id = |s: &str| s.parse::<u64>().map_err(|_| bad());
        Ok(ReadSnapshot {
            xmin: id(xmin)?,
            xmax: id(xmax)?,
            xip: if xip.is_empty() {
                Vec::new()
            } else {
                xip.split(',').map(id).collect::<Result<_>>()?
            },
        })
    }

    /// Whether a read with this snapshot saw what transaction `xid` (32 bits, as a row's
    /// `xmin` shows it) committed. The 32-bit id is taken as the full id nearest to
    /// `xmax` (within 2^31 either side, as PostgreSQL compares them): row versions a
    /// wake-up carries are seconds old, never 2^31 transactions.
    pub fn sees(&self, xid: u32) -> bool {
        let offset = xid.wrapping_sub(self.xmax as u32) as i32;
        let Some(full) = self.xmax.checked_add_signed(i64::from(offset)) else {
            // Before the first epoch: no such transaction.
            return false;
        };
        full < self.xmin || (full < self.xmax && !self.xip.contains(&full))
    }
}

/// One task carried by a wake-up.
#[derive(Debug, Clone)]
pub struct CarriedTask {
    /// The task, as a read returns it (`lease_left_ms` is 0: see `lease_until_ms`).
    pub task: AssignedTask,
    /// The transaction that wrote the row version it was taken from.
    pub xid: u32,
    /// When its lease ends, by the database's clock (Unix milliseconds).
    pub lease_until_ms: f64,
}

/// Whether a notification's payload carries assignments (an empty one is a plain
/// wake-up, `cancel` a canceled task).
pub fn carries_assignments(payload: &str) -> bool {
    payload.starts_with('[')
}

/// The tasks a wake-up carries: a JSON array of arrays written by the planner's
/// `artex.assign_and_wake` (see blackboard/planner/dispatch.rs), each `[id, kind, payload,
/// epoch, retries, max_retries, timeout_ms, checkpoint, flow_id, payload_bytes, xmin,
/// lease_until_ms]`, and a traced task's `traceparent` after them (V45: an untraced
/// task's array is as before, which older workers read); a fair kind's task ends with
/// `traceparent` (or null), `priority`, `limit_key` (V64), which its turns in the
/// worker's local queue go by.
pub fn parse_carried(payload: &str) -> Result<Vec<CarriedTask>> {
    #[derive(serde::Deserialize)]
    struct Row(
        Uuid,
        String,
        serde_json::Value,
        i64,
        i32,
        i32,
        Option<i32>,
        Option<serde_json::Value>,
        Option<Uuid>,
        i64,
        i64,
        f64,
        #[serde(default)] Option<String>,
        #[serde(default)] i32,
        #[serde(default)] Option<String>,
    );
    let rows: Vec<Row> = serde_json::from_str(payload).map_err(|e| {
        Error::Invalid(format!(
            "assignments carried by a wake-up: {e}; expected [[id, kind, payload, …], …]"
        ))
    })?;
    rows.into_iter()
        .map(|r| {
            let xid = u32::try_from(r.10).map_err(|_| {
                Error::Invalid(format!("carried task {}: xmin {} out of range", r.0, r.10))
            })?;
            Ok(CarriedTask {
                task: AssignedTask {
                    id: r.0,
                    kind: r.1,
                    payload: r.2,
                    epoch: r.3,
                    retries: r.4,
                    max_retries: r.5,
                    timeout_ms: r.6,
                    checkpoint: r.7,
                    flow_id: r.8,
                    payload_bytes: r.9,
                    lease_left_ms: 0.0,
                    // Carried for a fair kind's task only (its turns go by them); the
                    // others start in the order they came.
                    priority: r.13,
                    limit_key: r.14,
                    traceparent: r.12.as_deref().and_then(|tp| TraceParent::parse(tp).ok()),
                },
                xid,
                lease_until_ms: r.11,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_task_brings_its_traceparent_when_it_has_one() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let id = "0190b3a0-0000-7000-8000-000000000001";
        let plain = format!(r#"[["{id}", "echo", {{}}, 1, 0, 3, null, null, null, 2, 77, 1.5]]"#);
        let traced = plain.replace("1.5]", &format!("1.5, \"{tp}\"]"));
        let plain = parse_carried(&plain).unwrap();
        assert_eq!(plain[0].task.traceparent, None);
        assert_eq!((plain[0].xid, plain[0].lease_until_ms), (77, 1.5));
        let traced = parse_carried(&traced).unwrap();
        assert_eq!(
            traced[0].task.traceparent.map(|t| t.to_string()).as_deref(),
            Some(tp)
        );
    }

    #[test]
    fn a_fair_kind_s_carried_task_brings_its_priority_and_limit_key() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let id = "0190b3a0-0000-7000-8000-000000000001";
        let plain = format!(r#"[["{id}", "echo", {{}}, 1, 0, 3, null, null, null, 2, 77, 1.5]]"#);
        let fair = plain.replace("1.5]", r#"1.5, null, 7, "tenant-a"]"#);
        let fair_traced = plain.replace("1.5]", &format!(r#"1.5, "{tp}", -2, null]"#));
        let plain = &parse_carried(&plain).unwrap()[0].task;
        assert_eq!((plain.priority, plain.limit_key.as_deref()), (0, None));
        let fair = &parse_carried(&fair).unwrap()[0].task;
        assert_eq!(
            (fair.priority, fair.limit_key.as_deref(), fair.traceparent),
            (7, Some("tenant-a"), None)
        );
        let traced = &parse_carried(&fair_traced).unwrap()[0].task;
        assert_eq!((traced.priority, traced.limit_key.as_deref()), (-2, None));
        assert_eq!(
            traced.traceparent.map(|t| t.to_string()).as_deref(),
            Some(tp)
        );
    }

    #[test]
    fn a_snapshot_sees_what_committed_before_it() {
        let s = ReadSnapshot::parse("100:105:101,103").unwrap();
        assert!(s.sees(99) && s.sees(100) && s.sees(102) && s.sees(104));
        assert!(
            !s.sees(101) && !s.sees(103),
            "in progress when it was taken"
        );
        assert!(!s.sees(105) && !s.sees(200), "started after it");
        let s = ReadSnapshot::parse("7:7:").unwrap();
        assert!(s.sees(6) && !s.sees(7));
    }

    #[test]
    fn a_32_bit_xid_is_placed_in_the_snapshots_epoch() {
        let epoch = 3u64 << 32;
        let s = ReadSnapshot::parse(&format!("{}:{}:", epoch + 10, epoch + 20)).unwrap();
        assert!(s.sees(5), "epoch 3, below xmin");
        assert!(!s.sees(25), "epoch 3, after xmax");
        // Just past a wraparound: xid 4,294,967,290 belongs to the epoch before.
        assert!(s.sees(u32::MAX - 5));
        // Just before one: a 32-bit id past xmax is newer, in the same epoch or the next.
        let s = ReadSnapshot::parse(&format!("{}:{}:", epoch - 20, epoch - 10)).unwrap();
        assert!(s.sees(u32::MAX - 25) && !s.sees(u32::MAX - 5));
        assert!(!s.sees(3), "epoch 3's xid 3, after the snapshot");
        // No epoch before the first.
        let s = ReadSnapshot::parse("10:20:").unwrap();
        assert!(!s.sees(u32::MAX - 5));
    }

    #[test]
    fn bad_snapshots_and_payloads_are_refused_with_what_was_expected() {
        for bad in ["", "1:2", "1:2:3:4", "a:2:", "1:2:x"] {
            let e = ReadSnapshot::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected xmin:xmax:xip"), "{bad}: {e}");
        }
        let e = parse_carried("[[1]]").unwrap_err().to_string();
        assert!(e.contains("expected [[id, kind, payload"), "{e}");
    }

    #[test]
    fn carried_tasks_read_back_as_a_read_returns_them() {
        let id = Uuid::now_v7();
        let payload = format!(
            r#"[["{id}", "echo", {{"a": 1}}, 3, 0, 5, null, null, null, 8, 4242, 1700000000000.5]]"#
        );
        assert!(carries_assignments(&payload));
        assert!(!carries_assignments("") && !carries_assignments("cancel"));
        let got = parse_carried(&payload).unwrap();
        assert_eq!(got.len(), 1);
        let c = &got[0];
        assert_eq!(
            (c.task.id, c.task.kind.as_str(), c.task.epoch),
            (id, "echo", 3)
        );
        assert_eq!(c.task.payload, serde_json::json!({"a": 1}));
        assert_eq!((c.task.max_retries, c.task.payload_bytes), (5, 8));
        assert_eq!((c.xid, c.lease_until_ms), (4242, 1_700_000_000_000.5));
    }
}

//! Property tests of [`plan_with_runs`] (so of [`super::plan`], its runs of one) on random
//! rosters, claims and shortest runs (issue 25 §2): never more than a worker's free
//! slots, only its kinds and its host, no task twice, no task left while an eligible
//! worker has a slot (but the place a worker keeps for a fair kind's idle key, which no
//! other task of a fair kind takes), each worker at most its share and as one run when
//! the fleet is uniform, and the same answer whatever the roster's order. Bounded and
//! seeded: see `testkit/src/fuzz.rs` for `ARTEX_FUZZ_CASES` / `ARTEX_FUZZ_SEED`.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use artex_testkit::fuzz;

use super::plan_with_runs;
use crate::blackboard::{Assignment, Claimed, RosterEntry};

const KINDS: [&str; 4] = ["a", "b", "c", "d"];
const HOSTS: [&str; 3] = ["h1", "h2", "h3"];

/// One round's input.
#[derive(Debug, Clone)]
struct Round {
    roster: Vec<RosterEntry>,
    claimed: Vec<Claimed>,
    /// The shortest run a worker is given (1: `plan`; more: a round cut at its batch).
    min_run: i64,
}

impl Round {
    fn plan(&self, roster: &[RosterEntry]) -> Vec<Assignment> {
        plan_with_runs(&self.claimed, roster, self.min_run)
    }
}

fn worker(rng: &mut fastrand::Rng, i: usize, uniform: bool) -> RosterEntry {
    let kinds = if uniform {
        KINDS.iter().map(|k| k.to_string()).collect()
    } else {
        // Any subset, possibly empty, possibly naming a kind twice.
        (0..rng.usize(0..=5))
            .map(|_| KINDS[rng.usize(..KINDS.len())].to_string())
            .collect()
    };
    let capacity = match rng.u8(0..8) {
        0 => 0,
        1 => rng.i32(1..=2),
        _ => rng.i32(1..=40),
    };
    // Held may exceed capacity (capacity lowered while tasks ran).
    let held = rng
        .i32(0..=capacity + 3)
        .min(if rng.bool() { capacity } else { i32::MAX });
    RosterEntry {
        // Ids in random order of length and digits, so the tie-break by id is exercised.
        id: format!("w{:x}", rng.u32(..) ^ i as u32),
        kinds,
        capacity,
        held,
        host: HOSTS[rng.usize(..HOSTS.len())].to_string(),
        // Its handlers: none said, all of its capacity (no local queue), or fewer.
        slots: match rng.u8(0..3) {
            0 => None,
            _ => Some(rng.i32(1..=capacity.max(1) + 1)),
        },
    }
}

fn claimed(rng: &mut fastrand::Rng, n: usize, uniform: bool) -> Vec<Claimed> {
    (0..n)
        .map(|i| Claimed {
            id: Uuid::from_u128(i as u128 + 1),
            kind: if uniform || rng.u8(0..10) != 0 {
                KINDS[rng.usize(..KINDS.len())].to_string()
            } else {
                "nobody-runs-me".to_string()
            },
            host: match (uniform, rng.u8(0..6)) {
                (false, 0) => Some(HOSTS[rng.usize(..HOSTS.len())].to_string()),
                (false, 1) => Some("no-worker-here".to_string()),
                _ => None,
            },
            limited: rng.bool(),
            // A uniform fleet's rounds have no fair kind: the plan fills every place.
            fresh: match (uniform, rng.u8(0..3)) {
                (true, _) | (false, 0) => None,
                (false, _) => Some(rng.bool()),
            },
        })
        .collect()
}

fn round(rng: &mut fastrand::Rng, uniform: bool) -> Round {
    let workers = fuzz::len(rng, 12);
    let mut roster: Vec<RosterEntry> = (0..workers).map(|i| worker(rng, i, uniform)).collect();
    // Ids are unique in the workers table.
    let mut seen = HashSet::new();
    roster.retain(|w| seen.insert(w.id.clone()));
    let tasks = fuzz::len(rng, 120);
    Round {
        claimed: claimed(rng, tasks, uniform),
        roster,
        min_run: if rng.bool() { 1 } else { rng.i64(2..=16) },
    }
}

/// Simpler rounds: fewer tasks, fewer workers, less capacity.
fn shrink(r: &Round) -> Vec<Round> {
    let mut out = Vec::new();
    for claimed in fuzz::shrink_vec(&r.claimed) {
        out.push(Round {
            claimed,
            ..r.clone()
        });
    }
    for roster in fuzz::shrink_vec(&r.roster) {
        out.push(Round {
            roster,
            ..r.clone()
        });
    }
    if r.min_run > 1 {
        out.push(Round {
            min_run: r.min_run - 1,
            ..r.clone()
        });
    }
    for i in 0..r.roster.len() {
        if r.roster[i].capacity > 1 {
            let mut roster = r.roster.clone();
            roster[i].capacity -= 1;
            roster[i].held = roster[i].held.min(roster[i].capacity);
            out.push(Round {
                roster,
                ..r.clone()
            });
        }
    }
    out
}

fn eligible(w: &RosterEntry, t: &Claimed) -> bool {
    w.kinds.contains(&t.kind) && t.host.as_ref().is_none_or(|h| *h == w.host)
}

fn per_worker(out: &[Assignment]) -> HashMap<&str, i32> {
    let mut per = HashMap::new();
    for a in out {
        *per.entry(a.worker.as_str()).or_default() += 1;
    }
    per
}

/// What holds for every round.
fn check_always(r: &Round) {
    let out = r.plan(&r.roster);
    let workers: HashMap<&str, &RosterEntry> =
        r.roster.iter().map(|w| (w.id.as_str(), w)).collect();
    let tasks: HashMap<Uuid, &Claimed> = r.claimed.iter().map(|t| (t.id, t)).collect();

    let mut assigned = HashSet::new();
    for a in &out {
        let t = tasks
            .get(&a.task)
            .expect("an assignment of a task never claimed");
        assert!(assigned.insert(a.task), "task {} assigned twice", a.task);
        let w = workers
            .get(a.worker.as_str())
            .expect("a worker not in the roster");
        assert!(
            eligible(w, t),
            "task {} (kind {}, host {:?}) went to {} (kinds {:?}, host {})",
            t.id,
            t.kind,
            t.host,
            w.id,
            w.kinds,
            w.host
        );
    }
    let per = per_worker(&out);
    for w in &r.roster {
        let got = per.get(w.id.as_str()).copied().unwrap_or(0);
        assert!(got <= w.free(), "{} got {got} with {} free", w.id, w.free());
        // The kept place goes to no fair kind's task of a key that holds some.
        let held_keys = out
            .iter()
            .filter(|a| a.worker == w.id && !tasks[&a.task].may_take_kept())
            .count() as i32;
        assert!(
            held_keys <= (w.free() - w.kept()).max(0),
            "{} got {held_keys} tasks of held keys with {} free, {} kept",
            w.id,
            w.free(),
            w.kept()
        );
    }
    // Greedy but never idle: a task left over has no eligible worker with a place left
    // that it may take.
    for t in r.claimed.iter().filter(|t| !assigned.contains(&t.id)) {
        for w in r.roster.iter().filter(|w| eligible(w, t)) {
            let kept = if t.may_take_kept() { 0 } else { w.kept() };
            let left = w.free() - per.get(w.id.as_str()).copied().unwrap_or(0) - kept;
            assert!(
                left <= 0,
                "task {} (kind {}, host {:?}) left unassigned while {} has {left} free slots",
                t.id,
                t.kind,
                t.host,
                w.id
            );
        }
    }
    // Deterministic, and blind to the order the roster was read in.
    assert_eq!(r.plan(&r.roster), out, "two runs differ");
    let mut reversed = r.roster.clone();
    reversed.reverse();
    let mapping = |o: &[Assignment]| -> HashMap<Uuid, String> {
        o.iter().map(|a| (a.task, a.worker.clone())).collect()
    };
    assert_eq!(
        mapping(&r.plan(&reversed)),
        mapping(&out),
        "the roster's order changed the plan"
    );
}

/// What the documentation promises of a uniform fleet (every worker runs every kind, no
/// task bound to a host): every task placed while slots last, each worker at most its
/// share (proportional to its free slots, rounded up, at least the shortest run, at most
/// its free slots, all of them if fewer than the shortest run would be left), as one run
/// of consecutive tasks.
fn check_uniform(r: &Round) {
    check_always(r);
    let out = r.plan(&r.roster);
    let total: i64 = r.roster.iter().map(|w| i64::from(w.free())).sum();
    let n = r.claimed.len() as i64;
    assert_eq!(out.len() as i64, n.min(total), "tasks left with slots free");
    let per = per_worker(&out);
    for w in &r.roster {
        let f = i64::from(w.free());
        let share = if total == 0 {
            0
        } else {
            let s = ((n * f + total - 1) / total).max(r.min_run);
            if f - s < r.min_run {
                f
            } else {
                s
            }
        };
        let got = i64::from(per.get(w.id.as_str()).copied().unwrap_or(0));
        assert!(got <= share, "{} got {got}, over its share {share}", w.id);
    }
    // One run each: once a worker's run ends, it gets nothing more this round.
    let mut done = HashSet::new();
    for pair in out.windows(2) {
        if pair[0].worker != pair[1].worker {
            done.insert(pair[0].worker.as_str());
            assert!(
                !done.contains(pair[1].worker.as_str()),
                "{} got two runs",
                pair[1].worker
            );
        }
    }
}

#[test]
fn plan_holds_its_promises_on_random_rosters() {
    fuzz::run(
        "assigner::plan",
        3000,
        |rng| round(rng, false),
        shrink,
        check_always,
    );
}

#[test]
fn plan_shares_a_uniform_fleet_fairly() {
    fuzz::run(
        "assigner::plan/uniform",
        3000,
        |rng| round(rng, true),
        shrink,
        check_uniform,
    );
}

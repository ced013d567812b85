//! How a round's claimed tasks are matched to workers ([`plan`], [`plan_round`]): pure,
//! fed the round's claim and roster, so each rule is tested here and by the property
//! tests (`props.rs`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::blackboard::{Assignment, Claimed, RosterEntry};

/// Matches claimed tasks to workers so that load spreads evenly: each worker's share of
/// the round is proportional to its free slots, and it gets its share as one run of
/// consecutive tasks (claimed in dispatch order, so mostly neighbours in the table):
/// two workers writing interleaved rows would contend for the same pages. A task whose
/// kind the current worker does not run goes to the eligible worker with the most free
/// slots (ties by id). A task bound to a host (its uploaded file is there) is eligible
/// only for workers on that host. A fair kind's task of a key that already holds tasks
/// does not take the place a worker keeps for a key that holds none
/// ([`RosterEntry::kept`], migrations/V48): a late key's first task finds room in the
/// next round however busy the fleet. Pure, so it is tested directly.
pub fn plan(claimed: &[Claimed], roster: &[RosterEntry]) -> Vec<Assignment> {
    plan_with_runs(claimed, roster, 1)
}

/// The shortest run a worker is given in a round cut at its batch (see [`plan_round`]).
pub const MIN_RUN: i64 = 8;

/// [`plan`] for a round of at most `batch` tasks. A round that took its whole batch
/// while the roster had more free slots was cut short: more runnable tasks wait behind
/// it, and the next rounds, milliseconds apart, fill the slots this one leaves. Spreading
/// such a round one task per worker buys no parallelism the next rounds would not give,
/// while every worker touched costs the round's write a row lock, a counter and a
/// wake-up (~10 µs each: 2,000 workers of one task each made a round of 2,000 a third
/// slower than 10 workers of 200). So in a cut round each chosen worker takes a run of at
/// least [`MIN_RUN`] tasks (or its free slots, if fewer): no more than it asked for (its
/// concurrency and the local queue it sized), and a worker touched costs each of its
/// tasks ~1 µs instead of ~10. A run that would leave a worker fewer than [`MIN_RUN`]
/// free slots takes those too: 2,000 workers of 10 slots took runs of 8, then runs of
/// 2 in rounds that touched 1,000 workers each. A round that was not cut (every runnable task fits) is
/// spread as [`plan`] spreads it, so that an idle fleet starts a small burst on as many
/// hosts as it can.
pub fn plan_round(claimed: &[Claimed], roster: &[RosterEntry], batch: i64) -> Vec<Assignment> {
    let free: i64 = roster.iter().map(|w| i64::from(w.free())).sum();
    let cut = claimed.len() as i64 >= batch && batch < free;
    plan_with_runs(claimed, roster, if cut { MIN_RUN } else { 1 })
}

/// [`plan`], each worker's share at least `min_run` tasks (or its free slots).
pub(crate) fn plan_with_runs(
    claimed: &[Claimed],
    roster: &[RosterEntry],
    min_run: i64,
) -> Vec<Assignment> {
    let mut free: Vec<i32> = roster.iter().map(RosterEntry::free).collect();
    let total: i64 = free.iter().map(|&f| i64::from(f)).sum();
    let n = claimed.len() as i64;
    // This round's share of each worker (at least one task, or `min_run`, when it has a
    // free slot).
    let mut share: Vec<i64> = free
        .iter()
        .map(|&f| {
            let s = if total == 0 {
                0
            } else {
                ((n * i64::from(f) + total - 1) / total).max(min_run)
            };
            // A run that would leave fewer than `min_run` free slots takes them too.
            if i64::from(f) - s < min_run {
                i64::from(f)
            } else {
                s
            }
        })
        .collect();
    // Per kind, the workers that run it, best first: (has a share left, free slots, the
    // smaller id). Keys only go down as tasks are placed, so an entry is checked when it
    // comes to the top and pushed back with its current key if it went stale: a round
    // costs O(tasks · log workers), not O(tasks · workers) (2,000 workers: 5× faster).
    type Entry<'a> = (bool, i32, Reverse<&'a str>, usize);
    // Keyed by kind and host: `None` holds every worker of the kind, `Some(h)` those on
    // host h (for tasks bound to it).
    let mut by_kind: HashMap<(&str, Option<&str>), BinaryHeap<Entry>> = HashMap::new();
    for (i, w) in roster.iter().enumerate() {
        if free[i] > 0 {
            for k in &w.kinds {
                for host in [None, Some(w.host.as_str())] {
                    by_kind.entry((k.as_str(), host)).or_default().push((
                        share[i] > 0,
                        free[i],
                        Reverse(w.id.as_str()),
                        i,
                    ));
                }
            }
        }
    }
    let kept: Vec<i32> = roster.iter().map(RosterEntry::kept).collect();
    // The (kind, host) pairs whose workers have only kept places left: the tasks that may
    // not take those skip the heap (free places only go down within a round).
    let mut only_kept: HashSet<(&str, Option<&str>)> = HashSet::new();
    let mut out = Vec::with_capacity(claimed.len());
    let mut current: Option<usize> = None;
    for task in claimed {
        let host = task.host.as_deref();
        let open = task.may_take_kept();
        let runs = |i: usize| {
            roster[i].kinds.iter().any(|k| k == &task.kind)
                && host.is_none_or(|h| roster[i].host == h)
        };
        let room = |i: usize| free[i] > if open { 0 } else { kept[i] };
        let keep = current.filter(|&i| runs(i) && room(i) && share[i] > 0);
        let key = (task.kind.as_str(), host);
        let chosen = keep.or_else(|| {
            if !open && only_kept.contains(&key) {
                return None;
            }
            let heap = by_kind.get_mut(&key)?;
            // Workers with only kept places, set aside for this task and put back after.
            let mut passed = Vec::new();
            let found = loop {
                let Some(&(has_share, slots, id, i)) = heap.peek() else {
                    break None;
                };
                heap.pop();
                if free[i] <= 0 {
                    continue;
                }
                let now = (share[i] > 0, free[i]);
                if (has_share, slots) != now {
                    heap.push((now.0, now.1, id, i));
                    continue;
                }
                if !room(i) {
                    passed.push((has_share, slots, id, i));
                    continue;
                }
                // Still the best; it stays in the heap for the tasks after this one.
                heap.push((has_share, slots, id, i));
                break Some(i);
            };
            heap.extend(passed);
            if found.is_none() && !open {
                only_kept.insert(key);
            }
            found
        });
        let Some(i) = chosen else {
            continue;
        };
        current = Some(i);
        free[i] -= 1;
        share[i] -= 1;
        out.push(Assignment {
            task: task.id,
            worker: roster[i].id.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::{plan, plan_round, MIN_RUN};
    use crate::blackboard::{Claimed, RosterEntry};

    #[test]
    fn plan_spreads_tasks_over_workers_that_run_their_kind() {
        let roster = vec![
            RosterEntry {
                id: "a".into(),
                kinds: vec!["echo".into()],
                capacity: 2,
                held: 0,
                host: "h".into(),
                slots: None,
            },
            RosterEntry {
                id: "b".into(),
                kinds: vec!["echo".into(), "sleep".into()],
                capacity: 3,
                held: 1,
                host: "h".into(),
                slots: None,
            },
        ];
        let claimed: Vec<Claimed> = ["echo", "sleep", "echo", "echo", "sleep", "fail"]
            .iter()
            .map(|k| Claimed {
                id: Uuid::new_v4(),
                kind: k.to_string(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect();
        let out = plan(&claimed, &roster);
        // 4 free slots in all (a: 2, b: 2); `fail` has no worker; sleep only on b.
        assert_eq!(out.len(), 4);
        let on = |w: &str| out.iter().filter(|a| a.worker == w).count();
        assert_eq!((on("a"), on("b")), (2, 2));
        for a in &out {
            let kind = &claimed.iter().find(|c| c.id == a.task).unwrap().kind;
            assert_ne!(kind, "fail");
            if kind == "sleep" {
                assert_eq!(a.worker, "b");
            }
        }
    }

    fn fleet(workers: usize, free: i32) -> Vec<RosterEntry> {
        (0..workers)
            .map(|i| RosterEntry {
                id: format!("w{i:03}"),
                kinds: vec!["echo".into()],
                capacity: free,
                held: 0,
                host: "h".into(),
                slots: None,
            })
            .collect()
    }

    fn echoes(n: usize) -> Vec<Claimed> {
        (0..n)
            .map(|_| Claimed {
                id: Uuid::new_v4(),
                kind: "echo".into(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect()
    }

    /// Tasks per worker, in the order the workers got them.
    fn runs(out: &[crate::blackboard::Assignment]) -> Vec<(String, usize)> {
        let mut runs: Vec<(String, usize)> = Vec::new();
        for a in out {
            match runs.last_mut() {
                Some((w, n)) if *w == a.worker => *n += 1,
                _ => runs.push((a.worker.clone(), 1)),
            }
        }
        runs
    }

    #[test]
    fn a_round_cut_at_its_batch_gives_runs_of_min_run_tasks() {
        // 64 tasks, the whole batch, while 100 workers have 3,200 slots free: more wait.
        let out = plan_round(&echoes(64), &fleet(100, 32), 64);
        let got = runs(&out);
        assert_eq!(out.len(), 64);
        assert_eq!(got.len(), 64 / MIN_RUN as usize, "{got:?}");
        assert!(got.iter().all(|(_, n)| *n as i64 == MIN_RUN), "{got:?}");
    }

    #[test]
    fn a_cut_round_leaves_a_worker_no_stub_of_free_slots() {
        // Runs of 8 would leave each worker of 10 free slots 2, for later rounds to
        // touch it again for two tasks: each takes its 10.
        let out = plan_round(&echoes(64), &fleet(100, 10), 64);
        let got: Vec<usize> = runs(&out).into_iter().map(|(_, n)| n).collect();
        assert_eq!(got, [10, 10, 10, 10, 10, 10, 4]);
    }

    #[test]
    fn a_round_not_cut_spreads_one_task_per_worker() {
        // Fewer tasks than the batch: every runnable task is in this round.
        let out = plan_round(&echoes(40), &fleet(100, 10), 2000);
        assert_eq!(runs(&out).len(), 40);
        // A batch that the free slots bound, not the backlog: not cut either.
        let out = plan_round(&echoes(40), &fleet(4, 10), 40);
        assert_eq!(
            runs(&out),
            [("w000", 10), ("w001", 10), ("w002", 10), ("w003", 10)]
                .map(|(w, n)| (w.to_string(), n))
        );
    }

    #[test]
    fn a_cut_round_gives_a_worker_no_more_than_its_free_slots() {
        let out = plan_round(&echoes(30), &fleet(100, 3), 30);
        let got = runs(&out);
        assert_eq!(out.len(), 30);
        assert_eq!(got.len(), 10, "{got:?}");
        assert!(got.iter().all(|(_, n)| *n == 3), "{got:?}");
    }

    #[test]
    fn plan_gives_each_worker_one_run_of_neighbouring_tasks() {
        let worker = |id: &str, free: i32| RosterEntry {
            id: id.into(),
            kinds: vec!["echo".into()],
            capacity: free,
            held: 0,
            host: "h".into(),
            slots: None,
        };
        let roster = vec![worker("a", 100), worker("b", 100), worker("c", 50)];
        let out: Vec<String> = plan(&echoes(10), &roster)
            .into_iter()
            .map(|a| a.worker)
            .collect();
        // Shares 4 / 4 / 2 of the 10 (proportional to free slots, rounded up), each as one
        // run in claim order: interleaved rows would have two workers write the same pages.
        assert_eq!(out, ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"]);
    }

    #[test]
    fn plan_gives_a_large_fleet_its_shares_and_never_more_than_free_slots() {
        let roster: Vec<RosterEntry> = (0..2000)
            .map(|i| RosterEntry {
                id: format!("w{i:04}"),
                kinds: vec![if i % 2 == 0 { "a" } else { "b" }.into()],
                capacity: 10,
                held: if i % 10 == 0 { 10 } else { 3 },
                host: format!("h{}", i % 7),
                slots: None,
            })
            .collect();
        let claimed: Vec<Claimed> = (0..6000u128)
            .map(|i| Claimed {
                id: Uuid::from_u128(i),
                kind: if i % 3 == 0 { "b" } else { "a" }.into(),
                host: None,
                limited: false,
                fresh: None,
            })
            .collect();
        let out = plan(&claimed, &roster);
        let mut per: std::collections::HashMap<&str, i32> = Default::default();
        for a in &out {
            *per.entry(a.worker.as_str()).or_default() += 1;
        }
        for w in &roster {
            let got = per.get(w.id.as_str()).copied().unwrap_or(0);
            assert!(got <= w.free(), "{} got {got}, free {}", w.id, w.free());
        }
        // Every task placed, on a worker of its kind: kind a has 1,000 workers, 200 of
        // them full, the others 7 free slots each (5,600 for 4,000 tasks); kind b 7,000
        // slots for 2,000.
        assert_eq!(out.len(), 6000);
        for a in &out {
            let kind = &claimed[a.task.as_u128() as usize].kind;
            let w: usize = a.worker[1..].parse().unwrap();
            assert_eq!(
                kind == "a",
                w.is_multiple_of(2),
                "{} went to {}",
                a.task,
                a.worker
            );
        }
    }

    /// A worker with a local queue keeps its last free place for a fair kind's key that
    /// holds no task (migrations/V48): the fair kind's other tasks leave it, the fresh
    /// key's task and other kinds' take it; a worker without a queue (its slots all its
    /// capacity) or that did not say its slots keeps nothing.
    #[test]
    fn plan_keeps_a_queue_place_for_a_fair_kinds_idle_key() {
        let worker = |id: &str, capacity: i32, slots: Option<i32>| RosterEntry {
            id: id.into(),
            kinds: vec!["fair".into(), "plain".into()],
            capacity,
            held: 0,
            host: "h".into(),
            slots,
        };
        let task = |kind: &str, fresh: Option<bool>| Claimed {
            id: Uuid::new_v4(),
            kind: kind.into(),
            host: None,
            limited: true,
            fresh,
        };
        let placed = |claimed: &[Claimed], roster: &[RosterEntry]| -> Vec<(usize, String)> {
            plan(claimed, roster)
                .into_iter()
                .map(|a| {
                    let i = claimed.iter().position(|t| t.id == a.task).unwrap();
                    (i, a.worker)
                })
                .collect()
        };
        let held_key = |n: usize| {
            (0..n)
                .map(|_| task("fair", Some(false)))
                .collect::<Vec<_>>()
        };

        // Queue: 4 places, 2 slots, so one kept. The held key takes three; the fresh
        // key's task, claimed after them, the fourth.
        let mut claimed = held_key(5);
        claimed.push(task("fair", Some(true)));
        let out = placed(&claimed, &[worker("q", 4, Some(2))]);
        let got: Vec<usize> = out.iter().map(|(i, _)| *i).collect();
        assert_eq!(got, [0, 1, 2, 5], "{out:?}");

        // Another kind's task takes the kept place: the place is kept from the fair
        // kind's backlog, not from the worker.
        let mut claimed = held_key(5);
        claimed.push(task("plain", None));
        let got: Vec<usize> = placed(&claimed, &[worker("q", 4, Some(2))])
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(got, [0, 1, 2, 5]);

        // No queue (slots = capacity), or slots not said: every place is the backlog's.
        for w in [worker("n", 4, Some(4)), worker("s", 4, None)] {
            assert_eq!(placed(&held_key(5), &[w]).len(), 4);
        }

        // Two workers: the held key fills both but their kept places (two and four of
        // its seven), skipping a worker with only its kept place left for one with more;
        // its seventh stays pending, and the fresh task takes a kept place.
        let mut claimed = held_key(7);
        claimed.push(task("fair", Some(true)));
        let roster = [worker("a", 3, Some(1)), worker("b", 5, Some(1))];
        let out = placed(&claimed, &roster);
        let held_on = |w: &str| out.iter().filter(|(i, x)| x == w && *i < 7).count();
        assert_eq!((held_on("a"), held_on("b")), (2, 4), "{out:?}");
        assert!(out.iter().any(|(i, _)| *i == 7), "{out:?}");
        assert_eq!(out.len(), 7, "{out:?}");
    }

    #[test]
    fn plan_gives_a_task_bound_to_a_host_only_to_workers_there() {
        let worker = |id: &str, host: &str| RosterEntry {
            id: id.into(),
            kinds: vec!["digest".into()],
            capacity: 10,
            held: 0,
            host: host.into(),
            slots: None,
        };
        let roster = vec![worker("a", "h1"), worker("b", "h2"), worker("c", "h2")];
        let task = |host: Option<&str>| Claimed {
            id: Uuid::new_v4(),
            kind: "digest".into(),
            host: host.map(String::from),
            limited: false,
            fresh: None,
        };
        let claimed = vec![
            task(Some("h2")),
            task(None),
            task(Some("h1")),
            task(Some("h3")),
            task(Some("h2")),
            task(Some("h1")),
        ];
        let out = plan(&claimed, &roster);
        let to = |t: &Claimed| {
            out.iter()
                .find(|a| a.task == t.id)
                .map(|a| a.worker.as_str())
        };
        for c in &claimed {
            let t = c;
            match c.host.as_deref() {
                Some("h1") => assert_eq!(to(t), Some("a")),
                Some("h2") => assert!(matches!(to(t), Some("b" | "c")), "{:?}", to(t)),
                // No worker on h3: it waits.
                Some(_) => assert_eq!(to(t), None),
                None => assert!(to(t).is_some()),
            }
        }
        assert_eq!(out.len(), 5);
    }
}

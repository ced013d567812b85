//! A fair kind's turns in the worker's local queue (`artex kind limit K --fair`).
//!
//! The planner hands a fair kind's tasks out by turns across their limit keys
//! (migrations/V43), but a worker keeps about 100 ms of work queued (`depth`) in the order
//! it read it: a new key's task would wait there behind the queued tasks of the key with
//! the backlog (20 ms tasks behind a 20,000-task key waited 31 times as long as on an idle
//! fleet). So the queue takes turns too. Its order between kinds stays as read; which
//! queued task of a fair kind fills that kind's next place goes by start-time fair
//! queuing: a task is tagged when it arrives with its key's next turn (one past the key's
//! last tag, or the kind's clock, the tag of the kind's last start, if that is later: a
//! key that was idle here takes the turn now going, ahead of the backlog's next), and
//! the kind's next start is its queued task of highest priority, then lowest tag, then
//! earliest arrival. A key with fifty tasks queued and a key with one thus alternate, and
//! priority still goes first, as in the round.
//!
//! Pure: fed the fair kinds, the arrivals and the queue; the worker starts what
//! [`Turns::next`] takes.

use std::collections::{HashMap, HashSet, VecDeque};

use uuid::Uuid;

use crate::blackboard::AssignedTask;

/// Tags kept per kind before the ones at or behind its clock are dropped (they say
/// nothing a missing one does not).
const PRUNE_AT: usize = 1_024;

/// One fair kind's clock and its keys' last tags.
#[derive(Debug, Default)]
struct KindTurns {
    /// The tag of the kind's last start here.
    clock: u64,
    /// Each key's last tag (`None`: tasks without a limit key, one key together).
    last: HashMap<Option<String>, u64>,
}

/// The fair kinds and the tags of their queued tasks.
#[derive(Debug, Default)]
pub(super) struct Turns {
    kinds: HashMap<String, KindTurns>,
    /// Each queued fair task's tag, and its arrival (the tie-break).
    tags: HashMap<Uuid, (u64, u64)>,
    arrivals: u64,
}

impl Turns {
    /// The kinds that are fair now, as last read: a kind that stops being fair starts
    /// its queued tasks in the order they came again.
    pub fn set_fair(&mut self, fair: &HashSet<String>) {
        self.kinds.retain(|k, _| fair.contains(k));
        for k in fair {
            self.kinds.entry(k.clone()).or_default();
        }
    }

    /// Whether any kind is fair (else [`Turns::next`] is the queue's front).
    pub fn any(&self) -> bool {
        !self.kinds.is_empty()
    }

    /// Tags `task`, just queued, with its key's next turn (a task of a kind that is not
    /// fair gets none).
    pub fn arrived(&mut self, task: &AssignedTask) {
        let Some(k) = self.kinds.get_mut(&task.kind) else {
            return;
        };
        let clock = k.clock;
        let tag = k
            .last
            .get(&task.limit_key)
            .map_or(clock, |last| (last + 1).max(clock));
        k.last.insert(task.limit_key.clone(), tag);
        self.arrivals += 1;
        self.tags.insert(task.id, (tag, self.arrivals));
        if k.last.len() > PRUNE_AT {
            k.last.retain(|_, t| *t >= clock);
        }
    }

    /// Takes the task to start next from `queue`: its front, or when the front is of a
    /// fair kind, that kind's queued task whose turn it is (highest priority, then lowest
    /// tag, then earliest arrival; a task queued before its kind was fair counts as
    /// tagged with the kind's clock, arrived first). The front task takes the place of
    /// the one taken, so every kind keeps its places in the queue.
    pub fn next(&mut self, queue: &mut VecDeque<AssignedTask>) -> Option<AssignedTask> {
        let front = queue.front()?;
        let Some(k) = self.kinds.get_mut(&front.kind) else {
            return queue.pop_front();
        };
        let tag = |t: &AssignedTask| self.tags.get(&t.id).copied().unwrap_or((k.clock, 0));
        let order = |t: &AssignedTask| (std::cmp::Reverse(t.priority), tag(t));
        let kind = front.kind.clone();
        let mut best = (0, order(front));
        for (i, t) in queue.iter().enumerate().skip(1) {
            if t.kind == kind && order(t) < best.1 {
                best = (i, order(t));
            }
        }
        let task = queue.swap_remove_front(best.0)?;
        k.clock = k.clock.max(best.1 .1 .0);
        self.tags.remove(&task.id);
        if self.tags.len() > 2 * queue.len() + PRUNE_AT {
            let queued: HashSet<Uuid> = queue.iter().map(|t| t.id).collect();
            self.tags.retain(|id, _| queued.contains(id));
        }
        Some(task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(kind: &str, key: Option<&str>, priority: i32) -> AssignedTask {
        AssignedTask {
            id: Uuid::now_v7(),
            kind: kind.into(),
            payload: serde_json::Value::Null,
            epoch: 1,
            retries: 0,
            max_retries: 3,
            timeout_ms: None,
            checkpoint: None,
            flow_id: None,
            payload_bytes: 4,
            lease_left_ms: 30_000.0,
            priority,
            limit_key: key.map(str::to_string),
            traceparent: None,
        }
    }

    fn fair(kinds: &[&str]) -> Turns {
        let mut t = Turns::default();
        t.set_fair(&kinds.iter().map(|k| k.to_string()).collect());
        t
    }

    /// Queues `tasks` as a refill does.
    fn arrive(turns: &mut Turns, queue: &mut VecDeque<AssignedTask>, tasks: Vec<AssignedTask>) {
        for t in &tasks {
            turns.arrived(t);
        }
        queue.extend(tasks);
    }

    fn keys(turns: &mut Turns, queue: &mut VecDeque<AssignedTask>, n: usize) -> Vec<String> {
        (0..n)
            .map_while(|_| turns.next(queue))
            .map(|t| format!("{}:{}", t.kind, t.limit_key.unwrap_or_default()))
            .collect()
    }

    #[test]
    fn a_new_key_goes_ahead_of_a_queued_backlog() {
        let mut turns = fair(&["resize"]);
        let mut q = VecDeque::new();
        arrive(
            &mut turns,
            &mut q,
            (0..50).map(|_| task("resize", Some("big"), 0)).collect(),
        );
        assert_eq!(keys(&mut turns, &mut q, 10), vec!["resize:big"; 10]);
        arrive(&mut turns, &mut q, vec![task("resize", Some("small"), 0)]);
        // A key idle here takes the kind's clock, the turn now going: it starts before
        // the backlog's queued tasks, tagged past it.
        assert_eq!(
            keys(&mut turns, &mut q, 3),
            ["resize:small", "resize:big", "resize:big"]
        );
        // Two keys with several queued alternate.
        arrive(
            &mut turns,
            &mut q,
            (0..3).map(|_| task("resize", Some("small"), 0)).collect(),
        );
        assert_eq!(
            keys(&mut turns, &mut q, 6),
            [
                "resize:small",
                "resize:big",
                "resize:small",
                "resize:big",
                "resize:small",
                "resize:big"
            ]
        );
        assert_eq!(q.len(), 35);
    }

    #[test]
    fn a_kind_that_is_not_fair_keeps_the_order_it_came_in() {
        let mut turns = fair(&["resize"]);
        let mut q = VecDeque::new();
        let mut tasks: Vec<_> = (0..5).map(|_| task("echo", Some("big"), 0)).collect();
        tasks.push(task("echo", Some("small"), 9));
        let ids: Vec<Uuid> = tasks.iter().map(|t| t.id).collect();
        arrive(&mut turns, &mut q, tasks);
        let got: Vec<Uuid> = (0..6)
            .filter_map(|_| turns.next(&mut q))
            .map(|t| t.id)
            .collect();
        assert_eq!(got, ids);
        assert!(turns.next(&mut q).is_none());
    }

    #[test]
    fn other_kinds_keep_their_places_and_priority_goes_first() {
        let mut turns = fair(&["resize"]);
        let mut q = VecDeque::new();
        arrive(
            &mut turns,
            &mut q,
            vec![
                task("resize", Some("a"), 0),
                task("resize", Some("a"), 0),
                task("echo", None, 0),
                task("resize", Some("b"), 0),
                task("resize", Some("c"), 5),
            ],
        );
        // The first resize place goes to c's priority 5; echo keeps the third place; then
        // a and b by their turns (a's first was tagged 1, b's 1: a arrived first).
        assert_eq!(
            keys(&mut turns, &mut q, 5),
            ["resize:c", "resize:a", "echo:", "resize:b", "resize:a"]
        );
    }

    #[test]
    fn fairness_follows_the_kinds_as_last_read() {
        let mut turns = Turns::default();
        assert!(!turns.any());
        let mut q = VecDeque::new();
        arrive(
            &mut turns,
            &mut q,
            (0..4).map(|_| task("resize", Some("big"), 0)).collect(),
        );
        arrive(&mut turns, &mut q, vec![task("resize", Some("small"), 0)]);
        // Made fair with these queued untagged: each counts as the kind's clock, so the
        // order they came in decides among them.
        turns.set_fair(&["resize".to_string()].into());
        assert!(turns.any());
        arrive(&mut turns, &mut q, vec![task("resize", Some("late"), 0)]);
        assert_eq!(
            keys(&mut turns, &mut q, 6),
            [
                "resize:big",
                "resize:big",
                "resize:big",
                "resize:big",
                "resize:small",
                "resize:late"
            ]
        );
        // No longer fair: the queue's order.
        arrive(
            &mut turns,
            &mut q,
            vec![task("resize", Some("x"), 0), task("resize", Some("y"), 9)],
        );
        turns.set_fair(&HashSet::new());
        assert_eq!(keys(&mut turns, &mut q, 2), ["resize:x", "resize:y"]);
    }

    #[test]
    fn tags_of_tasks_gone_from_the_queue_are_dropped() {
        let mut turns = fair(&["resize"]);
        let mut q = VecDeque::new();
        for round in 0..20 {
            let tasks: Vec<_> = (0..200)
                .map(|i| task("resize", Some(&format!("k{round}-{i}")), 0))
                .collect();
            arrive(&mut turns, &mut q, tasks);
            // A drain or a lost lease takes the queue away without a start.
            q.clear();
            arrive(&mut turns, &mut q, vec![task("resize", None, 0)]);
            turns.next(&mut q);
        }
        assert!(turns.tags.len() <= PRUNE_AT + 2, "{}", turns.tags.len());
        assert!(
            turns.kinds["resize"].last.len() <= PRUNE_AT + 1,
            "{}",
            turns.kinds["resize"].last.len()
        );
    }
}

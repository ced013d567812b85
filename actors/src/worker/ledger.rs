//! The worker's ledger of every (task, epoch) it took, so that no read takes one twice.
//! Pure bookkeeping (no actor, no database), so each of its rules is unit-tested here;
//! the Worker changes it only through these methods.
//!
//! Why it is needed: a worker reads its assignments without writing (the read is not a
//! claim), and a task it ran stays `assigned` in the blackboard until the write of its
//! start or outcome commits. A read that started before that write can still return the
//! task, so the ledger keeps the task until a read that started *after* the write: that
//! read sees the write, and from then on the blackboard alone tells the truth.

use std::collections::HashMap;

use uuid::Uuid;

/// A task held at one lease epoch: what the ledger counts (the same task assigned again
/// later, at a higher epoch, is a new entry).
pub type Key = (Uuid, i64);

/// One read of the worker's assignments, numbered in the order they started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Read(u64);

/// Where a taken task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// Queued, running, suspended, or finished with its outcome not written yet.
    Held,
    /// Let go (outcome written or fenced off, lease lost) when `reads` reads had started:
    /// a read numbered above that sees the write, and the entry goes.
    LetGo { reads: u64 },
}

/// Every (task, epoch) a worker took; see the module doc.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<Key, Entry>,
    /// Reads started so far.
    reads: u64,
}

impl Ledger {
    /// A read of the assignments starts: returns its number, which
    /// [`Ledger::read_returned`] needs.
    pub fn start_read(&mut self) -> Read {
        self.reads += 1;
        Read(self.reads)
    }

    /// Read `read` came back with `tasks`: returns the ones to take (each task the ledger
    /// does not know yet, now held), in their order, then forgets what that read could
    /// see. `key` names a task's (id, epoch).
    pub fn read_returned<T>(
        &mut self,
        read: Read,
        tasks: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> Key,
    ) -> Vec<T> {
        let taken = tasks.into_iter().filter(|t| self.take(key(t))).collect();
        self.forget_seen_by(read);
        taken
    }

    /// Takes the task unless the ledger knows it already (held, or let go but possibly
    /// still `assigned` to this read): returns whether it was taken.
    fn take(&mut self, key: Key) -> bool {
        match self.entries.entry(key) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Entry::Held);
                true
            }
            std::collections::hash_map::Entry::Occupied(_) => false,
        }
    }

    /// Forgets the tasks let go before `read` started: that read, and every later one,
    /// sees the write that let them go, so the blackboard no longer shows them assigned
    /// here at that epoch.
    fn forget_seen_by(&mut self, read: Read) {
        self.entries.retain(|_, e| match e {
            Entry::Held => true,
            Entry::LetGo { reads } => *reads >= read.0,
        });
    }

    /// A task carried by a wake-up (see `blackboard::carried`) whose row version no
    /// finished read could see: taken unless the ledger knows it (a read in flight took
    /// it first). Returns whether it was taken. A version the latest finished read could
    /// see must not come here: that read may have taken it, and the ledger may have
    /// forgotten it since.
    pub fn take_carried(&mut self, key: Key) -> bool {
        self.take(key)
    }

    /// A task moved to this worker by a task transfer (hot upgrade, new side): held, as if
    /// a read had taken it.
    pub fn took_over(&mut self, key: Key) {
        self.entries.insert(key, Entry::Held);
    }

    /// The worker no longer holds the task: its outcome was written or fenced off, its
    /// start was fenced off, or its lease was lost. The blackboard may still show it
    /// `assigned` here to a read started by now, so it stays until a later one.
    pub fn let_go(&mut self, key: Key) {
        self.entries.insert(key, Entry::LetGo { reads: self.reads });
    }

    /// A queued task dropped before it ran (the worker is draining, or suspending for a
    /// task transfer): forgotten at once, since it is still `assigned` in the blackboard,
    /// where the drain gives it back or the task transfer moves it.
    pub fn dropped_unrun(&mut self, key: Key) {
        self.entries.remove(&key);
    }

    /// Every (task, epoch) it knows, held or let go: a read need not return them, since
    /// [`Ledger::read_returned`] would take none of them (migrations/V71).
    pub fn known(&self) -> Vec<Key> {
        self.entries.keys().copied().collect()
    }

    /// How many tasks it holds as the blackboard counts them: taken and not let go
    /// (queued, running, suspended, or finished with the outcome not written yet).
    pub fn held(&self) -> usize {
        self.entries.values().filter(|e| **e == Entry::Held).count()
    }

    /// The tasks taken and not let go: queued, running, suspended, or finished with the
    /// outcome not written yet. With the queue emptied, what a drain must not give back
    /// and a task transfer must not move: their start may not be written, so they may still
    /// read `assigned`.
    pub fn outcome_unwritten(&self) -> Vec<Uuid> {
        self.entries
            .iter()
            .filter(|(_, e)| **e == Entry::Held)
            .map(|((id, _), _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u128, epoch: i64) -> Key {
        (Uuid::from_u128(n), epoch)
    }

    /// What a read returning `keys` takes.
    fn read(ledger: &mut Ledger, keys: &[Key]) -> Vec<Key> {
        let r = ledger.start_read();
        ledger.read_returned(r, keys.iter().copied(), |k| *k)
    }

    fn sorted(mut ids: Vec<Uuid>) -> Vec<Uuid> {
        ids.sort();
        ids
    }

    #[test]
    fn reads_are_numbered_in_the_order_they_start() {
        let mut ledger = Ledger::default();
        let first = ledger.start_read();
        let second = ledger.start_read();
        assert!(first < second);
        assert_ne!(first, second);
    }

    #[test]
    fn a_read_takes_every_task_it_does_not_know_in_order() {
        let mut ledger = Ledger::default();
        let keys = [key(3, 1), key(1, 1), key(2, 1)];
        assert_eq!(read(&mut ledger, &keys), keys);
        assert_eq!(
            sorted(ledger.outcome_unwritten()),
            sorted(keys.iter().map(|k| k.0).collect())
        );
    }

    #[test]
    fn it_holds_what_the_blackboard_counts_until_the_outcome_is_written() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1), key(2, 1), key(3, 1)]);
        // Finished with the outcome not written: still held, as the blackboard counts.
        assert_eq!(ledger.held(), 3);
        ledger.let_go(key(2, 1));
        assert_eq!(ledger.held(), 2);
        ledger.dropped_unrun(key(3, 1));
        assert_eq!(ledger.held(), 1);
    }

    #[test]
    fn a_held_task_is_not_taken_again() {
        let mut ledger = Ledger::default();
        assert_eq!(read(&mut ledger, &[key(1, 1)]), [key(1, 1)]);
        assert_eq!(read(&mut ledger, &[key(1, 1), key(2, 1)]), [key(2, 1)]);
        assert_eq!(read(&mut ledger, &[key(1, 1), key(2, 1)]), []);
    }

    #[test]
    fn the_same_task_at_a_new_epoch_is_a_new_task() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1)]);
        assert_eq!(read(&mut ledger, &[key(1, 2)]), [key(1, 2)]);
    }

    #[test]
    fn a_task_let_go_is_not_taken_by_a_read_that_started_before() {
        // The read starts, the outcome is written, then the read comes back: its snapshot
        // may predate the write, so the task may read `assigned`; it must not run again.
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1)]);
        let in_flight = ledger.start_read();
        ledger.let_go(key(1, 1));
        assert_eq!(
            ledger.read_returned(in_flight, [key(1, 1)], |k| *k),
            Vec::<Key>::new()
        );
    }

    #[test]
    fn a_task_let_go_stays_until_a_read_started_after_the_write() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1)]);
        let before = ledger.start_read();
        ledger.let_go(key(1, 1));
        // The read that started before the write comes back: the entry must stay.
        ledger.read_returned(before, Vec::<Key>::new(), |k| *k);
        assert_eq!(read(&mut ledger, &[key(1, 1)]), []);
        // That read started after the write and forgot it: a task at that key (which the
        // blackboard can only show again if it really is assigned again) is taken.
        assert_eq!(read(&mut ledger, &[key(1, 1)]), [key(1, 1)]);
    }

    #[test]
    fn a_read_forgets_only_what_was_let_go_before_it_started() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1), key(2, 1)]);
        ledger.let_go(key(1, 1));
        let r = ledger.start_read();
        ledger.let_go(key(2, 1));
        ledger.read_returned(r, Vec::<Key>::new(), |k| *k);
        // 1 was let go before the read started: forgotten, so taken again if returned.
        // 2 was let go while the read ran: kept, so not taken.
        let again = ledger.start_read();
        assert_eq!(
            ledger.read_returned(again, [key(1, 1), key(2, 1)], |k| *k),
            [key(1, 1)]
        );
    }

    #[test]
    fn a_read_never_forgets_a_held_task() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1)]);
        for _ in 0..3 {
            assert_eq!(read(&mut ledger, &[key(1, 1)]), []);
        }
        assert_eq!(ledger.outcome_unwritten(), [key(1, 1).0]);
    }

    #[test]
    fn a_task_let_go_has_its_outcome_written() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1), key(2, 1)]);
        ledger.let_go(key(1, 1));
        assert_eq!(ledger.outcome_unwritten(), [key(2, 1).0]);
    }

    #[test]
    fn letting_go_of_a_task_never_taken_still_keeps_it_from_earlier_reads() {
        // A lease lost or a record fenced off for a key the ledger did not hold (e.g.
        // after a drop) is remembered all the same.
        let mut ledger = Ledger::default();
        let r = ledger.start_read();
        ledger.let_go(key(1, 1));
        assert_eq!(ledger.read_returned(r, [key(1, 1)], |k| *k), []);
        assert!(ledger.outcome_unwritten().is_empty());
    }

    #[test]
    fn a_task_taken_over_is_held_whatever_the_ledger_said() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1)]);
        ledger.let_go(key(1, 1));
        ledger.took_over(key(1, 1));
        assert_eq!(ledger.outcome_unwritten(), [key(1, 1).0]);
        ledger.took_over(key(2, 5));
        assert_eq!(read(&mut ledger, &[key(2, 5)]), []);
        // Held: no read forgets it.
        assert_eq!(read(&mut ledger, &[key(1, 1)]), []);
    }

    #[test]
    fn a_task_dropped_unrun_is_forgotten_at_once() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1), key(2, 1)]);
        ledger.dropped_unrun(key(1, 1));
        assert_eq!(ledger.outcome_unwritten(), [key(2, 1).0]);
        // Nothing keeps it from being taken again (after a rolled-back upgrade).
        assert_eq!(read(&mut ledger, &[key(1, 1)]), [key(1, 1)]);
    }

    #[test]
    fn outcome_unwritten_lists_held_tasks_only() {
        let mut ledger = Ledger::default();
        read(&mut ledger, &[key(1, 1), key(2, 1), key(3, 1)]);
        ledger.let_go(key(2, 1));
        ledger.dropped_unrun(key(3, 1));
        ledger.took_over(key(4, 7));
        assert_eq!(
            sorted(ledger.outcome_unwritten()),
            sorted(vec![key(1, 1).0, key(4, 7).0])
        );
    }
}

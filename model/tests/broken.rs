//! The checker can fail: each test breaks one guard of the protocol on purpose (or
//! widens the clock skew past the fence's margin) and asserts that a counterexample is
//! found, printed as a trace. The last one is a window the model found in artex as it
//! is: a recall after a failed push (docs/model.md, "What the model found").

use std::collections::BTreeSet;

use artex_model::properties::names;
use artex_model::{trace, Bound, Protocol, Recall};
use stateright::{Checker, HasDiscoveries, Model};

/// A small world: one planner, two workers, one task, no upgrade, no faults.
fn small() -> Bound {
    Bound {
        planners: 1,
        workers: 2,
        tasks: 1,
        upgrade: false,
        crashes: 0,
        partitions: 0,
        horizon: 6,
        ..Bound::ci()
    }
}

/// The trace of a counterexample to `property` in `model`; fails if there is none.
fn counterexample(model: Protocol, property: &'static str) -> String {
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("no counterexample to \"{property}\" was found"));
    let mut shown = trace::render(&path);
    if property == names::RECOVERS {
        let why = artex_model::properties::recovers(checker.model(), path.last_state());
        shown.push_str(&format!("the continuation from its last state: {why:?}\n"));
    }
    println!("counterexample to \"{property}\":\n{shown}");
    shown
}

#[test]
fn a_reaper_that_ignores_the_lease_runs_a_task_twice() {
    let mut model = Protocol::new(small());
    model.guards.reaper_waits_for_lease = false;
    let shown = counterexample(model, names::NO_OVERLAP);
    assert!(shown.contains("Reclaim"), "{shown}");
}

#[test]
fn writes_that_do_not_name_the_epoch_let_a_stale_worker_write() {
    let mut model = Protocol::new(small());
    model.guards.writes_name_epoch = false;
    counterexample(model, names::FENCING);
}

#[test]
fn a_take_over_that_ignores_the_checkpoint_starts_from_scratch() {
    let mut model = Protocol::new(Bound {
        upgrade: true,
        ..small()
    });
    model.guards.resume_from_checkpoint = false;
    let shown = counterexample(model, names::NO_RESTART);
    assert!(shown.contains("TakeOver"), "{shown}");
}

#[test]
fn a_reaper_that_leaves_unstarted_tasks_loses_a_crashed_worker_s_task() {
    let mut model = Protocol::new(Bound {
        crashes: 1,
        ..small()
    });
    model.guards.reaper_takes_unstarted = false;
    let shown = counterexample(model, names::RECOVERS);
    assert!(shown.contains("Crash"), "{shown}");
}

#[test]
fn clocks_skewed_past_the_margin_overlap_two_executions() {
    let bound = Bound {
        partitions: 1,
        skew: Bound::ci().margin + 1,
        ..small()
    };
    let shown = counterexample(Protocol::new(bound), names::NO_OVERLAP);
    assert!(shown.contains("Reclaim"), "{shown}");
}

// Found by the model in artex as it was (docs/model.md): a worker reads a task (from its
// wake-up or its poll) and starts its handler, and is cut off before its start is
// written; the planner's push fails, so it recalled the task, still `assigned`, and gave
// it to another worker, while the first handler ran on until its fence stopped it, up
// to a lease later. artex now recalls only a refused push (the process gone): that
// holds, with a crash and a partition in the world.
#[test]
fn a_recall_after_any_failed_push_can_overlap_two_executions() {
    let bound = Bound {
        partitions: 1,
        ..small()
    };
    let mut model = Protocol::new(bound.clone());
    model.guards.recall = Recall::Always;
    let shown = counterexample(model, names::NO_OVERLAP);
    assert!(
        shown.contains("Partition") && shown.contains("RECALL"),
        "{shown}"
    );
    // Recalling only when the push was refused (the process gone), the same world holds,
    // crashes added.
    let model = Protocol::new(Bound {
        crashes: 1,
        ..bound
    });
    assert_eq!(model.guards.recall, Recall::WhenRefused);
    let checker = model.checker().spawn_bfs().join();
    assert!(checker.discovery(names::NO_OVERLAP).is_none());
}

//! The protocol checked exhaustively within the CI bound (docs/model.md): every `always`
//! property holds in every reachable state; every `sometimes` property is reached (in a
//! run that keeps the flags it needs). A counterexample is printed as a trace.

use std::collections::BTreeMap;
use std::time::Instant;

use artex_model::{properties, symmetry, trace, Bound, Protocol, Recall};
use stateright::{Checker, Expectation, Model};

/// What a check found: the counterexamples to `always` properties (as traces) and the
/// `sometimes` properties never reached.
fn check(model: Protocol, label: &str) -> Vec<String> {
    let expectations: BTreeMap<&'static str, Expectation> = model
        .properties()
        .iter()
        .map(|p| (p.name, p.expectation.clone()))
        .collect();
    let witness = model.witness;
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .symmetry_fn(symmetry::representative)
        .spawn_dfs()
        .join();
    let found = checker.discoveries();
    println!(
        "{label}: {:?}, guards {:?}: {} states generated, {} unique, depth {}, {:.1} s",
        checker.model().bound,
        checker.model().guards,
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    let mut failures = Vec::new();
    for (name, expectation) in expectations {
        match (expectation, found.get(name)) {
            (Expectation::Always, Some(path)) => {
                let mut shown = format!("counterexample to \"{name}\":\n{}", trace::render(path));
                if name == properties::names::RECOVERS {
                    let why = properties::recovers(checker.model(), path.last_state());
                    shown.push_str(&format!("the continuation from its last state: {why:?}\n"));
                }
                failures.push(shown)
            }
            (Expectation::Sometimes, None) if witness => failures.push(format!(
                "never reached: \"{name}\" (the model is vacuous there)"
            )),
            _ => {}
        }
    }
    failures
}

/// The protocol as artex runs it but for the recall of a refused push: the wake-ups it
/// keeps in the state multiply the states past the CI's minutes. The recall as artex
/// makes it (`Recall::WhenRefused`) is checked in a smaller world with a crash and a
/// partition (tests/broken.rs), where the recall on any failure overlaps two executions.
fn protocol(bound: Bound) -> Protocol {
    let mut model = Protocol::new(bound);
    model.guards.recall = Recall::Never;
    model
}

#[test]
fn the_protocol_holds_within_the_ci_bound() {
    // Exhaustive, without the flags of `sometimes` properties (they split states).
    let mut model = protocol(Bound::ci());
    model.witness = false;
    let failures = check(model, "exhaustive");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_interesting_state_is_reached() {
    // The same world with the flags kept, so that each `sometimes` property is reached:
    // an upgrade completes, the reaper rescues a task, a transferred task resumes from
    // its checkpoint, a cut-off worker fences itself, a stale write is refused. A
    // shorter horizon suffices to reach them all.
    let model = protocol(Bound {
        horizon: 6,
        ..Bound::ci()
    });
    let failures = check(model, "witness");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn two_tasks_hold_without_the_upgrade() {
    // Two tasks at once (rows claimed, renewed and reclaimed side by side) within what
    // fits: no upgrade and no crash, one partition.
    let mut model = protocol(Bound {
        workers: 2,
        tasks: 2,
        upgrade: false,
        crashes: 0,
        horizon: 6,
        ..Bound::ci()
    });
    model.witness = false;
    let failures = check(model, "two tasks");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

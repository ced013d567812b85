//! Checks the model at a bound given on the command line and prints what it found:
//! `cargo run -p artex-model --release --example explore -- planners workers tasks
//! upgrade(0/1) crashes partitions horizon [seconds [recall(0 never, 1 when refused, 2 always)]]`.

use std::time::{Duration, Instant};

use artex_model::{trace, Bound, Protocol, Recall};
use stateright::{Checker, Model};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numbers"))
        .collect();
    let mut b = Bound::ci();
    let get = |i: usize, d: u64| a.get(i).copied().unwrap_or(d);
    b.planners = get(0, b.planners.into()) as u8;
    b.workers = get(1, b.workers.into()) as u8;
    b.tasks = get(2, b.tasks.into()) as u8;
    b.upgrade = get(3, b.upgrade.into()) == 1;
    b.crashes = get(4, b.crashes.into()) as u8;
    b.partitions = get(5, b.partitions.into()) as u8;
    b.horizon = get(6, b.horizon.into()) as u8;
    let secs = get(7, 60);
    b.lease = get(10, b.lease.into()) as u8;
    let mut model = Protocol::new(b.clone());
    model.guards.recall = match get(8, 1) {
        0 => Recall::Never,
        2 => Recall::Always,
        _ => Recall::WhenRefused,
    };
    model.witness = get(9, 1) == 1;
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(2)
        .timeout(Duration::from_secs(secs))
        .symmetry_fn(artex_model::symmetry::representative)
        .spawn_dfs()
        .join();
    println!(
        "{b:?}\n{} states, {} unique, depth {}, {:.1} s, done: {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64(),
        checker.is_done()
    );
    for (name, path) in checker.discoveries() {
        let always = checker
            .model()
            .properties()
            .iter()
            .any(|p| p.name == name && p.expectation == stateright::Expectation::Always);
        if always {
            println!("COUNTEREXAMPLE {name}:\n{}", trace::render(&path));
        } else {
            println!("reached: {name} in {} steps", path.into_actions().len());
        }
    }
}

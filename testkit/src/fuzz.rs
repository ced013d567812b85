//! Bounded randomized testing without a framework (issue 25 §2): a target generates cases
//! from a seeded RNG, checks each, and on a failure shrinks the case and prints how to
//! replay it. Shared by the crates' own test modules as a dev-dependency, so it depends on
//! nothing but `std` and `fastrand` (in the tree already; proptest would add a dozen crates
//! to build on every machine for what these 150 lines do).
//!
//! - `ARTEX_FUZZ_CASES=<n>`: cases per target (default: each target's own, chosen to keep
//!   it well under 30 s here);
//! - `ARTEX_FUZZ_SEED=<u64>`: the run's seed (default fixed, so CI is deterministic);
//! - `ARTEX_FUZZ_CASE=<i>`: replay only case `i` of that seed (as a failure prints it).
//!
//! The targets: `assigner::plan` (actors/src/assigner/props.rs), the bundle reader and
//! the upgrade channel's frames (upgrade/src/{bundle,channel}/tests/fuzz.rs), the
//! `/upgrade` form reader and the new side's listener pass (src/hot_upgrade/…/fuzz.rs),
//! the upload protocol (tests/uploads/fuzz.rs) and limits on a real database
//! (tests/planner/limits.rs). A long run goes past nextest's 2-minute kill: run it with
//! `cargo test` instead (it starts the test cluster itself), e.g.
//! `ARTEX_FUZZ_CASES=20000 ARTEX_FUZZ_SEED=7 cargo test -p artex-upgrade --lib fuzz`.

use std::fmt::Debug;
use std::panic::{self, AssertUnwindSafe};

/// The seed of a run that names none.
pub const DEFAULT_SEED: u64 = 0x00a7_7e25_f022_0001;

/// How many cases a target runs: `ARTEX_FUZZ_CASES`, else `default`.
pub fn cases(default: u64) -> u64 {
    env_u64("ARTEX_FUZZ_CASES").unwrap_or(default)
}

/// The integer (decimal, or hex after `0x`) in environment variable `name`; panics
/// naming it when it is not one. Shared with the proptest targets (`props.rs`).
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?}: expected an integer")))
}

/// The seed of case `index` of target `name`: independent per target and per case, so
/// one case replays alone.
pub fn case_seed(seed: u64, name: &str, index: u64) -> u64 {
    // FNV-1a of the name, then splitmix64 of everything.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = seed ^ h ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs target `name`: `default_cases` cases (see [`cases`]), each made by `generate`
/// from its own RNG and checked by `check`, which panics on a violation. A failing case
/// is shrunk with `shrink` (candidates, simplest first; the first that still fails is
/// kept, until none does) and the target fails naming the seed, the case and the smallest
/// failing value.
pub fn run<T: Debug>(
    name: &str,
    default_cases: u64,
    mut generate: impl FnMut(&mut fastrand::Rng) -> T,
    shrink: impl Fn(&T) -> Vec<T>,
    mut check: impl FnMut(&T),
) {
    let seed = env_u64("ARTEX_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let only = env_u64("ARTEX_FUZZ_CASE");
    let count = cases(default_cases);
    let indexes: Box<dyn Iterator<Item = u64>> = match only {
        Some(i) => Box::new(std::iter::once(i)),
        None => Box::new(0..count),
    };
    let mut ran = 0u64;
    for index in indexes {
        let mut rng = fastrand::Rng::with_seed(case_seed(seed, name, index));
        let value = generate(&mut rng);
        if let Err(first) = panic::catch_unwind(AssertUnwindSafe(|| check(&value))) {
            let (smallest, why) = shrink_failure(value, first, &shrink, &mut check);
            panic!(
                "fuzz target {name} failed at case {index} of seed {seed:#x}: {why}\n\
                 smallest failing case: {smallest:#?}\n\
                 replay: ARTEX_FUZZ_SEED={seed:#x} ARTEX_FUZZ_CASE={index}"
            );
        }
        ran += 1;
    }
    eprintln!("fuzz target {name}: {ran} cases passed (seed {seed:#x})");
}

/// Greedy shrinking: the first simpler candidate that still fails replaces the case.
/// The panic hook is silenced meanwhile (the candidates' panics are expected).
fn shrink_failure<T: Debug>(
    mut value: T,
    mut why: Box<dyn std::any::Any + Send>,
    shrink: &impl Fn(&T) -> Vec<T>,
    check: &mut impl FnMut(&T),
) -> (T, String) {
    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let mut steps = 0;
    'outer: while steps < 1000 {
        for candidate in shrink(&value) {
            steps += 1;
            if let Err(e) = panic::catch_unwind(AssertUnwindSafe(|| check(&candidate))) {
                value = candidate;
                why = e;
                continue 'outer;
            }
        }
        break;
    }
    panic::set_hook(hook);
    let text = why
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| why.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(a non-text panic)".to_string());
    (value, text)
}

/// No shrinking: for cases that cannot be made simpler meaningfully.
pub fn no_shrink<T>(_: &T) -> Vec<T> {
    Vec::new()
}

/// Candidates for a list: without each element in turn (last first), then its first half.
pub fn shrink_vec<T: Clone>(v: &[T]) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    if v.len() > 1 {
        out.push(v[..v.len() / 2].to_vec());
    }
    for i in (0..v.len()).rev() {
        let mut w = v.to_vec();
        w.remove(i);
        out.push(w);
    }
    out
}

/// A random length biased to the small and to the edges: 0, 1, `max`, or uniform.
pub fn len(rng: &mut fastrand::Rng, max: usize) -> usize {
    match rng.u8(0..10) {
        0 => 0,
        1 => 1.min(max),
        2 => max,
        _ => rng.usize(0..=max),
    }
}

/// `n` random bytes.
pub fn bytes(rng: &mut fastrand::Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v);
    v
}

/// A u32 biased to the values that break parsers: 0, 1, small, around powers of two,
/// the maximum; or uniform.
pub fn interesting_u32(rng: &mut fastrand::Rng) -> u32 {
    match rng.u8(0..8) {
        0 => 0,
        1 => 1,
        2 => rng.u32(0..256),
        3 => {
            let p = 1u32 << rng.u32(0..32);
            p.wrapping_add(rng.u32(0..3)).wrapping_sub(1)
        }
        4 => u32::MAX - rng.u32(0..3),
        _ => rng.u32(..),
    }
}

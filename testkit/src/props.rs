//! Property tests' settings: how many cases and from which seed, so that CI runs a
//! bounded, reproducible number of them and anyone can run more, or others.
//!
//! `ARTEX_FUZZ_CASES` (else `PROPTEST_CASES`) sets every target's case count, each
//! target's own default otherwise (sized to stay well under 30 s on a shared 2-core
//! machine); `ARTEX_FUZZ_SEED` picks the seed (a fixed one by default). A failure panics
//! with the minimal case proptest shrank it to, the seed and the line that replays it.

use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// The seed every target runs from unless `ARTEX_FUZZ_SEED` says otherwise.
pub const DEFAULT_SEED: u64 = 0x6172_7465_7825; // "artex%": issue 25

/// How a target runs: its case count and seed.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub cases: u32,
    pub seed: u64,
}

/// The settings of a target whose default is `default_cases`.
pub fn settings(default_cases: u32) -> Settings {
    let number = crate::fuzz::env_u64;
    let cases = number("ARTEX_FUZZ_CASES")
        .or_else(|| number("PROPTEST_CASES"))
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(default_cases);
    Settings {
        cases,
        seed: number("ARTEX_FUZZ_SEED").unwrap_or(DEFAULT_SEED),
    }
}

/// Runs `test` on `cases` values of `strategy` (see [`settings`]); panics on the first
/// failure with its minimal case, the seed and how to replay it. `name` names the target
/// in that message.
pub fn check<S>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let s = settings(default_cases);
    eprintln!(
        "{name}: {} cases from seed {:#x} (ARTEX_FUZZ_CASES, ARTEX_FUZZ_SEED)",
        s.cases, s.seed
    );
    let config = Config {
        cases: s.cases,
        rng_seed: RngSeed::Fixed(s.seed),
        // Cases are replayed by seed, not from files written into the source tree.
        failure_persistence: None,
        // Each case runs against PostgreSQL: shrink for a while, not for ever.
        max_shrink_iters: 512,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(why, minimal)) => panic!(
            "{name}: {why}\nminimal failing case: {minimal:#?}\nseed {seed:#x}, {cases} cases: \
             replay with ARTEX_FUZZ_SEED={seed:#x} ARTEX_FUZZ_CASES={cases}",
            seed = s.seed,
            cases = s.cases,
        ),
        Err(TestError::Abort(why)) => panic!(
            "{name}: aborted: {why} (seed {:#x}, {} cases)",
            s.seed, s.cases
        ),
    }
}

//! The strategies that make a case: statuses, workers, epochs, raw updates of any
//! column the trigger looks at, and the runtime's own steps.

use proptest::prelude::*;

use super::*;

fn status() -> impl Strategy<Value = St> {
    proptest::sample::select(STATUSES.to_vec())
}

fn worker() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => Just("w1"), 3 => Just("w2"), 1 => Just("w3")]
}

fn epoch() -> impl Strategy<Value = Epoch> {
    prop_oneof![6 => Just(Epoch::Held), 1 => Just(Epoch::Stale), 1 => Just(Epoch::Ahead)]
}

fn raw() -> impl Strategy<Value = Raw> {
    use proptest::option::weighted;
    let holder = prop_oneof![
        6 => worker().prop_map(Some),
        2 => Just(None),
        1 => Just(Some("")),
    ];
    (
        weighted(0.8, status()),
        weighted(0.5, holder),
        weighted(0.5, weighted(0.85, 1i64..600)),
        weighted(0.15, -1i64..=2),
        weighted(0.2, -1i32..=2),
        weighted(0.1, 0i32..=3),
        weighted(
            0.25,
            proptest::option::of(proptest::sample::select(vec!["oops", "", "it's broken"])),
        ),
        weighted(
            0.25,
            proptest::option::of(prop_oneof![
                Just(-1500i64),
                Just(0i64),
                Just(250i64),
                Just(1500i64)
            ]),
        ),
        weighted(
            0.4,
            (
                proptest::sample::select(vec!["tester", "w1", "operator 'x'"]),
                proptest::option::of(proptest::sample::select(vec![
                    "by hand",
                    "r\u{e9}sum\u{e9}",
                ])),
            ),
        ),
    )
        .prop_map(
            |(
                status,
                holder,
                lease_secs,
                epoch_delta,
                retries_delta,
                max_retries,
                error,
                started_ago_ms,
                context,
            )| Raw {
                status,
                holder,
                lease_secs,
                epoch_delta,
                retries_delta,
                max_retries,
                error,
                started_ago_ms,
                context,
            },
        )
}

fn step_kind() -> impl Strategy<Value = StepKind> {
    prop_oneof![
        3 => Just(StepKind::Start),
        3 => Just(StepKind::Succeeded),
        3 => prop_oneof![Just(0i64), Just(500), Just(60_000)]
            .prop_map(|retry_in_ms| StepKind::Failed { retry_in_ms }),
        2 => prop_oneof![Just(0i64), Just(1500)]
            .prop_map(|retry_in_ms| StepKind::TimedOut { retry_in_ms }),
        1 => Just(StepKind::Released),
        1 => Just(StepKind::Discarded),
        1 => prop_oneof![Just(0i64), Just(1500)].prop_map(|delay_ms| StepKind::Snoozed { delay_ms }),
    ]
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    let secs = || prop_oneof![Just(1i64), Just(30), Just(300)];
    prop_oneof![
        7 => raw().prop_map(Op::Raw),
        4 => (worker(), secs()).prop_map(|(worker, secs)| Op::Assign { worker, secs }),
        6 => (
            worker(),
            epoch(),
            step_kind(),
            proptest::option::weighted(0.6, prop_oneof![Just(0i64), Just(250), Just(1000)])
        )
            .prop_map(|(worker, epoch, step, started_ago_ms)| Op::Record {
                worker,
                epoch,
                step,
                started_ago_ms
            }),
        1 => (worker(), epoch(), secs()).prop_map(|(worker, epoch, secs)| Op::Renew {
            worker,
            epoch,
            secs
        }),
        1 => (epoch(), any::<u8>()).prop_map(|(epoch, n)| Op::Checkpoint { epoch, n }),
        1 => (worker(), proptest::bool::weighted(0.2))
            .prop_map(|(worker, spare)| Op::Release { worker, spare }),
        1 => (worker(), worker(), epoch(), secs()).prop_map(|(from, to, epoch, secs)| {
            Op::TakeOver {
                from,
                to,
                epoch,
                secs
            }
        }),
        1 => (worker(), worker(), proptest::bool::weighted(0.2), secs()).prop_map(
            |(from, to, spare, secs)| Op::MoveAssigned {
                from,
                to,
                spare,
                secs
            }
        ),
        2 => (
            prop_oneof![Just(Ctl::Pause), Just(Ctl::Resume), Just(Ctl::Cancel)],
            proptest::option::of(Just("by the model"))
        )
            .prop_map(|(control, reason)| Op::Control { control, reason }),
    ]
}

//! `artex submit` under random and mutated arguments (issue 25): edge and wrong values
//! for every option, unknown flags, odd kinds and payloads. Each run (the real binary,
//! spawned) either submits a valid task, printing its id, or exits non-zero with a
//! message and writes nothing: never a panic (exit 101) nor a signal. Few cases by
//! default (each is a process): `ARTEX_FUZZ_CASES` for more (`testkit/src/props.rs`).

use artex_testkit::props;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::artex;
use crate::common::{connect, fixtures, TestDb};

/// An option and the values it is tried with (valid ones first).
fn option() -> impl Strategy<Value = Vec<String>> {
    let pick = |flag: &'static str, values: &[&str]| {
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        proptest::sample::select(values).prop_map(move |v| vec![flag.to_string(), v])
    };
    prop_oneof![
        pick(
            "--payload",
            &[
                "{}",
                r#"{"a": [1, 2.5, "ü"]}"#,
                "[]",
                "12345678901234567890123456789",
                r#"{"a": "x\u0000y"}"#,
                "{not json",
                "",
                "@/nonexistent/file",
            ]
        ),
        pick(
            "--priority",
            &[
                "0",
                "-5",
                "2147483647",
                "-2147483648",
                "2147483648",
                "1.5",
                "high"
            ]
        ),
        pick(
            "--run-at",
            &[
                "2026-12-01T08:00:00Z",
                "9999-12-31T23:59:59Z",
                "0000-01-01T00:00:00Z",
                "2026-02-30T00:00:00Z",
                "tomorrow",
            ]
        ),
        pick("--max-retries", &["0", "1000", "1001", "-1", "x"]),
        pick("--timeout-ms", &["1", "0", "-1", "2147483648"]),
        pick("--shard-key", &["site-1", "", "ü ✓", &"s".repeat(300)]),
        pick("--unique-key", &["k0", "k1", "", &"u".repeat(201)]),
        pick(
            "--unique-for",
            &["10m", "36500d", "36501d", "1000000000d", "-1s", "5x"]
        ),
        pick("--tag", &["a", "", &"t".repeat(65), "ü"]),
        pick("--limit-key", &["customer-1", "", &"l".repeat(201)]),
        Just(vec!["--allow-unregistered-kind".to_string()]),
        Just(vec!["--bogus".to_string()]),
    ]
}

fn argv() -> impl Strategy<Value = Vec<String>> {
    let kind = prop_oneof![
        6 => Just("echo".to_string()),
        1 => Just(String::new()),
        1 => Just("never-declared".to_string()),
        1 => Just("../etc".to_string()),
        1 => Just("k".repeat(101)),
        1 => Just("Échø".to_string()),
    ];
    (kind, proptest::collection::vec(option(), 0..5)).prop_map(|(kind, opts)| {
        let mut argv = vec!["submit".to_string(), kind];
        argv.extend(opts.into_iter().flatten());
        argv
    })
}

const COUNTS: &str =
    "select (select count(*) from artex.tasks), (select count(*) from artex.task_transitions)";

#[test]
fn artex_submit_submits_or_refuses_with_a_message() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (db, c) = rt.block_on(async {
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
        let c = connect(&db.url).await;
        // k0's first task, finished: a window looks back at it.
        c.batch_execute(
            "insert into artex.tasks (kind, unique_key) values ('echo', 'k0');
             update artex.tasks set status = 'canceled'",
        )
        .await
        .expect("a finished task with a unique key");
        (db, c)
    });
    let counts = || {
        rt.block_on(async {
            let r = c.query_one(COUNTS, &[]).await.expect("counting");
            (r.get::<_, i64>(0), r.get::<_, i64>(1))
        })
    };
    let outcomes = std::cell::Cell::new((0, 0));
    let cases = 64;
    props::check("artex submit", cases, argv(), |argv| {
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let before = counts();
        let out = artex(Some(&db.url), None, &args);
        let after = counts();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let code = out.status.code();
        prop_assert!(code.is_some(), "killed by a signal: {}", err);
        prop_assert!(
            code != Some(101) && !err.contains("panicked"),
            "panicked: {}",
            err
        );
        let (ok, refused) = outcomes.get();
        if out.status.success() {
            outcomes.set((ok + 1, refused));
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            prop_assert!(
                text.split_whitespace()
                    .any(|w| w.parse::<uuid::Uuid>().is_ok()),
                "no task id printed: {}",
                text
            );
            let written = after.0 - before.0;
            prop_assert!(
                written == 1 || (written == 0 && args.contains(&"--unique-key")),
                "{} tasks written",
                written
            );
            prop_assert_eq!(after.1 - before.1, written, "history rows");
        } else {
            outcomes.set((ok, refused + 1));
            prop_assert_eq!(after, before, "a refused submit wrote something: {}", err);
            prop_assert!(!err.trim().is_empty(), "exit {:?} without a message", code);
        }
        Ok::<(), TestCaseError>(())
    });
    // Both sides of the property were reached.
    let (ok, refused) = outcomes.get();
    eprintln!("artex submit: {ok} submitted, {refused} refused");
    if props::settings(cases).cases >= cases {
        assert!(ok > 0 && refused > 0, "{ok} submitted, {refused} refused");
    }
}

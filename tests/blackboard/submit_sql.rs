//! `artex.submit`, the submission path for any language, under random and mutated
//! arguments (issue 25): every argument given as text and cast by PostgreSQL, so wrong
//! types, out-of-range numbers, NUL, huge and unicode strings, odd intervals, times and
//! arrays reach it. Each call is a valid task (its row holds the arguments, and the
//! library's rules accept it) or an SQL error with a message and no internal error
//! class, with nothing written and the session still usable. Cases and seed:
//! `testkit/src/props.rs`.

use artex_actors::blackboard::NewTask;
use artex_testkit::props;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::common::{fixtures, TestDb};

/// Every argument as text, cast where the function's parameter has another type.
const SUBMIT: &str = "select id, duplicate from artex.submit(
        kind => $1::text, payload => $2::text::jsonb, priority => $3::text::int4,
        run_at => $4::text::timestamptz, max_retries => $5::text::int4,
        timeout_ms => $6::text::int4, shard_key => $7::text, unique_key => $8::text,
        unique_for => $9::text::interval,
        allow_unregistered_kind => coalesce($10::text::bool, false),
        actor => $11::text, reason => $12::text, tags => $13::text::text[],
        limit_key => $14::text)";

const NAMES: [&str; 14] = [
    "kind",
    "payload",
    "priority",
    "run_at",
    "max_retries",
    "timeout_ms",
    "shard_key",
    "unique_key",
    "unique_for",
    "allow_unregistered_kind",
    "actor",
    "reason",
    "tags",
    "limit_key",
];

/// What one argument may be: a value its type takes, or anything else.
fn arg(i: usize) -> BoxedStrategy<Option<String>> {
    let any_text = prop_oneof![
        Just(String::new()),
        Just("a\u{0}b".to_string()),
        Just("x".repeat(201)),
        Just("ü".repeat(101)),
        Just("😀 \u{202e}".to_string()),
        Just("2147483648".to_string()),
        Just("-1".to_string()),
        Just("1e3".to_string()),
        Just("{a,b}".to_string()),
        Just("{{a},{b}}".to_string()),
        Just("[1, {\"a\": null}]".to_string()),
        Just("[".repeat(3000) + &"]".repeat(3000)),
        "\\PC{0,12}",
    ];
    let good: BoxedStrategy<String> = match NAMES[i] {
        "kind" => prop_oneof!["[a-z][a-z0-9._:-]{0,20}", Just("echo".to_string())].boxed(),
        "payload" => prop_oneof![
            Just("{}".to_string()),
            Just("{\"a\": [1, 2.5, \"x\", null, true]}".to_string()),
            Just("\"just a string\"".to_string()),
            Just("12345678901234567890123456789".to_string()),
            (-64i64..64).prop_map(|d| {
                // {"p": "…"}: 9 bytes around the string as PostgreSQL prints it.
                let n = ((1 << 20) - 9 + d) as usize;
                format!("{{\"p\": \"{}\"}}", "z".repeat(n))
            }),
        ]
        .boxed(),
        "priority" | "max_retries" | "timeout_ms" => prop_oneof![
            (-5i64..1005).prop_map(|n| n.to_string()),
            Just(i32::MAX.to_string()),
            Just(i32::MIN.to_string()),
        ]
        .boxed(),
        "run_at" => prop_oneof![
            Just("2026-12-01T08:00:00Z".to_string()),
            Just("infinity".to_string()),
            Just("-infinity".to_string()),
            Just("epoch".to_string()),
            Just("294277-01-01".to_string()),
            Just("4714-11-24 BC".to_string()),
        ]
        .boxed(),
        "unique_for" => prop_oneof![
            Just("0".to_string()),
            Just("1 hour".to_string()),
            Just("1 month".to_string()),
            Just("-1 day".to_string()),
            Just("100 years".to_string()),
            Just("10000 years".to_string()),
            Just("178000000 years".to_string()),
        ]
        .boxed(),
        "allow_unregistered_kind" => {
            prop_oneof![Just("true".to_string()), Just("false".to_string())].boxed()
        }
        "tags" => prop_oneof![
            Just("{a,b}".to_string()),
            Just("{}".to_string()),
            Just("{NULL}".to_string()),
            Just("{\"\"}".to_string()),
            Just(format!("{{{}}}", vec!["t"; 21].join(","))),
            Just(format!("{{{}}}", "x".repeat(65))),
            Just("{{a},{b}}".to_string()),
        ]
        .boxed(),
        // Keys: a few shared ones (duplicates, with a finished task under k0), or new.
        "unique_key" => prop_oneof![
            (0..3u8).prop_map(|n| format!("k{n}")),
            "[a-z]{1,8}".prop_map(|k| format!("{k}-{}", Uuid::new_v4())),
        ]
        .boxed(),
        _ => "[a-zA-Z0-9 _-]{1,30}".boxed(),
    };
    let required = NAMES[i] == "kind";
    proptest::option::weighted(
        if required { 0.97 } else { 0.4 },
        prop_oneof![4 => good, 1 => any_text],
    )
    .boxed()
}

fn args() -> impl Strategy<Value = Vec<Option<String>>> {
    (0..NAMES.len()).map(arg).collect::<Vec<_>>()
}

const COUNTS: &str =
    "select (select count(*) from artex.tasks), (select count(*) from artex.task_transitions),
        (select count(*) from artex.flows)";

async fn counts(c: &Client) -> (i64, i64, i64) {
    let r = c.query_one(COUNTS, &[]).await.expect("counting");
    (r.get(0), r.get(1), r.get(2))
}

/// The written row against the arguments, compared by PostgreSQL (casts included).
const SAME: &str = "select t.kind = $2::text, t.payload = coalesce($3::text::jsonb, '{}'),
        t.priority = coalesce($4::text::int4, 0),
        t.max_retries = coalesce($5::text::int4, t.max_retries),
        t.timeout_ms is not distinct from $6::text::int4,
        t.shard_key is not distinct from $7::text, t.unique_key is not distinct from $8::text,
        t.tags is not distinct from $9::text::text[], t.limit_key is not distinct from $10::text,
        t.status::text = 'pending', t.payload::text, t.tags
    from artex.tasks t where t.id = $1";

async fn case(c: &Client, args: &[Option<String>]) -> Result<(), TestCaseError> {
    let before = counts(c).await;
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
        .iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let answer = c.query(SUBMIT, &params).await;
    let after = counts(c).await;
    match answer {
        Err(e) => {
            prop_assert_eq!(after, before, "a refused call wrote something: {}", e);
            let db = e
                .as_db_error()
                .ok_or_else(|| TestCaseError::fail(format!("not an SQL error: {e}")))?;
            let class = &db.code().code()[..2];
            prop_assert!(
                !matches!(class, "XX" | "58" | "57" | "08"),
                "internal error {}: {}",
                db.code().code(),
                db.message()
            );
            prop_assert!(!db.message().is_empty());
            // The session goes on.
            c.query_one("select 1", &[])
                .await
                .map_err(|e| TestCaseError::fail(format!("session lost after {db:?}: {e}")))?;
        }
        Ok(rows) => {
            prop_assert_eq!(rows.len(), 1);
            let (id, duplicate): (Uuid, bool) = (rows[0].get(0), rows[0].get(1));
            let written = i64::from(!duplicate);
            prop_assert_eq!(after.0 - before.0, written, "tasks written");
            prop_assert_eq!(after.1 - before.1, written, "history rows written");
            prop_assert_eq!(after.2, before.2);
            if duplicate {
                prop_assert!(args[7].is_some(), "a duplicate without a unique key");
                return Ok(());
            }
            let a = |i: usize| args[i].as_deref();
            let r = c
                .query_one(
                    SAME,
                    &[
                        &id,
                        &a(0),
                        &a(1),
                        &a(2),
                        &a(4),
                        &a(5),
                        &a(6),
                        &a(7),
                        &a(12),
                        &a(13),
                    ],
                )
                .await
                .map_err(|e| TestCaseError::fail(format!("comparing: {e}")))?;
            for (i, name) in [
                "kind",
                "payload",
                "priority",
                "max_retries",
                "timeout_ms",
                "shard_key",
                "unique_key",
                "tags",
                "limit_key",
                "status",
            ]
            .iter()
            .enumerate()
            {
                prop_assert!(r.get::<_, bool>(i), "{} differs from the argument", name);
            }
            // What the SQL function writes, the library's rules accept: one set of rules
            // for every entry.
            let payload: serde_json::Value = serde_json::from_str(r.get(10)).unwrap();
            let task = NewTask {
                kind: a(0).unwrap_or_default().to_string(),
                payload,
                priority: 0,
                run_at: None,
                max_retries: a(4).and_then(|s| s.parse().ok()),
                timeout_ms: a(5).and_then(|s| s.parse().ok()),
                shard_key: a(6).map(str::to_string),
                unique_key: a(7).map(str::to_string),
                unique_for: None,
                tags: r.get::<_, Option<Vec<String>>>(11).unwrap_or_default(),
                limit_key: a(13).map(str::to_string),
                traceparent: None,
            };
            if let Err(e) = task.validate() {
                return Err(TestCaseError::fail(format!(
                    "artex.submit wrote a task the library refuses: {e}"
                )));
            }
        }
    }
    Ok(())
}

#[test]
fn artex_submit_writes_a_valid_task_or_refuses_with_a_message() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (db, c) = rt.block_on(async {
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
        let c = db.client().await;
        // k0's first task, finished: a window looks back at it.
        c.batch_execute(
            "insert into artex.tasks (kind, unique_key) values ('echo', 'k0');
             update artex.tasks set status = 'canceled'",
        )
        .await
        .expect("a finished task with a unique key");
        (db, c)
    });
    props::check("artex.submit", 300, args(), |args| {
        rt.block_on(case(&c, &args))
    });
    drop(db);
}

/// Found by the API's property (`tests/api/submit_fuzz.rs`): a window longer than the
/// timestamp range looked past the oldest time PostgreSQL holds and failed with
/// "timestamp out of range" once a task with the key had finished. It reaches back 100
/// years at most (V21): the finished task is found.
#[tokio::test]
async fn a_window_past_the_time_range_finds_the_finished_task() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let submit = "select id, duplicate from artex.submit('echo', unique_key => 'once',
        unique_for => $1::text::interval, allow_unregistered_kind => true)";
    let first: Uuid = c.query_one(submit, &[&"10000 years"]).await.unwrap().get(0);
    c.execute(
        "update artex.tasks set status = 'canceled' where id = $1",
        &[&first],
    )
    .await
    .unwrap();
    for window in ["10000 years", "178000000 years", "100 years"] {
        let r = c
            .query_one(submit, &[&window])
            .await
            .unwrap_or_else(|e| panic!("{window}: {e:?}"));
        assert_eq!(
            (r.get::<_, Uuid>(0), r.get::<_, bool>(1)),
            (first, true),
            "{window}"
        );
    }
}

/// Found by the API's property while V21 was written: a window capped with `least`
/// (which skips NULLs) made "no window" a window of 100 years, and a plain insert with
/// the key of a finished task failed as a duplicate. Without a window, finished tasks do
/// not count; with a window of 0, neither do they.
#[tokio::test]
async fn a_finished_task_keeps_its_key_only_within_a_window() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let old: Uuid = c
        .query_one(
            "insert into artex.tasks (kind, unique_key) values ('echo', 'k') returning id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "update artex.tasks set status = 'canceled' where id = $1",
        &[&old],
    )
    .await
    .unwrap();
    for window in [None, Some("0")] {
        let r = c
            .query_one(
                "select id, duplicate from artex.submit('echo', unique_key => 'k',
                     unique_for => $1::text::interval, allow_unregistered_kind => true)",
                &[&window],
            )
            .await
            .unwrap_or_else(|e| panic!("{window:?}: {e:?}"));
        let (id, duplicate): (Uuid, bool) = (r.get(0), r.get(1));
        assert!(!duplicate && id != old, "{window:?}");
        c.execute(
            "update artex.tasks set status = 'canceled' where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    }
    c.execute(
        "insert into artex.tasks (kind, unique_key) values ('echo', 'k')",
        &[],
    )
    .await
    .expect("a plain insert with a finished task's key");
}

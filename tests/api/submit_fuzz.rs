//! `POST /api/v1/tasks` under random and mutated input (issue 25): valid tasks with wrong
//! types, missing and unknown fields, huge, empty, unicode and NUL strings, out-of-range
//! numbers, deep nesting and payloads near the limits, alone, in batches, or as broken
//! JSON. Every answer is a valid task written (the row holds what was sent) or a 4xx
//! whose JSON error names a field, with nothing written: never a 5xx, never a dropped
//! connection. `POST /api/v1/flows` likewise, with DAGs, cycles and unknown
//! dependencies: a flow and all its tasks written, or a refusal that writes nothing.
//! Cases and seed: `testkit/src/props.rs`.

use artex_testkit::props;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::{call, declare, id_of, written, Server, WRITE_TOKEN};
use crate::common::{connect, fixtures, TestDb};

/// The database's default payload limit (`artex.limits`), bytes of the payload's text.
const PAYLOAD_LIMIT: usize = 1 << 20;

/// A task as sent, and the fields a mutation touched (where an error may point).
#[derive(Clone, Debug)]
struct Task {
    fields: Map<String, Value>,
    mutated: Vec<String>,
}

#[derive(Clone, Debug)]
enum Body {
    One(Task),
    Batch(Vec<Task>),
    /// Bytes that are no task: broken JSON, a cut body, bad UTF-8.
    Bytes(Vec<u8>),
}

const FIELDS: [&str; 12] = [
    "kind",
    "payload",
    "priority",
    "run_at",
    "max_retries",
    "timeout_ms",
    "shard_key",
    "unique_key",
    "unique_for",
    "tags",
    "limit_key",
    "allow_unregistered_kind",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]{1,12}",
        "[a-zA-Z0-9 ._:/-]{1,40}",
        "\\PC{1,20}",
        Just("ünïcödé ✓ 日本".to_string()),
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn payload() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A task every rule accepts.
fn valid_task() -> impl Strategy<Value = Task> {
    use proptest::option::weighted;
    (
        payload(),
        weighted(0.3, any::<i32>()),
        weighted(0.3, 0i32..=1000),
        weighted(0.3, 1i32..=i32::MAX),
        weighted(0.3, "[a-z0-9-]{1,30}"),
        weighted(
            0.3,
            (
                prop_oneof![Just(None), (0..4u8).prop_map(Some)],
                proptest::option::of(1u32..100_000),
            ),
        ),
        weighted(0.3, proptest::collection::vec("[a-z0-9:-]{1,20}", 1..6)),
        weighted(0.3, "[a-z0-9]{1,30}"),
        weighted(0.2, 0i64..4_000_000_000),
        weighted(0.2, any::<bool>()),
    )
        .prop_map(
            |(
                payload,
                priority,
                max_retries,
                timeout_ms,
                shard,
                unique,
                tags,
                limit,
                run_at,
                allow,
            )| {
                let mut f = Map::new();
                f.insert("kind".into(), json!("echo"));
                f.insert("payload".into(), payload);
                let mut put = |k: &str, v: Option<Value>| {
                    if let Some(v) = v {
                        f.insert(k.into(), v);
                    }
                };
                put("priority", priority.map(Value::from));
                put("max_retries", max_retries.map(Value::from));
                put("timeout_ms", timeout_ms.map(Value::from));
                put("shard_key", shard.map(Value::from));
                if let Some((shared, window)) = unique {
                    // A key of its own, or one of a few whose tasks have finished (see
                    // the test) or are unfinished from earlier cases: duplicates.
                    let key = match shared {
                        Some(n) => format!("k{n}"),
                        None => Uuid::new_v4().to_string(),
                    };
                    put("unique_key", Some(json!(key)));
                    put("unique_for", window.map(|s| json!(format!("{s}s"))));
                }
                put("tags", tags.map(Value::from));
                put("limit_key", limit.map(Value::from));
                put(
                    "run_at",
                    run_at.map(|s| {
                        json!(chrono::DateTime::from_timestamp(s, 0).unwrap().to_rfc3339())
                    }),
                );
                put("allow_unregistered_kind", allow.map(Value::from));
                Task {
                    fields: f,
                    mutated: Vec::new(),
                }
            },
        )
}

fn deep(depth: usize) -> Value {
    (0..depth).fold(json!(1), |v, i| {
        if i % 2 == 0 {
            json!([v])
        } else {
            json!({ "a": v })
        }
    })
}

/// Values no field expects, or expects only at its edges.
fn hostile() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            Just(json!(2_147_483_648i64)),
            Just(json!(-2_147_483_649i64)),
            Just(json!(i32::MAX)),
            Just(json!(i32::MIN)),
            Just(json!(0)),
            Just(json!(-1)),
            Just(json!(1001)),
            Just(json!(1.5)),
            Just(json!(1e10)),
            Just(json!(u64::MAX)),
        ],
        prop_oneof![
            Just(json!("")),
            Just(json!(" ")),
            Just(json!("a\u{0}b")),
            Just(json!("x".repeat(101))),
            Just(json!("x".repeat(201))),
            Just(json!("ü".repeat(70))),
            Just(json!("y".repeat(20_000))),
            Just(json!("\u{202e}gnp.exe")),
            Just(json!("😀🚀")),
            Just(json!("echo\n")),
            Just(json!("../echo")),
            Just(json!("Échø")),
        ],
        prop_oneof![
            Just(json!("99999999999999s")),
            Just(json!("1000000000d")),
            Just(json!("106751991167d")),
            Just(json!("18446744073709551615ms")),
            Just(json!("-1s")),
            Just(json!("0s")),
            Just(json!("1.5h")),
            Just(json!("7d")),
            Just(json!("10x")),
        ],
        prop_oneof![
            Just(json!("9999-12-31T23:59:59Z")),
            Just(json!("0000-01-01T00:00:00Z")),
            Just(json!("2026-02-30T00:00:00Z")),
            Just(json!("2026-12-01T08:00:00+14:00")),
            Just(json!("2026-12-01 08:00:00")),
            Just(json!("yesterday")),
        ],
        prop_oneof![
            Just(json!([])),
            Just(json!([1, 2])),
            Just(json!([""])),
            Just(json!(["a\u{0}"])),
            Just(json!(vec!["t"; 21])),
            Just(json!(["x".repeat(65)])),
            Just(json!([null])),
            Just(json!(["a", "a"])),
        ],
        prop_oneof![
            Just(json!({})),
            Just(json!({"a": 1})),
            Just(json!({"k\u{0}": 1})),
            Just(deep(40)),
            Just(deep(200)),
            Just(json!(vec![1e300; 3500])),
        ],
        // Payloads whose text is near the database's limit, either side.
        (-64i64..64).prop_map(|d| {
            // {"p": "…"}: 9 bytes around the string as PostgreSQL prints it.
            let n = (PAYLOAD_LIMIT as i64 - 9 + d) as usize;
            json!({ "p": "z".repeat(n) })
        }),
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    Remove(&'static str),
    Set(&'static str, Value),
    /// A value at the edge of what the field takes, either side (a window with a key
    /// whose task finished, so that the window is looked through).
    Edge(&'static str, Value),
    Extra(String, Value),
}

/// Values at or just past the edges of each field's rules.
fn edges(field: &'static str) -> Vec<Value> {
    let max_i32 = i64::from(i32::MAX);
    match field {
        "kind" => vec![
            json!(""),
            json!("x".repeat(100)),
            json!("x".repeat(101)),
            json!("a.b:c-d_e"),
            json!("_echo"),
            json!("echo\n"),
            json!("ECHO"),
        ],
        "priority" => vec![
            json!(max_i32),
            json!(-max_i32 - 1),
            json!(max_i32 + 1),
            json!(-max_i32 - 2),
        ],
        "max_retries" => vec![json!(-1), json!(0), json!(1000), json!(1001)],
        "timeout_ms" => vec![
            json!(-1),
            json!(0),
            json!(1),
            json!(max_i32),
            json!(max_i32 + 1),
        ],
        "run_at" => vec![
            json!("9999-12-31T23:59:59.999999Z"),
            json!("0001-01-01T00:00:00Z"),
            json!("1970-01-01T00:00:00-23:59"),
            json!("2026-12-01T08:00:00.1234567891Z"),
        ],
        "unique_for" => vec![
            json!("0s"),
            json!("1ms"),
            json!("36500d"),
            json!("36501d"),
            json!("1000000000d"),
            json!("99999999999999s"),
            json!("18446744073709551615ms"),
            json!("18446744073709551615s"),
        ],
        "tags" => vec![
            json!(vec!["t"; 20]),
            json!(vec!["t"; 21]),
            json!(["x".repeat(64)]),
            json!(["x".repeat(65)]),
            json!(["ü".repeat(32)]),
            json!(["ü".repeat(33)]),
        ],
        "shard_key" | "unique_key" | "limit_key" => vec![
            json!(""),
            json!("x".repeat(200)),
            json!("x".repeat(201)),
            json!("ü".repeat(100)),
            json!("ü".repeat(101)),
            json!("x".repeat(100_000)),
        ],
        _ => vec![Value::Null],
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let field = proptest::sample::select(FIELDS.to_vec());
    prop_oneof![
        1 => field.clone().prop_map(Mutation::Remove),
        6 => (field.clone(), hostile()).prop_map(|(f, v)| Mutation::Set(f, v)),
        5 => field
            .prop_flat_map(|f| proptest::sample::select(edges(f)).prop_map(move |v| (f, v)))
            .prop_map(|(f, v)| Mutation::Edge(f, v)),
        1 => (prop_oneof![Just("Kind".to_string()), Just("payload ".to_string()), Just("".to_string()), "[a-z_]{1,10}"], json_leaf())
            .prop_map(|(k, v)| Mutation::Extra(k, v)),
    ]
}

fn task() -> impl Strategy<Value = Task> {
    (valid_task(), proptest::collection::vec(mutation(), 0..3)).prop_map(|(mut t, ms)| {
        for m in ms {
            match m {
                Mutation::Remove(f) => {
                    t.fields.remove(f);
                    t.mutated.push(f.into());
                }
                Mutation::Set(f, v) => {
                    t.fields.insert(f.into(), v);
                    t.mutated.push(f.into());
                }
                Mutation::Edge(f, v) => {
                    if f == "unique_for" {
                        t.fields.insert("unique_key".into(), json!("k0"));
                    }
                    t.fields.insert(f.into(), v);
                    t.mutated.push(f.into());
                }
                Mutation::Extra(k, v) => {
                    if !FIELDS.contains(&k.as_str()) {
                        t.fields.insert(k.clone(), v);
                        t.mutated.push(k);
                    }
                }
            }
        }
        t
    })
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        8 => task().prop_map(Body::One),
        2 => proptest::collection::vec(task(), 0..4).prop_map(Body::Batch),
        1 => (task(), any::<proptest::sample::Index>(), any::<u8>()).prop_map(|(t, cut, byte)| {
            let mut bytes = serde_json::to_vec(&Value::Object(t.fields)).unwrap();
            let at = cut.index(bytes.len());
            if byte % 2 == 0 {
                bytes.truncate(at);
            } else {
                bytes[at] = byte | 0x80;
            }
            Body::Bytes(bytes)
        }),
        1 => prop_oneof![
            Just(b"kind=echo".to_vec()),
            Just(b"\"echo\"".to_vec()),
            Just(b"42".to_vec()),
            Just(b"null".to_vec()),
            Just(b"[[]]".to_vec()),
            Just(b"{\"kind\": \"echo\", \"kind\": 5}".to_vec()),
            Just(b"\xff\xfe{}".to_vec()),
        ]
        .prop_map(Body::Bytes),
    ]
}

const COUNTS: &str =
    "select (select count(*) from artex.tasks), (select count(*) from artex.task_transitions),
        (select count(*) from artex.flows)";

/// A written task against what was sent: every field the request gave is in the row,
/// the others have their defaults.
const ROW: &str = "select kind, payload, priority, max_retries, timeout_ms, shard_key, unique_key,
        coalesce(to_jsonb(tags), 'null'), limit_key, run_at, status::text
    from artex.tasks where id = $1";

async fn check_written(
    c: &tokio_postgres::Client,
    id: Uuid,
    t: &Task,
) -> Result<(), TestCaseError> {
    let r = c
        .query_one(ROW, &[&id])
        .await
        .map_err(|e| TestCaseError::fail(format!("reading task {id}: {e}")))?;
    let f = &t.fields;
    let given = |k: &str| f.get(k).filter(|v| !v.is_null());
    prop_assert_eq!(
        Some(r.get::<_, String>(0)),
        given("kind").and_then(|v| v.as_str()).map(str::to_string)
    );
    let payload: Value = r.get(1);
    let sent = given("payload").cloned().unwrap_or_else(|| json!({}));
    // PostgreSQL keeps numbers as numerics: compare them as numbers.
    prop_assert!(same_json(&payload, &sent), "payload {payload} for {sent}");
    prop_assert_eq!(
        r.get::<_, i32>(2) as i64,
        given("priority").and_then(Value::as_i64).unwrap_or(0)
    );
    if let Some(m) = given("max_retries") {
        prop_assert_eq!(Some(r.get::<_, i32>(3) as i64), m.as_i64());
    }
    prop_assert_eq!(
        r.get::<_, Option<i32>>(4).map(i64::from),
        given("timeout_ms").and_then(Value::as_i64)
    );
    for (i, k) in [(5, "shard_key"), (6, "unique_key"), (8, "limit_key")] {
        prop_assert_eq!(
            r.get::<_, Option<String>>(i),
            given(k).and_then(|v| v.as_str()).map(str::to_string),
            "{}",
            k
        );
    }
    let tags: Value = r.get(7);
    let sent_tags = given("tags")
        .cloned()
        .filter(|t| t != &json!([]))
        .unwrap_or(Value::Null);
    prop_assert_eq!(tags, sent_tags);
    if let Some(at) = given("run_at").and_then(Value::as_str) {
        let at = chrono::DateTime::parse_from_rfc3339(at).unwrap();
        // PostgreSQL keeps microseconds.
        let stored = r.get::<_, chrono::DateTime<chrono::Utc>>(9);
        let off = (stored - at.with_timezone(&chrono::Utc)).num_nanoseconds();
        prop_assert!(
            off.is_some_and(|ns| ns.abs() < 1000),
            "run_at {stored} for {at}"
        );
    }
    prop_assert_eq!(r.get::<_, String>(10), "pending");
    Ok(())
}

fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || x.as_f64().zip(y.as_f64()).is_some_and(|(x, y)| x == y)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn every_submission_is_a_task_or_a_clear_refusal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (db, c) = rt.block_on(async {
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
        let c = connect(&db.url).await;
        // The shared unique keys' first tasks, finished: a window looks back at them.
        c.batch_execute(
            "insert into artex.tasks (kind, unique_key) select 'echo', 'k' || n from generate_series(0, 3) n;
             update artex.tasks set status = 'canceled'",
        )
        .await
        .expect("finished tasks with the shared keys");
        (db, c)
    });
    // A body limit above the payload limit, so that both limits are reached.
    let server = Server::with(&db.url, true, true, false, 2 << 20);
    let counts = || {
        rt.block_on(async {
            let r = c.query_one(COUNTS, &[]).await.expect("counting");
            (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2))
        })
    };
    props::check("POST /api/v1/tasks", 160, body(), |body| {
        let (bytes, tasks): (Vec<u8>, Vec<Task>) = match &body {
            Body::One(t) => (
                serde_json::to_vec(&Value::Object(t.fields.clone())).unwrap(),
                vec![t.clone()],
            ),
            Body::Batch(ts) => (
                serde_json::to_vec(&Value::Array(
                    ts.iter().map(|t| Value::Object(t.fields.clone())).collect(),
                ))
                .unwrap(),
                ts.clone(),
            ),
            Body::Bytes(b) => (b.clone(), Vec::new()),
        };
        let before = counts();
        let r = call(
            &server.addr,
            "POST",
            "/api/v1/tasks",
            Some(WRITE_TOKEN),
            Some(&bytes),
        );
        let after = counts();
        let text = r.text();
        let shown: String = text.chars().take(600).collect();
        prop_assert!(
            (200..500).contains(&r.status),
            "answered {} {shown}",
            r.status
        );
        if r.status >= 300 {
            prop_assert_eq!(
                after,
                before,
                "a refused submission ({} {}) wrote something",
                r.status,
                shown
            );
            let v = r.json_or_null();
            prop_assert!(
                v["error"].as_str().is_some_and(|m| !m.is_empty()) && v.get("field").is_some(),
                "not an artex error body: {} {shown}",
                r.status
            );
            if matches!(r.status, 400 | 422) {
                let field = v["field"].as_str();
                let named = |f: &str| {
                    f == "body"
                        || tasks.is_empty()
                        || tasks.iter().enumerate().any(|(i, t)| {
                            t.mutated.iter().any(|m| {
                                // A window without its key is the window's fault.
                                let also = (m == "unique_key").then_some("unique_for");
                                [Some(m.as_str()), also]
                                    .into_iter()
                                    .flatten()
                                    .any(|m| f == m || f == format!("[{i}].{m}"))
                                    || f == format!("[{i}]")
                            })
                        })
                };
                prop_assert!(
                    field.is_some_and(named),
                    "{} names no field at fault: {shown}",
                    r.status
                );
            }
            let clean = !tasks.is_empty() && tasks.iter().all(|t| t.mutated.is_empty());
            prop_assert!(!clean, "valid tasks refused: {} {shown}", r.status);
            return Ok(());
        }
        let v = r.json();
        let (ids, dups): (Vec<Uuid>, Vec<bool>) = match &body {
            Body::One(_) => (
                vec![v["id"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .expect("an id")],
                vec![v["duplicate"].as_bool().expect("duplicate")],
            ),
            Body::Batch(_) => (
                v["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|s| s.as_str().unwrap().parse().unwrap())
                    .collect(),
                v["duplicate"]
                    .as_array()
                    .expect("duplicate")
                    .iter()
                    .map(|d| d.as_bool().unwrap())
                    .collect(),
            ),
            Body::Bytes(_) => {
                return Err(TestCaseError::fail(format!(
                    "accepted bytes that are no task: {shown}"
                )))
            }
        };
        prop_assert_eq!(ids.len(), tasks.len());
        let written = dups.iter().filter(|d| !**d).count() as i64;
        prop_assert_eq!(after.0 - before.0, written, "tasks written");
        prop_assert_eq!(after.1 - before.1, written, "history rows written");
        prop_assert_eq!(after.2, before.2, "flows written");
        for ((id, dup), t) in ids.iter().zip(&dups).zip(&tasks) {
            if !dup {
                rt.block_on(check_written(&c, *id, t))?;
            }
        }
        Ok(())
    });
}

// Plain regressions of what the property found.

/// A body that is JSON but no task (a string, a number) is the body's fault: the error
/// names `body`, as for an empty or broken body (it named no field).
#[tokio::test]
async fn a_body_that_is_no_task_names_the_body() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let c = db.client().await;
    let api = Server::start(&db.url);
    let before = written(&c).await;
    for body in ["\"echo\"", "42", "true", "null"] {
        let m = api
            .w("POST", "/api/v1/tasks", Some(body))
            .error(400, Some("body"));
        assert!(m.contains("expected a task"), "{body}: {m}");
    }
    // In a batch, the item is at fault.
    api.w("POST", "/api/v1/tasks", Some("[{\"kind\": \"echo\"}, 5]"))
        .error(400, Some("[1]"));
    assert_eq!(written(&c).await, before);
}

/// A payload's numbers are stored as they were sent: the server's JSON parser rounded
/// some decimals to a neighbouring double (serde_json without `float_roundtrip`).
#[tokio::test]
async fn payload_numbers_are_stored_as_sent() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let c = db.client().await;
    let api = Server::start(&db.url);
    let sent = "-400068737720.84204";
    let r = api.w(
        "POST",
        "/api/v1/tasks",
        Some(&format!(
            "{{\"kind\": \"echo\", \"payload\": {{\"a\": {sent}}}}}"
        )),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id: Uuid = id_of(&r).parse().unwrap();
    let stored: String = c
        .query_one(
            "select payload->>'a' from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, sent);
}

/// A `unique_for` window past 100 years is refused naming it; before, it was written,
/// and once a task with its key had finished, every submission with the key answered
/// 500 "timestamp out of range".
#[tokio::test]
async fn a_unique_window_past_a_hundred_years_is_refused_naming_it() {
    let db = TestDb::new().await;
    declare(&db.bb, "w1", &["echo"]).await;
    let c = db.client().await;
    let api = Server::start(&db.url);
    let before = written(&c).await;
    for (i, w) in ["1000000000d", "36501d", "18446744073709551615s"]
        .iter()
        .enumerate()
    {
        let one = json!({"kind": "echo", "unique_key": format!("k{i}"), "unique_for": w});
        let m = api
            .w("POST", "/api/v1/tasks", Some(&one.to_string()))
            .error(422, Some("unique_for"));
        assert!(m.contains("at most"), "{w}: {m}");
        api.w("POST", "/api/v1/tasks", Some(&json!([one]).to_string()))
            .error(422, Some("[0].unique_for"));
    }
    assert_eq!(written(&c).await, before);

    // 100 years is the longest: a task with the key that finished counts.
    let one = json!({"kind": "echo", "unique_key": "century", "unique_for": "36500d"}).to_string();
    let first = api.w("POST", "/api/v1/tasks", Some(&one));
    assert_eq!(first.status, 201, "{}", first.text());
    c.execute(
        "update artex.tasks set status = 'canceled' where unique_key = 'century'",
        &[],
    )
    .await
    .unwrap();
    let again = api.w("POST", "/api/v1/tasks", Some(&one));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["duplicate"], json!(true));
    assert_eq!(id_of(&again), id_of(&first));
}

/// A flow as sent: its tasks' names, dependencies (possibly on no task of the flow, or
/// in a cycle), and mutations of its fields and its tasks' fields.
fn flow() -> impl Strategy<Value = (Value, bool)> {
    const TASK_FIELDS: [&str; 8] = [
        "name",
        "kind",
        "payload",
        "depends_on",
        "priority",
        "max_retries",
        "timeout_ms",
        "shard_key",
    ];
    let task_mutation = (
        proptest::sample::select(TASK_FIELDS.to_vec()),
        prop_oneof![hostile().prop_map(Some), Just(None)],
    );
    (
        1usize..6,
        proptest::collection::vec((any::<proptest::sample::Index>(), any::<bool>()), 0..6),
        proptest::collection::vec((any::<proptest::sample::Index>(), task_mutation), 0..3),
        proptest::option::weighted(
            0.2,
            (
                proptest::sample::select(vec!["name", "tasks", "allow_unregistered_kind", "extra"]),
                hostile(),
            ),
        ),
        payload(),
    )
        .prop_map(|(n, edges, task_mutations, flow_mutation, payload)| {
            let mut deps: Vec<Vec<String>> = vec![Vec::new(); n];
            for (at, back) in edges {
                let i = at.index(n);
                // Mostly upstream tasks (a DAG); sometimes a later one (a cycle) or none.
                let j = if back && i > 0 {
                    at.index(i)
                } else {
                    at.index(n)
                };
                let dep = format!("t{j}");
                if !deps[i].contains(&dep) {
                    deps[i].push(dep);
                }
            }
            let mut tasks: Vec<Map<String, Value>> = (0..n)
                .map(|i| {
                    let mut t = Map::new();
                    t.insert("name".into(), json!(format!("t{i}")));
                    t.insert("kind".into(), json!("echo"));
                    t.insert("payload".into(), payload.clone());
                    t.insert("depends_on".into(), json!(deps[i]));
                    t
                })
                .collect();
            let mut clean = true;
            for (at, (field, value)) in task_mutations {
                let t = &mut tasks[at.index(n)];
                clean = false;
                match value {
                    Some(v) => t.insert(field.into(), v),
                    None => t.remove(field),
                };
            }
            let mut f = Map::new();
            f.insert("name".into(), json!("fuzzed flow"));
            f.insert(
                "tasks".into(),
                Value::Array(tasks.into_iter().map(Value::Object).collect()),
            );
            if let Some((field, v)) = flow_mutation {
                clean = false;
                f.insert(field.into(), v);
            }
            (Value::Object(f), clean)
        })
}

#[test]
fn every_flow_submission_is_a_flow_or_a_clear_refusal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (db, c) = rt.block_on(async {
        let db = TestDb::new().await;
        fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
        let c = connect(&db.url).await;
        (db, c)
    });
    let server = Server::with(&db.url, true, true, false, 2 << 20);
    let counts = || {
        rt.block_on(async {
            let r = c.query_one(COUNTS, &[]).await.expect("counting");
            (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2))
        })
    };
    props::check("POST /api/v1/flows", 96, flow(), |(body, clean)| {
        let bytes = serde_json::to_vec(&body).unwrap();
        let n = body["tasks"].as_array().map_or(0, |t| t.len()) as i64;
        let before = counts();
        let r = call(
            &server.addr,
            "POST",
            "/api/v1/flows",
            Some(WRITE_TOKEN),
            Some(&bytes),
        );
        let after = counts();
        let shown: String = r.text().chars().take(600).collect();
        prop_assert!(
            (200..500).contains(&r.status),
            "answered {} {shown}",
            r.status
        );
        if r.status >= 300 {
            prop_assert_eq!(
                after,
                before,
                "a refused flow ({} {}) wrote something",
                r.status,
                shown
            );
            let v = r.json_or_null();
            prop_assert!(
                v["error"].as_str().is_some_and(|m| !m.is_empty()) && v.get("field").is_some(),
                "not an artex error body: {} {shown}",
                r.status
            );
        } else {
            prop_assert_eq!(after.2 - before.2, 1, "flows written");
            prop_assert_eq!(after.0 - before.0, n, "tasks written");
            prop_assert_eq!(after.1 - before.1, n, "history rows written");
        }
        // An unmutated flow is refused only for a dependency that is no upstream task.
        let acyclic = body["tasks"].as_array().is_some_and(|ts| {
            ts.iter().enumerate().all(|(i, t)| {
                t["depends_on"].as_array().is_some_and(|d| {
                    d.iter().all(|x| {
                        x.as_str()
                            .and_then(|s| s.strip_prefix('t'))
                            .and_then(|s| s.parse::<usize>().ok())
                            .is_some_and(|j| j < i)
                    })
                })
            })
        });
        if clean && acyclic {
            prop_assert!(r.status < 300, "a valid flow refused: {} {shown}", r.status);
        }
        Ok(())
    });
}

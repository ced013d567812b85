//! The submission rules case by case: a table of submissions each accepted or refused on
//! its field, the shape checked before the facts, one refusal in each surface's words,
//! kind names, payloads, and flows' dependencies and cycles.

use super::*;
use serde_json::json;

fn facts(limit: i32, kinds: &[&str]) -> Facts {
    Facts {
        max_payload_bytes: limit,
        known_kinds: kinds.iter().map(|k| k.to_string()).collect(),
    }
}

fn flow(tasks: &[(&str, &[&str])]) -> FlowSpec {
    FlowSpec {
        name: "f".into(),
        tasks: tasks
            .iter()
            .map(|(n, d)| FlowTaskSpec {
                name: n.to_string(),
                kind: "echo".into(),
                wait: None,
                payload: empty_object(),
                depends_on: d.iter().map(|s| s.to_string()).collect(),
                priority: 0,
                max_retries: None,
                timeout_ms: None,
                shard_key: None,
            })
            .collect(),
    }
}

fn err(s: &FlowSpec) -> String {
    s.validate().unwrap_err().to_string()
}

/// A submission and what it borrows, for a table.
enum Given {
    Tasks(Vec<NewTask>, Vec<bool>),
    Flow(FlowSpec, bool),
}

impl Given {
    fn task(t: NewTask) -> Given {
        Given::Tasks(vec![t], vec![false])
    }

    fn flow(spec: FlowSpec) -> Given {
        Given::Flow(spec, false)
    }

    fn view(&self) -> Submission<'_> {
        match self {
            Given::Tasks(tasks, allow) => Submission::Tasks {
                tasks,
                allow_unregistered_kind: allow.clone(),
            },
            Given::Flow(spec, allow) => Submission::Flow {
                spec,
                allow_unregistered_kind: *allow,
            },
        }
    }
}

/// The flow task `name`, of kind echo, changed by `f`.
fn flow_task(name: &str, f: fn(&mut FlowTaskSpec)) -> FlowTaskSpec {
    let mut t = flow(&[(name, &[])]).tasks.remove(0);
    f(&mut t);
    t
}

#[test]
fn a_table_of_submissions_each_accepted_or_refused_on_its_field() {
    let echo = || NewTask::new("echo", json!({"n": 1}));
    let with = |f: fn(&mut NewTask)| {
        let mut t = echo();
        f(&mut t);
        Given::task(t)
    };
    let flow_of = |tasks: Vec<FlowTaskSpec>| {
        Given::flow(FlowSpec {
            name: "f".into(),
            tasks,
        })
    };
    let known = facts(100, &["echo", "resize.v2"]);
    let (a, b) = (Some(0), Some(1));
    // What, the submission, and the task and field refused (None: accepted).
    type Refused = Option<(Option<usize>, Field)>;
    let cases: Vec<(&str, Given, Refused)> = vec![
        ("a plain task", Given::task(echo()), None),
        (
            "every setting",
            with(|t| {
                t.priority = -5;
                t.run_at = Some(Utc::now());
                t.max_retries = Some(MAX_RETRIES);
                t.timeout_ms = Some(1);
                t.shard_key = Some("site-1".into());
            }),
            None,
        ),
        ("no retries", with(|t| t.max_retries = Some(0)), None),
        (
            "an empty kind",
            with(|t| t.kind.clear()),
            Some((a, Field::Kind)),
        ),
        (
            "a path as kind",
            with(|t| t.kind = "../x".into()),
            Some((a, Field::Kind)),
        ),
        (
            "a NUL in the payload",
            with(|t| t.payload = json!({"a": "x\u{0}"})),
            Some((a, Field::Payload)),
        ),
        (
            "negative retries",
            with(|t| t.max_retries = Some(-1)),
            Some((a, Field::MaxRetries)),
        ),
        (
            "too many retries",
            with(|t| t.max_retries = Some(MAX_RETRIES + 1)),
            Some((a, Field::MaxRetries)),
        ),
        (
            "no timeout",
            with(|t| t.timeout_ms = Some(0)),
            Some((a, Field::TimeoutMs)),
        ),
        (
            "an empty shard key",
            with(|t| t.shard_key = Some(String::new())),
            Some((a, Field::ShardKey)),
        ),
        (
            "a NUL in the shard key",
            with(|t| t.shard_key = Some("a\u{0}".into())),
            Some((a, Field::ShardKey)),
        ),
        (
            "a payload over the limit",
            with(|t| t.payload = json!({"s": "x".repeat(100)})),
            Some((a, Field::Payload)),
        ),
        (
            "an undeclared kind",
            with(|t| t.kind = "ech0".into()),
            Some((a, Field::Kind)),
        ),
        (
            "an undeclared kind, allowed",
            Given::Tasks(vec![NewTask::new("ech0", json!({}))], vec![true]),
            None,
        ),
        (
            "the second of a batch",
            Given::Tasks(vec![echo(), NewTask::new("ech0", json!({}))], vec![true]),
            Some((b, Field::Kind)),
        ),
        (
            "a flow",
            Given::flow(flow(&[("a", &[]), ("b", &["a"])])),
            None,
        ),
        (
            "a flow without a name",
            Given::flow(FlowSpec {
                name: " ".into(),
                ..flow(&[("a", &[])])
            }),
            Some((None, Field::FlowName)),
        ),
        (
            "a flow without tasks",
            Given::flow(flow(&[])),
            Some((None, Field::Tasks)),
        ),
        (
            "a flow task without a name",
            Given::flow(flow(&[("a", &[]), ("", &[])])),
            Some((b, Field::TaskName)),
        ),
        (
            "a flow task defined twice",
            Given::flow(flow(&[("a", &[]), ("a", &[])])),
            Some((b, Field::TaskName)),
        ),
        (
            "a cycle",
            Given::flow(flow(&[("a", &["b"]), ("b", &["a"])])),
            Some((a, Field::DependsOn)),
        ),
        (
            "a dependency on no task",
            Given::flow(flow(&[("a", &[]), ("b", &["c"])])),
            Some((b, Field::DependsOn)),
        ),
        (
            "a flow task of an undeclared kind",
            flow_of(vec![
                flow_task("a", |_| {}),
                flow_task("b", |t| t.kind = "ech0".into()),
            ]),
            Some((b, Field::Kind)),
        ),
        (
            "a flow task of an undeclared kind, allowed",
            Given::Flow(
                FlowSpec {
                    tasks: vec![flow_task("b", |t| t.kind = "ech0".into())],
                    ..flow(&[])
                },
                true,
            ),
            None,
        ),
        (
            "a flow task with too many retries",
            flow_of(vec![flow_task("a", |t| t.max_retries = Some(5000))]),
            Some((a, Field::MaxRetries)),
        ),
        (
            "a flow task's payload over the limit",
            flow_of(vec![flow_task("a", |t| {
                t.payload = json!({"s": "x".repeat(100)})
            })]),
            Some((a, Field::Payload)),
        ),
    ];
    for (what, given, expect) in cases {
        let got = given.view().check(&known).err().map(|r| (r.task, r.field));
        assert_eq!(got, expect, "{what}");
    }
}

#[test]
fn the_shape_is_checked_without_the_facts_and_the_facts_after_it() {
    let task = NewTask::new("ech0", json!({"s": "x".repeat(200)}));
    let t = Submission::task(&task, false);
    assert!(
        t.check_shape().is_ok(),
        "the size and the kind need the facts"
    );
    // Sizes before kinds, as a submitter fixes one thing at a time.
    let r = t.check(&facts(100, &["echo"])).unwrap_err();
    assert_eq!(
        r.reason,
        Reason::PayloadTooLarge {
            bytes: 209,
            limit: 100
        }
    );
    let r = t.check(&facts(1000, &["echo"])).unwrap_err();
    assert_eq!(r.field, Field::Kind);
    assert!(t.needs_known_kinds());
    let spec = flow(&[("a", &[])]);
    let allowed = Submission::Flow {
        spec: &spec,
        allow_unregistered_kind: true,
    };
    assert!(!allowed.needs_known_kinds());
    assert_eq!(allowed.check(&facts(1000, &[])), Ok(vec![vec![]]));
}

#[test]
fn each_surface_words_the_same_refusal_with_its_own_names() {
    let task = NewTask::new("ech0", json!({}));
    let r = Submission::task(&task, false)
        .check(&facts(100, &["echo", "resize.v2"]))
        .unwrap_err();
    assert_eq!(
        r.message("kind", "pass --allow-unregistered-kind"),
        "kind: \"ech0\" has never been declared by a worker (known kinds: echo, \
         resize.v2); check the name, or pass --allow-unregistered-kind to submit it \
         before its workers run"
    );
    assert!(r
        .message("task.kind", "x")
        .starts_with("task.kind: \"ech0\""));
    let task = NewTask::new("echo", json!({"s": "x".repeat(192)}));
    let big = Submission::task(&task, false)
        .check(&facts(100, &["echo"]))
        .unwrap_err();
    assert!(big
        .message("--payload", "")
        .starts_with("--payload: 201 bytes, more than the limit of 100 bytes"));
    // The library's wording names a flow task by its name.
    let mut spec = flow(&[("a", &[])]);
    spec.tasks[0].kind = String::new();
    assert_eq!(
        err(&spec),
        "task 'a': kind: must not be empty; a flow task has a kind, or is a wait ({\"wait\": \
         {\"signal\": …}})"
    );
    let e = NewTask::new("echo", json!({"k\u{0}": 1}))
        .validate()
        .unwrap_err();
    assert!(e.to_string().starts_with("payload: contains"), "{e}");
}

#[test]
fn the_known_kinds_listed_are_names_and_at_most_twenty() {
    assert_eq!(listing(&[]), "no worker has registered yet");
    assert_eq!(listing(&["a\nb".into()]), "no worker has registered yet");
    let many: Vec<String> = (0..30).map(|i| format!("k{i:02}")).collect();
    let l = listing(&many);
    assert!(
        l.starts_with("known kinds: k00, k01") && l.ends_with("k19, …"),
        "{l}"
    );
}

#[test]
fn kinds_are_names() {
    for ok in [
        "echo",
        "resize.v2",
        "img:thumb",
        "a_b-c",
        "9",
        &"k".repeat(100),
    ] {
        assert_eq!(check_kind(ok), Ok(()), "{ok}");
    }
    for bad in [
        "", "a\nb", "a'b", "a\"b", "../etc", "a/b", ".hidden", "-x", "a b", "é",
    ] {
        assert!(check_kind(bad).is_err(), "{bad:?}");
    }
    let long = check_kind(&"k".repeat(101)).unwrap_err();
    assert!(long.contains("101 bytes"), "{long}");
    let newline = check_kind("a\nb").unwrap_err();
    assert_eq!(newline.lines().count(), 1, "{newline}");
}

#[test]
fn nul_is_refused_anywhere_in_the_payload() {
    assert!(check_payload(&json!({"a": [1, "x\u{0}"]})).is_err());
    assert!(check_payload(&json!({"k\u{0}": 1})).is_err());
    assert!(check_payload(&json!({"a": [1, "x", {"b": null}]})).is_ok());
}

#[test]
fn payload_size_counts_what_postgres_prints() {
    // PostgreSQL prints {"a": 1, "b": [1, 2, {}], "c": "x"}.
    let v = json!({"a": 1, "b": [1, 2, {}], "c": "x"});
    assert_eq!(
        payload_text_len(&v),
        r#"{"a": 1, "b": [1, 2, {}], "c": "x"}"#.len()
    );
    assert_eq!(payload_text_len(&json!({})), 2);
    assert_eq!(payload_text_len(&json!([])), 2);
    assert_eq!(payload_text_len(&json!("é")), 4);
}

#[test]
fn a_dag_is_accepted_with_its_edges() {
    let s = flow(&[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])]);
    assert_eq!(
        s.validate().unwrap(),
        vec![vec![], vec![0], vec![0], vec![1, 2]]
    );
}

#[test]
fn cycles_are_named() {
    let e = err(&flow(&[
        ("a", &["c"]),
        ("b", &["a"]),
        ("c", &["b"]),
        ("x", &[]),
    ]));
    assert!(e.contains("dependency cycle: a -> c -> b -> a"), "{e}");
    let e = err(&flow(&[("a", &["a"])]));
    assert!(e.contains("task 'a' depends on itself"), "{e}");
}

#[test]
fn bad_references_duplicates_and_empty_flows_are_named() {
    let e = err(&flow(&[("a", &[]), ("b", &["nope"])]));
    assert!(
        e.contains("task 'b' depends on 'nope', which is not a task"),
        "{e}"
    );
    let e = err(&flow(&[("a", &[]), ("a", &[])]));
    assert!(
        e.contains("task 'a' is defined twice (tasks #1 and #2)"),
        "{e}"
    );
    let e = err(&flow(&[("a", &[]), ("b", &["a", "a"])]));
    assert!(e.contains("task 'b' lists 'a' twice"), "{e}");
    let e = err(&flow(&[]));
    assert!(e.contains("has no tasks"), "{e}");
    let mut s = flow(&[("a", &[])]);
    s.tasks[0].kind = String::new();
    assert!(err(&s).contains("task 'a': kind"), "{}", err(&s));
    s.name = String::new();
    assert_eq!(err(&s), "flow name: must not be empty");
}

#[test]
fn a_long_chain_is_checked_without_recursion() {
    let names: Vec<String> = (0..100_000).map(|i| format!("t{i}")).collect();
    let mut s = flow(&[]);
    for (i, n) in names.iter().enumerate() {
        let mut t = flow(&[(n, &[])]).tasks.remove(0);
        if i > 0 {
            t.depends_on = vec![names[i - 1].clone()];
        }
        s.tasks.push(t);
    }
    assert_eq!(s.validate().unwrap().len(), 100_000);
    s.tasks[0].depends_on = vec!["t99999".into()];
    assert!(err(&s).contains("dependency cycle"));
}

#[test]
fn unknown_fields_are_refused_with_their_name() {
    let e = FlowSpec::from_json(
        r#"{"name": "f", "tasks": [{"name": "a", "kind": "echo", "dependson": []}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `dependson`"), "{e}");
}

//! The rules on flows' waits, one refusal each: what a wait may not have (a kind, a
//! payload, handler settings), what it must be (one of signal, until, for), well-formed
//! durations and times, timeouts only on signals, one wait per signal name; and the
//! forms accepted.

use super::*;
use serde_json::json;

fn parse(flow: serde_json::Value) -> FlowSpec {
    serde_json::from_value(flow).unwrap()
}

/// A flow of `a` (echo) and the wait `w` (as JSON) after it; the refusal's text.
fn refusal(w: serde_json::Value) -> String {
    let mut task = json!({"name": "w", "depends_on": ["a"]});
    for (k, v) in w.as_object().unwrap() {
        task[k] = v.clone();
    }
    let spec = parse(json!({"name": "f", "tasks": [{"name": "a", "kind": "echo"}, task]}));
    spec.validate()
        .map(|_| ())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn the_three_forms_are_accepted() {
    for w in [
        json!({"wait": {"signal": "approved"}}),
        json!({"wait": {"signal": "approved", "timeout": "24h"}}),
        json!({"wait": {"signal": "approved", "timeout": "90s", "on_timeout": "succeed"}}),
        json!({"wait": {"signal": "approved", "timeout": "1d", "on_timeout": "fail"}}),
        json!({"wait": {"until": "2026-12-24T18:00:00Z"}}),
        json!({"wait": {"until": "2026-12-24T18:00:00+02:00"}}),
        json!({"wait": {"for": "1h"}}),
        json!({"wait": {"for": "1500ms"}, "payload": {}}),
    ] {
        assert_eq!(refusal(w.clone()), "", "{w} refused");
    }
    let spec = parse(json!({"name": "f", "tasks": [
        {"name": "w", "wait": {"signal": "approved", "timeout": "24h", "on_timeout": "succeed"}}]}));
    let wait = spec.tasks[0].wait.as_ref().unwrap().resolve().unwrap();
    assert_eq!(wait.timeout, Some(std::time::Duration::from_secs(86_400)));
    assert_eq!(wait.on_timeout, OnTimeout::Succeed);
    let spec = parse(json!({"name": "f", "tasks": [
        {"name": "w", "wait": {"until": "2026-12-24T18:00:00+02:00"}}]}));
    let wait = spec.tasks[0].wait.as_ref().unwrap().resolve().unwrap();
    assert_eq!(
        wait.until.unwrap().to_rfc3339(),
        "2026-12-24T16:00:00+00:00"
    );
}

#[test]
fn each_bad_wait_is_refused_naming_what_is_wrong() {
    for (w, expected) in [
        (json!({"wait": {}}), "task 'w': wait: expected one of signal (with an optional timeout), until or for; got none"),
        (json!({"wait": {"signal": "s", "until": "2026-12-24T18:00:00Z"}}), "got signal and until"),
        (json!({"wait": {"until": "2026-12-24T18:00:00Z", "for": "1h"}}), "got until and for"),
        (json!({"wait": {"for": "1 hour"}}), "task 'w': wait: for: \"1 hour\": expected a number with a unit"),
        (json!({"wait": {"for": "0s"}}), "for: \"0s\": must be longer than zero"),
        (json!({"wait": {"for": "h"}}), "for: \"h\": expected a number with a unit"),
        (json!({"wait": {"for": "36501d"}}), "at most 36500d"),
        (json!({"wait": {"signal": "s", "timeout": "-5m"}}), "timeout: \"-5m\": expected a number"),
        (json!({"wait": {"until": "tomorrow"}}), "task 'w': wait: until: \"tomorrow\" is not an RFC 3339 time"),
        (json!({"wait": {"until": "2026-12-24 18:00"}}), "is not an RFC 3339 time"),
        (json!({"wait": {"for": "1h", "timeout": "2h"}}), "timeout: only a signal's wait times out"),
        (json!({"wait": {"signal": "s", "on_timeout": "succeed"}}), "on_timeout: needs a timeout"),
        (json!({"wait": {"signal": "s", "timeout": "1h", "on_timeout": "retry"}}), "on_timeout: \"retry\"; expected \"fail\" or \"succeed\""),
        (json!({"wait": {"signal": "bad name"}}), "wait: signal: \"bad name\" is not a kind name"),
        (json!({"wait": {"signal": ""}}), "wait: signal: must not be empty"),
        (json!({"kind": "echo", "wait": {"signal": "s"}}), "task 'w': kind: a wait has no kind (no worker runs it); remove kind"),
        (json!({"payload": {"x": 1}, "wait": {"signal": "s"}}), "task 'w': payload: a wait has no payload"),
        (json!({"priority": 3, "wait": {"signal": "s"}}), "task 'w': priority: a wait has no priority"),
        (json!({"max_retries": 3, "wait": {"signal": "s"}}), "task 'w': max_retries: a wait has no retries"),
        (json!({"timeout_ms": 30, "wait": {"signal": "s"}}), "task 'w': timeout_ms: a wait has no handler timeout"),
        (json!({"shard_key": "k", "wait": {"signal": "s"}}), "task 'w': shard_key: a wait has no shard key"),
        (json!({}), "task 'w': kind: must not be empty; a flow task has a kind, or is a wait"),
    ] {
        let got = refusal(w.clone());
        assert!(got.contains(expected), "{w}: expected {expected:?}, got {got:?}");
    }
}

#[test]
fn unknown_fields_of_a_wait_are_refused() {
    let e = FlowSpec::from_json(
        r#"{"name": "f", "tasks": [{"name": "w", "wait": {"signal": "s", "timout": "1h"}}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `timout`"), "{e}");
}

#[test]
fn a_signal_names_one_wait_of_its_flow() {
    let spec = parse(json!({"name": "f", "tasks": [
        {"name": "eu", "wait": {"signal": "go"}},
        {"name": "us", "wait": {"signal": "go"}}]}));
    let e = spec.validate().unwrap_err().to_string();
    assert_eq!(
        e,
        "tasks 'eu' and 'us' both wait for signal 'go'; a signal is waited for by one wait \
         of a flow"
    );
}

#[test]
fn no_task_may_take_the_kind_of_waits() {
    let e = NewTask::new(WAIT_KIND, json!({}))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("kind: \"artex:wait\" is the kind of flows' waits"),
        "{e}"
    );
    assert!(refusal(json!({"kind": "artex:wait"})).contains("is the kind of flows' waits"));
}

#[test]
fn a_wait_needs_no_declared_kind() {
    let spec = parse(json!({"name": "f", "tasks": [
        {"name": "a", "kind": "echo"},
        {"name": "w", "wait": {"for": "1h"}, "depends_on": ["a"]}]}));
    let facts = Facts {
        max_payload_bytes: 1000,
        known_kinds: vec!["echo".into()],
    };
    let s = Submission::Flow {
        spec: &spec,
        allow_unregistered_kind: false,
    };
    assert_eq!(s.check(&facts).unwrap(), vec![vec![], vec![0]]);
}

#[test]
fn durations_take_the_units_of_the_command_line() {
    use std::time::Duration;
    assert_eq!(parse_wait_duration("90s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_wait_duration("15m"), Ok(Duration::from_secs(900)));
    assert_eq!(parse_wait_duration("24h"), Ok(Duration::from_secs(86_400)));
    assert_eq!(parse_wait_duration("7d"), Ok(Duration::from_secs(604_800)));
    assert_eq!(parse_wait_duration("250ms"), Ok(Duration::from_millis(250)));
    for bad in [
        "",
        "90",
        "1.5h",
        "1H",
        " 1h",
        "1h ",
        "99999999999999999999d",
    ] {
        assert!(parse_wait_duration(bad).is_err(), "{bad:?} accepted");
    }
}

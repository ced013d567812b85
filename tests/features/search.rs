//! Tags, search and bulk actions from the command line.

use serde_json::Value;

use crate::common::{count, run_cli as artex, TestDb};

#[tokio::test]
async fn the_cli_tags_finds_and_acts_on_tasks_in_bulk() {
    let db = TestDb::new().await;
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", "echo", "--allow-unregistered-kind"];
        args.extend_from_slice(extra);
        let (code, out, err) = artex(&db.url, &args);
        assert_eq!(code, 0, "{err}");
        out.trim().to_string()
    };
    let a = submit(&[
        "--tag",
        "nightly",
        "--tag",
        "eu",
        "--payload",
        r#"{"customer":42}"#,
    ]);
    let b = submit(&[
        "--tag",
        "nightly",
        "--payload",
        r#"{"customer":7}"#,
        "--limit-key",
        "7",
    ]);
    let list = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["tasks", "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = artex(&db.url, &args);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(list(&["--tag", "nightly"]), [b.clone(), a.clone()]);
    assert_eq!(list(&["--tag", "eu"]), [a.as_str()]);
    assert_eq!(list(&["--where", r#"{"customer":7}"#]), [b.as_str()]);
    let (code, out, _) = artex(&db.url, &["task", "show", &b, "--json"]);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["task"]["limit_key"], "7", "{out}");
    for (args, names) in [
        (&["tasks", "--where", "[1]"][..], "--where"),
        (&["tasks", "--where", "{"][..], "--where"),
        (&["tasks", "--since", "soon"][..], "--since"),
        (
            &["submit", "echo", "--allow-unregistered-kind", "--tag", ""][..],
            "--tag",
        ),
        (&["tasks", "cancel"][..], "--all"),
    ] {
        let (code, _, err) = artex(&db.url, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
    let (code, out, err) = artex(
        &db.url,
        &["tasks", "cancel", "--tag", "nightly", "--dry-run"],
    );
    assert_eq!((code, out.trim()), (0, "2 task(s) match"), "{err}");
    let (code, out, err) = artex(
        &db.url,
        &["tasks", "cancel", "--tag", "eu", "--reason", "not needed"],
    );
    assert_eq!(
        (code, out.trim()),
        (0, "canceled 1 of 1 matching task(s) in 1 batch(es)"),
        "{err}"
    );
    let c = db.client().await;
    let audited = "select count(*) from artex.task_transitions
                   where to_status = 'canceled' and reason = 'not needed' and actor like 'cli:%'";
    assert_eq!(count(&c, audited).await, 1);
    let (code, out, err) = artex(
        &db.url,
        &["tasks", "retry", "--status", "canceled", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (report["matched"].as_u64(), report["changed"].as_u64()),
        (Some(1), Some(1))
    );
    let (code, out, err) = artex(&db.url, &["tasks", "delete", "--status", "canceled"]);
    assert_eq!(
        (code, out.trim()),
        (0, "deleted 1 of 1 matching task(s) in 1 batch(es)"),
        "{err}"
    );
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 2);
}

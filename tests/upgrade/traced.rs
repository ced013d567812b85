//! A hot upgrade in traces (docs/tracing.md), sent to a real OTLP/HTTP receiver: the old
//! process makes the upgrade's span and its upload's, and ends the moved attempt's span
//! as `transferred`; the new one makes the transfer's span and the resumed attempt's,
//! children of the task's context.

use std::time::Duration;

use artex_actors::blackboard::NewTask;
use serde_json::json;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{wait_for, worker_http, worker_id_of_pid, Proc};
use crate::common::TestDb;
use crate::receiver::{exporting_to, Receiver};
use crate::transfer::{wait_checkpointed, wait_ended};
use crate::{curl_upgrade, upgradable_worker, KillAll};

const GIVEN: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test]
async fn a_transferred_task_stays_in_its_trace_across_the_upgrade() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let rx = Receiver::start();
    let otel = exporting_to(&rx.url);
    let keys = Keys::new();
    let bundle = keys.variant_bundles(1).remove(0).0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("journal");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut gen0 = upgradable_worker("gen0", &db.url, &keys, &[], &otel);
    let http = worker_http(&c, &gen0).await;
    let old_id = worker_id_of_pid(&c, gen0.pid()).await;
    let task = NewTask {
        traceparent: Some(GIVEN.into()),
        ..NewTask::new(
            "journal-checkpoint",
            json!({ "file": file, "steps": 40, "ms": 100 }),
        )
    };
    let id = db.bb.operator().submit(&task, "test").await.unwrap();
    wait_checkpointed(&db.bb, &[id]).await;

    let (code, body) = curl_upgrade(&http, &bundle, Some(TOKEN), false);
    assert_eq!(code, 200, "{body}");
    let new = body["new_pid"].as_i64().unwrap() as i32;
    let _spawned = KillAll(vec![new]);
    assert_eq!(body["tasks_resumed"], 1, "{body}");
    let new_id = worker_id_of_pid(&c, new).await;
    wait_ended(&db.bb, &[id]).await;

    let spans = wait_for("the transfer's spans", Duration::from_secs(60), || async {
        let spans: Vec<_> = rx
            .spans()
            .into_iter()
            .filter(|s| s.attr("artex.task.id") == id.to_string())
            .collect();
        let outcomes: Vec<&str> = spans
            .iter()
            .filter(|s| s.name == "artex.attempt")
            .map(|s| s.attr("artex.outcome"))
            .collect();
        (spans.iter().any(|s| s.name == "artex.transfer")
            && outcomes.contains(&"transferred")
            && outcomes.contains(&"succeeded"))
        .then_some(spans)
    })
    .await;
    for s in &spans {
        assert_eq!(s.trace, &GIVEN[3..35], "one trace: {s:?}");
        assert_eq!(
            s.parent,
            &GIVEN[36..52],
            "a child of the task's context: {s:?}"
        );
    }
    let transfer = spans.iter().find(|s| s.name == "artex.transfer").unwrap();
    assert_eq!(transfer.attr("artex.worker.from"), old_id, "{transfer:?}");
    assert_eq!(transfer.attr("artex.worker"), new_id, "{transfer:?}");
    assert_eq!(transfer.attr("artex.attempt"), "1", "{transfer:?}");
    assert_eq!(transfer.pid, new.to_string(), "made by the new process");
    let by_outcome = |o: &str| {
        spans
            .iter()
            .find(|s| s.name == "artex.attempt" && s.attr("artex.outcome") == o)
            .unwrap()
    };
    assert_eq!(by_outcome("transferred").attr("artex.worker"), old_id);
    assert_eq!(by_outcome("transferred").pid, gen0.pid().to_string());
    assert_eq!(by_outcome("succeeded").attr("artex.worker"), new_id);
    assert_eq!(by_outcome("succeeded").attr("artex.attempt"), "1");

    // The upgrade itself, in the old process: its span (a new trace: curl sent no
    // context) and its upload's, a child of it.
    let (upgrade, upload) = wait_for("the upgrade's spans", Duration::from_secs(60), || async {
        let spans = rx.spans();
        let upgrade = spans.iter().find(|s| s.name == "artex.upgrade")?.clone();
        let upload = spans
            .iter()
            .find(|s| s.name == "artex.upgrade.upload")?
            .clone();
        Some((upgrade, upload))
    })
    .await;
    assert_eq!(upgrade.pid, gen0.pid().to_string(), "{upgrade:?}");
    assert!(upgrade.parent.is_empty(), "{upgrade:?}");
    assert_eq!(
        upgrade.attr("artex.upgrade.status"),
        "upgraded",
        "{upgrade:?}"
    );
    assert_eq!(
        upgrade.attr("artex.upgrade.tasks_resumed"),
        "1",
        "{upgrade:?}"
    );
    assert_eq!(upgrade.attr("artex.upgrade.new_pid"), new.to_string());
    assert_eq!(
        (upload.trace.as_str(), upload.parent.as_str()),
        (upgrade.trace.as_str(), upgrade.span.as_str())
    );
    let bytes: u64 = upload.attr("artex.upgrade.bundle_bytes").parse().unwrap();
    assert_eq!(
        bytes,
        std::fs::metadata(&bundle).unwrap().len(),
        "{upload:?}"
    );
    gen0.wait_exit(Duration::from_secs(60))
        .expect("the first process exits");
}

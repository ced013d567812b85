//! An upload's task joins the flow its spec names, or is refused or held when that flow
//! has ended.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::common::fixtures;
use crate::{call, data, entries, send_all, setup, sha};

#[tokio::test]
async fn an_uploads_task_joins_the_flow_its_spec_names() {
    let (db, _dir, uploads, f) = setup(&[]).await;
    let c = db.client().await;
    let file = data(3000, 41);
    let declare = |flow: Value| {
        call(
            &f.http,
            "POST",
            "/api/v1/uploads",
            &[],
            json!({"size": file.len(), "sha256": sha(&file), "chunk_size": 1024,
                   "task": {"kind": "digest", "flow": flow}})
            .to_string()
            .as_bytes(),
        )
    };

    // Refused, nothing written: no such flow; a flow whose tasks all ended; not an id.
    let ended: uuid::Uuid = {
        let (flow, held) = fixtures::raw::held_flow(&c).await;
        fixtures::cancel(&db.bb, held).await;
        flow
    };
    for (flow, why) in [
        (json!(uuid::Uuid::now_v7()), "does not exist"),
        (json!(ended), "has ended"),
    ] {
        let (code, body) = declare(flow.clone());
        assert_eq!(code, 422, "{flow}: {body}");
        assert_eq!(body["field"], "task.flow", "{body}");
        assert!(body["error"].as_str().unwrap().contains(why), "{body}");
    }
    let (code, body) = declare(json!("not-a-flow"));
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("task.flow"),
        "{body}"
    );
    assert_eq!(entries(&uploads), 0, "a refused upload left something");

    // An unfinished flow: the task joins it, named after the upload, and runs.
    let (flow, _) = fixtures::raw::held_flow(&c).await;
    let (code, body) = declare(json!(flow));
    assert_eq!(code, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let task = send_all(&f.http, &id, &file, 1024);
    common::procs::wait_status(&db.bb, task, "succeeded", Duration::from_secs(30)).await;
    let t = db.bb.operator().task(task).await.unwrap();
    assert_eq!(t.flow_id, Some(flow));
    assert_eq!(
        t.flow_task.as_deref(),
        Some(format!("upload:{id}").as_str())
    );
    let view = db.bb.operator().flow(flow).await.unwrap();
    assert!(view.tasks.iter().any(|x| x.id == task), "{view:?}");

    // The flow ends while the upload is under way: the task is held paused, saying why,
    // not run in a flow that is over.
    let (flow, held) = fixtures::raw::held_flow(&c).await;
    let (code, body) = declare(json!(flow));
    assert_eq!(code, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    fixtures::cancel(&db.bb, held).await;
    let task = send_all(&f.http, &id, &file, 1024);
    let t = db.bb.operator().task(task).await.unwrap();
    assert_eq!(t.status.as_str(), "paused");
    assert_eq!(t.flow_id, Some(flow));
    assert!(
        t.error.as_deref().unwrap_or("").contains("held paused"),
        "{:?}",
        t.error
    );
}

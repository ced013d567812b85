//! A flow's waits on its page (issue 37): what each waits for, reached and due, and a
//! signal sent from the page's form (the write token asked for) completing the wait live.

use serde_json::json;

use crate::browser::Browser;
use crate::common::TestDb;
use crate::{call, created, public_serve, WRITE_TOKEN};

#[tokio::test]
async fn a_flows_page_shows_its_waits_and_sends_a_signal_from_its_form() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (_serve, addr) = public_serve(&db, dir.path()).await;
    // Waits without upstream tasks are reached at submission: no planner is needed.
    let flow = created(call(
        "POST",
        &addr,
        "/api/v1/flows",
        Some(json!({"name": "release", "tasks": [
            {"name": "approval", "wait": {"signal": "approved", "timeout": "24h"}},
            {"name": "cool-down", "wait": {"for": "1h"}}]})),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();

    let b = Browser::start().await;
    b.goto(&format!("http://{addr}/#/flows/{flow}")).await;
    b.until(
        "both waits listed with what they wait for",
        "const a = document.querySelector('[data-wait=approval]');
         const c = document.querySelector('[data-wait=cool-down]');
         return !!a && !!c && a.textContent.includes(\"signal 'approved' (timeout 24h, then fails)\")
           && c.textContent.includes('for 1h') && !c.textContent.includes('not yet')
           && !!a.querySelector('form[data-signal=approved]')",
    )
    .await;
    b.mark_page().await;
    b.type_into(
        "form[data-signal=approved] input[name=payload]",
        r#"{"by": "ana"}"#,
    )
    .await;
    b.click("form[data-signal=approved] button").await;
    // Reads are public, so the page has no token yet: it asks for the write token.
    b.give_token(WRITE_TOKEN).await;
    b.until(
        "the wait shown succeeded, with its signal",
        "const a = document.querySelector('[data-wait=approval]');
         return !!a && !!a.querySelector('[data-status=succeeded]') && !a.querySelector('form')
           && a.textContent.includes(' from api@')",
    )
    .await;
    let result: serde_json::Value = db
        .client()
        .await
        .query_one(
            "select result from artex.tasks where flow_task = 'approval'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(result, json!({"by": "ana"}));
    b.finish_on_the_marked_page().await;
}

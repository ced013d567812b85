//! `/api/v1/flows…`: submit a flow (the `artex flow submit` format), list them newest
//! first, show one with its DAG (each task with the names it depends on), pause, resume
//! or cancel all of it, and send it a signal for its waits.

use actix_web::http::header::LOCATION;
use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::FlowSpec;
use artex_actors::submission::{Reason, Submission};
use serde_json::{json, Map, Value};

use super::{
    actor, check_submission, field, only_fields, param, parse_int, parse_uuid, path_id, query,
    submission, ApiError, ApiState,
};
use crate::http::auth::{CanRead, CanWrite};

const FLOW_FIELDS: &[&str] = &["name", "tasks", "allow_unregistered_kind"];

const FLOW_TASK_FIELDS: &[&str] = &[
    "name",
    "kind",
    "wait",
    "payload",
    "depends_on",
    "priority",
    "max_retries",
    "timeout_ms",
    "shard_key",
];

/// Checks the syntax of a flow (fields and their types), so that a wrong one is named;
/// the rules on what they hold are the submission's.
fn check_shape(obj: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    only_fields(obj, "", FLOW_FIELDS)?;
    field::<String>(obj, "", "name", "a string")?
        .ok_or_else(|| ApiError::bad("name", "name: missing; a flow needs a name"))?;
    let tasks = match obj.get("tasks") {
        Some(Value::Array(tasks)) => tasks,
        Some(other) => {
            return Err(ApiError::bad(
                "tasks",
                format!(
                    "tasks: expected an array of tasks, got {}",
                    super::shown(other)
                ),
            ))
        }
        None => {
            return Err(ApiError::bad(
                "tasks",
                "tasks: missing; expected an array of tasks",
            ))
        }
    };
    for (i, t) in tasks.iter().enumerate() {
        let prefix = format!("tasks[{i}].");
        let Some(t) = t.as_object() else {
            return Err(ApiError::bad(
                format!("tasks[{i}]"),
                format!(
                    "tasks[{i}]: expected a task like {{\"name\": \"extract\", \"kind\": \
                     \"echo\"}}, got {}",
                    super::shown(t)
                ),
            ));
        };
        only_fields(t, &prefix, FLOW_TASK_FIELDS)?;
        field::<String>(t, &prefix, "name", "a string")?.ok_or_else(|| {
            ApiError::bad(format!("{prefix}name"), format!("{prefix}name: missing"))
        })?;
        // A task has a kind, or is a wait (whose rules are the submission's).
        let waits = field::<Map<String, Value>>(
            t,
            &prefix,
            "wait",
            "an object like {\"signal\": \"approved\", \"timeout\": \"24h\"}",
        )?
        .is_some();
        if field::<String>(t, &prefix, "kind", "a string")?.is_none() && !waits {
            return Err(ApiError::bad(
                format!("{prefix}kind"),
                format!("{prefix}kind: missing; a flow task has a kind, or is a wait"),
            ));
        }
        if let Some(Value::Object(w)) = t.get("wait") {
            let prefix = format!("{prefix}wait.");
            only_fields(
                w,
                &prefix,
                &["signal", "timeout", "on_timeout", "until", "for"],
            )?;
            for name in ["signal", "timeout", "on_timeout", "until", "for"] {
                field::<String>(w, &prefix, name, "a string")?;
            }
        }
        field::<Vec<String>>(t, &prefix, "depends_on", "an array of task names")?;
        field::<i32>(t, &prefix, "priority", "a 32-bit integer")?;
        field::<i32>(t, &prefix, "max_retries", "a 32-bit integer")?;
        field::<i32>(t, &prefix, "timeout_ms", "a positive 32-bit integer")?;
        field::<String>(t, &prefix, "shard_key", "a string")?;
    }
    Ok(())
}

/// `POST /api/v1/flows`: 201 `{"id"}`; nothing is written unless all of it is valid.
pub(super) async fn submit(
    _: CanWrite,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let (mut value, allow_query) = submission(
        &req,
        body,
        &state,
        "a flow: {\"name\": …, \"tasks\": [...]}",
    )
    .await?;
    let Some(obj) = value.as_object_mut() else {
        return Err(ApiError::bad(
            "body",
            format!(
                "expected a flow, a JSON object like {{\"name\": \"etl\", \"tasks\": [...]}}, \
                 got {}",
                super::shown(&value)
            ),
        ));
    };
    check_shape(obj)?;
    let allow_body = field(obj, "", "allow_unregistered_kind", "true or false")?.unwrap_or(false);
    obj.remove("allow_unregistered_kind");
    let spec: FlowSpec = serde_json::from_value(value)
        .map_err(|e| ApiError::bad("body", format!("not a flow: {e}")))?;
    let submission = Submission::Flow {
        spec: &spec,
        allow_unregistered_kind: allow_query || allow_body,
    };
    // A task's fault is named by its place (`tasks[2].kind`), a fault of the flow's
    // shape by the task it is found at (`tasks[2]`).
    check_submission(&state.bb, &submission, |r| match (r.task, &r.reason) {
        (Some(i), Reason::Flow(_)) => format!("tasks[{i}]"),
        (Some(i), _) => format!("tasks[{i}].{}", r.field.as_str()),
        (None, _) => r.field.as_str().to_string(),
    })
    .await?;
    let id = state.bb.submit_flow(&spec, &actor(&req)).await?;
    let mut answer = HttpResponse::Created();
    state.reads.written(&mut answer).await;
    Ok(answer
        .insert_header((LOCATION, format!("/api/v1/flows/{id}")))
        .json(json!({ "id": id })))
}

/// `GET /api/v1/flows?limit=&after=`: flows newest first (ids are time-ordered); `next`
/// is the `after` of the next page (null on the last one).
pub(super) async fn list(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(&req, &["limit", "after"])?;
    let limit = param(&q, "limit", |s| parse_int(s, 1, 1000))?.unwrap_or(50);
    let after = param(&q, "after", parse_uuid)?;
    let (flows, from) = state
        .reads
        .read(&req, |bb| async move { bb.flows_page(after, limit).await })
        .await?;
    let next = (flows.len() as i64 == limit)
        .then(|| flows.last().map(|f| f.id))
        .flatten();
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(json!({ "flows": flows, "next": next })))
}

/// `GET /api/v1/flows/{id}`: the flow, its state and counts, and each task with the
/// names of the tasks it depends on (the DAG).
pub(super) async fn show(
    _: CanRead,
    req: HttpRequest,
    id: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id)?;
    query(&req, &[])?;
    let (flow, from) = state
        .reads
        .read(&req, |bb| async move { bb.flow(id).await })
        .await?;
    Ok(HttpResponse::Ok().insert_header(from.header()).json(flow))
}

/// `POST /api/v1/flows/{id}/signals/{name}` (an optional `{"payload": …}`): the flow's
/// wait for the signal completes now (`"outcome": "completed"`), or the signal is kept
/// until the wait is reached (`"stored"`). 404 for an unknown flow or a name no wait of
/// the flow has; 400 for a malformed name or body; 409 for a second signal of the name
/// or a wait that has ended.
pub(super) async fn signal(
    _: CanWrite,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let (id, name) = path.into_inner();
    let id = path_id(&id)?;
    query(&req, &[])?;
    let body = super::read_body(&req, body, state.max_body_bytes).await?;
    let payload = match super::parse_json(&body)? {
        None => None,
        Some(Value::Object(mut obj)) => {
            only_fields(&obj, "", &["payload"])?;
            obj.remove("payload")
        }
        Some(other) => {
            return Err(ApiError::bad(
                "body",
                format!(
                    "expected no body or a JSON object like {{\"payload\": {{…}}}}, got {}",
                    super::shown(&other)
                ),
            ))
        }
    };
    let report = state
        .bb
        .signal_flow(id, &name, payload.as_ref(), &actor(&req))
        .await
        .map_err(|e| match e {
            artex_actors::Error::Invalid(m) if m.starts_with("payload") => {
                ApiError::refused("payload", m)
            }
            artex_actors::Error::Invalid(m) => ApiError::bad("name", m),
            e => ApiError::from(e),
        })?;
    super::changed(&state, report).await
}

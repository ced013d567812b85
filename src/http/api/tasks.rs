//! `/api/v1/tasks…`: submit one task or a batch, list with filters and keyset
//! pagination, show one with its history, and the operator controls (pause, resume,
//! cancel, retry).

use actix_web::http::header::LOCATION;
use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::{
    check_kind, BulkAction, BulkReport, Control, ControlTarget, NewTask, TaskFilter,
};
use artex_actors::submission::{check_payload, Submission, MAX_RETRIES};
use artex_actors::trace::{SubmitSpan, TraceParent, TRACEPARENT_FORMAT};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{
    actor, check_submission, field, object_body, only_fields, param, parse_bool, parse_int,
    parse_json, parse_uuid, path_id, query, read_body, submission, ApiError, ApiState, CUT_CHARS,
    MAX_BATCH,
};
use crate::http::auth::{CanRead, CanWrite};

/// The fields of a task in `POST /api/v1/tasks`.
const TASK_FIELDS: &[&str] = &[
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

/// A reason longer than this many characters is refused (it is stored in every changed
/// task's history). Characters, not bytes: as `maxLength` in docs/openapi.json counts.
pub(super) const MAX_REASON_CHARS: usize = 10_000;

/// Why `reason` cannot be recorded, if it cannot: too long, or holding `\u0000`, which
/// PostgreSQL's text cannot store.
pub(super) fn reason_fault(reason: &str) -> Option<String> {
    if reason.contains('\0') {
        return Some("contains the character \\u0000, which PostgreSQL cannot store".into());
    }
    let chars = reason.chars().count();
    (chars > MAX_REASON_CHARS).then(|| format!("{chars} characters; at most {MAX_REASON_CHARS}"))
}

/// The task at `v`, named `{prefix}…` in errors, and whether its kind may be unregistered.
/// Only the syntax is read here (fields and their types); the rules on the values are
/// the submission's.
fn parse_task(v: &Value, prefix: &str) -> Result<(NewTask, bool), ApiError> {
    let Some(obj) = v.as_object() else {
        let name = prefix.trim_end_matches('.');
        return Err(ApiError::BadRequest {
            // A body that is no task at all is the body's fault, as an empty or broken one.
            field: Some(if name.is_empty() { "body" } else { name }.to_string()),
            message: format!(
                "{}expected a task: a JSON object like {{\"kind\": \"echo\", \"payload\": {{}}}}, \
                 got {}",
                if name.is_empty() {
                    String::new()
                } else {
                    format!("{name}: ")
                },
                super::shown(v)
            ),
        });
    };
    only_fields(obj, prefix, TASK_FIELDS)?;
    let kind: String = field(obj, prefix, "kind", "a string")?.ok_or_else(|| {
        ApiError::bad(
            format!("{prefix}kind"),
            format!("{prefix}kind: missing; every task needs a kind, e.g. \"echo\""),
        )
    })?;
    let run_at = match field::<String>(obj, prefix, "run_at", "an RFC 3339 time (a string)")? {
        None => None,
        Some(s) => Some(
            DateTime::parse_from_rfc3339(&s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    ApiError::bad(
                        format!("{prefix}run_at"),
                        format!(
                            "{prefix}run_at: {s:?} is not an RFC 3339 time ({e}); expected e.g. \
                             2026-12-01T08:00:00Z"
                        ),
                    )
                })?,
        ),
    };
    let expected_retries = format!("an integer from 0 to {MAX_RETRIES}");
    let task = NewTask {
        kind,
        payload: obj
            .get("payload")
            .filter(|p| !p.is_null())
            .cloned()
            .unwrap_or_else(|| json!({})),
        priority: field(obj, prefix, "priority", "a 32-bit integer")?.unwrap_or(0),
        run_at,
        max_retries: field(obj, prefix, "max_retries", &expected_retries)?,
        timeout_ms: field(obj, prefix, "timeout_ms", "a positive 32-bit integer")?,
        shard_key: field(obj, prefix, "shard_key", "a string")?,
        unique_key: field(obj, prefix, "unique_key", "a string")?,
        unique_for: match field::<String>(obj, prefix, "unique_for", "a duration (a string)")? {
            None => None,
            Some(s) => Some(crate::config::parse_duration(&s).map_err(|e| {
                ApiError::bad(
                    format!("{prefix}unique_for"),
                    format!("{prefix}unique_for: {e}"),
                )
            })?),
        },
        tags: field::<Vec<String>>(obj, prefix, "tags", "an array of strings")?.unwrap_or_default(),
        limit_key: field(obj, prefix, "limit_key", "a string")?,
        traceparent: None,
    };
    let allow = field(obj, prefix, "allow_unregistered_kind", "true or false")?.unwrap_or(false);
    Ok((task, allow))
}

/// The W3C `traceparent` header of a submission, checked: every task of it is stored
/// with it (docs/tracing.md). A bad one is the request's fault, named as the header.
fn traceparent_header(req: &HttpRequest) -> Result<Option<TraceParent>, ApiError> {
    let Some(value) = req.headers().get("traceparent") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        ApiError::bad(
            "traceparent",
            format!("traceparent header: not ASCII text; expected {TRACEPARENT_FORMAT}"),
        )
    })?;
    TraceParent::parse(text)
        .map(Some)
        .map_err(|why| ApiError::bad("traceparent", format!("traceparent header: {why}")))
}

/// `POST /api/v1/tasks`: one task (an object; 201 `{"id", "duplicate": false}`, or 200
/// `{"id", "duplicate": true}` when a task with its `unique_key` is unfinished: that
/// task's id, nothing written) or a batch (an array; `{"ids", "duplicate"}` with one flag
/// per task, 201 if any was written, else 200; all or nothing).
pub(super) async fn submit(
    _: CanWrite,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let (value, allow_all) = submission(
        &req,
        body,
        &state,
        "a task (a JSON object) or a batch (an array of them)",
    )
    .await?;
    let (batch, items): (bool, Vec<&Value>) = match &value {
        Value::Array(a) => (true, a.iter().collect()),
        v => (false, vec![v]),
    };
    if batch && items.is_empty() {
        return Err(ApiError::refused(
            "body",
            "an empty batch; expected at least one task",
        ));
    }
    if items.len() > MAX_BATCH {
        return Err(ApiError::refused(
            "body",
            format!(
                "a batch of {} tasks; at most {MAX_BATCH} per request",
                items.len()
            ),
        ));
    }
    let traceparent = traceparent_header(&req)?;
    let mut tasks = Vec::with_capacity(items.len());
    let mut allowed = Vec::with_capacity(items.len());
    let prefix = |i: usize| {
        if batch {
            format!("[{i}].")
        } else {
            String::new()
        }
    };
    for (i, v) in items.iter().enumerate() {
        let (mut task, allow) = parse_task(v, &prefix(i))?;
        task.traceparent = traceparent.map(|tp| tp.to_string());
        tasks.push(task);
        allowed.push(allow || allow_all);
    }
    let submission = Submission::Tasks {
        tasks: &tasks,
        allow_unregistered_kind: allowed,
    };
    check_submission(&state.bb, &submission, |r| {
        format!("{}{}", prefix(r.task.unwrap_or(0)), r.field.as_str())
    })
    .await?;
    // With tracing on, the submission's span is the tasks' parent (the header's context
    // is its own parent).
    let span = SubmitSpan::start(traceparent.as_ref(), "api", &tasks);
    if let Some(tp) = span.as_ref().and_then(SubmitSpan::traceparent) {
        for t in &mut tasks {
            t.traceparent = Some(tp.clone());
        }
    }
    let submitted = state.bb.submit_all(&tasks, &actor(&req)).await;
    if let Some(span) = span {
        span.end(&submitted);
    }
    let submitted = submitted?;
    let ids: Vec<_> = submitted.iter().map(|s| s.id).collect();
    let duplicate: Vec<bool> = submitted.iter().map(|s| s.duplicate).collect();
    let mut answer = if duplicate.iter().all(|&d| d) {
        HttpResponse::Ok()
    } else {
        HttpResponse::Created()
    };
    state.reads.written(&mut answer).await;
    Ok(if batch {
        answer.json(json!({ "ids": ids, "duplicate": duplicate }))
    } else {
        answer
            .insert_header((LOCATION, format!("/api/v1/tasks/{}", ids[0])))
            .json(json!({ "id": ids[0], "duplicate": duplicate[0] }))
    })
}

/// `GET /api/v1/tasks?status=&kind=&flow=&worker=&limit=&after=&full=`: newest first;
/// `next` is the `after` of the next page (null on the last one).
pub(super) async fn list(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let q = query(
        &req,
        &[
            "status", "kind", "flow", "worker", "tag", "since", "until", "where", "limit", "after",
            "full",
        ],
    )?;
    let matching = filter_of(&q)?;
    let after = param(&q, "after", parse_uuid)?;
    let limit = param(&q, "limit", |s| parse_int(s, 1, 1000))?.unwrap_or(50);
    let full = param(&q, "full", parse_bool)?.unwrap_or(false);
    let cut = if full { i32::MAX } else { CUT_CHARS };
    let Some(filter) = matching else {
        // Where it would have been read, though nothing is: the header is the same.
        let (_, from) = state.reads.board(&req).await?;
        return Ok(HttpResponse::Ok()
            .insert_header(from.header())
            .json(json!({ "tasks": [], "next": null })));
    };
    let filter = TaskFilter {
        after,
        limit,
        ..filter
    };
    let wanted = &filter;
    let (page, from) = state
        .reads
        .read(&req, |bb| async move { bb.tasks_page(wanted, cut).await })
        .await?;
    let next = (page.len() as i64 == filter.limit)
        .then(|| page.last().map(|t| t.task.id))
        .flatten();
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(json!({ "tasks": page, "next": next })))
}

/// The filters of `GET /api/v1/tasks` (and of a bulk action's `filter`) in `q`: every
/// one given must hold. `None` when one holds `\u0000`, which PostgreSQL cannot store:
/// no task can match it, so none does (the database, which would refuse the value, is
/// not asked).
fn filter_of(q: &[(String, String)]) -> Result<Option<TaskFilter>, ApiError> {
    let time = |s: &str| {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                format!("{s:?} is not an RFC 3339 time ({e}); expected e.g. 2026-12-01T08:00:00Z")
            })
    };
    let filter = TaskFilter {
        status: param(q, "status", |s| {
            s.parse().map_err(|e: artex_actors::Error| e.to_string())
        })?,
        kind: param(q, "kind", |s| check_kind(s).map(|()| s.to_string()))?,
        flow: param(q, "flow", parse_uuid)?,
        worker: param(q, "worker", |s| {
            text(s, "a worker id (GET /api/v1/workers)")
        })?,
        tag: param(q, "tag", |s| text(s, "a tag"))?,
        since: param(q, "since", time)?,
        until: param(q, "until", time)?,
        payload_contains: param(q, "where", |s| match serde_json::from_str(s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err("expected a JSON object, e.g. {\"customer\":42}".into()),
            Err(e) => Err(format!("not JSON ({e}); expected e.g. {{\"customer\":42}}")),
        })?,
        ..TaskFilter::default()
    };
    let storable = |s: &Option<String>| !s.as_deref().is_some_and(|s| s.contains('\0'));
    let possible = storable(&filter.worker)
        && storable(&filter.tag)
        && filter
            .payload_contains
            .as_ref()
            .is_none_or(|v| check_payload(v).is_ok());
    Ok(possible.then_some(filter))
}

/// A filter's text value: not empty.
fn text(s: &str, expected: &str) -> Result<String, String> {
    if s.is_empty() {
        Err(format!("must not be empty; expected {expected}"))
    } else {
        Ok(s.to_string())
    }
}

/// The fields of `POST /api/v1/tasks/bulk`.
const BULK_FIELDS: &[&str] = &["action", "filter", "all", "reason", "dry_run"];

/// The fields of a bulk action's `filter`: `GET /api/v1/tasks`'s filters.
const FILTER_FIELDS: &[&str] = &[
    "status", "kind", "flow", "worker", "tag", "since", "until", "where",
];

/// `POST /api/v1/tasks/bulk`: `{"action": "retry"|"cancel"|"delete", "filter": {…},
/// "reason", "dry_run", "all"}`; 200 with what it did (`OperatorBoard::bulk`). A filter
/// is required unless `all` is true.
pub(super) async fn bulk(
    _: CanWrite,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let example = r#"{"action": "retry", "filter": {"status": "failed"}}"#;
    let obj = &object_body(&req, body, &state, example, BULK_FIELDS).await?;
    let action: String = field(obj, "", "action", "retry, cancel or delete")?.ok_or_else(|| {
        ApiError::bad(
            "action",
            "action: missing; expected retry, cancel or delete",
        )
    })?;
    let action: BulkAction = action
        .parse()
        .map_err(|e| ApiError::bad("action", format!("action: {e}")))?;
    let filter = match obj.get("filter") {
        None | Some(Value::Null) => Some(TaskFilter::default()),
        Some(Value::Object(f)) => {
            only_fields(f, "filter.", FILTER_FIELDS)?;
            let mut q = Vec::new();
            for (k, v) in f {
                match v {
                    Value::String(s) => q.push((k.clone(), s.clone())),
                    Value::Object(_) if k == "where" => q.push((k.clone(), v.to_string())),
                    Value::Null => {}
                    other => {
                        return Err(ApiError::bad(
                            format!("filter.{k}"),
                            format!("filter.{k}: expected a string, got {}", super::shown(other)),
                        ))
                    }
                }
            }
            filter_of(&q).map_err(|e| match e {
                ApiError::BadRequest { field, message } => ApiError::BadRequest {
                    field: field.map(|f| format!("filter.{f}")),
                    message: format!("filter.{message}"),
                },
                other => other,
            })?
        }
        Some(other) => {
            return Err(ApiError::bad(
                "filter",
                format!(
                    "filter: expected an object of GET /api/v1/tasks's filters, got {}",
                    super::shown(other)
                ),
            ))
        }
    };
    let all: bool = field(obj, "", "all", "true or false")?.unwrap_or(false);
    if filter == Some(TaskFilter::default()) && !all {
        return Err(ApiError::bad(
            "filter",
            "filter: none given; name the tasks (status, kind, tag, …) or set \"all\": true",
        ));
    }
    let reason: Option<String> = field(obj, "", "reason", "a string")?;
    if let Some(why) = reason.as_deref().and_then(reason_fault) {
        return Err(ApiError::refused("reason", format!("reason: {why}")));
    }
    let dry_run: bool = field(obj, "", "dry_run", "true or false")?.unwrap_or(false);
    let Some(filter) = filter else {
        return Ok(HttpResponse::Ok().json(BulkReport {
            action,
            matched: 0,
            changed: 0,
            batches: 0,
            dry_run,
        }));
    };
    let report = state
        .bb
        .bulk(action, &filter, &actor(&req), reason.as_deref(), dry_run)
        .await?;
    let mut answer = HttpResponse::Ok();
    if !dry_run {
        state.reads.written(&mut answer).await;
    }
    Ok(answer.json(report))
}

/// `GET /api/v1/tasks/{id}?full=`: the task and its history, oldest first.
pub(super) async fn show(
    _: CanRead,
    req: HttpRequest,
    id: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id)?;
    let q = query(&req, &["full"])?;
    let full = param(&q, "full", parse_bool)?.unwrap_or(false);
    let ((task, mut history), from) = state
        .reads
        .read(&req, |bb| async move {
            let task = bb
                .task_preview(id, if full { i32::MAX } else { CUT_CHARS })
                .await?;
            Ok((task, bb.transitions(id).await?))
        })
        .await?;
    if !full {
        // A failure's reason is its error: as large as the error can be.
        for h in &mut history {
            if let Some(r) = &h.reason {
                if let Some((end, _)) = r.char_indices().nth(CUT_CHARS as usize) {
                    h.reason = Some(format!("{}… ({} bytes; ?full=true)", &r[..end], r.len()));
                }
            }
        }
    }
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(json!({ "task": task, "transitions": history })))
}

/// The optional `{"reason": …}` body of a control.
pub(super) async fn read_reason(
    req: &HttpRequest,
    body: web::Payload,
    state: &ApiState,
) -> Result<Option<String>, ApiError> {
    query(req, &[])?;
    let body = read_body(req, body, state.max_body_bytes).await?;
    let Some(v) = parse_json(&body)? else {
        return Ok(None);
    };
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad(
            "body",
            format!(
                "expected no body or a JSON object like {{\"reason\": \"…\"}}, got {}",
                super::shown(&v)
            ),
        ));
    };
    only_fields(obj, "", &["reason"])?;
    let reason: Option<String> = field(obj, "", "reason", "a string")?;
    if let Some(why) = reason.as_deref().and_then(reason_fault) {
        return Err(ApiError::refused("reason", format!("reason: {why}")));
    }
    Ok(reason)
}

/// What a control's path names: `/tasks/{id}/…` or `/flows/{id}/…`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Named {
    /// A task.
    Task,
    /// A flow (every task of it).
    Flow,
}

/// Pause, resume or cancel what the path names; a task's id under `/flows` (or a flow's
/// under `/tasks`) is 404 with where it belongs.
pub(super) async fn control(
    named: Named,
    control: Control,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id)?;
    let reason = read_reason(&req, body, &state).await?;
    let (what, other) = match named {
        Named::Task => ("task", "flows"),
        Named::Flow => ("flow", "tasks"),
    };
    match (named, state.bb.control_target(id).await) {
        (Named::Task, Ok(ControlTarget::Task(_))) | (Named::Flow, Ok(ControlTarget::Flow(_))) => {}
        (_, Ok(_)) => {
            return Err(ApiError::NotFound(format!(
                "no {what} with id {id}: it is a {} (POST /api/v1/{other}/{id}/{})",
                if named == Named::Task { "flow" } else { "task" },
                control.as_str()
            )))
        }
        (_, Err(artex_actors::Error::Invalid(_))) => {
            return Err(ApiError::NotFound(format!("no {what} with id {id}")))
        }
        (_, Err(e)) => return Err(e.into()),
    }
    let report = state
        .bb
        .control(control, id, &actor(&req), reason.as_deref())
        .await?;
    super::changed(&state, report).await
}

/// The handler of `POST /api/v1/{tasks|flows}/{id}/pause|resume|cancel` (write scope):
/// [`control`] with what the route names.
pub(super) fn control_route(
    named: Named,
    action: Control,
) -> impl actix_web::Handler<
    (
        CanWrite,
        HttpRequest,
        web::Path<String>,
        web::Payload,
        web::Data<ApiState>,
    ),
    Output = Result<HttpResponse, ApiError>,
> {
    move |_: CanWrite, req, id, body, state| control(named, action, req, id, body, state)
}

/// `POST /api/v1/tasks/{id}/retry`: a failed, timed-out or canceled task runs again, as
/// a new task (201 `{"id", "retry_of"}`); see `Blackboard::retry`.
pub(super) async fn retry(
    _: CanWrite,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id)?;
    let reason = read_reason(&req, body, &state).await?;
    let new = state.bb.retry(id, &actor(&req), reason.as_deref()).await?;
    let mut answer = HttpResponse::Created();
    state.reads.written(&mut answer).await;
    Ok(answer
        .insert_header((LOCATION, format!("/api/v1/tasks/{new}")))
        .json(json!({ "id": new, "retry_of": id })))
}

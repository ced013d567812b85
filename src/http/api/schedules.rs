//! `/api/v1/schedules…`: add a cron schedule, list them, show one, pause, resume and
//! remove it. A name that is none is 400; an expression or time zone that is none is
//! 422 naming the field (`cron`, `timezone`); the task's fields are checked as a
//! submission's (422 for a kind no worker declared or a payload over the limit); a name
//! taken is 409.

use actix_web::http::header::LOCATION;
use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::blackboard::NewTask;
use artex_actors::schedule::{check_name, CatchUp, NewSchedule};
use artex_actors::submission::{Submission, MAX_RETRIES};
use serde_json::{json, Value};

use super::tasks::{read_reason, reason_fault};
use super::{
    actor, changed, check_submission, field, only_fields, param, query, submission, ApiError,
    ApiState,
};
use crate::http::auth::{CanRead, CanWrite};

/// The fields of `POST /api/v1/schedules`.
const SCHEDULE_FIELDS: &[&str] = &[
    "name",
    "cron",
    "timezone",
    "kind",
    "payload",
    "priority",
    "max_retries",
    "timeout_ms",
    "shard_key",
    "catch_up",
    "allow_unregistered_kind",
];

/// The `{name}` of a path.
fn path_name(raw: &str) -> Result<String, ApiError> {
    check_name(raw)
        .map(|()| raw.to_string())
        .map_err(|why| ApiError::bad("name", format!("name: {why}")))
}

/// A required string field.
fn required(
    obj: &serde_json::Map<String, Value>,
    name: &str,
    example: &str,
) -> Result<String, ApiError> {
    field(obj, "", name, "a string")?.ok_or_else(|| {
        ApiError::bad(
            name,
            format!("{name}: missing; every schedule needs one, expected e.g. {example}"),
        )
    })
}

/// The schedule in a body, and whether its kind may be one no worker declared.
fn parse_schedule(v: &Value) -> Result<(NewSchedule, bool), ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad(
            "body",
            format!(
                "expected a schedule: a JSON object like {{\"name\": \"nightly\", \"cron\": \
                 \"0 2 * * *\", \"kind\": \"echo\"}}, got {}",
                super::shown(v)
            ),
        ));
    };
    only_fields(obj, "", SCHEDULE_FIELDS)?;
    let expected_retries = format!("an integer from 0 to {MAX_RETRIES}");
    let catch_up = match field::<String>(obj, "", "catch_up", "none, last or all (a string)")? {
        None => CatchUp::default(),
        Some(s) => s
            .parse()
            .map_err(|why: String| ApiError::bad("catch_up", format!("catch_up: {why}")))?,
    };
    let schedule = NewSchedule {
        name: required(obj, "name", "\"nightly-report\"")?,
        cron: required(obj, "cron", "\"*/5 * * * *\"")?,
        timezone: field(obj, "", "timezone", "an IANA time zone (a string)")?
            .unwrap_or_else(|| "UTC".into()),
        task: NewTask {
            kind: required(obj, "kind", "\"echo\"")?,
            payload: obj
                .get("payload")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(|| json!({})),
            priority: field(obj, "", "priority", "a 32-bit integer")?.unwrap_or(0),
            max_retries: field(obj, "", "max_retries", &expected_retries)?,
            timeout_ms: field(obj, "", "timeout_ms", "a positive 32-bit integer")?,
            shard_key: field(obj, "", "shard_key", "a string")?,
            ..NewTask::default()
        },
        catch_up,
    };
    let allow = field(obj, "", "allow_unregistered_kind", "true or false")?.unwrap_or(false);
    Ok((schedule, allow))
}

/// `POST /api/v1/schedules[?allow_unregistered_kind=true]`: adds a schedule (201, the
/// schedule with its next slot).
pub(super) async fn add(
    _: CanWrite,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let (value, allow_all) = submission(&req, body, &state, "a schedule (a JSON object)").await?;
    let (schedule, allow) = parse_schedule(&value)?;
    let allow = allow || allow_all;
    // The schedule's own rules. A name is malformed (400) when it breaks its pattern,
    // which docs/openapi.json states; an expression or a zone is refused (422) for what
    // it means (no such zone, no slot left), which no pattern can state.
    schedule.check().map_err(|r| {
        let message = format!("{}: {}", r.field, r.why);
        if r.field == "name" {
            ApiError::bad(r.field, message)
        } else {
            ApiError::refused(r.field, message)
        }
    })?;
    // Its task's, as a submission's.
    let submission = Submission::task(&schedule.task, allow);
    check_submission(&state.bb, &submission, |r| r.field.as_str().to_string()).await?;
    let added = state.bb.add_schedule(&schedule, &actor(&req)).await?;
    let mut answer = HttpResponse::Created();
    state.reads.written(&mut answer).await;
    Ok(answer
        .insert_header((LOCATION, format!("/api/v1/schedules/{}", added.name)))
        .json(added))
}

/// `GET /api/v1/schedules`: every schedule, by name.
pub(super) async fn list(
    _: CanRead,
    req: HttpRequest,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let (schedules, from) = state
        .reads
        .read(&req, |bb| async move { bb.schedules().await })
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(json!({ "schedules": schedules })))
}

/// `GET /api/v1/schedules/{name}`.
pub(super) async fn show(
    _: CanRead,
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    query(&req, &[])?;
    let name = &name;
    let (schedule, from) = state
        .reads
        .read(&req, |bb| async move { bb.schedule(name).await })
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header(from.header())
        .json(schedule))
}

/// `POST /api/v1/schedules/{name}/pause` (an optional `{"reason": …}`): the schedule
/// as it is now.
pub(super) async fn pause(
    _: CanWrite,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    let reason = read_reason(&req, body, &state).await?;
    let s = state
        .bb
        .pause_schedule(&name, &actor(&req), reason.as_deref())
        .await?;
    changed(&state, s).await
}

/// `POST /api/v1/schedules/{name}/resume` (an optional `{"reason": …}`): the schedule
/// as it is now, its next slot the first after now.
pub(super) async fn resume(
    _: CanWrite,
    req: HttpRequest,
    name: web::Path<String>,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    let reason = read_reason(&req, body, &state).await?;
    let s = state
        .bb
        .resume_schedule(&name, &actor(&req), reason.as_deref())
        .await?;
    changed(&state, s).await
}

/// `DELETE /api/v1/schedules/{name}?reason=…` (the reason optional; a DELETE carries
/// no body): `{"removed": name}`; the tasks it submitted stay.
pub(super) async fn remove(
    _: CanWrite,
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    let q = query(&req, &["reason"])?;
    let reason = param(&q, "reason", |r| match reason_fault(r) {
        Some(why) => Err(why),
        None => Ok(r.to_string()),
    })?;
    state
        .bb
        .remove_schedule(&name, &actor(&req), reason.as_deref())
        .await?;
    changed(&state, json!({ "removed": name })).await
}

//! The HTTP API, `/api/v1/…`: tasks (submit, list, show, pause|resume|cancel|retry),
//! flows (submit, list, show with the DAG, pause|resume|cancel, signals to their waits), schedules (add, list,
//! show, pause|resume, remove), kinds with their limits and retry policies, workers,
//! statistics and the live feed (and where its head is). The dashboard's page is
//! registered with them.
//! Served by `artex serve` (with `/health` and `/events`, see [`serve_routes`]) and by a
//! worker started with `--api` (`artex up` always). Stateless: every route reads or
//! writes the blackboard, and holds no SQL. Every worker also serves the uploads
//! ([`worker_routes`]), which are kept on its disk. Described in `docs/openapi.json`
//! (served at `/api/v1/openapi.json`), which a test holds to the routes registered here.
//!
//! Errors are JSON, `{"error": …, "field": …}` (`field` names the offending field or
//! parameter, or is null): 400 a malformed request (not JSON, a wrong type, an unknown
//! field or parameter), 401 a missing or wrong token, 404 an unknown id or route, 408 an
//! upload's body that stopped arriving, 409 a control the task's state does not allow
//! (or an upload's, or a schedule's name taken), 413 a body over the limit, 422 well-formed input the blackboard
//! refuses (a kind no worker declared, a payload over the limit, an invalid flow) or an
//! upload's content that does not match its sha256, 503 the database unreachable, 507
//! no room for an upload. A refused request writes nothing; after a 408, 413 or a
//! mismatch the connection is closed (the rest of the body is not read).

mod cluster;
mod flows;
mod kinds;
pub mod reads;
pub mod replica_health;
mod schedules;
mod tasks;
mod tokens;
mod uploads;

use actix_web::http::{Method, StatusCode};
use actix_web::{web, FromRequest, Handler, HttpRequest, HttpResponse, Responder, ResponseError};
use artex_actors::blackboard::{FeedBoard, OperatorBoard};
use artex_actors::submission::{Refusal, Submission};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use super::events;

pub use crate::config::DEFAULT_MAX_BODY_BYTES;

/// Tasks in one batch at most.
pub const MAX_BATCH: usize = 10_000;

/// Values longer than this many characters are cut in answers unless `?full=true`.
const CUT_CHARS: i32 = 1024;

/// This API's description, served at `/api/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// What the API's routes need.
#[derive(Clone)]
pub struct ApiState {
    /// The operator's statements (submit, control, and the reads a write depends on):
    /// the primary's.
    pub bb: OperatorBoard,
    /// Lists, pages and statistics: the replica's with `--read-database-url`, else the
    /// primary's.
    pub reads: reads::Reads,
    /// The change feed's (where it ends now).
    pub feed: FeedBoard,
    /// The largest request body accepted, bytes.
    pub max_body_bytes: usize,
    /// The last read of the fleet for `/metrics`, shared by every scrape.
    pub fleet: crate::http::fleet_metrics::FleetMetrics,
}

/// An API error: its status code and a JSON body saying what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed: not JSON, a wrong type, an unknown field or parameter (400).
    #[error("{message}")]
    BadRequest {
        /// The field or parameter.
        field: Option<String>,
        /// What was wrong, and what was expected.
        message: String,
    },
    /// Well-formed, but refused: an unknown kind, a payload over the limit, an invalid
    /// flow (422).
    #[error("{message}")]
    Unprocessable {
        /// The field.
        field: Option<String>,
        /// What was wrong, and what was expected.
        message: String,
    },
    /// No such task, flow or route (404).
    #[error("{0}")]
    NotFound(String),
    /// The task's or flow's state does not allow it (409).
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than the limit, or than the chunk it is sent as (413).
    #[error("{0}")]
    TooLarge(String),
    /// The body does not match its sha256 (422, no `field`): nothing of it was kept.
    #[error("{0}")]
    Mismatch(String),
    /// The body stopped arriving (408).
    #[error("{0}")]
    Timeout(String),
    /// No room left on this worker's disk for what is declared (507).
    #[error("{0}")]
    InsufficientStorage(String),
    /// The database could not be reached in time (503).
    #[error("{0}")]
    Unavailable(String),
    /// Anything else (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn bad(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    fn refused(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Unprocessable {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    fn over_limit(limit: usize) -> Self {
        ApiError::TooLarge(format!(
            "the request body is larger than the limit of {limit} bytes"
        ))
    }

    fn field(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { field, .. } | ApiError::Unprocessable { field, .. } => {
                field.as_deref()
            }
            ApiError::TooLarge(_) => Some("body"),
            _ => None,
        }
    }

    /// Refused while the body may still be arriving: the rest of it is not read, so the
    /// connection is closed after the answer.
    fn refuses_body(&self) -> bool {
        matches!(
            self,
            ApiError::TooLarge(_) | ApiError::Mismatch(_) | ApiError::Timeout(_)
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Mismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut answer = HttpResponse::build(self.status_code());
        if self.refuses_body() {
            answer.force_close();
        }
        answer.json(json!({ "error": self.to_string(), "field": self.field() }))
    }
}

/// PostgreSQL's code for "more than the payload limit" (`artex.limits`).
const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
/// PostgreSQL's code for a failed check (a kind that is no name, …).
const CHECK_VIOLATION: &str = "23514";

impl From<artex_actors::Error> for ApiError {
    fn from(e: artex_actors::Error) -> Self {
        use artex_actors::Error as E;
        match e {
            E::TaskNotFound(_)
            | E::FlowNotFound(_)
            | E::ScheduleNotFound(_)
            | E::NoSuchWait { .. } => ApiError::NotFound(e.to_string()),
            E::Refused(m) => ApiError::Conflict(m),
            E::Invalid(m) => ApiError::Unprocessable {
                field: None,
                message: m,
            },
            E::Db(ref db) => match db.as_db_error().map(|d| d.code().code()) {
                // The database's own checks, for writers that skip ours (the limit can
                // change between our check and the insert).
                Some(PROGRAM_LIMIT_EXCEEDED) => ApiError::refused("payload", e.to_string()),
                Some(CHECK_VIOLATION) => ApiError::Unprocessable {
                    field: None,
                    message: e.to_string(),
                },
                _ if e.is_connection() => ApiError::Unavailable(e.to_string()),
                _ => ApiError::Internal(e.to_string()),
            },
            e if e.is_connection() => ApiError::Unavailable(e.to_string()),
            e => ApiError::Internal(e.to_string()),
        }
    }
}

/// Where routes go: actix's [`web::ServiceConfig`] registers them, a [`RouteList`]
/// writes them down. Both are fed by the same functions ([`api_routes`],
/// [`serve_routes`], [`worker_routes`]), so the list is what is served (the OpenAPI test
/// reads it).
pub trait Routes {
    /// Adds `method path` served by `handler`.
    fn add<F, Args>(&mut self, method: Method, path: &'static str, handler: F)
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static;

    /// Adds routes that are served but are not the API (the dashboard's page and
    /// assets): a [`RouteList`] leaves them out, as `docs/openapi.json` does.
    fn pages(&mut self, _register: fn(&mut web::ServiceConfig)) {}

    /// Answers 405 for any other method than `allow` on `path` from here on: for a
    /// path that a parameterized one registered later would match too (`GET
    /// /api/v1/tasks/bulk` is no task id). See [`method_not_allowed`] for the rest.
    fn only(&mut self, _path: &'static str, _allow: &'static str) {}
}

impl Routes for web::ServiceConfig {
    fn add<F, Args>(&mut self, method: Method, path: &'static str, handler: F)
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        self.route(path, web::method(method).to(handler));
    }

    fn pages(&mut self, register: fn(&mut web::ServiceConfig)) {
        register(self);
    }

    fn only(&mut self, path: &'static str, allow: &'static str) {
        not_allowed(self, path, allow.to_string());
    }
}

/// The routes, as (method, path) pairs.
#[derive(Debug, Default)]
pub struct RouteList(pub Vec<(Method, &'static str)>);

impl Routes for RouteList {
    fn add<F, Args>(&mut self, method: Method, path: &'static str, _: F)
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        self.0.push((method, path));
    }
}

/// The `/api/v1/…` routes (they need `web::Data<ApiState>`, the `Access` table and, for
/// the feed, `EventsState`).
pub fn api_routes(r: &mut impl Routes) {
    use artex_actors::blackboard::Control;
    use tasks::{control_route, Named};
    use Method as M;
    r.add(M::POST, "/api/v1/tasks", tasks::submit);
    r.add(M::GET, "/api/v1/tasks", tasks::list);
    // Before `/api/v1/tasks/{id}…`: `bulk` is not an id.
    r.add(M::POST, "/api/v1/tasks/bulk", tasks::bulk);
    r.only("/api/v1/tasks/bulk", "POST");
    r.add(M::GET, "/api/v1/tasks/{id}", tasks::show);
    r.add(M::POST, "/api/v1/tasks/{id}/retry", tasks::retry);
    r.add(M::POST, "/api/v1/flows", flows::submit);
    r.add(M::GET, "/api/v1/flows/{id}", flows::show);
    // Pause, resume and cancel: one handler, told what the path names and what to do.
    for (path, named, action) in [
        ("/api/v1/tasks/{id}/pause", Named::Task, Control::Pause),
        ("/api/v1/tasks/{id}/resume", Named::Task, Control::Resume),
        ("/api/v1/tasks/{id}/cancel", Named::Task, Control::Cancel),
        ("/api/v1/flows/{id}/pause", Named::Flow, Control::Pause),
        ("/api/v1/flows/{id}/resume", Named::Flow, Control::Resume),
        ("/api/v1/flows/{id}/cancel", Named::Flow, Control::Cancel),
    ] {
        r.add(M::POST, path, control_route(named, action));
    }
    r.add(M::POST, "/api/v1/flows/{id}/signals/{name}", flows::signal);
    r.add(M::GET, "/api/v1/workers", cluster::workers);
    r.add(M::GET, "/api/v1/stats", cluster::stats);
    r.add(M::GET, "/api/v1/events", events::events);
    r.add(M::GET, "/api/v1/openapi.json", openapi);
    r.add(M::GET, "/api/v1/flows", flows::list);
    r.add(M::GET, "/api/v1/events/head", cluster::events_head);
    r.add(M::GET, "/api/v1/replica", cluster::replica);
    r.add(M::GET, "/api/v1/kinds", kinds::list);
    r.add(M::GET, "/api/v1/kinds/{kind}/limits", kinds::limits);
    r.add(M::PUT, "/api/v1/kinds/{kind}/limits", kinds::set_limits);
    r.add(
        M::DELETE,
        "/api/v1/kinds/{kind}/limits",
        kinds::clear_limits,
    );
    r.add(M::POST, "/api/v1/kinds/{kind}/pause", kinds::pause);
    r.add(M::POST, "/api/v1/kinds/{kind}/resume", kinds::resume);
    r.add(M::GET, "/api/v1/kinds/{kind}/retry", kinds::show_retry);
    r.add(M::PUT, "/api/v1/kinds/{kind}/retry", kinds::set_retry);
    r.add(M::DELETE, "/api/v1/kinds/{kind}/retry", kinds::clear_retry);
    r.add(M::GET, "/api/v1/whoami", tokens::whoami);
    r.add(M::GET, "/api/v1/tokens", tokens::list);
    r.add(M::POST, "/api/v1/tokens", tokens::create);
    r.add(M::DELETE, "/api/v1/tokens/{name}", tokens::revoke);
    r.add(M::GET, "/api/v1/schedules", schedules::list);
    r.add(M::POST, "/api/v1/schedules", schedules::add);
    r.add(M::GET, "/api/v1/schedules/{name}", schedules::show);
    r.add(M::DELETE, "/api/v1/schedules/{name}", schedules::remove);
    r.add(M::POST, "/api/v1/schedules/{name}/pause", schedules::pause);
    r.add(
        M::POST,
        "/api/v1/schedules/{name}/resume",
        schedules::resume,
    );
    r.pages(crate::http::dashboard::routes);
}

/// Everything `artex serve` serves: the API, `/health` (from the database probe) and
/// `/events` (the feed, as on a worker).
pub fn serve_routes(r: &mut impl Routes) {
    r.add(Method::GET, "/health", cluster::health);
    r.add(Method::GET, "/metrics", cluster::metrics);
    r.add(Method::GET, "/events", events::events);
    api_routes(r);
}

/// The API routes only a worker serves, with `--api` or without: uploads (they need
/// `web::Data<Arc<Uploads>>`), kept on the worker's own disk, which `artex serve` has
/// not.
pub fn worker_routes(r: &mut impl Routes) {
    use Method as M;
    r.add(M::POST, "/api/v1/uploads", uploads::create);
    r.add(M::GET, "/api/v1/uploads/{id}", uploads::show);
    r.add(M::POST, "/api/v1/uploads/{id}/complete", uploads::complete);
    r.add(
        M::PUT,
        "/api/v1/uploads/{id}/chunks/{n}",
        uploads::put_chunk,
    );
}

/// Answers `405 Method Not Allowed`, with `Allow` and the API's error body, for a
/// method `routes` does not serve on a path it serves (a client reading the OpenAPI
/// document is told the path exists, and which methods it takes). Register it after
/// `routes`: one resource per path, without a guard, in the order the paths came.
pub fn method_not_allowed(cfg: &mut web::ServiceConfig, routes: fn(&mut RouteList)) {
    let mut list = RouteList::default();
    routes(&mut list);
    let mut paths: Vec<(&'static str, Vec<String>)> = Vec::new();
    for (method, path) in list.0 {
        match paths.iter_mut().find(|(p, _)| *p == path) {
            Some((_, methods)) => methods.push(method.to_string()),
            None => paths.push((path, vec![method.to_string()])),
        }
    }
    for (path, methods) in paths {
        not_allowed(cfg, path, methods.join(", "));
    }
}

/// Registers the 405 of `path`, which takes the methods `allow` names.
fn not_allowed(cfg: &mut web::ServiceConfig, path: &'static str, allow: String) {
    cfg.service(web::resource(path).to(move |req: HttpRequest| {
        let allow = allow.clone();
        async move {
            HttpResponse::MethodNotAllowed()
                .insert_header(("Allow", allow.clone()))
                .json(serde_json::json!({
                    "error": format!(
                        "{} is not served on {}; it takes {allow} (see /api/v1/openapi.json)",
                        req.method(),
                        req.path()
                    ),
                    "field": null,
                }))
        }
    }));
}

/// The 200 answer to a change: `body`, with the primary's WAL position once it
/// committed (`Artex-Lsn`, with `--read-database-url`) so that a read can ask to see it.
async fn changed(state: &ApiState, body: impl serde::Serialize) -> Result<HttpResponse, ApiError> {
    let mut answer = HttpResponse::Ok();
    state.reads.written(&mut answer).await;
    Ok(answer.json(body))
}

/// The JSON answer for an unknown route (404) on `artex serve`.
pub async fn no_route(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!(
        "no route {} {}; see /api/v1/openapi.json",
        req.method(),
        req.path()
    ))
    .error_response()
}

/// The API's description (open: it holds no data).
async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

/// Who the history records for a change made through the API: a named token's name
/// (`token:NAME`), else the caller's address (`api@ADDRESS`).
fn actor(req: &HttpRequest) -> String {
    if let Some(name) = crate::http::auth::caller(req).and_then(|c| c.name) {
        return format!("token:{name}");
    }
    match req.peer_addr() {
        Some(peer) => format!("api@{}", peer.ip()),
        None => "api".into(),
    }
}

/// The request body, refused past `limit` bytes (by its `Content-Length` before anything
/// is read, or as it arrives): never more than the limit is held.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::over_limit(limit));
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest {
            field: Some("body".into()),
            message: format!("reading the request body: {e}"),
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::over_limit(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// A submission: its JSON body (an empty one is refused, saying what was `expected`) and
/// whether the query says `allow_unregistered_kind=true` for all of it.
async fn submission(
    req: &HttpRequest,
    body: web::Payload,
    state: &ApiState,
    expected: &str,
) -> Result<(Value, bool), ApiError> {
    let q = query(req, &["allow_unregistered_kind"])?;
    let allow = param(&q, "allow_unregistered_kind", parse_bool)?.unwrap_or(false);
    let body = read_body(req, body, state.max_body_bytes).await?;
    match parse_json(&body)? {
        Some(value) => Ok((value, allow)),
        None => Err(ApiError::bad(
            "body",
            format!("empty body; expected {expected}"),
        )),
    }
}

/// The body as a JSON object of only `known` fields: an empty body, another JSON value
/// or an unknown field is a 400 that shows `example`.
async fn object_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &ApiState,
    example: &str,
    known: &[&str],
) -> Result<Map<String, Value>, ApiError> {
    let body = read_body(req, payload, state.max_body_bytes).await?;
    let Some(value) = parse_json(&body)? else {
        return Err(ApiError::bad(
            "body",
            format!("empty body; expected a JSON object like {example}"),
        ));
    };
    let Value::Object(obj) = value else {
        return Err(ApiError::bad(
            "body",
            format!(
                "expected a JSON object like {example}, got {}",
                shown(&value)
            ),
        ));
    };
    only_fields(&obj, "", known)?;
    Ok(obj)
}

/// The body as JSON; `None` for an empty body.
fn parse_json(body: &[u8]) -> Result<Option<Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(body)
        .map(Some)
        .map_err(|e| ApiError::bad("body", format!("not valid JSON: {e}")))
}

/// A short rendering of a value for messages.
fn shown(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s,
    }
}

/// Field `name` of `obj` as a `T` (`None` if absent or null); a wrong type is a 400
/// naming `{prefix}{name}`, what was expected and what came.
fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    prefix: &str,
    name: &str,
    expected: &str,
) -> Result<Option<T>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|_| {
            ApiError::bad(
                format!("{prefix}{name}"),
                format!("{prefix}{name}: expected {expected}, got {}", shown(v)),
            )
        }),
    }
}

/// Refuses any field of `obj` not in `known` (a typo would otherwise be ignored).
fn only_fields(obj: &Map<String, Value>, prefix: &str, known: &[&str]) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::bad(
            format!("{prefix}{k}"),
            format!(
                "{prefix}{k}: unknown field; expected one of: {}",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// The query string's parameters, each at most once and each in `known`.
fn query(req: &HttpRequest, known: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| ApiError::bad("query", format!("query string: {e}")))?
        .into_inner();
    for (i, (k, _)) in pairs.iter().enumerate() {
        if !known.contains(&k.as_str()) {
            return Err(ApiError::bad(
                k.clone(),
                format!(
                    "{k}: unknown query parameter; expected one of: {}",
                    known.join(", ")
                ),
            ));
        }
        if pairs[..i].iter().any(|(k2, _)| k2 == k) {
            return Err(ApiError::bad(
                k.clone(),
                format!("{k}: given twice; expected it once"),
            ));
        }
    }
    Ok(pairs)
}

/// Parameter `name` of `pairs`, parsed.
fn param<T>(
    pairs: &[(String, String)],
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, ApiError> {
    match pairs.iter().find(|(k, _)| k == name) {
        None => Ok(None),
        Some((_, v)) => parse(v)
            .map(Some)
            .map_err(|e| ApiError::bad(name, format!("{name}: {e}"))),
    }
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean; expected true or false")),
    }
}

fn parse_uuid(s: &str) -> Result<uuid::Uuid, String> {
    uuid::Uuid::parse_str(s).map_err(|e| {
        format!(
            "{s:?} is not an id ({e}); expected a UUID like 0192f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"
        )
    })
}

fn parse_int(s: &str, min: i64, max: i64) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: expected an integer from {min} to {max}")),
    }
}

/// The `{id}` of a path.
fn path_id(raw: &str) -> Result<uuid::Uuid, ApiError> {
    parse_uuid(raw).map_err(|e| ApiError::bad("id", format!("id: {e}")))
}

/// How the API lets a kind no worker declared through.
const ALLOW_UNREGISTERED: &str =
    "set \"allow_unregistered_kind\": true (or ?allow_unregistered_kind=true)";

/// Checks a submission (`artex_actors::submission`) before anything is written: first
/// the rules that need nothing from the database, then against the payload limit and
/// the kinds workers declared. A refusal is 422 naming the field as `field` says this
/// request names it (`kind`, `[3].payload`, `tasks[2].kind`). Returns, for a flow, what
/// each task depends on.
async fn check_submission(
    bb: &OperatorBoard,
    submission: &Submission<'_>,
    field: impl Fn(&Refusal) -> String,
) -> Result<Vec<Vec<usize>>, ApiError> {
    let refused = |r: Refusal| {
        let field = field(&r);
        ApiError::Unprocessable {
            message: r.message(&field, ALLOW_UNREGISTERED),
            field: Some(field),
        }
    };
    submission.check_shape().map_err(refused)?;
    let facts = bb.submission_facts(submission).await?;
    submission.check(&facts).map_err(refused)
}

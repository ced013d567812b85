//! `/api/v1/uploads`: large files sent to this worker in chunks, each acknowledged only
//! once it is on disk and fsynced, resumable by asking what is missing. The write scope
//! is required. The work is the store's (`crate::uploads`); this maps it to HTTP.
//!
//! - `POST /api/v1/uploads` `{"size", "sha256"?, "name"?, "chunk_size"?, "task": {"kind",
//!   "payload"?, "priority"?, "flow"?}}` → 201 `{"id", "chunk_size", "chunks"}` (507 over
//!   quota; 422 `{"error", "field": "task.flow"}` for a flow that is unknown or ended);
//! - `PUT /api/v1/uploads/{id}/chunks/{n}` with `Chunk-Sha256` → 200 `{"ack": true,
//!   "chunk", "received", "missing", "task"}`; 422 if the hash differs (not stored);
//! - `POST /api/v1/uploads/{id}/complete` (body `{"sha256"}` when the upload declared
//!   none) → the task, once every chunk is there (with a sha256 declared, the last chunk
//!   does this by itself; 409 when already complete or chunks are missing, 422 for a
//!   sha256 missing or differing from the one declared);
//! - `GET /api/v1/uploads/{id}` → `{"state", "received", "missing", "task", "sha256", …}`.
//!
//! The sha256 may be left for `complete` so that a client sends while it hashes: the
//! file is read once before its first byte goes out otherwise.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde_json::json;
use uuid::Uuid;

use super::auth::CanWrite;
use crate::uploads::{check_sha256, CreateRequest, UploadError, Uploads};

/// Largest `POST /api/v1/uploads` body (the task's payload is in it).
const MAX_CREATE_BODY: usize = 2 * 1024 * 1024;

/// Largest `complete` body (a sha256 and some room).
const MAX_COMPLETE_BODY: usize = 4096;

/// The body of `complete`: the whole file's sha256, when the upload declared none.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    sha256: Option<String>,
}

impl ResponseError for UploadError {
    fn status_code(&self) -> StatusCode {
        match self {
            UploadError::Invalid(_) => StatusCode::BAD_REQUEST,
            UploadError::NotFound(_) => StatusCode::NOT_FOUND,
            UploadError::Conflict(_) => StatusCode::CONFLICT,
            UploadError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            UploadError::Mismatch(_) | UploadError::Unprocessable { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            UploadError::Quota(_) => StatusCode::INSUFFICIENT_STORAGE,
            UploadError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            UploadError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut r = HttpResponse::build(self.status_code());
        if matches!(
            self,
            UploadError::Timeout(_) | UploadError::TooLarge(_) | UploadError::Mismatch(_)
        ) {
            // The rest of a refused body may still come: this connection is done.
            r.force_close();
        }
        let field = match self {
            UploadError::Unprocessable { field, .. } => Some(*field),
            _ => None,
        };
        r.json(json!({ "error": self.to_string(), "field": field }))
    }
}

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/v1/uploads", web::post().to(create))
        .route("/api/v1/uploads/{id}", web::get().to(show))
        .route("/api/v1/uploads/{id}/complete", web::post().to(complete))
        .route("/api/v1/uploads/{id}/chunks/{n}", web::put().to(put_chunk));
}

fn parse_id(s: &str) -> Result<Uuid, UploadError> {
    Uuid::parse_str(s).map_err(|_| UploadError::NotFound(format!("{s:?} (not an upload id)")))
}

async fn create(
    _: CanWrite,
    body: web::Bytes,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, UploadError> {
    if body.len() > MAX_CREATE_BODY {
        return Err(UploadError::TooLarge(format!(
            "the request is larger than {MAX_CREATE_BODY} bytes"
        )));
    }
    let req: CreateRequest = serde_json::from_slice(&body)
        .map_err(|e| UploadError::Invalid(format!("the request: {e}")))?;
    let meta = uploads.create(req).await?;
    tracing::info!(upload = %meta.id, size = meta.size, chunks = meta.chunks, "upload started");
    Ok(HttpResponse::Created().json(json!({
        "id": meta.id,
        "chunk_size": meta.chunk_size,
        "chunks": meta.chunks,
    })))
}

async fn show(
    _: CanWrite,
    path: web::Path<String>,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, UploadError> {
    let id = parse_id(&path)?;
    Ok(HttpResponse::Ok().json(uploads.progress(id).await?))
}

async fn complete(
    _: CanWrite,
    path: web::Path<String>,
    body: web::Bytes,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, UploadError> {
    let id = parse_id(&path)?;
    if body.len() > MAX_COMPLETE_BODY {
        return Err(UploadError::TooLarge(format!(
            "the request is larger than {MAX_COMPLETE_BODY} bytes"
        )));
    }
    let given = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let b: CompleteBody = serde_json::from_slice(&body)
            .map_err(|e| UploadError::Invalid(format!("the request: {e}")))?;
        b.sha256.as_deref().map(check_sha256).transpose()?
    };
    let task = uploads.complete(id, given).await?;
    Ok(HttpResponse::Ok().json(json!({ "state": "complete", "task": task })))
}

/// A chunk for an upload whose folder is gone: if it was completed (by another request;
/// its task may have run and its file been swept since), nothing is missing and the
/// chunk is acknowledged with the task, as any re-sent chunk of a whole file; else 404.
async fn done_before(
    uploads: &Arc<Uploads>,
    id: Uuid,
    n: u64,
) -> Result<HttpResponse, UploadError> {
    let progress = uploads.progress(id).await?;
    let Some(task) = progress.task else {
        return Err(UploadError::NotFound(id.to_string()));
    };
    Ok(HttpResponse::Ok().force_close().json(json!({
        "ack": true,
        "chunk": n,
        "received": progress.received.len(),
        "missing": [],
        "state": progress.state,
        "task": task,
    })))
}

async fn put_chunk(
    _: CanWrite,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Payload,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, UploadError> {
    let (id, n) = path.into_inner();
    let id = parse_id(&id)?;
    let n: u64 = n.parse().map_err(|_| {
        UploadError::Invalid(format!("chunk {n:?}: expected a chunk number (0, 1, …)"))
    })?;
    let meta = match uploads.meta(id).await {
        Err(UploadError::NotFound(_)) => return done_before(&uploads, id, n).await,
        other => other?,
    };
    let expected = Uploads::chunk_len(&meta, n)?;
    let header = |name: &str| req.headers().get(name).and_then(|h| h.to_str().ok());
    let sha = header("chunk-sha256")
        .and_then(|h| check_sha256(h).ok())
        .ok_or_else(|| {
            UploadError::Invalid(format!(
                "chunk {n}: the Chunk-Sha256 header must hold the chunk's sha256 (64 hex digits)"
            ))
        })?;
    match header("content-length").map(|l| l.trim().parse::<u64>()) {
        Some(Ok(l)) if l > expected => {
            return Err(UploadError::TooLarge(format!(
                "chunk {n}: {l} bytes; this chunk has {expected}"
            )))
        }
        Some(Ok(l)) if l < expected => {
            return Err(UploadError::Invalid(format!(
                "chunk {n}: {l} bytes; this chunk has {expected}"
            )))
        }
        _ => {}
    }
    match uploads.put_chunk(&meta, n, &sha, body).await {
        Err(UploadError::NotFound(_)) => return done_before(&uploads, id, n).await,
        other => other?,
    }
    let mut progress = uploads.progress(id).await?;
    if progress.missing.is_empty() && progress.task.is_none() {
        progress.task = uploads.finish(&meta).await?;
        if progress.task.is_some() {
            progress.state = "complete";
        }
    }
    Ok(HttpResponse::Ok().json(json!({
        "ack": true,
        "chunk": n,
        "received": progress.received.len(),
        "missing": progress.missing,
        "state": progress.state,
        "task": progress.task,
    })))
}

//! `/api/v1/uploads`: large files sent to this worker in chunks, each acknowledged only
//! once it is on disk and fsynced, resumable by asking what is missing. The write scope
//! is required. The work is the store's (`crate::uploads`); this maps it to HTTP, and its
//! refusals to the API's [`ApiError`]. Every worker serves these routes
//! ([`super::worker_routes`]).
//!
//! - `POST /api/v1/uploads` `{"size", "sha256"?, "name"?, "chunk_size"?, "task": {"kind",
//!   "payload"?, "priority"?, "flow"?}}` → 201 `{"id", "chunk_size", "chunks"}` (507 over
//!   quota; 422 `{"error", "field": "task.flow"}` for a flow that is unknown or ended);
//! - `PUT /api/v1/uploads/{id}/chunks/{n}` with `Chunk-Sha256` → 200 `{"ack": true,
//!   "chunk", "received", "missing", "state", "task"}`; 422 if the hash differs (not
//!   stored), for a chunk the upload has not or a body shorter than the chunk;
//! - `POST /api/v1/uploads/{id}/complete` (body `{"sha256"}` when the upload declared
//!   none) → the task, once every chunk is there (with a sha256 declared, the last chunk
//!   does this by itself; 409 when already complete or chunks are missing, 422 for a
//!   sha256 missing or differing from the one declared);
//! - `GET /api/v1/uploads/{id}` → `{"state", "received", "missing", "task", "sha256", …}`.
//!
//! The sha256 may be left for `complete` so that a client sends while it hashes: the
//! file is read once before its first byte goes out otherwise. A 422 without `field`
//! says the content did not match its sha256 (clients rely on it: the whole file's
//! mismatch discards the upload).

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use uuid::Uuid;

use super::{read_body, ApiError};
use crate::http::auth::CanWrite;
use crate::uploads::{check_sha256, CreateRequest, UploadError, Uploads};

/// Largest `POST /api/v1/uploads` body (the task's payload is in it).
const MAX_CREATE_BODY: usize = 2 * 1024 * 1024;

/// Largest `complete` body (a sha256 and some room).
const MAX_COMPLETE_BODY: usize = 4096;

/// The fields a refusal of a declaration or of `complete` may name (its message starts
/// `field: …`).
const FIELDS: &[&str] = &[
    "size",
    "sha256",
    "name",
    "chunk_size",
    "task.kind",
    "task.payload",
    "task.flow",
];

/// The body of `complete`: the whole file's sha256, when the upload declared none.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    sha256: Option<String>,
}

impl From<UploadError> for ApiError {
    fn from(e: UploadError) -> Self {
        let message = e.to_string();
        match e {
            UploadError::Invalid(_) => ApiError::BadRequest {
                field: field_of(&message, FIELDS),
                message,
            },
            UploadError::NotFound(_) => ApiError::NotFound(message),
            UploadError::Conflict(_) => ApiError::Conflict(message),
            UploadError::TooLarge(_) => ApiError::TooLarge(message),
            UploadError::Unprocessable { field, .. } => ApiError::Unprocessable {
                field: Some(field.into()),
                message,
            },
            UploadError::Mismatch(_) => ApiError::Mismatch(message),
            UploadError::Quota(_) => ApiError::InsufficientStorage(message),
            UploadError::Timeout(_) => ApiError::Timeout(message),
            UploadError::Internal(_) => ApiError::Internal(message),
        }
    }
}

/// An upload's id; anything else names no upload (404, as an unknown one).
fn parse_id(s: &str) -> Result<Uuid, UploadError> {
    Uuid::parse_str(s).map_err(|_| UploadError::NotFound(format!("{s:?} (not an upload id)")))
}

pub(super) async fn create(
    _: CanWrite,
    req: HttpRequest,
    body: web::Payload,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, body, MAX_CREATE_BODY).await?;
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

pub(super) async fn show(
    _: CanWrite,
    path: web::Path<String>,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path)?;
    Ok(HttpResponse::Ok().json(uploads.progress(id).await?))
}

pub(super) async fn complete(
    _: CanWrite,
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Payload,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path)?;
    let body = read_body(&req, body, MAX_COMPLETE_BODY).await?;
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
async fn done_before(uploads: &Arc<Uploads>, id: Uuid, n: u64) -> Result<HttpResponse, ApiError> {
    let progress = uploads.progress(id).await?;
    let Some(task) = progress.task else {
        return Err(UploadError::NotFound(id.to_string()).into());
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

pub(super) async fn put_chunk(
    _: CanWrite,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Payload,
    uploads: web::Data<Arc<Uploads>>,
) -> Result<HttpResponse, ApiError> {
    let (id, n) = path.into_inner();
    let id = parse_id(&id)?;
    let n: u64 = n.parse().map_err(|_| {
        ApiError::bad(
            "n",
            format!("chunk {n:?}: expected a chunk number (0, 1, …)"),
        )
    })?;
    let meta = match uploads.meta(id).await {
        Err(UploadError::NotFound(_)) => return done_before(&uploads, id, n).await,
        other => other?,
    };
    // How many bytes chunk n takes, and whether there is one, depend on the upload, not
    // on the request's form: refused (422), not malformed.
    let expected = Uploads::chunk_len(&meta, n).map_err(|e| match e {
        UploadError::Invalid(message) => ApiError::Unprocessable {
            field: Some("n".into()),
            message,
        },
        e => e.into(),
    })?;
    let header = |name: &str| req.headers().get(name).and_then(|h| h.to_str().ok());
    let sha = header("chunk-sha256")
        .and_then(|h| check_sha256(h).ok())
        .ok_or_else(|| {
            ApiError::bad(
                "Chunk-Sha256",
                format!(
                    "chunk {n}: the Chunk-Sha256 header must hold the chunk's sha256 \
                     (64 hex digits)"
                ),
            )
        })?;
    match header("content-length").map(|l| l.trim().parse::<u64>()) {
        Some(Ok(l)) if l > expected => {
            return Err(ApiError::TooLarge(format!(
                "chunk {n}: {l} bytes; this chunk has {expected}"
            )))
        }
        Some(Ok(l)) if l < expected => {
            return Err(ApiError::Unprocessable {
                field: Some("body".into()),
                message: format!("chunk {n}: {l} bytes; this chunk has {expected}"),
            })
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

/// The field a refusal's message starts with (`size: …`), when it is one of `fields`.
fn field_of(message: &str, fields: &[&str]) -> Option<String> {
    let (head, _) = message.split_once(':')?;
    fields.contains(&head).then(|| head.to_string())
}

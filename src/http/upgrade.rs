//! `PUT|POST /upgrade`: the raw bundle ZIP (`curl -T bundle.zip`) or a multipart form
//! upload. Authenticates, refuses a second upgrade while one runs, streams the body to a
//! fresh private folder (size-capped), and runs the handover; on success this process
//! then drains itself (SIGUSR2), exactly as an operator's SIGUSR2 would.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde_json::json;

use crate::hot_upgrade::{UpgradeError, Upgrader};

/// Largest upload accepted (the bundle's own limits are checked when it is unpacked).
pub const MAX_UPLOAD: u64 = 300 * 1024 * 1024;

/// The route.
pub async fn upgrade(
    req: HttpRequest,
    mut body: web::Payload,
    upgrader: web::Data<Arc<Upgrader>>,
) -> HttpResponse {
    let received = Instant::now();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok());
    if let Err(e) = upgrader.authorize(auth) {
        return error_response(e);
    }
    if upgrader
        .in_progress
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return error_response(UpgradeError::InProgress);
    }
    struct Release<'a>(&'a Upgrader);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.in_progress.store(false, Ordering::Release);
        }
    }
    let _release = Release(&upgrader);

    let incoming = match upgrader.fresh_dir("incoming") {
        Ok(d) => d,
        Err(e) => return error_response(UpgradeError::Internal(format!("upload folder: {e}"))),
    };
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(incoming.clone());
    let raw = incoming.join("upload");
    let mut file = match std::fs::File::create(&raw) {
        Ok(f) => f,
        Err(e) => return error_response(UpgradeError::Internal(format!("upload file: {e}"))),
    };
    let mut size: u64 = 0;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                return error_response(UpgradeError::BadBundle(format!("reading the upload: {e}")))
            }
        };
        size += chunk.len() as u64;
        if size > MAX_UPLOAD {
            return error_response(UpgradeError::TooLarge(MAX_UPLOAD));
        }
        if let Err(e) = file.write_all(&chunk) {
            return error_response(UpgradeError::Internal(format!("writing the upload: {e}")));
        }
    }
    drop(file);
    if size == 0 {
        return error_response(UpgradeError::BadBundle(
            "empty body: send the bundle ZIP (curl -T bundle.zip) or a multipart form".into(),
        ));
    }
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let zip = if content_type.starts_with("multipart/form-data") {
        match extract_multipart(&raw, content_type, &incoming.join("bundle.zip")) {
            Ok(p) => p,
            Err(e) => return error_response(UpgradeError::BadBundle(e)),
        }
    } else {
        raw
    };
    match upgrader.upgrade(&zip, received).await {
        Ok(report) => {
            if report.status == "upgraded" {
                // Drain exactly as an operator's SIGUSR2 would; the HTTP server finishes
                // this response before it stops.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGUSR2);
            }
            HttpResponse::Ok().json(report)
        }
        Err(e) => error_response(e),
    }
}

/// The first file part of a multipart/form-data body, written to `out`.
fn extract_multipart(
    raw: &std::path::Path,
    content_type: &str,
    out: &std::path::Path,
) -> Result<std::path::PathBuf, String> {
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_string())
        .ok_or("multipart upload without a boundary")?;
    let data = std::fs::read(raw).map_err(|e| format!("reading the upload: {e}"))?;
    let delim = format!("--{boundary}");
    let mut rest: &[u8] = &data;
    while let Some(start) = find(rest, delim.as_bytes()) {
        rest = &rest[start + delim.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let Some(head_end) = find(rest, b"\r\n\r\n") else {
            break;
        };
        let headers = String::from_utf8_lossy(&rest[..head_end]).to_ascii_lowercase();
        let content = &rest[head_end + 4..];
        let end = find(content, format!("\r\n{delim}").as_bytes())
            .ok_or("multipart part without its closing boundary")?;
        if headers.contains("filename=") {
            std::fs::write(out, &content[..end]).map_err(|e| format!("writing the bundle: {e}"))?;
            return Ok(out.to_path_buf());
        }
        rest = &content[end..];
    }
    Err("multipart upload without a file part".into())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn error_response(e: UpgradeError) -> HttpResponse {
    let (status, body) = match e {
        UpgradeError::NotConfigured(m) => (StatusCode::FORBIDDEN, json!({ "error": m })),
        UpgradeError::Unauthorized => (
            StatusCode::UNAUTHORIZED,
            json!({ "error": "missing or wrong bearer token (Authorization: Bearer …)" }),
        ),
        UpgradeError::InProgress => (
            StatusCode::CONFLICT,
            json!({ "error": "another upgrade is in progress on this worker" }),
        ),
        UpgradeError::TooLarge(max) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({ "error": format!("bundle larger than {max} bytes") }),
        ),
        UpgradeError::BadBundle(m) => (
            StatusCode::BAD_REQUEST,
            json!({ "error": format!("bundle refused: {m}"), "status": "refused" }),
        ),
        UpgradeError::RolledBack {
            why,
            child_pid,
            elapsed_ms,
        } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({
                "status": "rolled_back",
                "error": why,
                "old_pid": std::process::id(),
                "new_pid": child_pid,
                "elapsed_ms": elapsed_ms,
            }),
        ),
        UpgradeError::Internal(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": m, "status": "not_started" }),
        ),
    };
    HttpResponse::build(status).json(body)
}

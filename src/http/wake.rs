//! `POST /wake`: a planner's push of this worker's wake-ups (see `artex_actors::waker`
//! and docs/design.md, "Wake-ups"). The body is a JSON array of the payloads a NOTIFY on
//! the worker's channel would have carried (tasks, a plain "look again", `cancel`); the
//! bearer token is the blackboard's wake secret, and `Artex-Worker` names the worker it
//! is for: during a hot upgrade two processes serve this port, and the one that is not
//! that worker answers 421 (the planner sends it again on a new connection). 204 once
//! the worker actor has it.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use artex_actors::worker::WakeUps;

use super::AppState;
use crate::tokens;

/// The largest push accepted: the tasks a worker of the deepest queue (a few thousand
/// slots) is given in one round, carried at under 1 KB each.
pub const MAX_WAKE_BYTES: usize = 8 << 20;

/// Who this process's worker is, and the secret pushes must carry.
#[derive(Clone)]
pub struct WakeTarget {
    /// The worker's id.
    pub worker: String,
    /// `artex.blackboard.wake_secret`.
    pub secret: String,
}

/// The route.
pub async fn wake(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
    target: web::Data<WakeTarget>,
) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|h| h.to_str().ok());
    let authorized = tokens::bearer(header("authorization"))
        .is_some_and(|given| tokens::matches(given, &target.secret));
    if !authorized {
        return answer(
            StatusCode::UNAUTHORIZED,
            "missing or wrong wake secret (Authorization: Bearer …)",
        );
    }
    if header("artex-worker") != Some(target.worker.as_str()) {
        return answer(
            StatusCode::MISDIRECTED_REQUEST,
            &format!(
                "this is worker {}, not {}",
                target.worker,
                header("artex-worker").unwrap_or("(no Artex-Worker header)")
            ),
        );
    }
    let payloads: Vec<String> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return answer(
                StatusCode::BAD_REQUEST,
                &format!("body: expected a JSON array of strings: {e}"),
            )
        }
    };
    match state.worker.try_send(WakeUps {
        payloads,
        pushed: true,
    }) {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the worker cannot take wake-ups now: {e}"),
        ),
    }
}

fn answer(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": message, "field": null }))
}

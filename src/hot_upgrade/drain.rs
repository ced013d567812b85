//! The drain of the old process once the listener pass is done: the successor accepts on
//! the same socket, so this process stops accepting first and only then stops serving,
//! while its worker finishes the tasks that stayed.

use std::time::Duration;

use actix_web::dev::ServerHandle;

/// After the listener pass, how long connections this process accepted get to send their
/// request before it stops serving HTTP.
pub const ACCEPT_GRACE: Duration = Duration::from_millis(500);

/// Stops this process's HTTP server after a listener pass. The successor takes every new
/// connection from the shared accept queue once this one pauses; connections accepted
/// here a moment ago may not have sent their request yet, and a graceful stop would
/// close them as idle, so they get [`ACCEPT_GRACE`] to arrive; then the server stops
/// (requests in flight finish, idle keep-alive connections close).
pub async fn stop_serving(handle: &ServerHandle) {
    handle.pause().await;
    tokio::time::sleep(ACCEPT_GRACE).await;
    handle.stop(true).await;
}

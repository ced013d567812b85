//! The new process's side of the handover: it says `Hello`, learns where it will serve,
//! registers, says `Ready`, receives the listening socket, serves, takes the transferred
//! tasks over, moves into the process group it is told to, and says `TakenOver`.
//! [`crate::runtime::run_worker`] calls these steps in that order, between its own
//! (registering, starting the HTTP server).

use std::path::Path;

use actix::Addr;
use artex_actors::worker::{ResumeReport, ResumeTasks, Worker};
use artex_upgrade::channel::{self, Channel};
use artex_upgrade::spawn;

use super::protocol::{HandoverError, Msg};

/// This process's handover channel to the process that spawned it.
pub struct Successor {
    ch: Channel,
}

impl Successor {
    /// The handover channel, from `ARTEX_HANDOVER_SOCKET`, when this process was spawned
    /// by an upgrade (or by `artex master`); `Hello` is said on it.
    pub async fn connect_if_spawned() -> Result<Option<Successor>, HandoverError> {
        let Some(path) = std::env::var_os(spawn::CHANNEL_ENV) else {
            return Ok(None);
        };
        let mut ch = channel::connect(Path::new(&path)).await?;
        ch.send(
            &Msg::Hello {
                pid: std::process::id(),
                version: crate::VERSION.to_string(),
                protocol: channel::PROTOCOL_VERSION,
            },
            &[],
        )
        .await?;
        Ok(Some(Successor { ch }))
    }

    /// Receives `Welcome`: (HTTP address, old worker id).
    pub async fn welcome(&mut self) -> Result<(String, String), HandoverError> {
        match self.ch.recv::<Msg>().await? {
            (
                Msg::Welcome {
                    http_addr,
                    old_worker,
                },
                _,
            ) => Ok((http_addr, old_worker)),
            (m, _) => Err(HandoverError::unexpected("welcome", &m)),
        }
    }

    /// Says `Ready` (registered as `worker_id`) and receives the listening socket.
    pub async fn ready(&mut self, worker_id: &str) -> Result<std::net::TcpListener, HandoverError> {
        self.ch
            .send(
                &Msg::Ready {
                    worker_id: worker_id.into(),
                },
                &[],
            )
            .await?;
        match self.ch.recv::<Msg>().await? {
            (Msg::Listener, mut fds) if fds.len() == 1 => {
                Ok(std::net::TcpListener::from(fds.remove(0)))
            }
            (m, fds) => Err(HandoverError::unexpected(
                format!("the listener with one fd ({} came)", fds.len()),
                &m,
            )),
        }
    }

    /// Says `Serving`, receives the transfer, has `worker` take the tasks over, says
    /// `TakenOver`.
    pub async fn take_over(
        &mut self,
        worker: &Addr<Worker>,
    ) -> Result<ResumeReport, HandoverError> {
        self.ch.send(&Msg::Serving, &[]).await?;
        artex_actors::supervisor::failpoint("handover_after_ready");
        let (from, tasks, join_group) = match self.ch.recv::<Msg>().await? {
            (
                Msg::Transfer {
                    from,
                    tasks,
                    join_group,
                },
                _,
            ) => (from, tasks, join_group),
            (m, _) => return Err(HandoverError::unexpected("transfer", &m)),
        };
        let report = if tasks.is_empty() {
            ResumeReport::default()
        } else {
            worker
                .send(ResumeTasks { from, tasks })
                .await
                .map_err(|source| HandoverError::Actor {
                    step: "taking the tasks over",
                    source,
                })?
                .map_err(|source| HandoverError::Blackboard {
                    step: "taking the tasks over",
                    source,
                })?
        };
        // Before `TakenOver`, so the predecessor cannot have drained and left the group
        // by then; failing here fails the handover, which rolls back: better than living
        // on in a group no supervisor looks at.
        if let Some(pgid) = join_group {
            spawn::join_group(pgid).map_err(HandoverError::ProcessGroup)?;
            tracing::info!(pgid, "joined the previous generation's process group");
        }
        self.ch
            .send(
                &Msg::TakenOver {
                    report: report.clone(),
                },
                &[],
            )
            .await?;
        Ok(report)
    }
}

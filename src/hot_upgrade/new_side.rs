//! The new process's side of the upgrade channel: it says `Hello`, learns where it will
//! serve, registers, says `Ready`, receives the listening socket (the listener pass),
//! serves, takes the transferred tasks over (the task transfer), moves into the process
//! group it is told to, says `TakenOver`, and tells systemd it is the main process now
//! (the main-PID pass). The worker's run calls these steps in that order, between its own
//! (registering, starting the HTTP server).

use std::path::Path;

use actix::Addr;
use artex_actors::worker::{ResumeReport, ResumeTasks, Worker};
use artex_upgrade::channel::{self, Channel};
use artex_upgrade::spawn;

use super::channel::{ChannelError, Msg};
use crate::process::notify_service;

/// Whether this process was spawned by a hot upgrade (or by `artex master`): it then
/// receives its listening socket over the upgrade channel instead of binding one.
pub fn spawned_by_upgrade() -> bool {
    std::env::var_os(spawn::CHANNEL_ENV).is_some()
}

/// This process's upgrade channel to the process that spawned it.
pub struct NewSide {
    ch: Channel,
}

impl NewSide {
    /// The upgrade channel, from `ARTEX_HANDOVER_SOCKET` ([`spawn::CHANNEL_ENV`]), when
    /// this process was spawned by an upgrade (or by `artex master`); `Hello` is said on
    /// it.
    pub async fn connect_if_spawned() -> Result<Option<NewSide>, ChannelError> {
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
        Ok(Some(NewSide { ch }))
    }

    /// Receives `Welcome`: (HTTP address, old worker id).
    pub async fn welcome(&mut self) -> Result<(String, String), ChannelError> {
        match self.ch.recv::<Msg>().await? {
            (
                Msg::Welcome {
                    http_addr,
                    old_worker,
                },
                _,
            ) => Ok((http_addr, old_worker)),
            (m, _) => Err(ChannelError::unexpected("welcome", &m)),
        }
    }

    /// The listener pass, new side: says `Ready` (registered as `worker_id`) and receives
    /// the listening socket.
    pub async fn receive_listener(
        &mut self,
        worker_id: &str,
    ) -> Result<std::net::TcpListener, ChannelError> {
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
            (m, fds) => Err(ChannelError::unexpected(
                format!("the listener with one fd ({} came)", fds.len()),
                &m,
            )),
        }
    }

    /// The task transfer, new side: says `Serving`, receives `Transfer`, has `worker`
    /// take the tasks over, says `TakenOver`; then the main-PID pass (under systemd,
    /// `Type=notify` and `NotifyAccess=all`, this process is the service now).
    pub async fn take_tasks(mut self, worker: &Addr<Worker>) -> Result<ResumeReport, ChannelError> {
        self.ch.send(&Msg::Serving, &[]).await?;
        artex_actors::supervisor::failpoint("after_listener_pass");
        let (from, tasks, join_group) = match self.ch.recv::<Msg>().await? {
            (
                Msg::Transfer {
                    from,
                    tasks,
                    join_group,
                },
                _,
            ) => (from, tasks, join_group),
            (m, _) => return Err(ChannelError::unexpected("transfer", &m)),
        };
        artex_actors::supervisor::delay_point("before_take_over").await;
        let report = if tasks.is_empty() {
            ResumeReport::default()
        } else {
            worker
                .send(ResumeTasks { from, tasks })
                .await
                .map_err(|source| ChannelError::Actor {
                    step: "taking the tasks over",
                    source,
                })?
                .map_err(|source| ChannelError::Blackboard {
                    step: "taking the tasks over",
                    source,
                })?
        };
        // Before `TakenOver`, so the predecessor cannot have drained and left the group
        // by then; failing here fails the upgrade, which rolls back: better than living
        // on in a group no supervisor looks at.
        if let Some(pgid) = join_group {
            spawn::join_group(pgid).map_err(ChannelError::ProcessGroup)?;
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
        tracing::info!(
            resumed = report.resumed.len(),
            conflicts = report.conflicts.len(),
            "task transfer done: took over from the previous generation"
        );
        notify_service(artex_upgrade::notify::mainpid(std::process::id()));
        Ok(report)
    }
}

#[cfg(test)]
mod fuzz;

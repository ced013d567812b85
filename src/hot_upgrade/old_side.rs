//! The old side of the upgrade channel with a spawned child, step by step (hello, ready,
//! listener pass, task transfer), each step bounded by the child's exit and one deadline.
//! Used by hot upgrades (the upgrader) and by `artex master` (which passes a listener
//! and transfers no tasks).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use artex_actors::worker::ResumeReport;
use artex_upgrade::channel::{self, Channel, ChannelListener};
use uuid::Uuid;

use super::channel::{describe_exit, ChannelError, Msg};

/// An upgrade in progress, seen from the process that gives its place up.
pub struct OldSide<'a> {
    ch: Channel,
    child: &'a mut tokio::process::Child,
    deadline: tokio::time::Instant,
    /// Where the exchange is, for the message if the child exits now.
    step: &'static str,
}

impl<'a> OldSide<'a> {
    /// Accepts the child's connection (its pid checked) and its `Hello`.
    pub async fn accept(
        listener: &ChannelListener,
        child: &'a mut tokio::process::Child,
        pid: u32,
        deadline: tokio::time::Instant,
    ) -> Result<OldSide<'a>, ChannelError> {
        let ch = tokio::select! {
            r = listener.accept(pid) => r?,
            st = child.wait() => return Err(ChannelError::ChildExited {
                step: "before connecting",
                status: describe_exit(st),
            }),
            _ = tokio::time::sleep_until(deadline) => return Err(ChannelError::Timeout { step: "connect" }),
        };
        let mut old = OldSide {
            ch,
            child,
            deadline,
            step: "before the listener pass",
        };
        match old.recv().await? {
            Msg::Hello { protocol, .. } if protocol == channel::PROTOCOL_VERSION => Ok(old),
            m => Err(ChannelError::unexpected(
                format!("hello with protocol {}", channel::PROTOCOL_VERSION),
                &m,
            )),
        }
    }

    /// `Welcome` → `Ready`: returns the new worker's id (it is registered).
    pub async fn ready(
        &mut self,
        http_addr: &str,
        old_worker: &str,
    ) -> Result<String, ChannelError> {
        self.send(
            &Msg::Welcome {
                http_addr: http_addr.into(),
                old_worker: old_worker.into(),
            },
            &[],
        )
        .await?;
        match self.recv().await? {
            Msg::Ready { worker_id } => Ok(worker_id),
            m => Err(ChannelError::unexpected("ready", &m)),
        }
    }

    /// The listener pass: `Listener` (the socket passed with SCM_RIGHTS) → `Serving`.
    pub async fn pass_listener(&mut self, listener: BorrowedFd<'_>) -> Result<(), ChannelError> {
        self.step = "during the listener pass";
        self.send(&Msg::Listener, &[listener]).await?;
        match self.recv().await? {
            Msg::Serving => Ok(()),
            m => Err(ChannelError::unexpected("serving", &m)),
        }
    }

    /// The task transfer: `Transfer` → `TakenOver`, what the child took over. With
    /// `join_group`, the child moves into that process group before it answers.
    pub async fn transfer(
        &mut self,
        from: &str,
        tasks: Vec<(Uuid, i64)>,
        join_group: Option<u32>,
    ) -> Result<ResumeReport, ChannelError> {
        self.step = "during the task transfer";
        self.send(
            &Msg::Transfer {
                from: from.into(),
                tasks,
                join_group,
            },
            &[],
        )
        .await?;
        match self.recv().await? {
            Msg::TakenOver { report } => Ok(report),
            m => Err(ChannelError::unexpected("taken_over", &m)),
        }
    }

    async fn send(&mut self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        match self.ch.send(msg, fds).await {
            Ok(()) => Ok(()),
            // A child that dies right after a message can break the next send before its
            // exit is seen (EPIPE): say how it died, as `recv` does.
            Err(e) => Err(self.died_or(e, ChannelError::Channel).await),
        }
    }

    async fn recv(&mut self) -> Result<Msg, ChannelError> {
        let step = self.step;
        let exited = |st| ChannelError::ChildExited {
            step,
            status: describe_exit(st),
        };
        tokio::select! {
            r = self.ch.recv::<Msg>() => match r {
                Ok((m, _)) => Ok(m),
                Err(e) => Err(self.died_or(e, ChannelError::Broken).await),
            },
            st = self.child.wait() => Err(exited(st)),
            _ = tokio::time::sleep_until(self.deadline) => Err(ChannelError::Timeout { step: "get ready" }),
        }
    }

    /// After the channel failed with `e`: how the child exited, if it does within a
    /// second (a broken channel usually means it died), else `otherwise(e)`.
    async fn died_or(
        &mut self,
        e: artex_upgrade::Error,
        otherwise: fn(artex_upgrade::Error) -> ChannelError,
    ) -> ChannelError {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(st) => ChannelError::ChildExited {
                step: self.step,
                status: describe_exit(st),
            },
            Err(_) => otherwise(e),
        }
    }
}

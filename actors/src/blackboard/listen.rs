//! LISTEN/NOTIFY: wake-ups sent after a write, one LISTEN session ([`Listener`]), and a
//! session that reconnects by itself and says when to catch up ([`ListenSession`]), the
//! one loop every follower of notifications (scanner, worker, …) runs.
//!
//! Notifications are hints, never the record: one sent while a session was down is lost,
//! so whoever listens rescans the tables after every (re)connect, and polls as well.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, NoTls};

use super::Blackboard;
use crate::error::{Error, Result};

const WAKE_SECRET: &str = "select wake_secret from artex.blackboard";

// One statement sends a payload on every channel: empty for a wake-up ("look again"),
// `at:<Unix ms>` for tasks due later (`due_at`).
const NOTIFY_CHANNELS: &str = "select count(pg_notify(c, $2)) from unnest($1::text[]) c";

/// A notification received on a LISTEN session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The channel it was sent on.
    pub channel: String,
    /// Its payload: empty for a plain wake-up, `cancel` for a worker's canceled task
    /// (see [`super::CANCEL_PAYLOAD`]).
    pub payload: String,
}

impl Blackboard {
    /// Opens a dedicated session that LISTENs on `channels`. LISTEN needs a session of its
    /// own (so pgbouncer must run in session mode for it); notifications are wake-up hints,
    /// never the record: when the session drops, `Listener::recv` returns `None` and the
    /// owner reconnects and rescans the tables. [`Blackboard::listen_session`] does that
    /// reconnecting.
    pub(crate) async fn listen(&self, channels: &[String]) -> Result<Listener> {
        self.listen_as(channels, None).await
    }

    /// [`Blackboard::listen`] with the session's `application_name` set to `name`, so
    /// that others can tell from `pg_stat_activity` whether it is there (a worker's
    /// session: see [`Registration::session`](super::Registration::session)).
    pub(crate) async fn listen_as(
        &self,
        channels: &[String],
        name: Option<&str>,
    ) -> Result<Listener> {
        let mut config = self.listen_config.clone();
        if let Some(name) = name {
            config.application_name(name);
        }
        // The connect timeout covers the TCP connect only; a server that accepts and
        // never answers must not hang the session's owner either.
        let (client, mut connection) =
            tokio::time::timeout(self.limits.connect_timeout, config.connect(NoTls))
                .await
                .map_err(|_| Error::Timeout {
                    what: "opening a LISTEN session",
                    after: self.limits.connect_timeout,
                })??;
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = stream.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        let n = Notification {
                            channel: n.channel().to_string(),
                            payload: n.payload().to_string(),
                        };
                        if tx.send(Ok(n)).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "listening session ended");
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            }
        });
        let mut sql = String::new();
        for c in channels {
            sql.push_str(&format!("listen {};", super::sql::quote_ident(c)));
        }
        // The session's settings, then its channels, pipelined: one round trip, and the
        // session shows its LISTENs as its last statement (pg_stat_activity.query).
        let (set, listened) = futures_util::future::join(
            client.batch_execute(&self.settings),
            client.batch_execute(&sql),
        )
        .await;
        set?;
        listened?;
        Ok(Listener {
            _client: client,
            rx,
            driver,
            ended: None,
        })
    }

    /// A LISTEN session on `channels` that reconnects by itself; `owner` names it in the
    /// logs (e.g. `planner`). Nothing connects until the first [`ListenSession::next`].
    pub(crate) fn listen_session<S: AsRef<str>>(
        &self,
        owner: impl Into<String>,
        channels: &[S],
    ) -> ListenSession {
        ListenSession {
            bb: self.clone(),
            name: None,
            owner: owner.into(),
            channels: channels.iter().map(|c| c.as_ref().to_string()).collect(),
            listener: None,
            backoff: ListenSession::MIN_BACKOFF,
            retry_at: None,
        }
    }

    /// The bearer token of planners' wake-up pushes to workers (migrations/V14).
    pub(crate) async fn wake_secret(&self) -> Result<String> {
        let client = self.client().await?;
        Ok(client.query_one(WAKE_SECRET, &[]).await?.try_get(0)?)
    }

    /// Sends the wake-ups of a hot-path write right after its commit (see
    /// migrations/V3__batched_hot_path.sql), in a transaction that does not wait for
    /// the WAL flush, on a task of its own: the writer goes on without waiting. A wake-up
    /// is a hint and its readers poll as well, so a failure is logged, not returned: the
    /// write it follows has committed.
    pub(crate) fn wake(&self, channels: &[&str]) {
        self.notify(channels, "")
    }

    /// Sends `payload` on `channels` as [`wake`](Self::wake) sends its wake-ups.
    pub(crate) fn notify(&self, channels: &[&str], payload: &str) {
        if channels.is_empty() {
            return;
        }
        let channels: Vec<String> = channels.iter().map(|c| c.to_string()).collect();
        let payload = payload.to_string();
        let bb = self.clone();
        tokio::spawn(async move {
            let sent = async {
                let client = bb.relaxed_client().await?;
                client
                    .relaxed(NOTIFY_CHANNELS, &[&channels, &payload])
                    .await?;
                Ok::<_, Error>(())
            };
            if let Err(e) = sent.await {
                tracing::warn!(error = %e, ?channels, "cannot send wake-ups; readers will find the change at their next poll");
            }
        });
    }
}

/// A LISTEN session on a connection of its own; see [`FeedBoard::listen`](super::FeedBoard::listen).
pub struct Listener {
    _client: tokio_postgres::Client,
    rx: mpsc::UnboundedReceiver<std::result::Result<Notification, tokio_postgres::Error>>,
    driver: tokio::task::JoinHandle<()>,
    /// Why the session ended, once it did with an error.
    ended: Option<Error>,
}

impl Listener {
    /// The next notification, or `None` once the session is gone.
    pub async fn recv(&mut self) -> Option<Notification> {
        match self.rx.recv().await? {
            Ok(n) => Some(n),
            Err(e) => {
                self.ended = Some(e.into());
                None
            }
        }
    }

    /// Takes every notification already received, without waiting (they all mean "look
    /// again"; a worker also looks for `cancel` payloads among them).
    pub fn drain_pending(&mut self) -> Vec<Notification> {
        let mut pending = Vec::new();
        while let Ok(n) = self.rx.try_recv() {
            match n {
                Ok(n) => pending.push(n),
                Err(e) => {
                    // The next `recv` says the session is gone.
                    self.ended = Some(e.into());
                    break;
                }
            }
        }
        pending
    }

    /// Why the session ended (after `recv` returned `None`).
    fn end_reason(&mut self) -> Error {
        self.ended.take().unwrap_or(Error::ListenClosed)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// What a [`ListenSession`] reports, in order: `Connected`, any number of `Notified`,
/// then `Lost` when the session drops, and `Connected` again once it is back.
#[derive(Debug)]
pub enum ListenEvent {
    /// The session is (re)connected and listening. Notifications sent while it was away
    /// are lost: run a catch-up round now.
    Connected,
    /// Notifications arrived: the first one and every other already received, at least
    /// one.
    Notified(Vec<Notification>),
    /// The session dropped or could not be opened (logged already); the next call
    /// reconnects after a backoff (100 ms, doubling, at most 2 s).
    Lost(Error),
}

/// A LISTEN session that reconnects forever, with backoff; made by the `listen_session`
/// of the role that needs one (the planner's, a worker's, the feed's). Call
/// [`ListenSession::next`] in a loop:
///
/// ```no_run
/// # async fn follow(bb: artex_actors::Blackboard) {
/// use artex_actors::blackboard::{ListenEvent, TASKS_CHANNEL};
///
/// let mut session = bb.planner().listen_session("planner", &[TASKS_CHANNEL]);
/// loop {
///     match session.next().await {
///         // Connected: notifications may have been missed; look at the tables.
///         ListenEvent::Connected | ListenEvent::Notified(_) => { /* rescan */ }
///         ListenEvent::Lost(_) => {}
///     }
/// }
/// # }
/// ```
pub struct ListenSession {
    bb: Blackboard,
    /// The session's `application_name`, when it must be recognizable.
    name: Option<String>,
    owner: String,
    channels: Vec<String>,
    listener: Option<Listener>,
    /// The wait before the next reconnect after a loss.
    backoff: Duration,
    /// No reconnect before this (set when the session was lost).
    retry_at: Option<Instant>,
}

impl std::fmt::Debug for ListenSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenSession")
            .field("owner", &self.owner)
            .field("channels", &self.channels)
            .field("connected", &self.listener.is_some())
            .finish()
    }
}

impl ListenSession {
    /// The first wait before reconnecting, and the wait after a successful connect.
    pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
    /// The longest wait before reconnecting.
    pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

    /// Waits for the next event: connects (after the backoff, if the session was lost)
    /// or waits for notifications. Cancel-safe: it may be one branch of a
    /// `tokio::select!` (with a poll timer, say); nothing is lost by dropping its future.
    pub async fn next(&mut self) -> ListenEvent {
        if let Some(listener) = self.listener.as_mut() {
            return match listener.recv().await {
                Some(first) => {
                    let mut batch = vec![first];
                    batch.extend(listener.drain_pending());
                    ListenEvent::Notified(batch)
                }
                None => {
                    let e = listener.end_reason();
                    self.listener = None;
                    tracing::warn!(owner = %self.owner, error = %e, "LISTEN session dropped; reconnecting");
                    self.lost(e)
                }
            };
        }
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
        }
        match self
            .bb
            .listen_as(&self.channels, self.name.as_deref())
            .await
        {
            Ok(listener) => {
                self.listener = Some(listener);
                self.backoff = Self::MIN_BACKOFF;
                self.retry_at = None;
                ListenEvent::Connected
            }
            Err(e) => {
                tracing::warn!(owner = %self.owner, error = %e, "cannot LISTEN; retrying");
                self.lost(e)
            }
        }
    }

    /// The same session, opened with `application_name` = `name` (see
    /// `Blackboard::listen_as`).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Schedules the next reconnect and reports the loss.
    fn lost(&mut self, e: Error) -> ListenEvent {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
        ListenEvent::Lost(e)
    }
}

//! The Waker: the planner's side of wake-ups pushed over HTTP (migrations/V14,
//! docs/design.md "Wake-ups"). A worker of this build holds no LISTEN session; the
//! planner that assigned it tasks pushes what its NOTIFY would have carried to its HTTP
//! port (`POST /wake`), over a keep-alive connection of its own per worker, with the
//! blackboard's wake secret as bearer token.
//!
//! A push that cannot be delivered (connection refused or reset, no answer within
//! [`PUSH_TIMEOUT`], an error status) makes the worker **unreachable** for this planner,
//! and the blackboard records since when (`workers.wake_failed_at`, migrations/V23). When
//! the push was **refused** (no process listens at the worker's address: it is gone, and
//! its handlers with it), its announced tasks that it has not started go back to
//! `pending` at once (a compare-and-set: a start it wrote first wins). Any other failure
//! (a timeout, a reset, an error status) may come from a worker that read its tasks, by
//! this push or its poll, and runs them with their start not written yet: those stay
//! its until a probe is refused, and come back through their leases if none is (the
//! model check found the overlap a recall on any failure allows: docs/model.md). A
//! killed worker's push can be reset rather than refused — its listening socket takes
//! the connection while the process is torn down — and its next probe, a second later,
//! is refused. The planner's rounds give it nothing
//! (the roster excludes it), and the Waker probes it every [`PROBE_EVERY`] with a plain
//! wake-up until one is answered. A killed worker is so excluded by the first round
//! after its death, as its vanished LISTEN backend used to exclude it.
//!
//! A worker heard from since its pushes began to fail (its heartbeat's `last_seen` past
//! `wake_failed_at`) is alive where this planner cannot reach it — `--http
//! 127.0.0.1:PORT` on another host, a network namespace of its own: it is **polling**.
//! The rounds give it work again, its pushes are set aside (it reads its assignments at
//! its poll, within `PUSHED_POLL`), and the probes go on: when one is answered, pushes
//! resume and the record is cleared. The worker reads the record with its heartbeat and
//! says so (its log, `/health`, the roster).
//!
//! Pushes to one worker go in order, one request at a time; pushes that queue up meanwhile
//! go together in the next request. Between pushes the link watches its connection: one
//! the worker closed (it died, or its keep-alive ended) is closed at once, and a link with
//! nothing to push for [`FORGET_AFTER`] ends, so workers that died hold no descriptor
//! (the hour-long soak found a planner keeping one per killed worker). A push is a hint like a NOTIFY: the worker's poll
//! finds what a planner that died between its commit and its push left announced.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::blackboard::{PlannerBoard, Push, CANCEL_PAYLOAD};

/// How long to reach a worker's port.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a worker has to answer a push: a process that is alive answers at once, but
/// on a host starved of CPU (hundreds of workers starting on two cores) it may take
/// seconds; a killed one is refused at once, whatever this is.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an unreachable worker is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A worker unreachable this long is forgotten (its link ends): a worker that comes back
/// registers under a new id. A link with nothing to push this long ends too; a worker
/// still in the roster is greeted again (`greet`).
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// The largest answer head read from a worker.
const MAX_HEAD: usize = 8 * 1024;

/// The planner's pushes: cheap to clone, shared by the Assigner and the Scanner.
#[derive(Clone)]
pub struct Waker {
    inner: Arc<Inner>,
}

struct Inner {
    bb: PlannerBoard,
    /// This planner's name in the history (recalled tasks).
    actor: String,
    secret: Mutex<String>,
    /// Each known worker's queue of pushes (its link task reads it) and address.
    links: Mutex<HashMap<String, Link>>,
    /// Workers whose last push failed: whether each is polling (heard from since its
    /// pushes began to fail, so given work that it reads at its poll).
    unreachable: Mutex<HashMap<String, bool>>,
    /// Workers whose last push or probe was refused: no process listens there.
    refused: Mutex<HashSet<String>>,
    /// Pushes that failed (`/metrics`).
    failed: crate::metrics::Counter,
}

struct Link {
    addr: String,
    tx: mpsc::UnboundedSender<Push>,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("unreachable", &self.unreachable())
            .field("polling", &self.polling())
            .finish()
    }
}

impl Waker {
    /// Pushes that failed since the start.
    pub fn pushes_failed(&self) -> u64 {
        self.inner.failed.get()
    }

    /// A Waker pushing as `actor`, with the blackboard's wake secret (read now).
    pub async fn start(bb: PlannerBoard, actor: impl Into<String>) -> crate::Result<Waker> {
        let secret = bb.wake_secret().await?;
        Ok(Waker {
            inner: Arc::new(Inner {
                bb,
                actor: actor.into(),
                secret: Mutex::new(secret),
                links: Mutex::new(HashMap::new()),
                unreachable: Mutex::new(HashMap::new()),
                refused: Mutex::new(HashSet::new()),
                failed: Default::default(),
            }),
        })
    }

    /// The workers whose last push failed and that have not been heard from since
    /// their pushes began to fail: the rounds give them nothing.
    pub fn unreachable(&self) -> Vec<String> {
        lock(&self.inner.unreachable)
            .iter()
            .filter(|(_, polling)| !**polling)
            .map(|(w, _)| w.clone())
            .collect()
    }

    /// The workers pushes do not reach that are alive (heard from since): the rounds
    /// give them work, which they read at their poll.
    pub fn polling(&self) -> Vec<String> {
        lock(&self.inner.unreachable)
            .iter()
            .filter(|(_, polling)| **polling)
            .map(|(w, _)| w.clone())
            .collect()
    }

    /// Pushes a round's wake-ups, each to its worker, in order.
    pub fn deliver(&self, pushes: Vec<Push>) {
        for p in pushes {
            self.send(p);
        }
    }

    /// A plain wake-up to each worker it has pushed to (but the unreachable ones, as
    /// [`Waker::nudge`]): after the planner's LISTEN session came back, a `given:` sent
    /// while it was away (a task born assigned, migrations/V62) may be lost, and the
    /// worker reads now instead of at its poll.
    pub fn wake_linked(&self) {
        let linked: Vec<(String, String)> = lock(&self.inner.links)
            .iter()
            .map(|(w, l)| (w.clone(), l.addr.clone()))
            .collect();
        for (worker, addr) in linked {
            self.nudge(&worker, &addr);
        }
    }

    /// A plain wake-up to each worker of the roster not pushed to before: a worker polls
    /// often until a push reaches it, rarely after (see `worker::PUSHED_POLL`).
    pub fn greet(&self, reachable: &[(String, String)]) {
        let new: Vec<&(String, String)> = {
            let links = lock(&self.inner.links);
            reachable
                .iter()
                .filter(|(id, addr)| links.get(id).is_none_or(|l| &l.addr != addr))
                .collect()
        };
        for (worker, addr) in new {
            self.plain(worker, addr);
        }
    }

    /// A plain wake-up to `worker` at `addr`, so that it claims what it may run
    /// (`artex.claim_and_read`) now; none to a worker whose pushes fail.
    pub fn nudge(&self, worker: &str, addr: &str) {
        if !lock(&self.inner.unreachable).contains_key(worker) {
            self.plain(worker, addr);
        }
    }

    /// A plain wake-up: the worker looks again.
    fn plain(&self, worker: &str, addr: &str) {
        self.send(Push {
            worker: worker.to_string(),
            addr: addr.to_string(),
            payloads: vec![String::new()],
            tasks: Vec::new(),
        });
    }

    /// Tells `worker` that a task it holds was canceled (the planners' `artex_wake`
    /// channel said so): it checks its leases and stops that handler.
    pub async fn cancel(&self, worker: &str) {
        self.pass_on(worker, CANCEL_PAYLOAD, Vec::new(), "a cancel")
            .await;
    }

    /// Tells `worker` that tasks were born assigned to it (`given:` on `artex_wake`,
    /// migrations/V62): `carried` is the push's payload the insert made, the tasks
    /// carried as a round carries them (or empty: a plain wake-up, and it reads them).
    /// None to a worker whose pushes fail: it polls.
    pub async fn given(&self, worker: &str, carried: &str) {
        if !lock(&self.inner.unreachable).contains_key(worker) {
            // The tasks carried, so that a push refused (the worker's process is gone)
            // gives them back at once, as a round's are, instead of a lease later.
            let tasks = crate::blackboard::carried::parse_carried(carried)
                .map(|c| c.iter().map(|c| c.task.id).collect())
                .unwrap_or_default();
            self.pass_on(worker, carried, tasks, "tasks given to it")
                .await;
        }
    }

    /// Pushes `payload` (carrying `tasks`) to `worker` at the address its link has, or
    /// else the one the blackboard says; `what` names it in the warning when neither
    /// can be had.
    async fn pass_on(&self, worker: &str, payload: &str, tasks: Vec<Uuid>, what: &str) {
        let known = lock(&self.inner.links).get(worker).map(|l| l.addr.clone());
        let addr = match known {
            Some(a) => Some(a),
            None => self.inner.bb.wake_addr(worker).await.unwrap_or_else(|e| {
                tracing::warn!(%worker, error = %e, "cannot read the worker's address to pass {what} on; the worker finds it at its next renewal or poll");
                None
            }),
        };
        if let Some(addr) = addr {
            self.send(Push {
                worker: worker.to_string(),
                addr,
                payloads: vec![payload.to_string()],
                tasks,
            });
        }
    }

    /// Queues `p` on its worker's link, starting the link if needed.
    fn send(&self, p: Push) {
        let mut links = lock(&self.inner.links);
        let p = match links.get(&p.worker) {
            Some(link) if link.addr == p.addr => match link.tx.send(p) {
                Ok(()) => return,
                // The link ended (forgotten): start another.
                Err(mpsc::error::SendError(p)) => p,
            },
            _ => p,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = p.worker.clone();
        let addr = p.addr.clone();
        tx.send(p).expect("the receiver is right here");
        links.insert(
            worker.clone(),
            Link {
                addr: addr.clone(),
                tx,
            },
        );
        tokio::spawn(link(self.inner.clone(), worker, addr, rx));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these maps leaves them consistent (single inserts/removes).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One worker's pushes, in order, over one keep-alive connection.
async fn link(
    inner: Arc<Inner>,
    worker: String,
    addr: String,
    mut rx: mpsc::UnboundedReceiver<Push>,
) {
    let mut conn: Option<BufStream<TcpStream>> = None;
    // A push that reached the link as it was about to end.
    let mut next: Option<Push> = None;
    // A record of failed pushes (this planner's earlier run's, another planner's) is
    // cleared by the link's first push that goes through.
    let mut delivered_once = false;
    loop {
        let first = match next.take() {
            Some(p) => p,
            None => match wait(&inner, &worker, &addr, &mut rx, &mut conn).await {
                Some(p) => p,
                None => break,
            },
        };
        let mut batch = vec![first];
        while let Ok(p) = rx.try_recv() {
            batch.push(p);
        }
        let payloads: Vec<&str> = batch
            .iter()
            .flat_map(|p| p.payloads.iter().map(String::as_str))
            .collect();
        let body = serde_json::to_string(&payloads).expect("strings serialize");
        match push(&inner, &mut conn, &addr, &worker, &body).await {
            Ok(()) => {
                let was_unreachable = lock(&inner.unreachable).remove(&worker).is_some();
                if was_unreachable {
                    tracing::info!(%worker, %addr, "worker reachable again");
                }
                if was_unreachable || !delivered_once {
                    delivered(&inner, &worker).await;
                }
                delivered_once = true;
            }
            Err(why) => {
                conn = None;
                inner.failed.inc();
                note_refused(&inner, &worker, why.refused());
                let polling = inner.bb.wake_failed(&worker).await.unwrap_or_else(|e| {
                    tracing::warn!(%worker, error = %e, "cannot record that pushes to the worker fail");
                    false
                });
                let first_failure = lock(&inner.unreachable)
                    .insert(worker.clone(), polling)
                    .is_none();
                if first_failure && polling {
                    tracing::warn!(%worker, %addr, %why, "cannot push a wake-up; the worker is alive (heard from since its pushes began to fail): it is given work and takes it by polling");
                } else if first_failure {
                    tracing::warn!(%worker, %addr, %why, "cannot push a wake-up: the worker gets nothing until it answers again or is heard from");
                }
                let mut unsettled: Vec<Uuid> =
                    batch.iter().flat_map(|p| p.tasks.iter().copied()).collect();
                settle(&inner, &worker, &mut unsettled).await;
                if !probe(&inner, &mut conn, &worker, &addr, &mut rx, unsettled).await {
                    // Pushed meanwhile: sent, or failing again, like any other.
                    next = forget(&inner, &worker, &addr, &mut rx);
                    if next.is_none() {
                        return;
                    }
                }
            }
        }
    }
    // Forgotten, or replaced by a link to the worker's new address.
    lock(&inner.unreachable).remove(&worker);
    lock(&inner.refused).remove(&worker);
}

/// Waits for the next push, closing the kept-alive connection if the worker closes it
/// meanwhile; `None` when the link is to end (replaced by a link to the worker's new
/// address, or idle for [`FORGET_AFTER`] and forgotten).
async fn wait(
    inner: &Inner,
    worker: &str,
    addr: &str,
    rx: &mut mpsc::UnboundedReceiver<Push>,
    conn: &mut Option<BufStream<TcpStream>>,
) -> Option<Push> {
    let idle = tokio::time::sleep(FORGET_AFTER);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            p = rx.recv() => return p,
            gone = closed(conn) => {
                tracing::debug!(%worker, %addr, ?gone, "the worker closed the wake-up connection");
                *conn = None;
            }
            () = &mut idle => return forget(inner, worker, addr, rx),
        }
    }
}

/// Ends the link unless a push reached it meanwhile (returned, to be sent). Pushes are
/// queued under the links' lock (`send`), so none is queued on a link that has ended: a
/// later push starts a new one.
fn forget(
    inner: &Inner,
    worker: &str,
    addr: &str,
    rx: &mut mpsc::UnboundedReceiver<Push>,
) -> Option<Push> {
    let mut links = lock(&inner.links);
    if let Ok(p) = rx.try_recv() {
        return Some(p);
    }
    if links.get(worker).is_some_and(|l| l.addr == addr) {
        links.remove(worker);
    }
    lock(&inner.unreachable).remove(worker);
    None
}

/// Resolves when the worker closes the connection kept alive between pushes (or sends
/// anything unasked, or it fails); never while there is none.
async fn closed(conn: &mut Option<BufStream<TcpStream>>) -> std::io::Result<usize> {
    match conn {
        Some(stream) => stream.fill_buf().await.map(<[u8]>::len),
        None => std::future::pending().await,
    }
}

/// Gives back the announced tasks the worker has not started.
async fn recall(inner: &Inner, worker: &str, tasks: &[Uuid]) {
    if tasks.is_empty() {
        return;
    }
    match inner.bb.recall(&inner.actor, worker, tasks).await {
        Ok(back) if !back.is_empty() => {
            tracing::info!(%worker, recalled = back.len(), "tasks whose wake-up was not delivered are pending again")
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(%worker, error = %e, "cannot give back tasks whose wake-up was not delivered; the reaper will when their leases end")
        }
    }
}

/// Probes an unreachable worker with a plain wake-up every [`PROBE_EVERY`] until one is
/// answered (true), or it has been unreachable for [`FORGET_AFTER`] or is gone (false).
/// Meanwhile a worker not heard from is looked for in the blackboard after each probe:
/// once heard from, it is polling (given work again). Pushes that come meanwhile are set
/// aside: a polling worker reads its tasks at its poll (and a cancel at its next
/// renewal). The tasks announced to a worker not heard from — by the push that failed,
/// or by a round under way as it was found unreachable — are `unsettled`: they go back
/// to `pending` as soon as a push or probe is refused ([`settle`]).
async fn probe(
    inner: &Inner,
    conn: &mut Option<BufStream<TcpStream>>,
    worker: &str,
    addr: &str,
    rx: &mut mpsc::UnboundedReceiver<Push>,
    mut unsettled: Vec<Uuid>,
) -> bool {
    let since = Instant::now();
    while since.elapsed() < FORGET_AFTER {
        let at = tokio::time::Instant::now() + PROBE_EVERY;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(at) => break,
                p = rx.recv() => match p {
                    Some(p) => {
                        unsettled.extend(p.tasks);
                        settle(inner, worker, &mut unsettled).await;
                    }
                    // Replaced by a link to the worker's new address.
                    None => return false,
                },
            }
        }
        let probed = push(inner, conn, addr, worker, "[\"\"]").await;
        note_refused(
            inner,
            worker,
            probed.as_ref().is_err_and(PushError::refused),
        );
        if probed.is_ok() {
            lock(&inner.unreachable).remove(worker);
            tracing::info!(%worker, %addr, "worker reachable again");
            delivered(inner, worker).await;
            return true;
        }
        *conn = None;
        // Whether it is alive comes first: a worker heard from keeps what it was given.
        let gone = if is_polling(inner, worker) {
            false
        } else {
            match inner.bb.heard_since_wake_failed(worker).await {
                Ok(Some(true)) => {
                    lock(&inner.unreachable).insert(worker.to_string(), true);
                    tracing::warn!(%worker, %addr, "the worker is alive but pushes do not reach it: it is given work again and takes it by polling");
                    false
                }
                Ok(Some(false)) | Err(_) => false,
                Ok(None) => true,
            }
        };
        settle(inner, worker, &mut unsettled).await;
        if gone {
            tracing::info!(%worker, %addr, "unreachable worker gone; forgetting it");
            return false;
        }
    }
    tracing::info!(%worker, %addr, "worker unreachable for {FORGET_AFTER:?}; forgetting it");
    false
}

fn is_polling(inner: &Inner, worker: &str) -> bool {
    lock(&inner.unreachable)
        .get(worker)
        .copied()
        .unwrap_or(false)
}

/// Tasks announced to an unreachable worker by pushes that did not reach it: see
/// [`probe`]. A polling worker reads them at its poll: nothing to do. Else they go back
/// to `pending` once the worker's last push or probe was refused (its process gone, and
/// its handlers with it), and not before: a push reset or unanswered may have been read.
/// A refused probe is as good a sign as a refused push — a killed worker's listening
/// socket may still take a connection (and reset it) while its process is being torn
/// down, and only the next probe is refused.
async fn settle(inner: &Inner, worker: &str, unsettled: &mut Vec<Uuid>) {
    if is_polling(inner, worker) {
        unsettled.clear();
    } else if lock(&inner.refused).contains(worker) {
        recall(inner, worker, &std::mem::take(unsettled)).await;
    }
}

/// Records whether `worker`'s last push or probe was refused.
fn note_refused(inner: &Inner, worker: &str, refused: bool) {
    let mut set = lock(&inner.refused);
    if refused {
        set.insert(worker.to_string());
    } else {
        set.remove(worker);
    }
}

/// Clears the record of failed pushes to `worker`: one went through.
async fn delivered(inner: &Inner, worker: &str) {
    if let Err(e) = inner.bb.wake_delivered(worker).await {
        tracing::debug!(%worker, error = %e, "cannot record that a push went through");
    }
}

/// Why a push failed.
#[derive(Debug)]
enum PushError {
    /// No process listens at the address: the worker is gone, and its handlers with it.
    Refused(std::io::Error),
    Io(std::io::Error),
    Timeout,
    Status(u16),
}

impl PushError {
    /// Whether the push was refused: nothing there can be running the worker's tasks.
    fn refused(&self) -> bool {
        matches!(self, PushError::Refused(_))
    }
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushError::Io(e) | PushError::Refused(e) => write!(f, "{e}"),
            PushError::Timeout => write!(f, "no answer within {PUSH_TIMEOUT:?}"),
            PushError::Status(s) => write!(f, "answered HTTP {s}"),
        }
    }
}

/// Sends one push and reads its answer: 2xx is delivered. A kept-alive connection the
/// worker closed meanwhile, one a hot upgrade's other process took (421), or a secret
/// that changed (401) get one more try on a fresh connection.
async fn push(
    inner: &Inner,
    conn: &mut Option<BufStream<TcpStream>>,
    addr: &str,
    worker: &str,
    body: &str,
) -> Result<(), PushError> {
    let mut last = PushError::Timeout;
    for _ in 0..2 {
        let reused = conn.is_some();
        if conn.is_none() {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| PushError::Timeout)?
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => PushError::Refused(e),
                    _ => PushError::Io(e),
                })?;
            let _ = stream.set_nodelay(true);
            *conn = Some(BufStream::new(stream));
        }
        let secret = lock(&inner.secret).clone();
        let stream = conn.as_mut().expect("connected above");
        let answer =
            tokio::time::timeout(PUSH_TIMEOUT, exchange(stream, addr, worker, &secret, body)).await;
        match answer {
            Ok(Ok((status, keep))) if (200..300).contains(&status) => {
                if !keep {
                    *conn = None;
                }
                return Ok(());
            }
            Ok(Ok((421, _))) => {
                *conn = None;
                last = PushError::Status(421);
            }
            Ok(Ok((401, _))) => {
                *conn = None;
                last = PushError::Status(401);
                match inner.bb.wake_secret().await {
                    Ok(s) => *lock(&inner.secret) = s,
                    Err(_) => return Err(last),
                }
            }
            Ok(Ok((status, _))) => return Err(PushError::Status(status)),
            Ok(Err(e)) if reused => {
                *conn = None;
                last = PushError::Io(e);
            }
            Ok(Err(e)) => return Err(PushError::Io(e)),
            Err(_) => return Err(PushError::Timeout),
        }
    }
    Err(last)
}

/// Writes the request, reads the answer's status and body; says whether the connection
/// stays open.
async fn exchange(
    stream: &mut BufStream<TcpStream>,
    addr: &str,
    worker: &str,
    secret: &str,
    body: &str,
) -> std::io::Result<(u16, bool)> {
    let head = format!(
        "POST /wake HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {secret}\r\n\
         Artex-Worker: {worker}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    let mut read = 0;
    let mut status = None;
    let mut length = 0usize;
    let mut keep = true;
    loop {
        line.clear();
        let n = stream.read_line(&mut line).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the worker closed the connection",
            ));
        }
        read += n;
        if read > MAX_HEAD {
            return Err(bad("answer head too long"));
        }
        let l = line.trim_end();
        if status.is_none() {
            status = Some(
                l.split(' ')
                    .nth(1)
                    .and_then(|s| s.parse::<u16>().ok())
                    .ok_or_else(|| bad("not an HTTP status line"))?,
            );
            continue;
        }
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().map_err(|_| bad("bad content-length"))?;
            } else if name.eq_ignore_ascii_case("connection") {
                keep = !value.eq_ignore_ascii_case("close");
            }
        }
    }
    if length > MAX_HEAD {
        return Err(bad("answer body too long"));
    }
    let mut rest = vec![0u8; length];
    stream.read_exact(&mut rest).await?;
    Ok((status.expect("read above"), keep))
}

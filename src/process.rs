//! What a process needs to know about itself and its surroundings: its host name and
//! identity, the digest of its own binary, its open files limit, stop signals as one shutdown that every part
//! can wait on, and messages to the service manager.

use std::future::Future;
use std::sync::Arc;

use artex_upgrade::StopSignal;
use sha2::Digest;

use crate::error::Result;

/// Raises this process's limit of open files to the most it may have (the hard limit):
/// a planner holds a connection to every worker it pushes wake-ups to, and a fleet of a
/// thousand workers is past the usual soft limit of 1,024. Says what it could not do.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open files limit");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open files limit"),
    }
}

/// This host's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A worker id: `host:pid:suffix`, where 48 random bits keep it unique among the
/// processes a fleet runs at once (pids are reused, hosts share names).
pub fn worker_id(host: &str) -> String {
    let suffix = uuid::Uuid::new_v4().as_u64_pair().0 & 0xffff_ffff_ffff;
    format!("{host}:{}:{suffix:012x}", std::process::id())
}

/// sha256 of the running binary, computed once on a background thread: hashing a large
/// binary must not delay serving (nor a successor's readiness).
#[derive(Clone, Default)]
pub struct BinaryDigest(Arc<std::sync::OnceLock<String>>);

impl BinaryDigest {
    /// Starts hashing now.
    pub fn start() -> Self {
        let d = BinaryDigest::default();
        let bg = d.clone();
        std::thread::spawn(move || {
            bg.0.get_or_init(binary_sha256);
        });
        d
    }

    /// The digest, waiting for it if it is still being computed.
    pub async fn get(&self) -> String {
        if let Some(v) = self.0.get() {
            return v.clone();
        }
        let d = self.clone();
        tokio::task::spawn_blocking(move || d.0.get_or_init(binary_sha256).clone())
            .await
            .unwrap_or_default()
    }
}

/// sha256 of the running binary, as `/status` reports it (empty if unreadable).
fn binary_sha256() -> String {
    // Streamed: reading the whole binary at once would set the worker's peak memory.
    let mut hasher = sha2::Sha256::new();
    match std::fs::File::open("/proc/self/exe").and_then(|mut f| std::io::copy(&mut f, &mut hasher))
    {
        Ok(_) => hex::encode(hasher.finalize()),
        Err(_) => String::new(),
    }
}

/// The process's stop: resolves once SIGTERM, SIGINT or SIGUSR2 arrived, for every
/// clone (a planner and a worker in one `artex up` stop together). The signal handlers
/// are installed when it is made, so a signal that comes early is not lost.
#[derive(Clone)]
pub struct Shutdown(tokio::sync::watch::Receiver<Option<StopSignal>>);

impl Shutdown {
    /// Installs the stop-signal handlers (on the current actix/tokio runtime).
    pub fn on_signals() -> Result<Shutdown> {
        let mut signals = artex_upgrade::StopSignals::install()?;
        let (tx, rx) = tokio::sync::watch::channel(None);
        actix::spawn(async move {
            let sig = signals.next().await;
            tracing::info!(signal = ?sig, "stopping");
            let _ = tx.send(Some(sig));
        });
        Ok(Shutdown(rx))
    }

    /// Resolves when the process is to stop.
    pub fn wait(&self) -> impl Future<Output = ()> + 'static {
        let mut rx = self.0.clone();
        async move {
            // A dropped sender without a signal means nobody can stop us any more; the
            // caller waits for ever, as it would without a signal.
            if rx.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Tells the service manager (systemd `Type=notify`) something; a failure is logged,
/// never fatal: the process serves whether or not anybody listens.
pub fn notify_service(r: std::result::Result<bool, artex_upgrade::Error>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

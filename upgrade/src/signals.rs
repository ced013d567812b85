//! Process signals as a shutdown source.
//!
//! SIGTERM and SIGINT ask the process to stop; SIGUSR2 asks it to drain (stop taking
//! work, finish what it runs, exit) once the next generation has taken over.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::error::{Error, Result};

/// Which stop request arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: the supervisor wants the process gone.
    Terminate,
    /// SIGINT: an operator pressed Ctrl-C.
    Interrupt,
    /// SIGUSR2: a newer generation took over; drain and exit.
    Drain,
}

/// Listeners for SIGTERM, SIGINT and SIGUSR2.
///
/// Once installed, these signals no longer kill the process: they are only reported
/// through [`StopSignals::next`], so the caller decides how to stop.
///
/// ```no_run
/// # async fn run() -> artex_upgrade::Result {
/// use artex_upgrade::{StopSignal, StopSignals};
///
/// let mut signals = StopSignals::install()?;
/// if signals.next().await == StopSignal::Drain {
///     // Stop taking work; a second SIGTERM while draining means "now".
///     let _ = signals.next().await;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct StopSignals {
    terminate: Signal,
    interrupt: Signal,
    drain: Signal,
}

impl StopSignals {
    /// Installs the three listeners. Must be called inside a tokio runtime (with the
    /// I/O driver enabled).
    pub fn install() -> Result<Self> {
        let listen = |kind: SignalKind, name: &'static str| {
            signal(kind).map_err(|source| Error::SignalInstall {
                signal: name,
                source,
            })
        };
        Ok(Self {
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            drain: listen(SignalKind::user_defined2(), "SIGUSR2")?,
        })
    }

    /// Waits for the next stop signal. Can be awaited again after it returns, so a second
    /// SIGTERM during a drain is seen. Cancel-safe.
    pub async fn next(&mut self) -> StopSignal {
        // `biased` so a terminate that races a drain wins: it is the more urgent request.
        // `recv` returns None only once the runtime's signal driver is gone, at which
        // point nothing can be delivered any more; treat that as a terminate request.
        tokio::select! {
            biased;
            _ = self.terminate.recv() => StopSignal::Terminate,
            _ = self.interrupt.recv() => StopSignal::Interrupt,
            _ = self.drain.recv() => StopSignal::Drain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{kill, Signal as NixSignal};
    use nix::unistd::Pid;
    use std::time::Duration;

    // All signal tests share the one process, so they run inside a single test to keep
    // one signal from being observed by another test's listeners.
    #[tokio::test]
    async fn real_signals_are_reported_in_order_and_repeatedly() {
        let mut signals = StopSignals::install().unwrap();
        let me = Pid::this();
        async fn wait(s: &mut StopSignals) -> StopSignal {
            tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("signal not observed within 10 s")
        }

        kill(me, NixSignal::SIGUSR2).unwrap();
        assert_eq!(wait(&mut signals).await, StopSignal::Drain);

        // A second request during drain must still be observable.
        kill(me, NixSignal::SIGTERM).unwrap();
        assert_eq!(wait(&mut signals).await, StopSignal::Terminate);

        kill(me, NixSignal::SIGINT).unwrap();
        assert_eq!(wait(&mut signals).await, StopSignal::Interrupt);

        kill(me, NixSignal::SIGTERM).unwrap();
        assert_eq!(wait(&mut signals).await, StopSignal::Terminate);

        // Nothing pending: next() must not return spuriously.
        let idle = tokio::time::timeout(Duration::from_millis(100), signals.next()).await;
        assert!(idle.is_err(), "next() returned without a signal: {idle:?}");
    }
}

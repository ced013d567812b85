//! Progress of work that takes time, on standard error (standard output stays the
//! command's result): a bar redrawn in place when standard error is a terminal, plain
//! lines a log or a script can read when it is not. `artex upload` and `artex bundle
//! create` share it; `submit --wait` and `flow show --follow` print plain lines only.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How often the bar is redrawn at most, milliseconds (a 64 KiB read is far quicker).
const REDRAW_MS: u64 = 100;

/// Whether standard error is a terminal (progress is drawn in place there).
fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// One plain progress line, `artex: {what}`, on standard error. Lost, not a panic, when
/// standard error is closed (`artex submit --wait … |& head -1`): nobody reads it.
pub(crate) fn step(what: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "artex: {what}");
}

/// Bytes of a known total done so far, drawn as `label done/total bytes  rate  ETA` on a
/// terminal; nothing between steps otherwise (the caller prints a [`step`] line for each
/// step). Shared across tasks: [`Progress::add`] takes `&self`.
pub(crate) struct Progress {
    /// What is being done, before the figures (may be empty).
    label: String,
    /// Bytes in all.
    pub total: u64,
    done: AtomicU64,
    started: Instant,
    /// Milliseconds after `started` of the last redraw.
    drawn_ms: AtomicU64,
    tty: bool,
}

impl Progress {
    /// A bar for `total` bytes, drawn only when standard error is a terminal.
    pub(crate) fn new(total: u64) -> Self {
        Progress::labelled("", total)
    }

    /// As [`Progress::new`], with what is being done before the figures.
    pub(crate) fn labelled(label: &str, total: u64) -> Self {
        Progress {
            label: label.to_string(),
            total,
            done: AtomicU64::new(0),
            started: Instant::now(),
            drawn_ms: AtomicU64::new(0),
            tty: stderr_is_tty(),
        }
    }

    /// Bytes done so far.
    pub(crate) fn done_bytes(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Seconds since the bar was made.
    pub(crate) fn secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// `n` more bytes done.
    pub(crate) fn add(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if !self.tty {
            return;
        }
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.drawn_ms.load(Ordering::Relaxed);
        if done < self.total && now < last + REDRAW_MS {
            return;
        }
        self.drawn_ms.store(now, Ordering::Relaxed);
        self.draw(done);
    }

    fn draw(&self, done: u64) {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / secs;
        let eta = if rate > 0.0 {
            (self.total.saturating_sub(done)) as f64 / rate
        } else {
            0.0
        };
        let label = if self.label.is_empty() {
            String::new()
        } else {
            format!("{}  ", self.label)
        };
        let _ = write!(
            std::io::stderr(),
            "\r{label}{done}/{} bytes  {:.1} MiB/s  ETA {eta:.0} s   ",
            self.total,
            rate / (1024.0 * 1024.0)
        );
    }

    /// Ends the bar's line (on a terminal; nothing otherwise).
    pub(crate) fn done(&self) {
        if self.tty {
            self.draw(self.done_bytes());
            let _ = writeln!(std::io::stderr());
        }
    }
}

//! Standard output, where each command's result goes. `println!` panics when the reader
//! has gone (`artex tasks | head -1`: Rust ignores SIGPIPE, so the write fails with EPIPE
//! instead of ending the process); here such a write is [`Error::OutputClosed`], which
//! ends the command quietly with exit 141. A command that waits between writes (it
//! follows a feed) also watches for its reader going away meanwhile ([`Reader`]).

use std::future::Future;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;

use tokio::io::Interest;
use tokio::net::unix::pipe;

use crate::error::{Error, Result};

/// As `println!`, to standard output, but a failed write is an error instead of a panic:
/// [`Error::OutputClosed`] for a closed pipe, an I/O error for any other (a full disk).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::stdout::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes `line` and a newline to standard output (what [`outln!`] expands to). Standard
/// output is line-buffered: the line is written out, and a failure reported, here.
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) -> Result {
    writeln!(std::io::stdout().lock(), "{line}").map_err(write_error)
}

/// The error of a failed write to standard output: the reader has gone
/// ([`Error::OutputClosed`]), or the write failed.
pub(crate) fn write_error(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe => Error::OutputClosed,
        _ => Error::io("writing to standard output", e),
    }
}

/// Prints `value` as one JSON document (the output of `--json`).
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::io("encoding JSON", std::io::Error::other(e)))?;
    outln!("{text}")
}

/// Prints `value` as one line of JSON and flushes it (a stream of JSON lines: a reader
/// sees each as it comes).
pub(crate) fn print_json_line(value: &impl serde::Serialize) -> Result {
    let text = serde_json::to_string(value)
        .map_err(|e| Error::io("encoding JSON", std::io::Error::other(e)))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(write_error)
}

/// The reader of standard output, watched for going away. A command that follows a feed
/// may write nothing for hours; without the watch, `artex events tail --follow | grep -m1
/// X` would outlive `grep` until the next event. Only a pipe tells (the kernel flags its
/// writing end once no reader is left): standard output that is a file or a terminal
/// never goes away.
pub(crate) struct Reader(Option<pipe::Sender>);

impl Reader {
    /// Starts watching standard output, through a copy of its descriptor: nothing is
    /// written through the copy, and standard output itself is left as it is (blocking,
    /// for the writes).
    pub(crate) fn watch() -> Reader {
        let pipe = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map(std::fs::File::from)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_fifo()));
        // Unchecked: the checked constructor would make the pipe non-blocking, for
        // standard output too (one open file shared by both descriptors).
        Reader(pipe.and_then(|f| pipe::Sender::from_owned_fd_unchecked(f.into()).ok()))
    }

    /// Resolves once the reader has gone; never for output that cannot tell.
    async fn gone(&self) {
        if let Some(pipe) = &self.0 {
            if pipe.ready(Interest::ERROR).await.is_ok() {
                return;
            }
        }
        std::future::pending().await
    }

    /// `work`'s output, unless the reader goes away first: then [`Error::OutputClosed`]
    /// (and `work` is dropped unfinished).
    pub(crate) async fn unless_gone<F: Future>(&self, work: F) -> Result<F::Output> {
        tokio::select! {
            out = work => Ok(out),
            () = self.gone() => Err(Error::OutputClosed),
        }
    }
}

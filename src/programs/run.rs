//! One attempt of a program (protocol version 1, docs/programs.md): the task in on stdin,
//! its lines on descriptor 3 acted on as they come, stdout and stderr to the log (the
//! last 8 KiB of stderr kept for the error), and its exit made the attempt's outcome.
//! Dropped before the program ended (a timeout, a lost lease, a drain past its
//! deadline), the attempt ends the program's whole process group.

use std::cell::RefCell;
use std::ffi::OsString;
use std::time::Duration;

use artex_actors::worker::{HandlerResult, TaskContext, TaskError};
use artex_upgrade::task_process::{self, Exit, Group};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

use super::protocol::{self, Line, MAX_LINE_BYTES};
use super::Program;

/// How much of stderr a failure's error keeps: its end.
const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// A line of stdout or stderr longer than this is logged in pieces.
const LOG_LINE_BYTES: usize = 64 * 1024;
/// How long the pipes may stay open after the program exited and its group was ended
/// (only a process that left the group can hold them): then they are let go.
const PIPES_AFTER_EXIT: Duration = Duration::from_secs(1);

/// What the program said on descriptor 3 so far.
#[derive(Default)]
struct Said {
    result: Option<Value>,
    /// A discard, snooze or retry_at: the outcome, whatever the exit status.
    then: Option<TaskError>,
    /// A bad line, or a checkpoint that could not be saved: the attempt failed so.
    broken: Option<String>,
}

/// Ends the program's group when the attempt's future is dropped: a timeout, a drain
/// past its deadline, or the worker's fence (a lease it could not renew). SIGTERM, then
/// SIGKILL after the grace, or after half of what is left of the lease if that is
/// sooner: a program that ignores SIGTERM must be gone before another worker may take
/// its task (the other half is for the kill, the reaping, and the clocks).
struct Ender {
    group: Group,
    grace: Duration,
    ctx: TaskContext,
}

impl Drop for Ender {
    fn drop(&mut self) {
        let grace = self
            .ctx
            .lease_left()
            .map_or(self.grace, |left| self.grace.min(left / 2));
        self.group.terminate(grace);
    }
}

/// Runs `program` for the task of `ctx`.
pub async fn attempt(program: Program, ctx: TaskContext) -> HandlerResult {
    let id = ctx.id();
    let env = env_for(&program, &ctx);
    let started = task_process::start(&program.path, &env, &program.launch).map_err(|e| {
        let user = program
            .runs_as
            .as_deref()
            .map_or_else(String::new, |u| format!(" as user {u}"));
        TaskError::new(format!(
            "cannot start {}{user}: {e}",
            program.path.display()
        ))
    })?;
    tracing::debug!(task = %id, pid = started.pid, program = %program.path.display(), "program started");
    let ender = Ender {
        group: started.group.clone(),
        grace: program.grace,
        ctx: ctx.clone(),
    };
    let io = |e: std::io::Error| TaskError::new(format!("program {}: {e}", program.path.display()));
    let stdin = pipe::Sender::from_owned_fd(started.stdin).map_err(io)?;
    let stdout = pipe::Receiver::from_owned_fd(started.stdout).map_err(io)?;
    let stderr = pipe::Receiver::from_owned_fd(started.stderr).map_err(io)?;
    let lines = pipe::Receiver::from_owned_fd(started.protocol).map_err(io)?;

    let input = json!({
        "id": id,
        "kind": ctx.kind(),
        "payload": ctx.payload(),
        "attempt": ctx.attempt(),
        "max_attempts": ctx.max_attempts(),
        "checkpoint": ctx.checkpoint(),
    })
    .to_string()
        + "\n";
    let said = RefCell::new(Said::default());
    let tail = RefCell::new(Vec::new());
    let pipes = async {
        tokio::join!(
            feed(stdin, input),
            log_lines(BufReader::new(stdout), id, "stdout", None),
            log_lines(BufReader::new(stderr), id, "stderr", Some(&tail)),
            follow(
                BufReader::new(lines),
                ctx.clone(),
                &started.group,
                program.grace,
                &said
            ),
        )
    };
    let mut pipes = std::pin::pin!(pipes);
    let mut exited = started.exited;
    let (mut exit, mut drained, mut canceled) = (None, false, false);
    let mut let_go = std::pin::pin!(tokio::time::sleep(Duration::MAX));
    while exit.is_none() || !drained {
        tokio::select! {
            _ = &mut pipes, if !drained => drained = true,
            e = &mut exited, if exit.is_none() => {
                exit = Some(e);
                let_go.as_mut().reset(tokio::time::Instant::now() + PIPES_AFTER_EXIT);
            }
            () = &mut let_go, if exit.is_some() => {
                tracing::warn!(task = %id, "a process that left the program's group still holds its pipes; no longer read");
                break;
            }
            () = ctx.cancelled(), if !canceled => {
                canceled = true;
                ender.group.terminate(program.grace);
            }
        }
    }
    let exit = exit.expect("the loop ends after the exit");
    let said = said.take();
    if canceled {
        return Err(TaskError::new("canceled"));
    }
    if let Some(broken) = said.broken {
        return Err(TaskError::new(broken));
    }
    if let Some(then) = said.then {
        return Err(then);
    }
    let tail = stderr_tail(&tail.take());
    let memory = program.bounds.memory.map_or_else(String::new, |b| {
        format!(" (its memory bound: {} MiB of address space)", b >> 20)
    });
    match exit {
        Exit::Code(0) => Ok(said.result.unwrap_or(Value::Null)),
        Exit::Code(code) => Err(TaskError::new(format!(
            "exited with status {code}{memory}{tail}"
        ))),
        Exit::Signal(Signal::SIGXCPU) if program.bounds.cpu_seconds.is_some() => {
            Err(TaskError::new(format!(
                "killed by signal SIGXCPU: over its CPU bound of {} s{tail}",
                program.bounds.cpu_seconds.unwrap_or_default()
            )))
        }
        Exit::Signal(signal) => Err(TaskError::new(format!(
            "killed by signal {}{memory}{tail}",
            signal.as_str()
        ))),
        Exit::Lost(why) => Err(TaskError::new(format!("lost the program: {why}"))),
    }
}

/// The program's environment: what it was given at start (PATH, `--tasks-env`), then
/// the task's own variables.
fn env_for(program: &Program, ctx: &TaskContext) -> Vec<(OsString, OsString)> {
    let mut env = program.env.as_ref().clone();
    for (k, v) in [
        ("ARTEX_TASK_ID", ctx.id().to_string()),
        ("ARTEX_TASK_KIND", ctx.kind().to_string()),
        ("ARTEX_TASK_ATTEMPT", ctx.attempt().to_string()),
        ("ARTEX_PROTOCOL", "1".to_string()),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.into(), v.into()));
    }
    // The attempt's span as the program's parent (W3C), when the task is traced.
    env.retain(|(name, _)| name != "TRACEPARENT");
    if let Some(tp) = ctx.trace_context() {
        env.push(("TRACEPARENT".into(), tp.to_string().into()));
    }
    env
}

/// Writes the task to stdin and closes it. A program that exits (or closes stdin)
/// without reading it all is its own business.
async fn feed(mut stdin: pipe::Sender, input: String) {
    let _ = stdin.write_all(input.as_bytes()).await;
    let _ = stdin.shutdown().await;
}

/// The next line of `r` (without its newline) if it has one, cut at `cap` bytes: the
/// flag says the line goes on.
async fn next_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    cap: usize,
) -> std::io::Result<Option<(Vec<u8>, bool)>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some((line, false)));
        }
        let room = cap - line.len();
        match buf.iter().take(room).position(|b| *b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&buf[..i]);
                r.consume(i + 1);
                return Ok(Some((line, false)));
            }
            None => {
                let n = buf.len().min(room);
                line.extend_from_slice(&buf[..n]);
                r.consume(n);
                if line.len() == cap {
                    return Ok(Some((line, true)));
                }
            }
        }
    }
}

/// Logs each line of `r`, tagged with the task, keeping the last bytes in `tail`.
async fn log_lines<R: AsyncBufRead + Unpin>(
    mut r: R,
    task: uuid::Uuid,
    stream: &'static str,
    tail: Option<&RefCell<Vec<u8>>>,
) {
    while let Ok(Some((line, _))) = next_line(&mut r, LOG_LINE_BYTES).await {
        let text = String::from_utf8_lossy(&line);
        tracing::info!(task = %task, stream, "{text}");
        if let Some(tail) = tail {
            let mut tail = tail.borrow_mut();
            tail.extend_from_slice(&line);
            tail.push(b'\n');
            if tail.len() > STDERR_TAIL_BYTES {
                let cut = tail.len() - STDERR_TAIL_BYTES;
                tail.drain(..cut);
            }
        }
    }
}

/// `: ` and the end of stderr, or nothing when it said nothing.
fn stderr_tail(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Acts on each line of descriptor 3 as it comes. A bad line, or a checkpoint that
/// cannot be saved, ends the program and the attempt with that reason.
async fn follow<R: AsyncBufRead + Unpin>(
    mut r: R,
    mut ctx: TaskContext,
    group: &Group,
    grace: Duration,
    said: &RefCell<Said>,
) {
    let mut n = 0usize;
    loop {
        let line = match next_line(&mut r, MAX_LINE_BYTES).await {
            Ok(Some((_, true))) => Err(format!("longer than {} MiB", MAX_LINE_BYTES / 1024 / 1024)),
            Ok(Some((line, false))) => protocol::parse(&line),
            Ok(None) => return,
            Err(e) => Err(format!("cannot read: {e}")),
        };
        n += 1;
        if said.borrow().broken.is_some() {
            continue;
        }
        let broken = match line {
            Ok(None) => None,
            Ok(Some(line)) => act(line, &mut ctx, said).await,
            Err(why) => Some(format!("fd 3 line {n}: {why}")),
        };
        if let Some(why) = broken {
            said.borrow_mut().broken = Some(why);
            group.terminate(grace);
        }
    }
}

/// Does what one line says; the reason the attempt must end, if it must.
async fn act(line: Line, ctx: &mut TaskContext, said: &RefCell<Said>) -> Option<String> {
    match line {
        Line::Progress(fraction, message) => ctx.progress(fraction, message.as_deref()),
        Line::Checkpoint(state) => {
            if let Err(e) = ctx.save_checkpoint(state).await {
                return Some(e.message().to_string());
            }
        }
        Line::Result(value) => said.borrow_mut().result = Some(value),
        Line::Discard(reason) => said.borrow_mut().then = Some(TaskError::discard(reason)),
        Line::Snooze(ms) => {
            said.borrow_mut().then = Some(TaskError::snooze(Duration::from_millis(ms)));
        }
        Line::RetryAt(at, reason) => said.borrow_mut().then = Some(TaskError::retry_at(at, reason)),
    }
    None
}

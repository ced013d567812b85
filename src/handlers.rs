//! The stock binary's task kinds, for demos and tests: `echo`, `sleep` (which stops
//! when its task is canceled), `fail`, `noop`,
//! `checkpoint` (which saves its progress after every step and resumes from it, in
//! whatever process runs it next) and `gather` (a flow task that returns its upstream
//! tasks' results), and `digest` (the sha256 of the file its task was uploaded with, read
//! where the worker holds it), and `journal` / `journal-checkpoint` (which append the
//! start and end of every execution to a side file, so that a test can see executions of
//! one task overlap or repeat; the second checkpoints each step like `checkpoint`; both
//! stop when their task is canceled, ending `canceled` in the file, unless the payload
//! says `"ignore_cancel": true`), and `progress` (which reports its progress `steps` times
//! over `ms` milliseconds, then holds its last value for `hold_ms` before it ends).

use std::time::Duration;

use artex_actors::worker::{Registry, TaskContext, TaskError};
use serde_json::{json, Value};

/// A registry with every stock kind.
pub fn stock() -> Registry {
    let mut r = Registry::new();
    r.register("echo", |ctx: TaskContext| async move {
        Ok(ctx.payload().clone())
    });
    r.register("noop", |_ctx: TaskContext| async move { Ok(Value::Null) });
    r.register("gather", |ctx: TaskContext| async move {
        // {"payload": …, "upstream": {"<task name>": <its result>, …}}
        let upstream = ctx.upstream_results().await?;
        Ok(json!({ "payload": ctx.payload(), "upstream": upstream }))
    });
    r.register("sleep", |ctx: TaskContext| async move {
        let ms = field_u64(ctx.payload(), "ms")?.unwrap_or(1000);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(json!({ "slept_ms": ms })),
            () = ctx.cancelled() => Err(TaskError::new("canceled")),
        }
    });
    r.register("fail", |ctx: TaskContext| async move {
        // Fails its first `times` attempts (all of them without `times`), then succeeds.
        // `"then"` says what follows a failure: retry with backoff (the default),
        // `"discard"` (failed now), `"retry_at"` (in `ms`), or `"snooze"` (for `ms`,
        // no attempt counted, until the unix time in ms `until`, then it succeeds).
        let times = field_u64(ctx.payload(), "times")?;
        let ms = field_u64(ctx.payload(), "ms")?.unwrap_or(1000);
        let attempt = ctx.attempt() as u64;
        let why = format!("failing on purpose (attempt {attempt})");
        if ctx.payload().get("then").and_then(Value::as_str) == Some("snooze") {
            let until = field_u64(ctx.payload(), "until")?.unwrap_or(0);
            if (unix_ms() as u64) < until {
                return Err(TaskError::snooze(Duration::from_millis(ms)));
            }
            return Ok(json!({ "succeeded_on_attempt": attempt }));
        }
        match times {
            Some(t) if attempt > t => Ok(json!({ "succeeded_on_attempt": attempt })),
            _ => match ctx.payload().get("then").and_then(Value::as_str) {
                Some("discard") => Err(TaskError::discard(why)),
                Some("retry_at") => Err(TaskError::retry_at(
                    chrono::Utc::now() + chrono::Duration::milliseconds(ms as i64),
                    why,
                )),
                _ => Err(TaskError::new(why)),
            },
        }
    });
    r.register("progress", progress);
    r.register_resumable("checkpoint", checkpoint);
    r.register("digest", digest);
    r.register("journal", |ctx: TaskContext| journal(ctx, false));
    r.register_resumable("journal-checkpoint", |ctx: TaskContext| journal(ctx, true));
    r
}

/// Reports `steps` progress values (`i / steps`, "step i of steps") spread over `ms`
/// milliseconds in ten slices (a thousand steps are a thousand calls in a few
/// microseconds each, as a handler working through items makes them), then holds the last
/// value for `hold_ms` (default 0) before it returns `{"steps": steps}`. Stops when its
/// task is canceled.
async fn progress(ctx: TaskContext) -> Result<Value, TaskError> {
    let steps = field_u64(ctx.payload(), "steps")?.unwrap_or(100).max(1);
    let ms = field_u64(ctx.payload(), "ms")?.unwrap_or(1000);
    let hold_ms = field_u64(ctx.payload(), "hold_ms")?.unwrap_or(0);
    let slice = steps.div_ceil(10);
    let work = async {
        for i in 1..=steps {
            ctx.progress(
                i as f64 / steps as f64,
                Some(&format!("step {i} of {steps}")),
            );
            if i % slice == 0 {
                tokio::time::sleep(Duration::from_millis(ms / 10)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    };
    tokio::select! {
        () = work => Ok(json!({ "steps": steps })),
        () = ctx.cancelled() => Err(TaskError::new("canceled")),
    }
}

/// Sleeps `steps` × `ms` (checkpointing each step when `checkpoints`, resuming from the
/// last one), and appends `<task> <attempt> <pid> start <unix ms>` to the payload's
/// `file` when it begins and `… end <unix ms> <how> <unix ms it last ran>` when it ends,
/// however it ends (also when its future is dropped: an abort, a lost lease; the last
/// field is when its code last ran, which a stopped worker's drop comes after). One `write` per line to a file
/// opened for appending: lines of several processes never interleave.
async fn journal(mut ctx: TaskContext, checkpoints: bool) -> Result<Value, TaskError> {
    let file = ctx
        .payload()
        .get("file")
        .and_then(Value::as_str)
        .ok_or_else(|| TaskError::new("payload field 'file': expected a path"))?
        .to_string();
    let steps = field_u64(ctx.payload(), "steps")?.unwrap_or(1);
    let ms = field_u64(ctx.payload(), "ms")?.unwrap_or(100);
    let honour_cancel = !ctx
        .payload()
        .get("ignore_cancel")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let who = format!("{} {} {}", ctx.id(), ctx.attempt(), std::process::id());
    let mut entry = JournalEntry::begin(file, who)?;
    let mut done = ctx
        .checkpoint()
        .and_then(|c| c.get("done"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    while done < steps {
        let step = tokio::time::sleep(Duration::from_millis(ms));
        if honour_cancel {
            tokio::select! {
                () = step => {}
                () = ctx.cancelled() => {
                    entry.ran();
                    entry.how = "canceled";
                    return Err(TaskError::new("canceled"));
                }
            }
        } else {
            step.await;
        }
        entry.ran();
        done += 1;
        if checkpoints {
            if let Err(e) = ctx.save_checkpoint(json!({ "done": done })).await {
                if ctx.is_cancelled() {
                    entry.how = "canceled";
                }
                return Err(e);
            }
        }
    }
    entry.how = "ok";
    Ok(json!({ "steps": steps, "pid": std::process::id() }))
}

/// One execution in a `journal` file: its start written now, its end when dropped.
struct JournalEntry {
    file: String,
    who: String,
    how: &'static str,
    /// When the handler's code last ran (unix ms).
    active: u128,
}

impl JournalEntry {
    fn begin(file: String, who: String) -> Result<Self, TaskError> {
        let now = unix_ms();
        journal_line(&file, &format!("{who} start {now}\n"))?;
        Ok(JournalEntry {
            file,
            who,
            how: "stopped",
            active: now,
        })
    }

    /// The handler's code runs now.
    fn ran(&mut self) {
        self.active = unix_ms();
    }
}

impl Drop for JournalEntry {
    fn drop(&mut self) {
        let line = format!(
            "{} end {} {} {}\n",
            self.who,
            unix_ms(),
            self.how,
            self.active
        );
        if let Err(e) = journal_line(&self.file, &line) {
            tracing::warn!(file = %self.file, error = %e, "journal: could not write an end");
        }
    }
}

fn journal_line(file: &str, line: &str) -> Result<(), TaskError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    f.write_all(line.as_bytes())?;
    Ok(())
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

async fn checkpoint(mut ctx: TaskContext) -> Result<Value, TaskError> {
    let steps = field_u64(ctx.payload(), "steps")?.unwrap_or(10);
    let ms = field_u64(ctx.payload(), "ms")?.unwrap_or(100);
    let mut done: Vec<Value> = ctx
        .checkpoint()
        .and_then(|c| c.get("steps"))
        .and_then(|s| s.as_array())
        .cloned()
        .unwrap_or_default();
    while (done.len() as u64) < steps {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        done.push(json!({ "step": done.len() + 1, "pid": std::process::id() }));
        ctx.save_checkpoint(json!({ "steps": done })).await?;
    }
    Ok(json!({ "steps": done }))
}

async fn digest(ctx: TaskContext) -> Result<Value, TaskError> {
    use sha2::{Digest, Sha256};
    let file = ctx
        .upload()
        .await?
        .ok_or_else(|| TaskError::new("this task names no upload (send it with artex upload)"))?;
    let path = file.path.clone();
    let sha256 = tokio::task::spawn_blocking(move || -> Result<String, TaskError> {
        let mut hash = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&path)?, &mut hash)?;
        Ok(hex::encode(hash.finalize()))
    })
    .await??;
    Ok(json!({
        "sha256": sha256,
        "size": file.size,
        "matches": sha256 == file.sha256,
        "host": crate::process::hostname(),
        "pid": std::process::id(),
    }))
}

fn field_u64(payload: &Value, name: &str) -> Result<Option<u64>, TaskError> {
    match payload.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            TaskError::new(format!(
                "payload field '{name}': expected a non-negative integer, got {v}"
            ))
        }),
    }
}

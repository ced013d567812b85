//! The stock binary's task kinds, for demos and tests: `echo`, `sleep`, `fail`, `noop`,
//! `checkpoint` (which saves its progress after every step and resumes from it, in
//! whatever process runs it next) and `gather` (a flow task that returns its upstream
//! tasks' results), and `digest` (the sha256 of the file its task was uploaded with, read
//! where the worker holds it).

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
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(json!({ "slept_ms": ms }))
    });
    r.register("fail", |ctx: TaskContext| async move {
        // Fails its first `times` attempts (all of them without `times`), then succeeds.
        let times = field_u64(ctx.payload(), "times")?;
        let attempt = ctx.attempt() as u64;
        match times {
            Some(t) if attempt > t => Ok(json!({ "succeeded_on_attempt": attempt })),
            _ => Err(TaskError::new(format!(
                "failing on purpose (attempt {attempt})"
            ))),
        }
    });
    r.register_resumable("checkpoint", checkpoint);
    r.register("digest", digest);
    r
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

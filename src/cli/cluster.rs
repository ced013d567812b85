//! `artex workers` and `artex stats`: the roster and the statistics as the blackboard has
//! them, the same reads (and, with `--json`, the same documents) as `GET /api/v1/workers`
//! and `GET /api/v1/stats`.

use clap::Args;
use serde_json::json;

use super::stdout::outln;
use super::{connect_one_shot, connect_reads, print_json, time_text};
use crate::config::DbConfig;
use crate::error::Result;

/// The arguments of `artex workers`.
#[derive(Debug, Args)]
pub(crate) struct WorkersArgs {
    /// At most this many.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    limit: i64,
    /// One JSON object, `{"workers": [...], "more": …}`, as `GET /api/v1/workers`.
    #[arg(long)]
    json: bool,
}

/// The arguments of `artex stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// The recent figures cover this many minutes.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..=60))]
    window_minutes: u32,
    /// One JSON object, as `GET /api/v1/stats`.
    #[arg(long)]
    json: bool,
}

/// Runs `artex workers`.
pub(crate) async fn workers(db: &DbConfig, args: WorkersArgs) -> Result {
    let bb = connect_reads(db).await?;
    // One more than asked says whether there are more.
    let mut workers = bb.workers(args.limit + 1).await?;
    let more = workers.len() as i64 > args.limit;
    workers.truncate(args.limit as usize);
    if args.json {
        return print_json(&json!({ "workers": workers, "more": more }));
    }
    if workers.is_empty() {
        eprintln!("no worker has registered yet");
        return Ok(());
    }
    outln!(
        "{:<40}  {:<9}  {:>7}  {:<10}  {:>9}  {:>5}  {:<24}  {:<12}  WAKE-UPS",
        "ID",
        "STATE",
        "PID",
        "VERSION",
        "HELD/CAP",
        "SLOTS",
        "LAST SEEN",
        "SHA256"
    )?;
    for w in &workers {
        outln!(
            "{:<40}  {:<9}  {:>7}  {:<10}  {:>9}  {:>5}  {:<24}  {:<12}  {}",
            w.id,
            w.state.as_str(),
            w.pid,
            w.version,
            format!("{}/{}", w.held, w.capacity),
            w.slots.map_or("-".to_string(), |s| s.to_string()),
            time_text(Some(w.last_seen)),
            w.binary_sha256
                .as_deref()
                .map(|s| &s[..s.len().min(12)])
                .unwrap_or("-"),
            w.wake_ups
        )?;
    }
    if more {
        eprintln!("(more than {}; --limit N to see more)", args.limit);
    }
    Ok(())
}

/// Runs `artex stats`.
pub(crate) async fn stats(db: &DbConfig, args: StatsArgs) -> Result {
    let stats = connect_reads(db)
        .await?
        .stats(args.window_minutes, None)
        .await?;
    // How far behind the replica is takes the primary too.
    let replica = match crate::runtime::connect_replica(db)? {
        Some(replica) => Some(replica.lag(&connect_one_shot(db).await?.operator()).await?),
        None => None,
    };
    if args.json {
        let mut body = serde_json::to_value(&stats)
            .map_err(|e| crate::error::Error::Invalid(format!("encoding the statistics: {e}")))?;
        body["replica"] = json!(replica);
        return print_json(&body);
    }
    let counts: Vec<String> = stats
        .by_status
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| {
            let plus = if stats.capped.contains(s) { "+" } else { "" };
            format!("{n}{plus} {s}")
        })
        .collect();
    outln!(
        "tasks:       {}",
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(", ")
        }
    )?;
    let r = &stats.recent;
    outln!(
        "finished:    {} in the last {} min ({:.1}/min{})",
        r.finished,
        r.window_minutes,
        r.throughput_per_minute,
        if r.sampled { ", sampled" } else { "" }
    )?;
    let ms = |v: Option<f64>| {
        v.map(|v| format!("{v:.0} ms"))
            .unwrap_or_else(|| "-".into())
    };
    for (name, p) in [("queue", &r.queue_ms), ("run", &r.run_ms)] {
        outln!(
            "{:<12} p50 {}, p95 {}, p99 {}, max {}",
            format!("{name}:"),
            ms(p.p50),
            ms(p.p95),
            ms(p.p99),
            ms(p.max)
        )?;
    }
    if let Some(lag) = replica {
        outln!(
            "replica:     {} behind ({} WAL bytes; replayed up to {})",
            ms(lag.lag_ms),
            lag.lag_bytes
                .map(|b| b.to_string())
                .unwrap_or_else(|| "-".into()),
            lag.replay_lsn
                .map(|l| l.to_string())
                .unwrap_or_else(|| "- (not a standby)".into())
        )?;
    }
    Ok(())
}

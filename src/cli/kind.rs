//! `artex kind …`: settings of one task kind. `kind limit K` sets, shows or clears the
//! kind's fleet-wide limits (at most N held at once, at most N of one `limit_key`, at
//! most R started per second), enforced where tasks are assigned
//! (migrations/V18__tags_and_limits.sql); `kind retry K` sets (or `--clear`s) its retry
//! policy — the backoff after a failed attempt and the attempts a task of the kind gets
//! when its submission states none (`artex_actors::retry`); `kind pause K` and `kind
//! resume K` stop and start the handing out of its tasks (migrations/V38__kinds_paused.sql).
//! `artex kinds` lists all of it.

use artex_actors::blackboard::{parse_rate, rate_text, KindLimit, KindPause, KnownKind, LimitSpec};
use artex_actors::retry::{Backoff, RetryPolicy};
use clap::{Args, Subcommand};

use super::stdout::outln;
use super::{cli_actor, connect_one_shot, print_json};
use crate::config::{parse_duration, DbConfig};
use crate::error::{Error, Result};

/// `artex kind …`.
#[derive(Debug, Subcommand)]
pub(crate) enum KindCommand {
    /// Set, show or clear a kind's fleet-wide limits: at most --concurrency of its
    /// tasks held (assigned or running) at once, at most --key-concurrency of one
    /// limit key (`submit --limit-key`), at most --rate started per second. Without a
    /// limit option, shows them.
    Limit(LimitArgs),
    /// Set a kind's retry policy: how long a failed attempt waits before its retry, and
    /// how many attempts its tasks get by default. Workers apply it within 5 s.
    Retry(RetryArgs),
    /// Pause a kind: its tasks stay pending (submissions are accepted, schedules keep
    /// firing) until `kind resume`; tasks already handed out finish. Holds across
    /// restarts and for every planner; audited with the reason.
    Pause(PauseArgs),
    /// Resume a paused kind: its pending tasks are handed out again at once.
    Resume(PauseArgs),
}

/// The arguments of `artex kind pause` and `artex kind resume`.
#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The task kind.
    #[arg(value_parser = parse_kind)]
    kind: String,
    /// Why, for the audit (at most 10,000 characters).
    #[arg(long)]
    reason: Option<String>,
    /// Print `{"kind", "changed", "paused"}` as JSON (`paused`: the pause now, null
    /// when the kind is not paused).
    #[arg(long)]
    json: bool,
}

/// The arguments of `artex kind limit`.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// The task kind.
    #[arg(value_parser = parse_kind)]
    kind: String,
    /// At most this many of the kind's tasks held at once, fleet-wide.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    concurrency: Option<i32>,
    /// At most this many of the kind's tasks with one limit key held at once.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    key_concurrency: Option<i32>,
    /// At most this many started, e.g. 100/s, 30/m, 1000/h.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Hand the kind's tasks out round-robin across their limit keys (`submit
    /// --limit-key`): a key with many waiting tasks does not hold back one with few;
    /// priority orders the tasks of a key. With or without the other limits.
    #[arg(long)]
    fair: bool,
    /// Remove the kind's limits.
    #[arg(long, conflicts_with_all = ["concurrency", "key_concurrency", "rate", "fair"])]
    clear: bool,
    /// Print the limits as one JSON object (`{"limits": …}`, null when none).
    #[arg(long)]
    json: bool,
}

fn parse_kind(s: &str) -> std::result::Result<String, String> {
    artex_actors::blackboard::check_kind(s).map(|()| s.to_string())
}

async fn limit(db: &DbConfig, args: LimitArgs) -> Result {
    let spec = LimitSpec {
        concurrency: args.concurrency,
        key_concurrency: args.key_concurrency,
        rate_per_sec: args.rate,
        fair: args.fair,
    };
    let setting = spec != LimitSpec::default();
    if setting {
        spec.check()
            .map_err(|(field, e)| Error::Invalid(format!("--{}: {e}", field.replace('_', "-"))))?;
    }
    let bb = connect_one_shot(db).await?;
    let board = bb.operator();
    let now = if args.clear {
        if !board.clear_kind_limit(&args.kind, &cli_actor()).await? {
            eprintln!("kind {} had no limits", args.kind);
        }
        None
    } else if setting {
        Some(
            board
                .set_kind_limit(&args.kind, &spec, &cli_actor())
                .await?,
        )
    } else {
        board.kind_limits(Some(&args.kind)).await?.pop()
    };
    if args.json {
        return print_json(&serde_json::json!({ "limits": now }));
    }
    match now {
        Some(l) => outln!("{}", limit_text(&l)),
        None => outln!("{}: no limits", args.kind),
    }
}

/// One kind's limits on one line, as `artex kind limit` and `artex kinds` show them.
pub(crate) fn limit_text(l: &KindLimit) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(n) = l.key_concurrency {
        parts.push(format!("per key {n}"));
    }
    if let Some(r) = l.rate_per_sec {
        parts.push(format!("rate {}", rate_text(r)));
    }
    if l.fair {
        parts.push("fair across keys".into());
    }
    format!("{}: {} ({} held)", l.kind, parts.join(", "), l.held)
}

/// The arguments of `artex kind retry`.
#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    /// The kind (one a worker has declared: `artex kinds`).
    kind: String,
    /// How the wait grows: exponential (base·2^n), linear (base·(n+1)) or fixed (base),
    /// n the attempts that failed before; exact, no jitter.
    #[arg(long, value_parser = parse_backoff, required_unless_present = "clear")]
    backoff: Option<Backoff>,
    /// The first wait (e.g. 200ms, 1s, 5m).
    #[arg(long, value_parser = parse_ms, required_unless_present = "clear")]
    base: Option<i64>,
    /// The longest wait (default: the base). Up to 30 days.
    #[arg(long, value_parser = parse_ms)]
    cap: Option<i64>,
    /// Attempts a task of the kind gets when its submission states no max_retries (its
    /// max_retries is this less one); a task that states its own keeps it.
    #[arg(long)]
    max_attempts: Option<i32>,
    /// Remove the policy: the fleet's default backoff and 3 retries apply again.
    #[arg(long, conflicts_with_all = ["backoff", "base", "cap", "max_attempts"])]
    clear: bool,
    /// Print the kind as `artex kinds --json` does.
    #[arg(long)]
    json: bool,
}

fn parse_backoff(s: &str) -> std::result::Result<Backoff, String> {
    s.parse()
}

/// A duration in milliseconds (at least 1 ms; the range is checked with the policy).
fn parse_ms(s: &str) -> std::result::Result<i64, String> {
    let d = parse_duration(s)?;
    i64::try_from(d.as_millis()).map_err(|_| format!("'{s}': too long"))
}

/// Runs `artex kind …`.
pub(crate) async fn kind(db: &DbConfig, command: KindCommand) -> Result {
    match command {
        KindCommand::Limit(args) => limit(db, args).await,
        KindCommand::Retry(args) => retry(db, args).await,
        KindCommand::Pause(args) => pause(db, args, true).await,
        KindCommand::Resume(args) => pause(db, args, false).await,
    }
}

/// `artex kind pause` (`pausing`) or `artex kind resume`.
async fn pause(db: &DbConfig, args: PauseArgs, pausing: bool) -> Result {
    let bb = connect_one_shot(db).await?;
    let board = bb.operator();
    let reason = args.reason.as_deref();
    let changed = if pausing {
        board.pause_kind(&args.kind, reason, &cli_actor()).await?
    } else {
        board.resume_kind(&args.kind, reason, &cli_actor()).await?
    };
    let paused = board.paused_kinds(Some(&args.kind)).await?.pop();
    if args.json {
        return print_json(&serde_json::json!({
            "kind": args.kind,
            "changed": changed,
            "paused": paused,
        }));
    }
    match (pausing, changed, &paused) {
        (true, true, _) => outln!(
            "kind {} paused: its tasks stay pending until `artex kind resume {}`",
            args.kind,
            args.kind
        ),
        (false, true, _) => outln!("kind {} resumed", args.kind),
        (_, false, Some(p)) => outln!("kind {} was paused already: {}", args.kind, pause_text(p)),
        (_, false, None) => outln!("kind {} was not paused", args.kind),
    }
}

/// A pause as `artex kinds` and `artex kind pause` show it.
pub(crate) fn pause_text(p: &KindPause) -> String {
    format!(
        "since {} by {}{}",
        super::time_text(Some(p.paused_at)),
        p.paused_by,
        p.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    )
}

async fn retry(db: &DbConfig, args: RetryArgs) -> Result {
    let policy = match (args.clear, args.backoff, args.base) {
        (true, ..) => None,
        (false, Some(backoff), Some(base_ms)) => Some(RetryPolicy {
            backoff,
            base_ms,
            cap_ms: args.cap.unwrap_or(base_ms),
            max_attempts: args.max_attempts,
        }),
        // clap requires both unless --clear.
        _ => {
            return Err(Error::Invalid(
                "--backoff and --base are needed (or --clear)".into(),
            ))
        }
    };
    // Checked before connecting: bad input says which option, whatever the database.
    if let Some(p) = &policy {
        p.check().map_err(|r| {
            let option = match r.field {
                "base" => "--base",
                "cap" => "--cap",
                _ => "--max-attempts",
            };
            Error::Invalid(format!("{option}: {}", r.message))
        })?;
    }
    let bb = connect_one_shot(db).await?;
    let Some(kind) = bb
        .operator()
        .set_retry_policy(&args.kind, policy.as_ref())
        .await?
    else {
        return Err(Error::Invalid(format!(
            "kind '{}': no worker has declared it (see artex kinds); a policy is set on a \
             declared kind",
            args.kind
        )));
    };
    if args.json {
        return print_json(&kind);
    }
    outln!("{}", kind_line(&kind))
}

/// A kind as `artex kinds` and `artex kind retry` print it.
pub(crate) fn kind_line(k: &KnownKind) -> String {
    format!(
        "{:<24}  first seen {}  last seen {}  retry {}",
        k.kind,
        super::time_text(Some(k.first_seen)),
        super::time_text(Some(k.last_seen)),
        k.retry
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "default".into())
    )
}

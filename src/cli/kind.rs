//! `artex kind limit K …`: a kind's fleet-wide limits (at most N held at once, at most N
//! of one `limit_key`, at most R started per second), enforced where tasks are assigned
//! (migrations/V18__tags_and_limits.sql). `artex kinds` lists them.

use artex_actors::blackboard::{parse_rate, rate_text, KindLimit, LimitSpec};
use clap::{Args, Subcommand};

use super::stdout::outln;
use super::{cli_actor, connect_one_shot, print_json};
use crate::config::DbConfig;
use crate::error::{Error, Result};

/// `artex kind …`
#[derive(Debug, Subcommand)]
pub(crate) enum KindCommand {
    /// Set, show or clear a kind's fleet-wide limits: at most --concurrency of its
    /// tasks held (assigned or running) at once, at most --key-concurrency of one
    /// limit key (`submit --limit-key`), at most --rate started per second. Without a
    /// limit option, shows them.
    Limit(LimitArgs),
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
    /// Remove the kind's limits.
    #[arg(long, conflicts_with_all = ["concurrency", "key_concurrency", "rate"])]
    clear: bool,
    /// Print the limits as one JSON object (`{"limits": …}`, null when none).
    #[arg(long)]
    json: bool,
}

fn parse_kind(s: &str) -> std::result::Result<String, String> {
    artex_actors::blackboard::check_kind(s).map(|()| s.to_string())
}

/// Runs `artex kind …`.
pub(crate) async fn kind(db: &DbConfig, command: KindCommand) -> Result {
    match command {
        KindCommand::Limit(args) => limit(db, args).await,
    }
}

async fn limit(db: &DbConfig, args: LimitArgs) -> Result {
    let spec = LimitSpec {
        concurrency: args.concurrency,
        key_concurrency: args.key_concurrency,
        rate_per_sec: args.rate,
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
    format!("{}: {} ({} held)", l.kind, parts.join(", "), l.held)
}

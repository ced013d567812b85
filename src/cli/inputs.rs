//! What the blackboard accepts, from the command line: `artex limits` (the payload size
//! limit) and `artex kinds` (every kind a worker has declared), and the input handling
//! `submit` and `flow submit` share — a payload given inline, as `@FILE` or `-`, and how
//! a refused submission (`artex_actors::submission`) is said on the command line.

use std::io::Read;

use artex_actors::submission::{Refusal, Submission};
use artex_actors::Blackboard;
use clap::Args;
use serde_json::Value;

use super::stdout::outln;
use super::{connect_one_shot, print_json};
use crate::config::DbConfig;
use crate::error::{Error, Result};

/// The arguments of `artex limits`.
#[derive(Debug, Args)]
pub(crate) struct LimitsArgs {
    /// Set the largest payload accepted, in bytes of its JSON text (new tasks only).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    max_payload_bytes: Option<i32>,
    /// Print `{"max_payload_bytes": …}`.
    #[arg(long)]
    json: bool,
}

/// Runs `artex limits`.
pub(crate) async fn limits(db: &DbConfig, args: LimitsArgs) -> Result {
    let bb = connect_one_shot(db).await?;
    let limits = match args.max_payload_bytes {
        Some(n) => bb.operator().set_max_payload_bytes(n).await?,
        None => bb.operator().limits().await?,
    };
    if args.json {
        return print_json(&limits);
    }
    outln!("max_payload_bytes: {}", limits.max_payload_bytes)
}

/// Runs `artex kinds`.
pub(crate) async fn kinds(db: &DbConfig, json: bool) -> Result {
    let bb = connect_one_shot(db).await?;
    let kinds = bb.operator().known_kinds().await?;
    let limits = bb.operator().kind_limits(None).await?;
    let paused = bb.operator().paused_kinds(None).await?;
    if json {
        return print_json(
            &serde_json::json!({ "kinds": kinds, "limits": limits, "paused": paused }),
        );
    }
    for k in &kinds {
        outln!("{}", super::kind::kind_line(k))?;
    }
    if kinds.is_empty() {
        eprintln!("no worker has registered yet");
    }
    if !limits.is_empty() {
        outln!("limits:")?;
        for l in &limits {
            outln!("  {}", super::kind::limit_text(l))?;
        }
    }
    if !paused.is_empty() {
        outln!("paused:")?;
        for p in &paused {
            outln!("  {}: {}", p.kind, super::kind::pause_text(p))?;
        }
    }
    Ok(())
}

/// A payload as given on the command line, and how messages name it.
pub(crate) struct Payload {
    /// The payload.
    pub value: Value,
    /// `--payload`, `--payload (file F)` or `--payload (standard input)`.
    pub name: String,
}

/// The payload of `--payload ARG`: JSON inline, `@FILE` to read it from a file, `-` from
/// standard input; `{}` without one. Errors name `--payload` and the file. Only the
/// syntax is read here: the rules on a payload are the submission's.
pub(crate) fn read_payload(arg: Option<&str>) -> Result<Payload> {
    let Some(arg) = arg else {
        return Ok(Payload {
            value: Value::Object(Default::default()),
            name: "--payload".into(),
        });
    };
    let (bytes, source) = if arg == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io("--payload -: reading standard input", e))?;
        (bytes, " (standard input)".to_string())
    } else if let Some(path) = arg.strip_prefix('@') {
        let bytes =
            std::fs::read(path).map_err(|e| Error::io(format!("--payload: reading {path}"), e))?;
        (bytes, format!(" (file {path})"))
    } else {
        (arg.as_bytes().to_vec(), String::new())
    };
    // From bytes, so a file that is not UTF-8 is bad JSON (exit 2), not a read failure.
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Invalid(format!("--payload{source}: not valid JSON: {e}")))?;
    Ok(Payload {
        value,
        name: format!("--payload{source}"),
    })
}

/// A refused submission as the command line says it: `place` is how the command names
/// the field (`--payload`, `kind`, `task 'b': kind`).
pub(crate) fn refusal_text(r: &Refusal, place: &str) -> String {
    r.message(place, "pass --allow-unregistered-kind")
}

/// Checks `submission` against this blackboard before anything is written (its shape
/// was checked before connecting): the payload limit, and the kinds workers declared —
/// the CLI's rule, not the database's, lifted by `--allow-unregistered-kind`
/// (submitting before the workers start). `refused` says a refusal.
pub(crate) async fn check_submission(
    bb: &Blackboard,
    submission: &Submission<'_>,
    refused: impl Fn(Refusal) -> Error,
) -> Result {
    let facts = bb.operator().submission_facts(submission).await?;
    submission.check(&facts).map_err(refused)?;
    Ok(())
}

//! What the blackboard accepts, from the command line: `artex limits` (the payload size
//! limit) and `artex kinds` (every kind a worker has declared), and the input handling
//! `submit` and `flow submit` share — a payload given inline, as `@FILE` or `-`, and the
//! checks against the blackboard made before anything is written.

use std::io::Read;

use artex_actors::blackboard::{check_kind, check_payload, payload_text_len, KnownKind};
use artex_actors::Blackboard;
use clap::Args;
use serde_json::Value;

use super::stdout::outln;
use super::{connect_one_shot, print_json, time_text};
use crate::config::DbConfig;
use crate::error::{Error, Result};

/// How many known kinds a refusal lists before it says "…".
const KINDS_LISTED: usize = 20;

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
    if json {
        return print_json(&serde_json::json!({ "kinds": kinds }));
    }
    for k in &kinds {
        outln!(
            "{:<24}  first seen {}  last seen {}",
            k.kind,
            time_text(Some(k.first_seen)),
            time_text(Some(k.last_seen))
        )?;
    }
    if kinds.is_empty() {
        eprintln!("no worker has registered yet");
    }
    Ok(())
}

/// The payload of `--payload ARG`: JSON inline, `@FILE` to read it from a file, `-` from
/// standard input; `{}` without one. Errors name `--payload` and the file.
pub(crate) fn read_payload(arg: Option<&str>) -> Result<Value> {
    let Some(arg) = arg else {
        return Ok(Value::Object(Default::default()));
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
    check_payload(&value).map_err(|e| Error::Invalid(format!("--payload{source}: {e}")))?;
    Ok(value)
}

/// One task about to be submitted, as [`check_submission`] sees it.
pub(crate) struct Submitted<'a> {
    /// How messages name this task's payload: `--payload`, or the flow task's.
    pub payload_name: String,
    /// How messages name this task's kind.
    pub kind_name: String,
    /// Its kind.
    pub kind: &'a str,
    /// Its payload.
    pub payload: &'a Value,
}

/// Checks tasks against this blackboard before anything is written. The payload size:
/// the database refuses an oversized payload too, but here the message names the option
/// and the payload is never sent. The kind: some worker must have declared it, or the
/// task would wait for a worker that may never come (a typo) — the CLI's rule, not the
/// database's, lifted by `allow_unregistered` (submitting before the workers start).
pub(crate) async fn check_submission(
    bb: &Blackboard,
    tasks: &[Submitted<'_>],
    allow_unregistered: bool,
) -> Result {
    let limit = bb.operator().limits().await?.max_payload_bytes;
    for t in tasks {
        let bytes = payload_text_len(t.payload);
        if bytes > limit as usize {
            return Err(Error::Invalid(format!(
                "{}: {bytes} bytes, more than the limit of {limit} bytes \
                 (an operator can raise it: artex limits --max-payload-bytes N)",
                t.payload_name
            )));
        }
    }
    if allow_unregistered {
        return Ok(());
    }
    let known = bb.operator().known_kinds().await?;
    for t in tasks {
        if !known.iter().any(|k| k.kind == t.kind) {
            return Err(Error::Invalid(format!(
                "{}: {:?} has never been declared by a worker ({}); check the name, or pass \
                 --allow-unregistered-kind to submit it before its workers run",
                t.kind_name,
                t.kind,
                listing(&known)
            )));
        }
    }
    Ok(())
}

fn listing(known: &[KnownKind]) -> String {
    if known.is_empty() {
        return "no worker has registered yet".into();
    }
    // A kind registered through the library may be no name at all (a newline in it):
    // such a kind cannot be submitted, and listing it would break the one-line message.
    let names: Vec<&str> = known
        .iter()
        .map(|k| k.kind.as_str())
        .filter(|k| check_kind(k).is_ok())
        .collect();
    let more = names.len() > KINDS_LISTED;
    let mut names: Vec<&str> = names.into_iter().take(KINDS_LISTED).collect();
    if more {
        names.push("…");
    }
    format!("known kinds: {}", names.join(", "))
}

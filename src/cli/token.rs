//! `artex token …`: the named bearer tokens of the HTTP API and the dashboard. `create`
//! makes one and prints its secret, once (the blackboard keeps only its SHA-256); `list`
//! shows them (never a secret); `revoke` ends one. Every `artex serve` and worker honors
//! a change within a few seconds (`http::auth::NAMED_REFRESH`), and the audit records
//! what a named token changes under its name (`token:NAME`).

use artex_actors::blackboard::{check_token_name, TokenInfo, TokenScope};
use chrono::Utc;
use clap::{Args, Subcommand};

use super::stdout::outln;
use super::{cli_actor, connect_one_shot, print_json, time_text};
use crate::config::{parse_duration, DbConfig};
use crate::error::{Error, Result};
use crate::tokens;

/// `artex token …`.
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a named token and print its secret, once: store it where it is used
    /// (`Authorization: Bearer …`, the dashboard asks for it). `read` looks, `write`
    /// changes too, `admin` manages tokens too.
    Create(CreateArgs),
    /// The named tokens: name, scope, who made them, when they expire (never a secret).
    List(ListArgs),
    /// Revoke a named token: every serve and worker refuses it (401) within seconds.
    Revoke(RevokeArgs),
}

/// The arguments of `artex token create`.
#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// The token's name (letters, digits, . _ @ -): what the audit records for what it
    /// does.
    #[arg(value_parser = parse_name)]
    name: String,
    /// What it may do: read, write or admin.
    #[arg(long, value_parser = parse_scope)]
    scope: TokenScope,
    /// Stop working after this long, e.g. 30d, 12h (default: never).
    #[arg(long, value_parser = parse_duration)]
    expires: Option<std::time::Duration>,
    /// Print `{"name","scope","secret","expires_at"}` as JSON.
    #[arg(long)]
    json: bool,
}

/// The arguments of `artex token list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// List revoked tokens too.
    #[arg(long)]
    revoked: bool,
    /// One JSON object, `{"tokens": [...]}`.
    #[arg(long)]
    json: bool,
}

/// The arguments of `artex token revoke`.
#[derive(Debug, Args)]
pub(crate) struct RevokeArgs {
    /// The token's name.
    #[arg(value_parser = parse_name)]
    name: String,
    /// Print `{"name","revoked_at"}` as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_name(s: &str) -> std::result::Result<String, String> {
    check_token_name(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

fn parse_scope(s: &str) -> std::result::Result<TokenScope, String> {
    TokenScope::parse(s).map_err(|e| e.to_string())
}

pub(crate) async fn token(db: &DbConfig, command: TokenCommand) -> Result {
    match command {
        TokenCommand::Create(args) => create(db, args).await,
        TokenCommand::List(args) => list(db, args).await,
        TokenCommand::Revoke(args) => revoke(db, args).await,
    }
}

async fn create(db: &DbConfig, args: CreateArgs) -> Result {
    let expires_at = args
        .expires
        .map(tokens::expiry)
        .transpose()
        .map_err(|e| Error::Invalid(format!("--expires: {e}")))?;
    let secret = tokens::new_secret()?;
    let bb = connect_one_shot(db).await?;
    bb.operator()
        .create_token(
            &args.name,
            args.scope,
            &tokens::secret_sha256(&secret),
            expires_at,
            &cli_actor(),
        )
        .await?;
    if args.json {
        return print_json(&serde_json::json!({
            "name": args.name,
            "scope": args.scope,
            "secret": secret,
            "expires_at": expires_at,
        }));
    }
    outln!("{secret}")?;
    eprintln!(
        "token {} ({} scope{}) made: its secret is printed above and never again",
        args.name,
        args.scope.as_str(),
        expires_at
            .map(|at| format!(", expires {}", time_text(Some(at))))
            .unwrap_or_default()
    );
    Ok(())
}

async fn list(db: &DbConfig, args: ListArgs) -> Result {
    let bb = connect_one_shot(db).await?;
    let tokens = bb.operator().tokens(args.revoked).await?;
    if args.json {
        return print_json(&serde_json::json!({ "tokens": tokens }));
    }
    if tokens.is_empty() {
        return outln!("no named tokens (artex token create NAME --scope read|write|admin)");
    }
    outln!(
        "{:<24} {:<6} {:<10} {:<26} CREATED BY",
        "NAME",
        "SCOPE",
        "STATE",
        "EXPIRES"
    )?;
    for t in &tokens {
        outln!(
            "{:<24} {:<6} {:<10} {:<26} {}",
            t.name,
            t.scope.as_str(),
            state(t),
            t.expires_at
                .map_or("never".into(), |at| time_text(Some(at))),
            t.created_by
        )?;
    }
    Ok(())
}

/// `live`, `expired` or `revoked`.
fn state(t: &TokenInfo) -> &'static str {
    if t.revoked_at.is_some() {
        "revoked"
    } else if t.expires_at.is_some_and(|at| at <= Utc::now()) {
        "expired"
    } else {
        "live"
    }
}

async fn revoke(db: &DbConfig, args: RevokeArgs) -> Result {
    let bb = connect_one_shot(db).await?;
    let revoked_at = bb.operator().revoke_token(&args.name, &cli_actor()).await?;
    if args.json {
        return print_json(&serde_json::json!({ "name": args.name, "revoked_at": revoked_at }));
    }
    match revoked_at {
        Some(_) => outln!(
            "token {} revoked: refused everywhere within seconds",
            args.name
        ),
        None => Err(artex_actors::Error::Refused(format!(
            "no live token named {:?} (see `artex token list --revoked`)",
            args.name
        ))
        .into()),
    }
}

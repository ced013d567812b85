//! The command line as a user meets it: bad input is refused with a one-line error naming
//! what was wrong, exit code 2, and nothing written; good input works; the embedded
//! PostgreSQL cluster is created on first start and reused on the second.
//!
//! # Layout
//! - `input`: bad input refused, kinds, payload limits and sources.
//! - `submit_fuzz`: `artex submit` with random and mutated arguments: a task or a
//!   message and a non-zero exit, never a panic, nothing written on a refusal.
//! - `output`: what one-shot commands print, in text and as JSON.
//! - `embedded_cluster`: the embedded PostgreSQL cluster's life.
//! - `waiting`: `submit --wait` and `flow show --follow`.
//! - `bundles`: `bundle create`.
//! - `pipes`: output into a pipe whose reader has gone (`| head -1`): quiet, exit 141.
//! - `up`: `artex up`'s banner and default port.
//! - `reference`: docs/cli.md and docs/configuration.md current, man pages, `--help`'s
//!   grouping.
//! - `doc_links`: every relative link in README.md and docs/ resolves.

#[path = "../common/mod.rs"]
mod common;

mod bundles;
mod doc_links;
mod embedded_cluster;
mod input;
mod output;
mod pipes;
mod reference;
mod submit_fuzz;
mod up;
mod waiting;

use std::path::Path;
use std::process::{Command, Output};

/// `artex ARGS…` against `url` (or the embedded cluster in `data_dir` when `url` is None).
fn artex(url: Option<&str>, data_dir: Option<&Path>, args: &[&str]) -> Output {
    artex_command(url, data_dir, args)
        .output()
        .expect("run artex")
}

/// The command [`artex`] runs, to be given its standard output.
fn artex_command(url: Option<&str>, data_dir: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::artex_bin());
    cmd.args(args)
        .env_remove("ARTEX_DATABASE_URL")
        .env("ARTEX_LOG", "warn");
    if let Some(u) = url {
        cmd.env("ARTEX_DATABASE_URL", u);
    }
    if let Some(d) = data_dir {
        cmd.env("ARTEX_DATA_DIR", d);
    }
    cmd
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Writes `spec` to `dir/flow.json` and submits it (`artex flow submit FILE --json`);
/// returns the flow's id.
fn submit_flow_file(url: Option<&str>, dir: &Path, spec: &str) -> String {
    let file = dir.join("flow.json");
    std::fs::write(&file, spec).expect("writing the flow file");
    let v = json_of(&artex(
        url,
        None,
        &["flow", "submit", file.to_str().unwrap(), "--json"],
    ));
    v["id"].as_str().expect("flow submit: id").to_string()
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", stdout(out)))
}

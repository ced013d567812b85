//! The reference pages and the help as a reader meets them: docs/cli.md and
//! docs/configuration.md say what this build's command line is (regenerated and compared:
//! a stale page fails, naming the command that makes it again), `artex docs man DIR` writes
//! a man page per command, and each command's `--help` shows its own options before the
//! connection options every command shares.

use std::path::Path;

use crate::{artex, stderr, stdout};

/// Compares the committed `page` (under docs/) with what `generated` makes of this build.
fn assert_current(page: &str, generated: String, command: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(page);
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    if committed.trim_end() != generated.trim_end() {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/{page} is stale (first difference at line {}): the command line changed. \
             Run `{command}` and commit the page.",
            first + 1
        );
    }
}

#[test]
fn docs_cli_md_is_what_the_clap_definitions_say() {
    assert_current(
        "cli.md",
        artex::cli::docs::cli_markdown(),
        "cargo run -q -- docs cli > docs/cli.md",
    );
}

#[test]
fn docs_configuration_md_is_what_the_clap_definitions_say() {
    assert_current(
        "configuration.md",
        artex::cli::docs::configuration_markdown(),
        "cargo run -q -- docs configuration > docs/configuration.md",
    );
}

/// Every command's path of names (`artex task show`), hidden ones and clap's `help` aside.
fn command_paths(cmd: &clap::Command, path: String, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            command_paths(sub, format!("{path} {}", sub.get_name()), out);
        }
    }
    out.push(path);
}

#[test]
fn docs_man_writes_a_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = artex(None, None, &["docs", "man", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut paths = Vec::new();
    command_paths(&artex::cli::docs::command(), "artex".into(), &mut paths);
    assert!(paths.len() > 40, "{paths:?}");
    for path in &paths {
        let page = dir.path().join(format!("{}.1", path.replace(' ', "-")));
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("no man page for `{path}` ({}): {e}", page.display()));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{text}");
    }
    let worker = std::fs::read_to_string(dir.path().join("artex-worker.1")).unwrap();
    for expected in ["artex\\-worker", "\\-\\-concurrency", "ARTEX_CONCURRENCY"] {
        assert!(worker.contains(expected), "{expected} missing:\n{worker}");
    }
    // The synopsis knows no headings: a command's own options still come first.
    let at = |s: &str| {
        worker
            .find(s)
            .unwrap_or_else(|| panic!("{s} missing:\n{worker}"))
    };
    assert!(
        at("\\-\\-concurrency") < at("\\-\\-database\\-url"),
        "{worker}"
    );
    let written = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(written, paths.len(), "one page per command, no other file");
}

#[test]
fn help_shows_a_commands_own_options_before_the_shared_connection_options() {
    for (args, own) in [
        (&["worker", "--help"][..], "--concurrency"),
        (&["submit", "--help"][..], "--payload"),
        (&["task", "show", "--help"][..], "--full"),
    ] {
        let out = artex(None, None, args);
        assert!(out.status.success(), "{}", stderr(&out));
        let help = stdout(&out);
        let at = |needle: &str| {
            help.find(needle)
                .unwrap_or_else(|| panic!("`artex {}` lacks {needle}:\n{help}", args.join(" ")))
        };
        let heading = at("\nDatabase connection:\n");
        assert!(at(own) < heading, "{help}");
        assert!(at("--verbose") < heading, "{help}");
        for shared in [
            "--database-url",
            "--pool-size",
            "--data-dir",
            "--db-start-wait-ms",
        ] {
            assert!(
                at(shared) > heading,
                "{shared} not under its heading:\n{help}"
            );
        }
    }
}

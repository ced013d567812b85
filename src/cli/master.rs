//! `artex master`: the stable parent for supervisord and runit ([`crate::master`]). This
//! file turns the command line into the master's settings: the generations run this
//! binary with the same command line, `master` replaced by `worker`.

use std::ffi::OsString;

use crate::config::{ms, WorkerArgs};
use crate::error::{Error, Result};
use crate::hot_upgrade::UpgradeSettings;
use crate::master::MasterConfig;
use crate::runtime::bind_http;

/// Runs `artex master`.
pub(crate) async fn master(worker: &WorkerArgs) -> Result {
    let listener = bind_http(&worker.http)?;
    // Also checks the upgrade key and token now, before any generation exists.
    let upgrade = UpgradeSettings::from_args(worker)?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("finding this executable (for the generations)", e))?;
    crate::master::run(MasterConfig {
        exe,
        generation_args: generation_args(&std::env::args_os().collect::<Vec<_>>())?,
        listener,
        dir: upgrade.dir,
        ready_deadline: ms(worker.upgrade_ready_ms),
        drain_deadline: ms(worker.drain_ms),
    })
    .await
}

/// The generations' command line: ours, with the subcommand (`master`) replaced by
/// `worker`. Before the subcommand only the global options may appear; those that take
/// a value in the next argument are skipped with it, so a value spelled `master` is
/// never mistaken for the subcommand.
fn generation_args(argv: &[OsString]) -> Result<Vec<OsString>> {
    let cli = <super::Cli as clap::CommandFactory>::command();
    let takes_value = |long: &str| {
        cli.get_arguments()
            .any(|a| a.get_long() == Some(long) && a.get_action().takes_values())
    };
    let mut i = 1;
    while i < argv.len() {
        let arg = argv[i].to_string_lossy();
        if let Some(long) = arg.strip_prefix("--") {
            if !long.contains('=') && takes_value(long) {
                i += 1;
            }
        } else if !arg.starts_with('-') {
            if arg != "master" {
                break;
            }
            let mut out = argv[1..].to_vec();
            out[i - 1] = "worker".into();
            return Ok(out);
        }
        i += 1;
    }
    Err(Error::Invalid(
        "artex master: cannot find the `master` subcommand in the command line".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_generation_runs_worker_with_the_same_flags() {
        let got = generation_args(&argv(&["artex", "master", "--http", "0.0.0.0:8080"])).unwrap();
        assert_eq!(got, argv(&["worker", "--http", "0.0.0.0:8080"]));
        // A global option's value may be spelled like the subcommand.
        let got = generation_args(&argv(&[
            "/usr/bin/artex",
            "--data-dir",
            "master",
            "--database-url=postgres://x/master",
            "master",
            "--concurrency",
            "master",
        ]))
        .unwrap();
        assert_eq!(
            got,
            argv(&[
                "--data-dir",
                "master",
                "--database-url=postgres://x/master",
                "worker",
                "--concurrency",
                "master",
            ])
        );
        let err = generation_args(&argv(&["artex", "worker"])).unwrap_err();
        assert!(err.to_string().contains("master"), "{err}");
    }
}

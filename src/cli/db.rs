//! `artex migrate`, `artex schema` and `artex db start|stop|status|url`: the blackboard's
//! schema and the embedded PostgreSQL cluster in `--data-dir`.

use artex_actors::blackboard::{Change, MIGRATIONS};
use clap::Subcommand;

use super::stdout::outln;
use super::{connect_to_migrate, print_json};
use crate::config::DbConfig;
use crate::dev_db::{start_embedded, Cluster, ClusterOptions, ClusterState, DATABASE};
use crate::error::{Error, Result};

/// Runs `artex migrate`.
pub(crate) async fn migrate(db: &DbConfig, json: bool) -> Result {
    let bb = connect_to_migrate(db).await?;
    let report = bb.maintenance().migrate().await?;
    if json {
        return print_json(&serde_json::json!({
            "applied": report.applied, "already": report.already, "newer": report.newer,
        }));
    }
    outln!(
        "schema up to date (applied now: {:?}, already: {:?})",
        report.applied,
        report.already
    )?;
    if !report.newer.is_empty() {
        outln!(
            "newer than this build, expansions it runs against: {}",
            report.newer.join(", ")
        )?;
    }
    Ok(())
}

/// Runs `artex schema`: what this build needs of the database, without connecting. With
/// `--json`, the form a bundle's manifest carries (`artex bundle create` asks the binary
/// it packages for it).
pub(crate) fn schema(json: bool) -> Result {
    if json {
        let text = serde_json::to_string(&crate::hot_upgrade::schema::this_build())
            .map_err(|e| Error::Invalid(format!("encoding the schema: {e}")))?;
        outln!("{text}")?;
        return Ok(());
    }
    outln!(
        "artex {} needs every migration below applied (`artex migrate` with this build) and \
         runs against newer ones that only expand the schema:",
        crate::VERSION
    )?;
    for m in MIGRATIONS {
        let change = match m.change {
            Change::Expand => "expand".to_string(),
            Change::Contract { compatible_from } => {
                format!("contract: builds that know V{compatible_from} or newer")
            }
        };
        outln!("  {}  {change}", m.label())?;
    }
    Ok(())
}

/// `artex db …`
#[derive(Debug, Subcommand)]
pub(crate) enum DbCommand {
    /// Create (first time) and start the cluster; prints its URL.
    Start {
        /// Also listen on this loopback TCP port.
        #[arg(long)]
        tcp_port: Option<u16>,
        /// Start with wal_level=logical (for the logical decoding feed).
        #[arg(long)]
        logical: bool,
        /// Print `{"url", "data_dir", "started"}`.
        #[arg(long)]
        json: bool,
    },
    /// Stop the cluster.
    Stop {
        /// Print `{"stopped": true|false}` (false: it was not running).
        #[arg(long)]
        json: bool,
    },
    /// Whether the cluster exists and runs (exit 0 running, 3 stopped or absent).
    Status {
        /// Print `{"state": "running"|"stopped"|"absent", "pid", "url", "data_dir"}`.
        #[arg(long)]
        json: bool,
    },
    /// Print a connection URL (for psql and ARTEX_DATABASE_URL).
    Url {
        /// Print `{"url"}`.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `artex db …`.
pub(crate) async fn db(db: &DbConfig, command: DbCommand) -> Result {
    let opts = |tcp_port, logical| ClusterOptions {
        tcp_port,
        logical,
        ..ClusterOptions::new(&db.data_dir)
    };
    match command {
        DbCommand::Start {
            tcp_port,
            logical,
            json,
        } => {
            let (cluster, started) = start_embedded(opts(tcp_port, logical)).await?;
            let bb = artex_actors::Blackboard::connect(&cluster.url(DATABASE), 1)?;
            bb.maintenance().migrate().await?;
            eprintln!(
                "{} PostgreSQL in {}",
                if started {
                    "started"
                } else {
                    "already running:"
                },
                cluster.data_dir().display()
            );
            if json {
                return print_json(&serde_json::json!({
                    "url": cluster.url(DATABASE),
                    "data_dir": cluster.data_dir(),
                    "started": started,
                }));
            }
            outln!("{}", cluster.url(DATABASE))
        }
        DbCommand::Stop { json } => {
            let cluster = Cluster::new(opts(None, false))?;
            let stopped = cluster.stop()?;
            if json {
                print_json(&serde_json::json!({ "stopped": stopped }))?;
            } else if stopped {
                outln!("stopped")?;
            } else {
                outln!("not running")?;
            }
            Ok(())
        }
        DbCommand::Status { json } => {
            let cluster = Cluster::new(opts(None, false))?;
            let state = cluster.status()?;
            if json {
                let (name, pid, url) = match state {
                    ClusterState::Absent => ("absent", None, None),
                    ClusterState::Stopped => ("stopped", None, None),
                    ClusterState::Running(pid) => {
                        ("running", Some(pid), Some(cluster.url(DATABASE)))
                    }
                };
                print_json(&serde_json::json!({
                    "state": name, "pid": pid, "url": url, "data_dir": cluster.data_dir(),
                }))?;
            }
            // Exit 0 only when it runs: scripts ask `artex db status && …`.
            match state {
                ClusterState::Absent => {
                    if !json {
                        outln!("absent: no cluster in {}", db.data_dir.display())?;
                    }
                    Err(Error::NotRunning(
                        "no cluster yet; create it with: artex db start".into(),
                    ))
                }
                ClusterState::Stopped => {
                    if !json {
                        outln!("stopped: {}", cluster.data_dir().display())?;
                    }
                    Err(Error::NotRunning(
                        "the cluster is stopped; start it with: artex db start".into(),
                    ))
                }
                ClusterState::Running(pid) => {
                    if !json {
                        outln!("running: pid {pid}, {}", cluster.url(DATABASE))?;
                    }
                    Ok(())
                }
            }
        }
        DbCommand::Url { json } => {
            let cluster = Cluster::new(opts(None, false))?;
            if cluster.status()? == ClusterState::Absent {
                return Err(Error::Cluster(format!(
                    "no cluster in {}; create it with: artex db start",
                    db.data_dir.display()
                )));
            }
            if json {
                return print_json(&serde_json::json!({ "url": cluster.url(DATABASE) }));
            }
            outln!("{}", cluster.url(DATABASE))
        }
    }
}

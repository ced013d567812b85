//! `artex migrate`, `artex schema` and `artex db start|stop|status|url`: the blackboard's
//! schema and the embedded PostgreSQL cluster in `--data-dir`.

use artex_actors::blackboard::{Change, MIGRATIONS};
use clap::Subcommand;

use super::connect_to_migrate;
use crate::config::DbConfig;
use crate::dev_db::{start_embedded, Cluster, ClusterOptions, ClusterState, DATABASE};
use crate::error::{Error, Result};

/// Runs `artex migrate`.
pub(crate) async fn migrate(db: &DbConfig) -> Result {
    let bb = connect_to_migrate(db).await?;
    let report = bb.migrate().await?;
    println!(
        "schema up to date (applied now: {:?}, already: {:?})",
        report.applied, report.already
    );
    if !report.newer.is_empty() {
        println!(
            "newer than this build, expansions it runs against: {}",
            report.newer.join(", ")
        );
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
        println!("{text}");
        return Ok(());
    }
    println!(
        "artex {} needs every migration below applied (`artex migrate` with this build) and \
         runs against newer ones that only expand the schema:",
        crate::VERSION
    );
    for m in MIGRATIONS {
        let change = match m.change {
            Change::Expand => "expand".to_string(),
            Change::Contract { compatible_from } => {
                format!("contract: builds that know V{compatible_from} or newer")
            }
        };
        println!("  {}  {change}", m.label());
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
    },
    /// Stop the cluster.
    Stop,
    /// Whether the cluster exists and runs.
    Status,
    /// Print a connection URL (for psql and ARTEX_DATABASE_URL).
    Url,
}

/// Runs `artex db …`.
pub(crate) async fn db(db: &DbConfig, command: DbCommand) -> Result {
    let opts = |tcp_port, logical| ClusterOptions {
        tcp_port,
        logical,
        ..ClusterOptions::new(&db.data_dir)
    };
    match command {
        DbCommand::Start { tcp_port, logical } => {
            let (cluster, started) = start_embedded(opts(tcp_port, logical)).await?;
            let bb = artex_actors::Blackboard::connect(&cluster.url(DATABASE), 1)?;
            bb.migrate().await?;
            eprintln!(
                "{} PostgreSQL in {}",
                if started {
                    "started"
                } else {
                    "already running:"
                },
                cluster.data_dir().display()
            );
            println!("{}", cluster.url(DATABASE));
            Ok(())
        }
        DbCommand::Stop => {
            let cluster = Cluster::new(opts(None, false))?;
            if cluster.stop()? {
                println!("stopped");
            } else {
                println!("not running");
            }
            Ok(())
        }
        DbCommand::Status => {
            let cluster = Cluster::new(opts(None, false))?;
            // Exit 0 only when it runs: scripts ask `artex db status && …`.
            match cluster.status()? {
                ClusterState::Absent => {
                    println!("absent: no cluster in {}", db.data_dir.display());
                    Err(Error::NotRunning(
                        "no cluster yet; create it with: artex db start".into(),
                    ))
                }
                ClusterState::Stopped => {
                    println!("stopped: {}", cluster.data_dir().display());
                    Err(Error::NotRunning(
                        "the cluster is stopped; start it with: artex db start".into(),
                    ))
                }
                ClusterState::Running(pid) => {
                    println!("running: pid {pid}, {}", cluster.url(DATABASE));
                    Ok(())
                }
            }
        }
        DbCommand::Url => {
            let cluster = Cluster::new(opts(None, false))?;
            if cluster.status()? == ClusterState::Absent {
                return Err(Error::Cluster(format!(
                    "no cluster in {}; create it with: artex db start",
                    db.data_dir.display()
                )));
            }
            println!("{}", cluster.url(DATABASE));
            Ok(())
        }
    }
}

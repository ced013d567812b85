//! Configuration: one struct per part, each field a flag with an `ARTEX_*` environment
//! variable and a default (clap's `env` feature). Printed at start-up, secrets masked.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// The heading `--help` shows the connection options under: every command takes them, so
/// each command's own options come first (as `git` and `cargo` group theirs). Their
/// display order (801…) keeps them after a command's own options in man pages' synopses
/// too, which know no headings.
pub const DB_HEADING: &str = "Database connection";

/// Where the blackboard is.
#[derive(Debug, Clone, Args)]
pub struct DbConfig {
    /// PostgreSQL URL (e.g. postgresql://user:pass@host/db), or libpq's key=value form.
    /// It may name several hosts, the primary found among them
    /// (postgresql://a:5432,b:5432/db?target_session_attrs=read-write): after a failover
    /// every process reconnects to the new one. Without a URL, artex runs its own private
    /// cluster in --data-dir.
    #[arg(
        long,
        env = "ARTEX_DATABASE_URL",
        global = true,
        help_heading = DB_HEADING,
        display_order = 801,
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// A URL whose connections keep their session, for LISTEN (a planner's wake-ups,
    /// `/events` followers): PostgreSQL itself, or a pgbouncer database in
    /// `pool_mode = session`. Needed when --database-url is a transaction pooler, which
    /// cannot carry a LISTEN; defaults to --database-url.
    #[arg(
        long,
        env = "ARTEX_LISTEN_DATABASE_URL",
        global = true,
        help_heading = DB_HEADING,
        display_order = 802,
        hide_env_values = true
    )]
    pub listen_database_url: Option<String>,
    /// PostgreSQL URL of a streaming replica of --database-url: operators' reads (lists,
    /// pages, statistics of `serve`, a worker's --api, `tasks`, `task show`, `flow
    /// list|show`, `schedule list|show`, `stats`, `workers`) come from it; writes and the feed always from
    /// --database-url. Other commands ignore it.
    #[arg(
        long,
        env = "ARTEX_READ_DATABASE_URL",
        global = true,
        help_heading = DB_HEADING,
        display_order = 803,
        hide_env_values = true
    )]
    pub read_database_url: Option<String>,
    /// How far behind the primary the replica of --read-database-url may be and still
    /// serve reads (90s, 1500ms, …): further behind, unreachable, or no longer a standby,
    /// reads go to the primary until it catches up (`/health` and `/metrics` say so).
    #[arg(
        long,
        env = "ARTEX_READ_MAX_LAG",
        global = true,
        default_value = "5s",
        value_parser = parse_duration,
        help_heading = DB_HEADING,
        display_order = 803
    )]
    pub read_max_lag: Duration,
    /// Folder of the embedded PostgreSQL cluster (used when no --database-url is given).
    #[arg(long, env = "ARTEX_DATA_DIR", default_value = ".artex", global = true,
        help_heading = DB_HEADING,
        display_order = 804)]
    pub data_dir: PathBuf,
    /// Connections in each process's pool (the budget per process is this, plus two
    /// for heartbeats and renewals, plus one LISTEN session per listener: see
    /// docs/operating/notes.md).
    #[arg(long, env = "ARTEX_POOL_SIZE", default_value_t = 4, global = true,
        help_heading = DB_HEADING,
        display_order = 805,
        value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub pool_size: u16,
    /// How long to reach PostgreSQL and log in, milliseconds.
    #[arg(long, env = "ARTEX_DB_CONNECT_TIMEOUT_MS", default_value_t = 5_000, global = true,
        help_heading = DB_HEADING,
        display_order = 806,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub db_connect_timeout_ms: u64,
    /// How long a caller waits for a free pooled connection, milliseconds.
    #[arg(long, env = "ARTEX_DB_POOL_WAIT_MS", default_value_t = 5_000, global = true,
        help_heading = DB_HEADING,
        display_order = 807,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub db_pool_wait_ms: u64,
    /// The server cancels a statement of artex's that runs longer, milliseconds
    /// (`statement_timeout`; migrations are exempt).
    #[arg(long, env = "ARTEX_DB_STATEMENT_TIMEOUT_MS", default_value_t = 30_000, global = true,
        help_heading = DB_HEADING,
        display_order = 808,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub db_statement_timeout_ms: u64,
    /// How long `planner`, `worker` and `serve` wait at start for a PostgreSQL they cannot
    /// reach (refused, reset, timed out; a refused login or a missing database fails at
    /// once), trying again every 250 ms, milliseconds; 0: fail at once. A fleet that boots
    /// before its database, or restarts while it does, comes up with it rather than
    /// exiting, and exhausting a supervisor's start limit.
    #[arg(
        long,
        env = "ARTEX_DB_START_WAIT_MS",
        default_value_t = 60_000,
        global = true,
        help_heading = DB_HEADING,
        display_order = 809
    )]
    pub db_start_wait_ms: u64,
}

impl DbConfig {
    /// The deadlines and pool size toward PostgreSQL these flags ask for.
    pub fn limits(&self) -> artex_actors::blackboard::DbLimits {
        artex_actors::blackboard::DbLimits {
            pool_size: usize::from(self.pool_size),
            connect_timeout: ms(self.db_connect_timeout_ms),
            pool_wait: ms(self.db_pool_wait_ms),
            statement_timeout: ms(self.db_statement_timeout_ms),
        }
    }
}

/// Who may read and write what a process serves over HTTP (`/health` is always open).
#[derive(Debug, Clone, Args)]
pub struct AccessArgs {
    /// File holding the bearer token of the read scope (`/status`, `/metrics`, `/events`).
    #[arg(long, env = "ARTEX_READ_TOKEN_FILE")]
    pub read_token_file: Option<PathBuf>,
    /// File holding the bearer token of the write scope (which can read too).
    #[arg(long, env = "ARTEX_WRITE_TOKEN_FILE")]
    pub write_token_file: Option<PathBuf>,
    /// Serve reads without a token (on a trusted network or loopback only).
    #[arg(long, env = "ARTEX_PUBLIC_READ")]
    pub public_read: bool,
    /// Open `/events` streams at most; more get 503 (each costs a socket and one batch
    /// of buffer, never a database connection).
    #[arg(long, env = "ARTEX_MAX_EVENT_STREAMS", default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_event_streams: u32,
}

/// How a worker runs.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// HTTP address (/health, /status, /metrics); port 0 picks a free port.
    #[arg(long = "http", env = "ARTEX_HTTP", default_value = "127.0.0.1:0")]
    pub http: String,
    /// Where planners reach this worker's HTTP port to push its wake-ups (`host:port`,
    /// `POST /wake`): by default --http's address, or this host's name with its port when
    /// --http listens on every address (0.0.0.0, [::]). A worker bound to loopback is
    /// reached by planners on its host only; others find its tasks by its poll.
    #[arg(long, env = "ARTEX_WAKE_ADDR")]
    pub wake_addr: Option<String>,
    #[command(flatten)]
    pub access: AccessArgs,
    /// Handlers running at once.
    #[arg(long, env = "ARTEX_CONCURRENCY", default_value_t = 10)]
    pub concurrency: usize,
    /// Tasks held beyond --concurrency in a local queue: read in one batch with the
    /// others, so starts and completions are written in large batches and no slot waits
    /// for a planner round trip. A queued task is `assigned` to this worker (leased,
    /// renewed); a drain gives it back unstarted, a hot upgrade's task transfer moves it. Without
    /// this flag the queue sizes itself: about what the worker finishes in 100 ms at
    /// its measured rate (or in two refills by the planner, if those take longer),
    /// between 4 and 2,000 — deep for short tasks, shallow for long ones so one worker
    /// does not hoard what others could run; `/status` shows the depth (`prefetch`),
    /// `/metrics` too (`artex_queue_depth`). A number pins it.
    #[arg(long, env = "ARTEX_PREFETCH")]
    pub prefetch: Option<usize>,
    /// Payload bytes (as JSON text) a worker holds at most, running and queued, so a
    /// burst of big payloads is read a few at a time; a task larger than this runs alone.
    #[arg(long, env = "ARTEX_QUEUE_MAX_BYTES", default_value_t = 64 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub queue_max_bytes: u64,
    /// Only these kinds (comma-separated); all registered kinds by default.
    #[arg(long, env = "ARTEX_KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// A folder of programs to run as task kinds: each executable file is the kind named
    /// by its file name without its last extension (docs/programs.md).
    #[arg(long, env = "ARTEX_TASKS_DIR")]
    pub tasks_dir: Option<std::path::PathBuf>,
    /// Variables of this process's environment that programs get (repeat, or separate
    /// with commas); nothing else of it reaches them.
    #[arg(long, env = "ARTEX_TASKS_ENV", value_delimiter = ',')]
    pub tasks_env: Vec<String>,
    /// Lease length in milliseconds; renewed every third of it.
    #[arg(long, env = "ARTEX_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Heartbeat interval in milliseconds.
    #[arg(long, env = "ARTEX_HEARTBEAT_MS", default_value_t = 2_000)]
    pub heartbeat_ms: u64,
    /// Safety-net poll for missed wake-ups, milliseconds; once planners' pushes reach the
    /// worker, it polls at most every 2 s. A worker planners cannot push to (its wake
    /// address out of their reach) takes its tasks by this poll: every this often while
    /// reads find tasks, backing off to 2 s apart while they find none.
    #[arg(long, env = "ARTEX_WORKER_POLL_MS", default_value_t = 200)]
    pub worker_poll_ms: u64,
    /// Handler timeout per attempt when neither task nor handler sets one, milliseconds.
    #[arg(long, env = "ARTEX_TASK_TIMEOUT_MS", default_value_t = 300_000)]
    pub task_timeout_ms: u64,
    /// How long a canceled task's handler has to stop after it is told
    /// (`ctx.cancelled()`) before the worker stops it, milliseconds; for a program
    /// (--tasks-dir), the time between SIGTERM and SIGKILL however it is stopped.
    #[arg(long, env = "ARTEX_CANCEL_GRACE_MS", default_value_t = 5_000)]
    pub cancel_grace_ms: u64,
    /// First retry backoff in milliseconds (doubles per retry, with jitter).
    #[arg(long, env = "ARTEX_RETRY_BASE_MS", default_value_t = 1_000)]
    pub retry_base_ms: u64,
    /// Longest retry backoff in milliseconds.
    #[arg(long, env = "ARTEX_RETRY_CAP_MS", default_value_t = 300_000)]
    pub retry_cap_ms: u64,
    /// On SIGTERM/SIGINT/SIGUSR2, how long running tasks may take to finish, milliseconds.
    #[arg(long, env = "ARTEX_DRAIN_MS", default_value_t = 30_000)]
    pub drain_ms: u64,
    /// Public key (hex, from `artex bundle keygen`) that upgrade bundles must be signed
    /// with. Without it (and a token), /upgrade answers 403.
    #[arg(long, env = "ARTEX_UPGRADE_PUBLIC_KEY")]
    pub upgrade_public_key: Option<PathBuf>,
    /// File holding the bearer token /upgrade requires.
    #[arg(long, env = "ARTEX_UPGRADE_TOKEN_FILE")]
    pub upgrade_token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --upgrade-token-file: flags show in `ps`).
    #[arg(long, env = "ARTEX_UPGRADE_TOKEN", hide_env_values = true)]
    pub upgrade_token: Option<String>,
    /// Where bundles are received and new generations unpacked (private, 0700).
    #[arg(long, env = "ARTEX_UPGRADE_DIR")]
    pub upgrade_dir: Option<PathBuf>,
    /// How long a new process has to get ready and take over, milliseconds.
    #[arg(long, env = "ARTEX_UPGRADE_READY_MS", default_value_t = 30_000)]
    pub upgrade_ready_ms: u64,
    /// An /upgrade upload that sends nothing for this long is cut (408), milliseconds;
    /// the whole upload must arrive within 60 times this.
    #[arg(long, env = "ARTEX_UPGRADE_BODY_TIMEOUT_MS", default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upgrade_body_timeout_ms: u64,
    /// How long resumable tasks have to reach a checkpoint during the task transfer of a
    /// hot upgrade, milliseconds.
    // The flag keeps its first name: an upgrade starts the new build with the old one's
    // arguments, so a flag renamed in either build would fail an upgrade forward or back.
    #[arg(
        long = "handover-suspend-ms",
        env = "ARTEX_HANDOVER_SUSPEND_MS",
        default_value_t = 10_000
    )]
    pub transfer_suspend_ms: u64,
    /// Also serve the HTTP API (`/api/v1/…`, as `artex serve`) on this worker's port,
    /// through the worker's own pool; `artex up` always does.
    #[arg(long, env = "ARTEX_API")]
    pub api: bool,
    #[command(flatten)]
    pub uploads: UploadArgs,
}

/// The largest request body `artex serve` accepts by default (`--max-body-bytes`): 2 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 2 << 20;

/// How `artex serve` runs: the HTTP API, `/health` and `/events`, and nothing else.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// HTTP address; port 0 picks a free port (logged).
    #[arg(long = "http", env = "ARTEX_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    #[command(flatten)]
    pub access: AccessArgs,
    /// The largest request body accepted, bytes (413 beyond); task payloads are limited
    /// by the blackboard (`artex limits`).
    #[arg(long, env = "ARTEX_MAX_BODY_BYTES",
        default_value_t = DEFAULT_MAX_BODY_BYTES,
        value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub max_body_bytes: u64,
    /// How long one read of the fleet from the blackboard serves `/metrics` (5s, 500ms,
    /// …; 0: every scrape reads it): however many scrapers ask, one read at a time.
    #[arg(long, env = "ARTEX_METRICS_EVERY", default_value = "5s", value_parser = parse_duration)]
    pub metrics_every: Duration,
}

/// Where a worker keeps files uploaded to it (`/api/v1/uploads`, `artex upload`).
#[derive(Debug, Clone, Args)]
pub struct UploadArgs {
    /// Private folder (0700) of uploads in progress and of files waiting for their
    /// task; `$TMPDIR/artex-uploads-<uid>-<blackboard id>` by default (the id is made
    /// when the database is migrated: deployments on one host never share a default
    /// folder), used as given otherwise. Keep it across restarts and hot upgrades (the
    /// new process resumes the uploads it finds there). Each upload names its blackboard
    /// in its meta.json: a worker never finishes, resumes or sweeps another's, even in a
    /// folder given to two.
    #[arg(long, env = "ARTEX_UPLOAD_DIR")]
    pub upload_dir: Option<PathBuf>,
    /// --upload-dir is on storage every worker of the fleet sees at the same path: an
    /// upload's task may run on any worker, not only on this host's.
    #[arg(long, env = "ARTEX_UPLOAD_SHARED")]
    pub upload_shared: bool,
    /// Bytes all uploads in --upload-dir may take at once (declared sizes, reserved when
    /// an upload starts: over it, 507 before anything is written).
    #[arg(long, env = "ARTEX_UPLOAD_MAX_BYTES", default_value_t = 20 * 1024 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_max_bytes: u64,
    /// An unfinished upload that receives nothing for this long is removed, milliseconds.
    #[arg(long, env = "ARTEX_UPLOAD_EXPIRE_MS", default_value_t = 24 * 3600 * 1000,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_expire_ms: u64,
    /// How long a file is kept after its task ended, milliseconds (0: removed at the
    /// next sweep).
    #[arg(long, env = "ARTEX_UPLOAD_KEEP_MS", default_value_t = 0)]
    pub upload_keep_ms: u64,
    /// How often the worker sweeps its upload folder, milliseconds.
    #[arg(long, env = "ARTEX_UPLOAD_SWEEP_MS", default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_sweep_ms: u64,
    /// A chunk whose body sends nothing for this long is cut (408), milliseconds.
    #[arg(long, env = "ARTEX_UPLOAD_BODY_TIMEOUT_MS", default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_body_timeout_ms: u64,
}

/// How a planner runs.
#[derive(Debug, Clone, Args)]
pub struct PlannerArgs {
    /// Safety-net poll for runnable tasks, milliseconds (NOTIFY wakes it sooner).
    #[arg(long, env = "ARTEX_PLANNER_POLL_MS", default_value_t = 200)]
    pub planner_poll_ms: u64,
    /// Tasks assigned per transaction at most (a round never assigns more than the
    /// workers' free slots, so this only matters with deep worker queues).
    #[arg(long, env = "ARTEX_BATCH", default_value_t = 2000)]
    pub batch: i64,
    /// Lease given with an assignment, milliseconds.
    #[arg(long, env = "ARTEX_ASSIGN_LEASE_MS", default_value_t = 30_000)]
    pub assign_lease_ms: u64,
    /// A worker silent this long is gone and its tasks are taken back, milliseconds.
    #[arg(long, env = "ARTEX_WORKER_TIMEOUT_MS", default_value_t = 10_000)]
    pub worker_timeout_ms: u64,
    /// A worker silent this long is suspect: given no new work (not yet gone),
    /// milliseconds; at most --worker-timeout-ms.
    #[arg(long, env = "ARTEX_WORKER_SUSPECT_MS", default_value_t = 5_000)]
    pub worker_suspect_ms: u64,
    /// Reaper sweep interval, milliseconds.
    #[arg(long, env = "ARTEX_REAP_MS", default_value_t = 2_000)]
    pub reap_ms: u64,
    /// This planner's shard as I/N (serves tasks whose shard % N = I); all by default.
    #[arg(long, env = "ARTEX_SHARD", value_parser = parse_shard)]
    pub shard: Option<(i32, i32)>,
    /// Planner shards owned through leases in the blackboard, spread over the live
    /// planners: `auto` (the count the planners use, 16 for the first) or `auto:N`.
    #[arg(long, env = "ARTEX_SHARDS", value_parser = parse_shards, conflicts_with = "shard")]
    pub shards: Option<AutoShards>,
    /// Lease of an owned planner shard (`--shards auto`), milliseconds: a dead planner's
    /// shards move to the others within about this long. Renewed every third of it.
    #[arg(long, env = "ARTEX_SHARD_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(300..))]
    pub shard_lease_ms: u64,
    /// Backoff base for retries the reaper schedules, milliseconds.
    #[arg(long, env = "ARTEX_REAP_RETRY_BASE_MS", default_value_t = 1_000)]
    pub reap_retry_base_ms: u64,
    /// How long history (task transitions, the change feed) and finished tasks are kept,
    /// e.g. 14d, 12h, 90m: older ones leave by whole partitions. Given, it is written to
    /// the blackboard at start (the one setting all planners share, also set by `artex
    /// events retention --set`); not given, the blackboard's stands (14 days unless
    /// changed).
    #[arg(long, env = "ARTEX_HISTORY_RETENTION", value_parser = parse_duration)]
    pub history_retention: Option<Duration>,
    /// A pending task bound to a host (its upload is on that host's disk) fails once
    /// every worker of that host has been gone this long, milliseconds: no other worker
    /// can read its file. Long enough for a host to reboot.
    #[arg(long, env = "ARTEX_UPLOAD_HOST_DEADLINE_MS", default_value_t = 600_000,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub upload_host_deadline_ms: u64,
    /// Serve this planner's Prometheus metrics at http://ADDR/metrics (round times,
    /// assignments, rescues, failed pushes, schedule slots; docs/metrics.md); off by
    /// default. Port 0 picks a free port (printed at start).
    #[arg(long = "metrics", env = "ARTEX_METRICS", value_name = "ADDR")]
    pub metrics: Option<String>,
    /// File holding the bearer token a scrape of --metrics must send (the read scope's
    /// token will do). Without it /metrics is open, which the planner allows on a
    /// loopback address only.
    #[arg(long, env = "ARTEX_METRICS_TOKEN_FILE", value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
}

fn parse_shard(s: &str) -> Result<(i32, i32), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}': expected I/N, e.g. 0/3"))?;
    let i: i32 = i
        .parse()
        .map_err(|_| format!("'{s}': shard index '{i}' is not a number"))?;
    let n: i32 = n
        .parse()
        .map_err(|_| format!("'{s}': shard count '{n}' is not a number"))?;
    if !(1..=1024).contains(&n) || !(0..n).contains(&i) {
        return Err(format!("'{s}': expected 0 <= I < N <= 1024"));
    }
    Ok((i, n))
}

/// `--shards auto[:N]`: planner shards owned through leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoShards {
    /// `auto:N`: the count wished; `None` takes the one the planners agreed.
    pub count: Option<i32>,
}

fn parse_shards(s: &str) -> Result<AutoShards, String> {
    let count = match s.strip_prefix("auto") {
        Some("") => None,
        Some(rest) => {
            let n = rest
                .strip_prefix(':')
                .ok_or_else(|| format!("'{s}': expected auto or auto:N, e.g. auto:16"))?;
            let n: i32 = n
                .parse()
                .map_err(|_| format!("'{s}': shard count '{n}' is not a number"))?;
            if !(1..=1024).contains(&n) {
                return Err(format!("'{s}': expected 1 <= N <= 1024"));
            }
            Some(n)
        }
        None => return Err(format!("'{s}': expected auto or auto:N, e.g. auto:16")),
    };
    Ok(AutoShards { count })
}

/// `90`, `90s`, `1500ms`, `15m`, `12h`, `7d`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{s}': expected a number with a unit, e.g. 7d, 12h, 90m, 30s"))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "'{s}': unknown unit '{unit}'; use ms, s, m, h or d"
            ))
        }
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("'{s}': too long"))
}

/// Milliseconds as a `Duration`.
pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_auto_takes_an_optional_count() {
        assert_eq!(parse_shards("auto"), Ok(AutoShards { count: None }));
        assert_eq!(parse_shards("auto:8"), Ok(AutoShards { count: Some(8) }));
        for bad in ["", "8", "auto:", "auto:0", "auto:1025", "auto8", "auto:x"] {
            assert!(parse_shards(bad).is_err(), "{bad:?} accepted");
        }
    }
}

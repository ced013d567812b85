//! Real processes for end-to-end tests: spawn `artex` planners and workers against a test
//! database, signal them, read their logs, talk HTTP to them, and wait on conditions in
//! the blackboard (never sleep-and-hope).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use artex_testkit::http::Request;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running `artex` process; killed (SIGKILL) and reaped on drop. If the test is failing,
/// its log is printed so the failure can be read.
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    exited: Option<ExitStatus>,
}

/// Test-friendly worker settings: fast heartbeats, short leases, quick retries.
pub const FAST_WORKER: &[&str] = &[
    "--http",
    "127.0.0.1:0",
    "--heartbeat-ms",
    "200",
    "--lease-ms",
    "3000",
    "--retry-base-ms",
    "20",
    "--retry-cap-ms",
    "200",
    "--drain-ms",
    "10000",
];

/// Test-friendly planner settings: gone after 5 s of silence (a loaded CI machine can
/// stall a process for a second or two), reaper every 200 ms.
pub const FAST_PLANNER: &[&str] = &[
    "--worker-timeout-ms",
    "5000",
    "--reap-ms",
    "200",
    "--reap-retry-base-ms",
    "20",
];

impl Proc {
    /// Starts `artex ARGS…` with `ARTEX_DATABASE_URL=url`.
    pub fn start(name: &str, url: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        Proc::start_via(&[], name, url, args, env)
    }

    /// As [`Proc::start`], with `launcher` put before `artex` (e.g. `ip netns exec NS`).
    /// The launcher must exec artex, not fork it, so that the pid is artex's.
    pub fn start_via(
        launcher: &[&str],
        name: &str,
        url: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        let dir = tempfile::tempdir().expect("temp dir for a process log");
        let log = dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = match launcher.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(super::artex_bin());
                cmd
            }
            None => Command::new(super::artex_bin()),
        };
        cmd.args(args)
            .env("ARTEX_DATABASE_URL", url)
            .env("ARTEX_READ_TOKEN_FILE", super::read_token_file())
            .env("ARTEX_LOG", "info,actix_server=warn")
            .env("TMPDIR", super::process_tmp_dir())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // An empty value removes the variable (e.g. the tests' read token).
        for (k, v) in env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let child = cmd.spawn().expect("spawn artex");
        Proc {
            name: name.into(),
            child,
            log,
            _dir: dir,
            exited: None,
        }
    }

    /// `artex worker` with [`FAST_WORKER`] settings, those `extra` names replaced.
    pub fn worker(name: &str, url: &str, extra: &[&str]) -> Proc {
        Proc::start(name, url, &with_defaults("worker", FAST_WORKER, extra), &[])
    }

    /// `artex planner` with [`FAST_PLANNER`] settings, those `extra` names replaced.
    pub fn planner(name: &str, url: &str, extra: &[&str]) -> Proc {
        Proc::start(
            name,
            url,
            &with_defaults("planner", FAST_PLANNER, extra),
            &[],
        )
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig`.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("send signal");
    }

    /// Waits for it to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exited.is_some() {
            return self.exited;
        }
        self.exited = exit_within(&mut self.child, timeout);
        self.exited
    }

    /// Its exit status if it has exited, without waiting.
    pub fn exited_now(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// Everything it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("---- last lines of {} ----", self.name);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// `command`, the `--flag value` pairs of `defaults` whose flag `extra` does not name,
/// then `extra`: artex refuses an option given twice.
pub fn with_defaults<'a>(
    command: &'a str,
    defaults: &[&'a str],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![command];
    for pair in defaults.chunks(2) {
        if !extra.contains(&pair[0]) {
            args.extend_from_slice(pair);
        }
    }
    args.extend_from_slice(extra);
    args
}

/// Polls `check` every 25 ms until it yields a value; panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A plain HTTP/1.1 GET with the tests' read token; returns (status, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_get_as(addr, path, Some(super::READ_TOKEN))
}

/// A plain HTTP/1.1 GET with `token` as the bearer token, if any; returns (status, body).
/// `Err` if there was no whole answer within 10 s.
pub fn http_get_as(addr: &str, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let r = Request::get(path)
        .bearer(token)
        .timeout(Duration::from_secs(10))
        .send(addr)?
        .complete()?;
    Ok((r.status, r.text()))
}

/// The value of the sample `name` (with its labels, if any, as written) in a `/metrics`
/// text, if it is there.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The id of the online worker row that process `p` registered.
pub async fn worker_id(c: &tokio_postgres::Client, p: &Proc) -> String {
    worker_id_of_pid(c, p.pid()).await
}

/// The id of the online worker row that process `pid` registered.
pub async fn worker_id_of_pid(c: &tokio_postgres::Client, pid: i32) -> String {
    wait_for(
        &format!("pid {pid} to register"),
        Duration::from_secs(30),
        || async move {
            c.query_opt(
                "select id from artex.workers where pid = $1 and state = 'online'",
                &[&pid],
            )
            .await
            .ok()
            .flatten()
            .map(|r| r.get::<_, String>(0))
        },
    )
    .await
}

/// The HTTP address of the worker that process `p` runs.
pub async fn worker_http(c: &tokio_postgres::Client, p: &Proc) -> String {
    let id = worker_id(c, p).await;
    c.query_one("select http_addr from artex.workers where id = $1", &[&id])
        .await
        .expect("worker row")
        .get(0)
}

/// Waits until exactly `n` workers are online (registered, not draining or gone).
pub async fn wait_online(c: &tokio_postgres::Client, n: i64, timeout: Duration) {
    wait_count(
        c,
        "select count(*) from artex.workers where state = 'online'",
        n,
        timeout,
    )
    .await
}

/// Waits until `count_sql` (a query of one `bigint`, a count) says `n`; a failed poll is
/// polled again.
pub async fn wait_count(c: &tokio_postgres::Client, count_sql: &str, n: i64, timeout: Duration) {
    wait_for(&format!("{n} from {count_sql}"), timeout, || async {
        let got: i64 = c.query_one(count_sql, &[]).await.ok()?.get(0);
        (got == n).then_some(())
    })
    .await
}

/// The HTTP address of the first online worker, once one is (in master mode: the
/// master's port, whichever generation serves it).
pub async fn online_http(c: &tokio_postgres::Client) -> String {
    wait_for("a worker to register", Duration::from_secs(30), || async {
        c.query_opt(
            "select http_addr from artex.workers where state = 'online' limit 1",
            &[],
        )
        .await
        .ok()
        .flatten()
        .and_then(|r| r.get::<_, Option<String>>(0))
    })
    .await
}

/// Waits for `artex serve`'s (or `artex up`'s) line naming where it serves the API;
/// returns `host:port`.
pub async fn serve_address(p: &Proc) -> String {
    wait_for(
        "artex serve to say where it listens",
        Duration::from_secs(30),
        || async { logged_address(&p.log_text(), "the HTTP API on http://") },
    )
    .await
}

/// The socket address a log line gives after `marker`, from whole lines only: the
/// pipe may have delivered half of the line so far.
pub fn logged_address(log: &str, marker: &str) -> Option<String> {
    log.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .find_map(|l| {
            let addr = l.split(marker).nth(1)?.split(['/', ' ', '\n']).next()?;
            addr.parse::<std::net::SocketAddr>().ok()?;
            Some(addr.to_string())
        })
}

/// Waits until every history row is below the cluster's transaction horizon: the
/// change feed may then deliver all of them (none is held back for an older writer).
pub async fn history_settled(c: &tokio_postgres::Client) {
    let settled = "select coalesce(bool_and(xid < pg_snapshot_xmin(pg_current_snapshot())), true)
                   from artex.task_transitions";
    wait_for("the history to settle", Duration::from_secs(30), || async {
        c.query_one(settled, &[])
            .await
            .ok()?
            .get::<_, bool>(0)
            .then_some(())
    })
    .await;
}

/// Whether process `pid` runs (a zombie counts as exited).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// How many file descriptors process `pid` holds.
pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `child`'s exit status once it has ended, `None` if it has not within `timeout`. std
/// has no wait with a deadline, and a child's end sends nothing a test could await
/// short of SIGCHLD handling: it is polled.
pub fn exit_within(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Waits until task `id` has status `status`; panics naming both after `timeout`.
pub async fn wait_status(
    bb: &artex_actors::Blackboard,
    id: uuid::Uuid,
    status: impl std::fmt::Display,
    timeout: Duration,
) {
    let status = status.to_string();
    wait_for(&format!("task {id} to be {status}"), timeout, || async {
        (bb.operator().task(id).await.ok()?.status.as_str() == status).then_some(())
    })
    .await;
}

/// Where `artex planner --metrics 127.0.0.1:0` serves, from its start-up line.
pub async fn planner_metrics(p: &Proc) -> String {
    wait_for(
        "the planner to say where its metrics are",
        Duration::from_secs(30),
        || async { logged_address(&p.log_text(), "metrics on http://") },
    )
    .await
}

/// Waits until the planner serving `/metrics` at `addr` has run `n` more rounds: the
/// last of them began after this call (a round under way now counts as the first).
pub async fn planner_rounds_pass(addr: &str, n: f64) {
    let rounds = || planner_counter(addr, "artex_planner_round_seconds_count");
    let seen = rounds();
    wait_for(
        &format!("{n} more rounds of the planner"),
        Duration::from_secs(30),
        || async { (rounds() >= seen + n).then_some(()) },
    )
    .await
}

/// A planner's counter, read from its `/metrics` at `addr`.
pub fn planner_counter(addr: &str, name: &str) -> f64 {
    let (code, text) = http_get(addr, "/metrics").expect("the planner's /metrics");
    assert_eq!(code, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the planner's /metrics:\n{text}"))
}

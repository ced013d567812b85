//! The change feed end to end (issues 6 and 13): out-of-order commits delivered in a final
//! order, a consumer killed with kill -9 mid-stream resuming without gap or duplicate, one
//! history row per real transition (the feed reads them), Server-Sent Events resumed with
//! Last-Event-ID, retention by whole time partitions that holds back for a live consumer
//! and then answers 410, finished tasks pruned past the retention, and the logical
//! decoding consumer resuming from its slot's LSN.

mod common;

use common::count;
use common::lines_of;
use common::run_cli as artex;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use artex_actors::blackboard::{EventFeed, EventPosition, FeedStart, NewTask, TaskStatus};
use artex_actors::maintenance::Maintenance;
use chrono::{DateTime, Utc};
use common::procs::{wait_for, Proc};
use common::TestDb;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio_postgres::Client;
use uuid::Uuid;

/// The history rows the feed shows (see `events.rs`).
const FEED_ROWS: &str = "xid > '1' and to_status <> 'assigned'
    and from_status is distinct from to_status";

/// Every event's position, in feed order.
async fn all_positions(c: &Client) -> Vec<String> {
    c.query(
        &format!(
            "select xid::text || '-' || id from artex.task_transitions where {FEED_ROWS}
             order by xid, id"
        ),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A long-running `artex` whose standard output goes to a file of its own.
struct Tail {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tail {
    /// Starts `artex ARGS…`; its database sessions are named `app` (see
    /// [`sessions_gone`]).
    fn start(url: &str, app: &str, args: &[&str]) -> Tail {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={app}");
        let url = url.as_str();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let err = dir.path().join("err.log");
        let child = Command::new(common::artex_bin())
            .args(args)
            .env("ARTEX_DATABASE_URL", url)
            .env("ARTEX_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("spawn artex");
        Tail {
            child,
            out,
            err,
            _dir: dir,
        }
    }

    fn lines(&self) -> Vec<Value> {
        read_lines(&self.out)
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- stderr of a tail ----\n{}",
                std::fs::read_to_string(&self.err).unwrap_or_default()
            );
        }
    }
}

/// The complete JSON lines of a file (a line cut by a kill is not complete).
fn read_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}")))
        .collect()
}

fn positions(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l["position"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the sessions of a killed process are gone: a statement it sent just
/// before dying (an acknowledgment) still runs to its end on the server, so its durable
/// position is only final then.
async fn sessions_gone(c: &Client, app: &str) {
    wait_for(
        &format!("the sessions of {app} to end"),
        Duration::from_secs(20),
        || async move {
            let n: i64 = c
                .query_one(
                    "select count(*) from pg_stat_activity where application_name = $1",
                    &[&app],
                )
                .await
                .ok()?
                .get(0);
            (n == 0).then_some(())
        },
    )
    .await
}

/// Waits until every event's transaction is older than every transaction in flight in
/// the cluster (the shared test cluster runs other tests' transactions too): only such
/// events are delivered or pruned.
async fn settled(c: &Client) {
    wait_for(
        "every event to be below the horizon",
        Duration::from_secs(30),
        || async move {
            let all: Option<bool> = c
                .query_one(
                    "select bool_and(xid < pg_snapshot_xmin(pg_current_snapshot()))
                     from artex.task_transitions",
                    &[],
                )
                .await
                .ok()?
                .get(0);
            (all != Some(false)).then_some(())
        },
    )
    .await
}

async fn cursor(c: &Client, consumer: &str) -> String {
    c.query_one(
        "select last_xid::text || '-' || last_event from artex.event_cursors where consumer = $1",
        &[&consumer],
    )
    .await
    .unwrap()
    .get(0)
}

/// Inserts one task per transaction from `sessions` sessions at once, each transaction
/// held open for a random few milliseconds after its insert, so that transactions commit
/// in another order than the one they drew their event ids in.
async fn concurrent_writers(url: &str, sessions: usize, per_session: usize) {
    let mut handles = Vec::new();
    for s in 0..sessions {
        let url = url.to_string();
        handles.push(tokio::spawn(async move {
            let mut c = common::connect(&url).await;
            for i in 0..per_session {
                let tx = c.transaction().await.unwrap();
                tx.execute(
                    "insert into artex.tasks (kind, payload) values ('echo', $1)",
                    &[&json!({ "s": s, "i": i })],
                )
                .await
                .unwrap();
                let ms = ((s * 7 + i * 13) % 6) as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tx.commit().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn an_event_committed_late_is_delivered_not_skipped() {
    let db = TestDb::new().await;
    let mut early = db.client().await;
    let late = db.client().await;
    // The first writer draws the smaller event id but commits last.
    let tx = early.transaction().await.unwrap();
    tx.execute("insert into artex.tasks (kind) values ('first')", &[])
        .await
        .unwrap();
    late.execute("insert into artex.tasks (kind) values ('second')", &[])
        .await
        .unwrap();
    let mut feed = EventFeed::open(
        db.bb.clone(),
        FeedStart::Beginning,
        false,
        Duration::from_millis(100),
    )
    .await
    .unwrap();
    // 'second' is committed and visible, but delivering it now would move the reader
    // past 'first' for good: it is held back until the older transaction ends.
    let batch = feed.next_batch(100).await.unwrap();
    assert!(batch.events.is_empty(), "{:?}", batch.events);
    assert!(batch.held_back);
    tx.commit().await.unwrap();
    // Both come once the older transaction ended (and any transaction of the shared
    // test cluster that is older still: the horizon is cluster-wide), in that order.
    let mut events = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while events.len() < 2 && std::time::Instant::now() < end {
        let batch = feed.next_batch(100).await.unwrap();
        if batch.events.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        events.extend(batch.events);
    }
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["first", "second"]);
    assert!(events[0].id < events[1].id);
    assert!(events[0].position < events[1].position);
    assert!(feed.next_batch(100).await.unwrap().events.is_empty());
    // Positions print and parse back.
    let p = events[1].position;
    assert_eq!(p.to_string().parse::<EventPosition>().unwrap(), p);
    assert!("12".parse::<EventPosition>().is_err());
}

#[tokio::test]
async fn a_consumer_killed_mid_stream_resumes_without_gap_or_duplicate() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let url = db.url.clone();
    let writers = tokio::spawn(async move { concurrent_writers(&url, 6, 250).await });
    let args = [
        "events",
        "tail",
        "--consumer",
        "c1",
        "--follow",
        "--batch",
        "7",
    ];
    let mut first = Tail::start(&db.url, "tail_first", &args);
    wait_for(
        "the consumer to print 400 events",
        Duration::from_secs(60),
        || {
            let n = first.lines().len();
            async move { (n >= 400).then_some(()) }
        },
    )
    .await;
    first.kill9();
    sessions_gone(&c, "tail_first").await;
    let acked = cursor(&c, "c1").await;
    let second = Tail::start(&db.url, "tail_second", &args);
    writers.await.unwrap();
    let all = all_positions(&c).await;
    assert_eq!(all.len(), 1500);
    let last = all.last().unwrap().clone();
    wait_for(
        "the restarted consumer to catch up",
        Duration::from_secs(60),
        || {
            let lines = second.lines();
            let last = last.clone();
            async move { (positions(&lines).last() == Some(&last)).then_some(()) }
        },
    )
    .await;
    let (one, two) = (positions(&first.lines()), positions(&second.lines()));
    // The first run printed a gap-free prefix of the feed…
    assert_eq!(
        &all[..one.len()],
        &one[..],
        "first run out of order or with a gap"
    );
    // …up to and beyond its last acknowledged event (at most one unacknowledged batch).
    let acked_at = all
        .iter()
        .position(|p| *p == acked)
        .expect("acked position");
    assert!(one.len() > acked_at, "acknowledged more than printed");
    assert!(
        one.len() - (acked_at + 1) <= 7,
        "more than a batch unacknowledged"
    );
    // The second run starts right after the acknowledged event and ends at the last:
    // acknowledged first-run events + second run = every event exactly once.
    assert_eq!(&two[..], &all[acked_at + 1..]);
    assert_eq!(cursor(&c, "c1").await, last);
}

#[tokio::test]
async fn a_task_that_ran_once_has_three_history_rows_and_the_feed_shows_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    // Leases renewed every 200 ms during a 1.5 s task; heartbeats every 200 ms.
    let _w = Proc::worker("worker", &db.url, &["--lease-ms", "600"]);
    let id = db
        .bb
        .submit(&NewTask::new("sleep", json!({ "ms": 1500 })), "test")
        .await
        .unwrap();
    wait_for("the task to succeed", Duration::from_secs(20), || async {
        (db.bb.task(id).await.ok()?.status == TaskStatus::Succeeded).then_some(())
    })
    .await;
    let lines = lines_of(
        &c,
        "select coalesce(from_status::text, '(new)') || '>' || to_status::text
         from artex.task_transitions where task_id = $1 order by at, id",
        id,
    )
    .await;
    assert_eq!(
        lines,
        ["(new)>pending", "assigned>running", "running>succeeded"],
        "no row for lease renewals, heartbeats, or an assignment followed by a start"
    );
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        3
    );
    // The start names the worker, the fencing token and when the task was assigned.
    let task = db.bb.task(id).await.unwrap();
    let trail = db.bb.transitions(id).await.unwrap();
    let start = &trail[1];
    assert!(start.worker.as_deref().is_some_and(|w| !w.is_empty()));
    assert_eq!(start.lease_epoch, task.lease_epoch);
    let assigned_at = start
        .assigned_at
        .expect("the start says when it was assigned");
    assert!(task.created_at <= assigned_at && assigned_at <= start.at);
    // The feed reads the same rows, at their positions.
    settled(&c).await;
    let batch = db
        .bb
        .events_after(EventPosition::default(), 100)
        .await
        .unwrap();
    let feed: Vec<String> = batch
        .events
        .iter()
        .map(|e| format!("{:?}>{:?}", e.from, e.to))
        .collect();
    assert_eq!(
        feed,
        [
            "None>Pending",
            "Some(Assigned)>Running",
            "Some(Running)>Succeeded"
        ]
    );
    assert!(batch.events.iter().all(|e| e.kind == "sleep"));
    assert_eq!(
        batch
            .events
            .iter()
            .map(|e| e.position.to_string())
            .collect::<Vec<_>>(),
        all_positions(&c).await
    );
}

/// A task given back before it started still has its assignment in the history (written
/// when it ends, dated when it was made), though the feed does not show it.
#[tokio::test]
async fn an_assignment_that_ends_without_a_start_keeps_its_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id = db
        .bb
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    c.batch_execute(
        "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
         values ('w-test', 'h', 1, 'v', 'w_test', '{echo}', 4);
         update artex.tasks set status = 'assigned', assigned_to = 'w-test',
             lease_until = now() + interval '1 minute';",
    )
    .await
    .unwrap();
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        1,
        "an assignment alone writes no row"
    );
    c.batch_execute(
        "begin;
         select artex.set_context('reaper', 'lease expired');
         update artex.tasks set status = 'pending', retries = retries + 1;
         commit",
    )
    .await
    .unwrap();
    let trail = db.bb.transitions(id).await.unwrap();
    let steps: Vec<String> = trail
        .iter()
        .map(|t| format!("{:?}>{:?} {:?}", t.from_status, t.to_status, t.worker))
        .collect();
    assert_eq!(
        steps,
        [
            "None>Pending None",
            "Some(Pending)>Assigned Some(\"w-test\")",
            "Some(Assigned)>Pending Some(\"w-test\")"
        ]
    );
    assert_eq!(trail[1].lease_epoch, 1);
    assert!(
        trail[1].at < trail[2].at,
        "the assignment is dated when it was made"
    );
    assert_eq!(trail[2].reason.as_deref(), Some("lease expired"));
    settled(&c).await;
    let feed = db
        .bb
        .events_after(EventPosition::default(), 100)
        .await
        .unwrap();
    let shown: Vec<String> = feed
        .events
        .iter()
        .map(|e| format!("{:?}>{:?}", e.from, e.to))
        .collect();
    assert_eq!(shown, ["None>Pending", "Some(Assigned)>Pending"]);
}

/// A streaming GET: yields SSE events (id, data) as they arrive.
struct Sse {
    reader: BufReader<TcpStream>,
    status: u16,
    body: String,
}

impl Sse {
    fn connect(addr: &str, path: &str, last_event_id: Option<&str>) -> Sse {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let extra = last_event_id
            .map(|id| format!("Last-Event-ID: {id}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nConnection: close\r\nAuthorization: Bearer {}\r\n{extra}\r\n",
            common::READ_TOKEN
        )
        .unwrap();
        let mut reader = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut body = String::new();
        if status != 200 {
            let _ = reader.read_to_string(&mut body);
        } else {
            assert!(
                head.to_ascii_lowercase().contains("text/event-stream"),
                "{head}"
            );
        }
        Sse {
            reader,
            status,
            body,
        }
    }

    /// The next task event: (id, data). Chunk-size lines and comments are skipped.
    fn next_event(&mut self) -> (String, Value) {
        let mut id = None;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .expect("reading the stream");
            assert!(n > 0, "the stream ended");
            let line = line.trim_end();
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                if let Some(id) = id.take() {
                    return (id, serde_json::from_str(v).unwrap());
                }
            }
        }
    }
}

#[tokio::test]
async fn server_sent_events_resume_after_last_event_id() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut w = Proc::worker("worker", &db.url, &[]);
    let pid = w.pid();
    let http: String = wait_for("the worker to register", Duration::from_secs(30), || {
        let c = &c;
        async move {
            c.query_opt(
                "select http_addr from artex.workers where pid = $1",
                &[&pid],
            )
            .await
            .ok()
            .flatten()
            .map(|r| r.get(0))
        }
    })
    .await;
    let ids = db
        .bb
        .submit_many(
            &(0..5)
                .map(|i| NewTask::new("echo", json!({ "i": i })))
                .collect::<Vec<_>>(),
            "test",
        )
        .await
        .unwrap();
    let h = http.clone();
    let got = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, "/events", None);
        assert_eq!(sse.status, 200, "{}", sse.body);
        (0..5).map(|_| sse.next_event()).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let task_ids: Vec<String> = got
        .iter()
        .map(|(_, d)| d["task_id"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(task_ids, expected);
    assert!(got
        .iter()
        .all(|(id, d)| d["position"] == id.as_str() && d["to"] == "pending"));

    // Reconnecting with the third event's id: the fourth comes first, then live events.
    let third = got[2].0.clone();
    let h = http.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, "/events", Some(&third));
        assert_eq!(sse.status, 200, "{}", sse.body);
        (0..3).map(|_| sse.next_event()).collect::<Vec<_>>()
    });
    let live = db
        .bb
        .submit(&NewTask::new("echo", json!({ "live": true })), "test")
        .await
        .unwrap();
    let resumed = reader.await.unwrap();
    assert_eq!(resumed[0].0, got[3].0);
    assert_eq!(resumed[1].0, got[4].0);
    assert_eq!(resumed[2].1["task_id"], live.to_string());
    // `?after=` works the same for a first connection.
    let h = http.clone();
    let fifth = got[4].0.clone();
    let after = tokio::task::spawn_blocking(move || {
        let mut sse = Sse::connect(&h, &format!("/events?after={fifth}"), None);
        sse.next_event()
    })
    .await
    .unwrap();
    assert_eq!(after.1["task_id"], live.to_string());

    // A malformed id is a bad request that says what was wrong.
    let h = http.clone();
    let bad = tokio::task::spawn_blocking(move || Sse::connect(&h, "/events", Some("nope")))
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("Last-Event-ID"), "{}", bad.body);
    // A position older than pruned events: 410 Gone rather than a silent gap. (The
    // clock moved past the retention: every partition of this history goes.)
    settled(&c).await;
    let later = Utc::now() + chrono::Duration::days(30);
    let report = Maintenance::run_once(&db.bb, Some(later)).await.unwrap();
    assert!(!report.partitions_dropped.is_empty());
    let h = http.clone();
    let gone = tokio::task::spawn_blocking(move || Sse::connect(&h, "/events", Some("1-1")))
        .await
        .unwrap();
    assert_eq!(gone.status, 410, "{}", gone.body);
    assert!(gone.body.contains("pruned"), "{}", gone.body);

    // Stopping the worker ends an open stream at once (its client reconnects to whoever
    // serves the port next) instead of holding the shutdown back.
    let mut sse = Sse::connect(&http, "/events", None);
    assert_eq!(sse.status, 200);
    w.signal(Signal::SIGTERM);
    let ended = tokio::task::spawn_blocking(move || loop {
        let mut line = String::new();
        match sse.reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line.contains("this process is stopping") => return true,
            Ok(_) => {}
        }
    })
    .await
    .unwrap();
    assert!(ended, "the stream should say it ends");
    let status = w
        .wait_exit(Duration::from_secs(8))
        .expect("the worker exits although a stream was open");
    assert!(status.success());
}

/// The partition that holds the history written so far, and where its slice ends.
async fn current_partition(c: &Client) -> (String, DateTime<Utc>) {
    let r = c
        .query_one(
            "select p.name, p.hi from artex.history_partitions p
             where p.name = (select tableoid::regclass::text from artex.task_transitions
                             order by at desc limit 1)
                or 'artex.' || p.name = (select tableoid::regclass::text
                                         from artex.task_transitions order by at desc limit 1)",
            &[],
        )
        .await
        .expect("the history lies in a partition the maintenance made");
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn retention_drops_whole_partitions_held_back_by_a_live_consumer_until_it_wins() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for i in 0..100 {
        db.bb
            .submit(&NewTask::new("echo", json!({ "i": i })), "test")
            .await
            .unwrap();
    }
    let all = all_positions(&c).await;
    assert_eq!(all.len(), 100);
    let at = |i: usize| all[i].parse::<EventPosition>().unwrap();
    // "live" has read 40 events; "stale" read 10 and then went silent.
    db.bb.ack_events("live", at(39)).await.unwrap();
    db.bb.ack_events("stale", at(9)).await.unwrap();
    let (code, out, err) = artex(&db.url, &["events", "retention", "--set", "1d"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("keep history 86400s"), "{out}");
    settled(&c).await;
    let (part, hi) = current_partition(&c).await;

    // A minute after the partition's slice passed the retention: "live" (heard from
    // then) still needs it, so it stays, and nothing is lost to anyone.
    let t1 = hi + chrono::Duration::days(1) + chrono::Duration::minutes(1);
    let alive = "update artex.event_cursors set updated_at = $1 where consumer = 'live'";
    c.execute(alive, &[&t1]).await.unwrap();
    let r = Maintenance::run_once(&db.bb, Some(t1)).await.unwrap();
    assert!(!r.partitions_dropped.contains(&part), "{r:?}");
    assert_eq!(all_positions(&c).await, all);
    assert_eq!(
        count(&c, "select count(*) from artex.tasks").await,
        100,
        "unfinished tasks stay whatever their age"
    );
    // Partitions are made ahead of the clock the maintenance runs on.
    let ahead: i64 = c
        .query_one(
            "select count(*) from artex.history_partitions where hi > $1",
            &[&t1],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ahead >= 1, "no partition ahead of {t1}");

    // Another retention later the retention wins: the partition goes whole, and the
    // feed's "pruned through" moves past its last position.
    let t2 = t1 + chrono::Duration::days(1);
    c.execute(alive, &[&t2]).await.unwrap();
    let r = Maintenance::run_once(&db.bb, Some(t2)).await.unwrap();
    assert!(r.partitions_dropped.contains(&part), "{r:?}");
    assert!(all_positions(&c).await.is_empty());
    let r = db.bb.event_retention().await.unwrap();
    assert_eq!(r.pruned_through.to_string(), *all.last().unwrap());

    // Both consumers are told they missed events rather than skipping them silently…
    for consumer in ["live", "stale"] {
        let (code, out, err) = artex(&db.url, &["events", "tail", "--consumer", consumer]);
        assert_eq!(code, 2, "{out}");
        assert!(err.contains("missed events"), "{err}");
        assert!(
            err.contains(all.last().unwrap().as_str()),
            "names how far events were pruned: {err}"
        );
    }
    // …and may accept the gap explicitly; a new consumer starts at the oldest kept.
    let (code, out, _) = artex(
        &db.url,
        &["events", "tail", "--consumer", "stale", "--accept-gap"],
    );
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 0);
    let (code, out, _) = artex(&db.url, &["events", "tail", "--consumer", "fresh"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 0);
}

#[tokio::test]
async fn finished_tasks_past_the_retention_go_unless_an_unfinished_flow_needs_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // A lone task and a flow that both finished; a flow with one task finished and one
    // still blocked.
    c.batch_execute(
        "insert into artex.flows (id, name) values
             ('00000000-0000-7000-8000-000000000001', 'done'),
             ('00000000-0000-7000-8000-000000000002', 'open');
         insert into artex.tasks (kind, flow_id, flow_task, status) values
             ('echo', null, null, 'pending'),
             ('echo', '00000000-0000-7000-8000-000000000001', 'a', 'pending'),
             ('echo', '00000000-0000-7000-8000-000000000002', 'a', 'pending'),
             ('echo', '00000000-0000-7000-8000-000000000002', 'b', 'blocked');
         update artex.tasks set status = 'canceled' where status = 'pending';",
    )
    .await
    .unwrap();
    let report = Maintenance::run_once(&db.bb, Some(Utc::now() + chrono::Duration::days(15)))
        .await
        .unwrap();
    assert_eq!(report.tasks_pruned, 2, "{report:?}");
    assert!(!report.partitions_dropped.is_empty(), "{report:?}");
    let left: Vec<String> = c
        .query(
            "select coalesce(flow_task, '-') || ' ' || status::text from artex.tasks
             order by flow_task",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["a canceled", "b blocked"]);
    assert_eq!(
        count(&c, "select count(*) from artex.flows").await,
        1,
        "the finished flow left with its tasks"
    );
}

/// A replication slot for one test, dropped at the end (a database with a slot cannot be
/// dropped, and a forgotten slot holds WAL on the shared cluster).
struct SlotGuard {
    url: String,
    slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (url, slot) = (self.url.clone(), self.slot.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let c = common::connect(&url).await;
                let _ = c
                    .execute(
                        "select pg_drop_replication_slot(slot_name) from pg_replication_slots
                         where slot_name = $1",
                        &[&slot],
                    )
                    .await;
            })
        })
        .join();
    }
}

fn lsn(s: &str) -> u64 {
    let (hi, lo) = s.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

#[tokio::test]
async fn the_logical_decoding_consumer_resumes_from_its_lsn() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let suffix = Uuid::new_v4().simple().to_string();
    let slot = format!("artex_t_{}", &suffix[..16]);
    let raw_slot = format!("artex_r_{}", &suffix[..16]);
    let _g1 = SlotGuard {
        url: db.url.clone(),
        slot: slot.clone(),
    };
    let _g2 = SlotGuard {
        url: db.url.clone(),
        slot: raw_slot.clone(),
    };
    assert!(db.bb.ensure_logical_slot(&slot).await.unwrap());
    assert!(!db.bb.ensure_logical_slot(&slot).await.unwrap());
    assert!(db.bb.ensure_logical_slot(&raw_slot).await.unwrap());
    let url = db.url.clone();
    let writers = tokio::spawn(async move { concurrent_writers(&url, 4, 100).await });
    let args = [
        "events",
        "tail",
        "--logical",
        "--slot",
        &slot,
        "--follow",
        "--batch",
        "5",
        "--poll-ms",
        "20",
    ];
    let mut first = Tail::start(&db.url, "tail_first", &args);
    wait_for(
        "the logical consumer to print 100 events",
        Duration::from_secs(60),
        || {
            let n = first.lines().len();
            async move { (n >= 100).then_some(()) }
        },
    )
    .await;
    first.kill9();
    sessions_gone(&c, "tail_first").await;
    let confirmed = db.bb.logical_slot_position(&slot).await.unwrap().unwrap();
    writers.await.unwrap();
    // Logical decoding reads flushed WAL only, and the test cluster commits
    // asynchronously: a synchronous commit that writes WAL (a transaction that wrote
    // nothing is never flushed) flushes everything before it.
    c.batch_execute(
        "begin; set local synchronous_commit = on;
         select pg_logical_emit_message(true, 'artex-test', 'flush'); commit",
    )
    .await
    .unwrap();
    let (code, out, err) = artex(&db.url, &["events", "tail", "--logical", "--slot", &slot]);
    assert_eq!(code, 0, "{err}");
    let second: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let one = first.lines();
    let id_of = |l: &Value| l["id"].as_i64().unwrap();
    // The first run's confirmed transactions, then the second run: every insert exactly
    // once; the second run starts after the confirmed LSN.
    let kept: Vec<&Value> = one
        .iter()
        .filter(|l| lsn(l["lsn"].as_str().unwrap()) <= lsn(&confirmed))
        .collect();
    let unconfirmed = one.len() - kept.len();
    assert!(
        unconfirmed <= 5 * 2,
        "{unconfirmed} lines past the confirmed LSN"
    );
    assert!(second
        .iter()
        .all(|l| lsn(l["lsn"].as_str().unwrap()) > lsn(&confirmed)));
    let mut ids: Vec<i64> = kept.iter().map(|l| id_of(l)).collect();
    ids.extend(second.iter().map(id_of));
    let expected: Vec<i64> = c
        .query(
            &format!("select id from artex.task_transitions where {FEED_ROWS}"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(sorted, expected_sorted, "every event exactly once");
    assert_eq!(ids.len(), 400);
    assert!(second
        .iter()
        .all(|l| l["to"] == "pending" && l["task_id"].is_string()));
    // The slot now stands after the last transaction printed.
    let end = db.bb.logical_slot_position(&slot).await.unwrap().unwrap();
    assert_eq!(end, second.last().unwrap()["lsn"].as_str().unwrap());

    // --raw: every row change of artex.tasks, decoded.
    let (code, out, err) = artex(
        &db.url,
        &["events", "tail", "--logical", "--slot", &raw_slot, "--raw"],
    );
    assert_eq!(code, 0, "{err}");
    let raw: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(raw.len(), 400);
    assert!(raw.iter().all(|l| l["table"] == "artex.tasks"
        && l["op"] == "INSERT"
        && l["row"]["kind"] == "echo"
        && l["row"]["payload"]["i"].is_number()));
    // A wrong wal_level or a foreign slot is refused clearly; dropping works.
    let (code, _, err) = artex(&db.url, &["events", "tail", "--logical"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, _) = artex(&db.url, &["events", "drop-slot", "--slot", &raw_slot]);
    assert_eq!(code, 0);
    assert!(out.contains("dropped"));
}

/// Not a test: measures the feed's end-to-end delay (task finished → event printed by
/// `artex events tail --follow`) over 300 tasks. Run with
/// `cargo test --release --test events -- --ignored --nocapture bench_`.
#[tokio::test]
#[ignore]
async fn bench_feed_delay() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let mut tail = Command::new(common::artex_bin())
        .args(["events", "tail", "--follow"])
        .env("ARTEX_DATABASE_URL", &db.url)
        .env("ARTEX_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = tail.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let now = chrono::Utc::now();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["to"] == "succeeded" {
                seen.push((v["task_id"].as_str().unwrap().to_string(), now));
                if seen.len() == 300 {
                    break;
                }
            }
        }
        seen
    });
    for i in 0..300 {
        db.bb
            .submit(&NewTask::new("noop", json!({ "i": i })), "bench")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = reader.join().unwrap();
    let _ = tail.kill();
    let _ = tail.wait();
    let mut delays = Vec::new();
    for (id, at) in seen {
        let id = Uuid::parse_str(&id).unwrap();
        let finished: chrono::DateTime<chrono::Utc> = c
            .query_one("select finished_at from artex.tasks where id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        delays.push((at - finished).num_microseconds().unwrap() as f64 / 1000.0);
    }
    delays.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| delays[((delays.len() as f64 * p).ceil() as usize).min(delays.len()) - 1];
    println!(
        "feed end-to-end delay over {} tasks: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        delays.len(),
        pct(0.5),
        pct(0.99),
        delays.last().unwrap()
    );
}

// With no partition for now (no planner ran for a while), history lands in the default
// partition; the next maintenance makes the partition and moves those rows into it.
#[tokio::test]
async fn history_caught_by_the_default_partition_moves_into_the_partition_made_for_it() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "do $$ declare p record; begin
             for p in select name from artex.history_partitions loop
                 execute format('drop table artex.%I', p.name);
             end loop;
             delete from artex.history_partitions;
         end $$",
    )
    .await
    .unwrap();
    let id = db
        .bb
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    let in_default = "select count(*) from artex.task_transitions_default";
    assert_eq!(count(&c, in_default).await, 1);
    let r = Maintenance::run_once(&db.bb, None).await.unwrap();
    assert!(r.partitions_made.len() >= 2, "{r:?}");
    assert_eq!(count(&c, in_default).await, 0);
    let trail = db.bb.transitions(id).await.unwrap();
    assert_eq!(trail.len(), 1);
    assert_eq!(trail[0].to_status, TaskStatus::Pending);
    // Nothing left to make until time moves on.
    let again = Maintenance::run_once(&db.bb, None).await.unwrap();
    assert!(again.partitions_made.is_empty(), "{again:?}");
}

// `--history-retention` on the planner is the blackboard's one setting (what `artex
// events retention --set` writes), so every planner agrees; a bad value is refused.
#[tokio::test]
async fn the_planner_sets_the_history_retention_it_is_given() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keep = "select extract(epoch from keep)::int8 from artex.event_retention";
    assert_eq!(count(&c, keep).await, 14 * 86_400, "the default is 14 days");
    let _p = Proc::planner("planner", &db.url, &["--history-retention", "3d"]);
    wait_for(
        "the planner to set the retention",
        Duration::from_secs(30),
        || async { (count(&c, keep).await == 3 * 86_400).then_some(()) },
    )
    .await;
    let (code, _, err) = artex(&db.url, &["planner", "--history-retention", "3 weeks"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--history-retention"), "{err}");
}

// A shortened retention takes effect in smaller slices: the empty partitions made ahead
// at the old width are made again at the new one.
#[tokio::test]
async fn a_shortened_retention_remakes_the_partitions_ahead_in_smaller_slices() {
    let db = TestDb::new().await;
    let c = db.client().await;
    db.bb
        .set_event_retention(Duration::from_secs(3600))
        .await
        .unwrap();
    let (_, hi) = {
        db.bb
            .submit(&NewTask::new("echo", json!({})), "test")
            .await
            .unwrap();
        current_partition(&c).await
    };
    // A minute before the partition holding now ends: the next ones are due.
    let r = Maintenance::run_once(&db.bb, Some(hi - chrono::Duration::minutes(1)))
        .await
        .unwrap();
    assert!(!r.partitions_made.is_empty(), "{r:?}");
    let widths: Vec<f64> = c
        .query(
            "select extract(epoch from hi - lo)::float8 from artex.history_partitions
             where lo >= $1 order by lo",
            &[&hi],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(widths.len() >= 3, "{widths:?}");
    assert!(widths.iter().all(|w| *w <= 450.0), "{widths:?}");
}

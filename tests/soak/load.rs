//! The steady mix the soak runs while faults hit: short tasks (noop, echo, a failure then
//! a success, sleeps under a kind limit), journaled executions (resumable and not), small
//! flows, unique keys, a schedule every minute, uploads, operators' cancels and pauses,
//! API readers and an `/events` consumer that keeps its cursor in a file. Every
//! submission that was acknowledged (committed, or `artex upload` exited 0) is recorded
//! with what its task must end as; a refused one (PostgreSQL down, disk full) is only
//! counted.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use artex_actors::blackboard::{Control, LimitSpec};
use artex_actors::schedule::{CatchUp, NewSchedule};
use artex_actors::submission::{FlowSpec, NewTask};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::world::World;
use crate::{pause, Acked, Expect, Soak};

/// The kind under a concurrency limit, and the limit.
pub const LIMITED_KIND: &str = "sleep";
/// See [`LIMITED_KIND`].
pub const LIMIT: i64 = 6;
/// The schedule the soak adds (every minute).
pub const SCHEDULE: &str = "soak-minutely";
/// The prefix of the soak's unique keys.
pub const UNIQUE_PREFIX: &str = "soak-u-";

/// What the `/events` consumer saw, in order: (position, event id, task, status).
#[derive(Debug, Default)]
pub struct FeedSeen {
    /// Every event, in the order received.
    pub events: Vec<((u64, i64), i64, Uuid, String)>,
    /// Reconnections.
    pub reconnects: u64,
}

/// The running load.
pub struct Load {
    loops: Vec<JoinHandle<()>>,
    /// The `/events` consumer (runs until the end of the run, after the load stops).
    pub consumer: JoinHandle<()>,
    /// What it saw.
    pub feed: Arc<Mutex<FeedSeen>>,
}

impl Load {
    /// Waits for every submitting loop to stop (they stop when the load is stopped).
    pub async fn finish(&self) {
        for l in &self.loops {
            while !l.is_finished() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Records acknowledged tasks.
fn acked(soak: &Soak, ids: &[Uuid], kind: &str, expect: Expect) {
    let at = soak.now();
    let mut a = soak.acked.lock().unwrap();
    for id in ids {
        a.entry(*id).or_insert_with(|| Acked {
            at,
            kind: kind.to_string(),
            expect: expect.clone(),
            ended: None,
        });
    }
}

/// Counts a refused submission by the first words of its error.
fn refused(soak: &Soak, what: &str, e: &dyn std::fmt::Display) {
    // Ids and paths differ from one refusal to the next: the first words say why.
    let text = e.to_string();
    let short: String = text
        .split_whitespace()
        .take_while(|w| !w.chars().any(|c| c.is_ascii_digit()) && !w.contains('/'))
        .take(8)
        .collect::<Vec<_>>()
        .join(" ");
    soak.count(&format!("refused {what}: {short}"));
}

/// Sets the kind limit and the schedule, then starts every loop.
pub async fn start(soak: &Arc<Soak>, world: &Arc<World>) -> Load {
    world
        .operator()
        .set_kind_limit(
            LIMITED_KIND,
            &LimitSpec {
                fair: false,
                concurrency: Some(LIMIT as i32),
                key_concurrency: None,
                rate_per_sec: None,
            },
            "soak",
        )
        .await
        .expect("setting the soak's kind limit");
    world
        .operator()
        .add_schedule(
            &NewSchedule {
                name: SCHEDULE.into(),
                cron: "* * * * *".into(),
                timezone: "UTC".into(),
                task: NewTask::new("noop", json!({ "scheduled": true })),
                catch_up: CatchUp::All,
            },
            "soak",
        )
        .await
        .expect("adding the soak's schedule");

    let feed = Arc::new(Mutex::new(FeedSeen::default()));
    let mut loops = Vec::new();
    let spawn =
        |f: fn(Arc<Soak>, Arc<World>, u64) -> futures_util::future::BoxFuture<'static, ()>,
         n: u64| {
            let (s, w) = (soak.clone(), world.clone());
            tokio::spawn(f(s, w, soak.settings.seed.wrapping_add(n)))
        };
    loops.push(spawn(|s, w, seed| Box::pin(short_tasks(s, w, seed)), 1));
    loops.push(spawn(|s, w, seed| Box::pin(journals(s, w, seed)), 2));
    loops.push(spawn(|s, w, seed| Box::pin(flows(s, w, seed)), 3));
    loops.push(spawn(|s, w, seed| Box::pin(uniques(s, w, seed)), 4));
    loops.push(spawn(|s, w, seed| Box::pin(operators(s, w, seed)), 5));
    loops.push(spawn(|s, w, seed| Box::pin(uploads(s, w, seed)), 6));
    loops.push(spawn(|s, w, seed| Box::pin(api_readers(s, w, seed)), 7));
    let consumer = {
        let (s, w, f) = (soak.clone(), world.clone(), feed.clone());
        tokio::task::spawn_blocking(move || consume_events(&s, &w, &f))
    };
    Load {
        loops,
        consumer,
        feed,
    }
}

/// Every 250 ms ten tasks: six noop, two echo, one that fails once then succeeds, one
/// sleep of 0.1–2 s (the limited kind).
async fn short_tasks(soak: Arc<Soak>, world: Arc<World>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0u64;
    while !soak.load_stopped() {
        n += 1;
        let mut batch = Vec::new();
        for i in 0..6 {
            batch.push(NewTask::new("noop", json!({ "n": n, "i": i })));
        }
        batch.push(NewTask::new("echo", json!({ "n": n })));
        batch.push(NewTask::new("echo", json!({ "n": n, "b": true })));
        batch.push(NewTask::new("fail", json!({ "times": 1 })));
        batch.push(NewTask::new(
            LIMITED_KIND,
            json!({ "ms": rng.u64(100..2000) }),
        ));
        match world.operator().submit_many(&batch, "soak").await {
            Ok(ids) => {
                for (t, id) in batch.iter().zip(&ids) {
                    acked(&soak, &[*id], &t.kind, Expect::Ends);
                }
            }
            Err(e) => refused(&soak, "batch", &e),
        }
        if !pause(&soak, Duration::from_millis(250)).await {
            break;
        }
    }
}

/// Every second a resumable journaled task (10–40 steps of 100 ms, a checkpoint each),
/// every other second a non-resumable one (5–20 steps): their executions are what the
/// overlap check reads.
async fn journals(soak: Arc<Soak>, world: Arc<World>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let file = world.journal.to_string_lossy().into_owned();
    let mut n = 0u64;
    while !soak.load_stopped() {
        n += 1;
        let (kind, steps) = if n.is_multiple_of(2) {
            ("journal", rng.u64(5..20))
        } else {
            ("journal-checkpoint", rng.u64(10..40))
        };
        let task = NewTask::new(kind, json!({ "file": file, "steps": steps, "ms": 100 }));
        match world.operator().submit(&task, "soak").await {
            Ok(id) => acked(&soak, &[id], kind, Expect::Ends),
            Err(e) => refused(&soak, kind, &e),
        }
        if !pause(&soak, Duration::from_millis(700)).await {
            break;
        }
    }
}

/// Every 4 s a diamond: a (echo) → b (sleep), c (journal) → d (gather).
async fn flows(soak: Arc<Soak>, world: Arc<World>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let file = world.journal.to_string_lossy().into_owned();
    while !soak.load_stopped() {
        let spec: FlowSpec = serde_json::from_value(json!({
            "name": "soak-diamond",
            "tasks": [
                { "name": "a", "kind": "echo", "payload": { "x": rng.u32(..) } },
                { "name": "b", "kind": LIMITED_KIND, "payload": { "ms": rng.u64(100..800) },
                  "depends_on": ["a"] },
                { "name": "c", "kind": "journal",
                  "payload": { "file": file, "steps": rng.u64(1..5), "ms": 100 },
                  "depends_on": ["a"] },
                { "name": "d", "kind": "gather", "depends_on": ["b", "c"] }
            ]
        }))
        .expect("the soak's flow spec");
        match world.operator().submit_flow(&spec, "soak").await {
            Ok(id) => {
                soak.flows.lock().unwrap().insert(id, false);
            }
            Err(e) => refused(&soak, "flow", &e),
        }
        if !pause(&soak, Duration::from_secs(4)).await {
            break;
        }
    }
}

/// Every second a noop with a unique key, each key submitted four times in a row:
/// while its task is unfinished the later ones write nothing and get its id.
async fn uniques(soak: Arc<Soak>, world: Arc<World>, _seed: u64) {
    let mut n = 0u64;
    while !soak.load_stopped() {
        let mut task = NewTask::new("noop", json!({ "unique": n }));
        task.unique_key = Some(format!("{UNIQUE_PREFIX}{}", n / 4));
        match world.operator().submit(&task, "soak").await {
            Ok(id) => acked(&soak, &[id], "noop", Expect::Ends),
            Err(e) => refused(&soak, "unique", &e),
        }
        n += 1;
        if !pause(&soak, Duration::from_secs(1)).await {
            break;
        }
    }
}

/// Operators: every 7 s a cancel of a task submitted in the last few seconds (a sleep
/// or a journaled one, perhaps running); every 15 s a pause of a recent flow, resumed
/// 3 s later (retried until it is: a paused flow would never finish).
async fn operators(soak: Arc<Soak>, world: Arc<World>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tick = 0u64;
    while !soak.load_stopped() {
        if !pause(&soak, Duration::from_secs(1)).await {
            break;
        }
        tick += 1;
        if tick.is_multiple_of(7) {
            let now = soak.now();
            let recent: Vec<Uuid> = soak
                .acked
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, a)| {
                    a.ended.is_none()
                        && now - a.at < 5.0
                        && matches!(a.kind.as_str(), "sleep" | "journal" | "journal-checkpoint")
                })
                .map(|(id, _)| *id)
                .collect();
            if let Some(id) = (!recent.is_empty()).then(|| recent[rng.usize(..recent.len())]) {
                match world
                    .operator()
                    .control(Control::Cancel, id, "soak-operator", Some("soak: canceled"))
                    .await
                {
                    Ok(_) => soak.count("operator cancel applied"),
                    Err(e) => refused(&soak, "cancel", &e),
                }
            }
        }
        if tick.is_multiple_of(15) {
            let flows = soak.open_flows();
            if flows.is_empty() {
                continue;
            }
            let id = flows[rng.usize(..flows.len())];
            match world
                .operator()
                .control(Control::Pause, id, "soak-operator", Some("soak: paused"))
                .await
            {
                Ok(_) => {
                    soak.count("operator pause applied");
                    let (s, w) = (soak.clone(), world.clone());
                    tokio::spawn(async move { resume_flow(&s, &w, id).await });
                }
                Err(e) => refused(&soak, "pause", &e),
            }
        }
    }
}

/// Resumes a paused flow 3 s after its pause, retrying through outages.
async fn resume_flow(soak: &Soak, world: &World, id: Uuid) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..600 {
        match world
            .operator()
            .control(Control::Resume, id, "soak-operator", Some("soak: resumed"))
            .await
        {
            Ok(_) => {
                soak.count("operator resume applied");
                return;
            }
            Err(artex_actors::Error::Refused(_)) => return,
            Err(e) => refused(soak, "resume", &e),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    soak.violation(
        "flows finish",
        format!("flow {id} could not be resumed for 10 minutes"),
    );
}

/// Every 6 s a file of 0.1–3 MiB sent to w3 with `artex upload` from host `cl`; its task
/// (`digest`) must succeed with the file's sha256.
async fn uploads(soak: Arc<Soak>, world: Arc<World>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0u64;
    while !soak.load_stopped() {
        n += 1;
        let size = rng.usize(100 * 1024..3 * 1024 * 1024);
        let mut bytes = vec![0u8; size];
        rng.fill(&mut bytes);
        let sha = hex::encode(Sha256::digest(&bytes));
        let file = world.files.join(format!("upload-{n}"));
        std::fs::write(&file, &bytes).expect("writing a file to upload");
        let w = world.clone();
        let f = file.clone();
        let out = tokio::task::spawn_blocking(move || send_upload(&w, &f))
            .await
            .expect("the upload thread");
        match out {
            Ok(id) => {
                soak.count("upload acknowledged");
                acked(&soak, &[id], "digest", Expect::Digest(sha));
            }
            Err(e) => refused(&soak, "upload", &e),
        }
        let _ = std::fs::remove_file(&file);
        if !pause(&soak, Duration::from_secs(6)).await {
            break;
        }
    }
}

/// `artex upload FILE` to w3 from host `cl`: the task's id, or why not.
fn send_upload(world: &World, file: &Path) -> Result<Uuid, String> {
    let to = format!("http://{}", world.w3_http());
    let out = world.fleet.exec(
        "cl",
        crate::common::artex_bin(),
        &[
            "upload",
            file.to_str().unwrap(),
            "--to",
            &to,
            "--kind",
            "digest",
            "--chunk-size",
            "524288",
            "--token-file",
            world.token_file.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("").to_string());
    }
    Uuid::parse_str(stdout.trim()).map_err(|e| format!("artex upload printed {stdout:?}: {e}"))
}

/// Dashboard and API readers: every second the dashboard's page, the task list, the
/// stats, the workers and the flows from `artex serve`. Anything but a 200 or a 503 (the database is away) is a broken promise;
/// a refused connection too (nothing stops `serve`).
async fn api_readers(soak: Arc<Soak>, world: Arc<World>, _seed: u64) {
    while !soak.load_stopped() {
        for path in [
            "/",
            "/api/v1/tasks?limit=20",
            "/api/v1/stats",
            "/api/v1/workers",
            "/api/v1/flows?limit=10",
        ] {
            read_api(&soak, &world, path, "api").await;
        }
        if soak.settings.topology == crate::topology::Topology::Fleet {
            replica_seen(&soak, &world).await;
        }
        if !pause(&soak, Duration::from_secs(1)).await {
            break;
        }
    }
}

/// In the fleet topology: whether `serve` reads from its replica now, as its `/health`
/// says (counted; a replica that is lost or behind sends the reads to the primary).
async fn replica_seen(soak: &Soak, world: &World) {
    let Some(body) = read_api(soak, world, "/health", "health").await else {
        return;
    };
    let health: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let replica = &health["replica"];
    if replica.is_object() {
        soak.count(&format!(
            "health: replica {}, serves reads {}",
            replica["state"].as_str().unwrap_or("?"),
            replica["serves_reads"]
        ));
    }
}

/// GET `path` from `serve`, its status counted under `counter`: anything but a 200 or a
/// 503 (the database is away), or no answer, is a broken promise. The body, if any.
async fn read_api(soak: &Soak, world: &World, path: &'static str, counter: &str) -> Option<String> {
    let addr = world.serve_addr.clone();
    let answer = tokio::task::spawn_blocking(move || crate::common::procs::http_get(&addr, path))
        .await
        .expect("the reader thread");
    match answer {
        Ok((code, body)) => {
            soak.count(&format!("{counter} {code}"));
            if code != 200 && code != 503 {
                let short: String = body.chars().take(200).collect();
                soak.violation("api answers", format!("GET {path}: {code} {short}"));
            }
            Some(body)
        }
        Err(e) => {
            soak.violation("api answers", format!("GET {path}: {e}"));
            None
        }
    }
}

/// The `/events` consumer: one stream at a time, its last id kept in a file and sent
/// as `Last-Event-ID` on every reconnection. Runs until the end of the run.
fn consume_events(soak: &Soak, world: &World, feed: &Mutex<FeedSeen>) {
    let cursor_file = soak.settings.out.join("feed-cursor");
    let _ = std::fs::remove_file(&cursor_file);
    while !soak.over() {
        let last = std::fs::read_to_string(&cursor_file).ok();
        match stream_events(soak, world, last.as_deref(), &cursor_file, feed) {
            Ok(()) => {}
            Err(e) => soak.count(&format!("feed stream ended: {}", e.kind())),
        }
        feed.lock().unwrap().reconnects += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// One stream: reads events until it ends or the run is over.
fn stream_events(
    soak: &Soak,
    world: &World,
    last: Option<&str>,
    cursor_file: &Path,
    feed: &Mutex<FeedSeen>,
) -> std::io::Result<()> {
    let mut s = TcpStream::connect(&world.serve_addr)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut head = format!(
        "GET /events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n",
        world.serve_addr,
        crate::common::READ_TOKEN
    );
    if let Some(l) = last {
        head.push_str(&format!("Last-Event-ID: {}\r\n", l.trim()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked") {
            chunked = true;
        }
    }
    if status != 200 {
        let mut body = String::new();
        let _ = r.read_to_string(&mut body);
        if status == 410 {
            soak.violation(
                "feed consumer",
                format!("the feed answered 410 (cursor pruned): {body}"),
            );
        } else {
            soak.count(&format!("feed answered {status}"));
        }
        return Ok(());
    }
    let mut pending = String::new();
    loop {
        if soak.over() {
            return Ok(());
        }
        let data = match read_some(&mut r, chunked) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        pending.push_str(&String::from_utf8_lossy(&data));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            take_event(soak, &event, cursor_file, feed);
        }
    }
}

/// The next piece of the body: a chunk (chunked encoding) or what the socket has.
/// `None` at the end of the stream.
fn read_some(r: &mut BufReader<TcpStream>, chunked: bool) -> std::io::Result<Option<Vec<u8>>> {
    if !chunked {
        let mut buf = vec![0u8; 16 * 1024];
        let n = r.read(&mut buf)?;
        buf.truncate(n);
        return Ok((n > 0).then_some(buf));
    }
    let mut size_line = String::new();
    if r.read_line(&mut size_line)? == 0 {
        return Ok(None);
    }
    let hex = size_line.trim().split(';').next().unwrap_or("");
    if hex.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let size = usize::from_str_radix(hex, 16)
        .map_err(|_| std::io::Error::other(format!("chunk size {hex:?}")))?;
    if size == 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; size + 2];
    // A chunk's bytes may come in several reads; the timeout between them is the
    // server's pace, so wait them out.
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Ok(None),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(size);
    Ok(Some(buf))
}

/// One SSE event: a task event is checked for order, recorded, and its id kept as the
/// cursor; anything else (comments, progress) is passed over.
fn take_event(soak: &Soak, event: &str, cursor_file: &Path, feed: &Mutex<FeedSeen>) {
    let mut id = None;
    let mut kind = "message";
    let mut data = String::new();
    for line in event.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("event:") {
            kind = if v.trim() == "task" { "task" } else { "other" };
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    if kind != "task" {
        return;
    }
    let Some(id) = id else {
        soak.violation(
            "feed consumer",
            format!("a task event without an id: {event:?}"),
        );
        return;
    };
    let position = parse_position(&id);
    let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
    let (Some(position), Some(event_id), Some(task), Some(to)) = (
        position,
        v["id"].as_i64(),
        v["task_id"].as_str().and_then(|t| Uuid::parse_str(t).ok()),
        v["to"].as_str(),
    ) else {
        soak.violation(
            "feed consumer",
            format!("an event it cannot read: {event:?}"),
        );
        return;
    };
    let mut f = feed.lock().unwrap();
    if let Some(last) = f.events.last() {
        if position <= last.0 {
            soak.violation(
                "feed once and in order",
                format!("event {id} came after {:?}", last.0),
            );
        }
    }
    f.events.push((position, event_id, task, to.to_string()));
    drop(f);
    // Written aside and renamed: a crash of the consumer never leaves half a cursor.
    let aside = cursor_file.with_extension("new");
    if std::fs::write(&aside, &id).is_ok() {
        let _ = std::fs::rename(&aside, cursor_file);
    }
}

/// "XID-ID" → (xid, id).
pub fn parse_position(text: &str) -> Option<(u64, i64)> {
    let (x, i) = text.trim().split_once('-')?;
    Some((x.parse().ok()?, i.parse().ok()?))
}

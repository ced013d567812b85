//! The soak's invariants. While it runs: every acknowledged task is seen final (an
//! upload's with its file's digest), no task succeeds twice, no unique key has two
//! unfinished tasks, the limited kind never holds more than its limit, each schedule
//! slot fires once, the feed consumer's events match the history, and the figures are
//! sampled. At the end, after a drain: nothing acknowledged is lost, every flow
//! finished, no two executions of a task overlapped (the journal), memory and
//! descriptors stayed flat, backends within the budget, the history pruned to its
//! retention, no deadlock in PostgreSQL's log.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::load::{parse_position, FeedSeen, LIMIT, LIMITED_KIND, SCHEDULE, UNIQUE_PREFIX};
use crate::world::World;
use crate::{pause, Expect, Sample, Soak};

/// The statuses a task ends in.
const FINAL: [&str; 4] = ["succeeded", "failed", "timeout", "canceled"];
/// Database connections allowed per artex process (its pool, its LISTEN session and a
/// spare), and for the soak itself.
const BACKENDS_PER_PROCESS: i64 = 8;
/// At most this many artex processes run at once: 2 planners, 3 workers (one of them
/// twice during a hot upgrade) and `serve`.
const MAX_PROCESSES: i64 = 7;
/// Descriptors a process's database connections may differ by between two moments (its
/// pool and sessions, see [`BACKENDS_PER_PROCESS`]).
const CONNECTIONS_SLACK: f64 = BACKENDS_PER_PROCESS as f64;
/// The soak's own connections (its pool and a few one-off clients).
const SOAK_BACKENDS: i64 = 10;

/// Acknowledged tasks of which the final status was not seen yet.
fn unfinished(soak: &Soak) -> Vec<Uuid> {
    soak.acked
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, a)| a.ended.is_none())
        .map(|(id, _)| *id)
        .collect()
}

/// Starts the checkers that run with the load; they stop at the end of the run.
pub fn start(
    soak: &Arc<Soak>,
    world: &Arc<World>,
    feed: &Arc<std::sync::Mutex<FeedSeen>>,
) -> Vec<JoinHandle<()>> {
    let mut handles = Vec::new();
    let (s, w) = (soak.clone(), world.clone());
    handles.push(tokio::spawn(async move {
        while pause(&s, Duration::from_secs(1)).await {
            w.supervise(&s);
        }
    }));
    let (s, w, f) = (soak.clone(), world.clone(), feed.clone());
    handles.push(tokio::spawn(async move {
        while pause(&s, Duration::from_secs(30)).await {
            let after = *s.feed_checked.lock().unwrap();
            if let Some(upto) = feed_complete(&s, &w, &f, after).await {
                *s.feed_checked.lock().unwrap() = Some(upto);
            }
        }
    }));
    let (s, w) = (soak.clone(), world.clone());
    handles.push(tokio::spawn(async move {
        while pause(&s, Duration::from_secs(2)).await {
            let _ = finals(&s, &w).await;
        }
    }));
    let (s, w) = (soak.clone(), world.clone());
    handles.push(tokio::spawn(async move {
        let mut slots: HashMap<String, HashSet<Uuid>> = HashMap::new();
        while pause(&s, Duration::from_secs(10)).await {
            let _ = twice(&s, &w, &mut slots).await;
        }
        s.counters
            .lock()
            .unwrap()
            .insert("schedule slots fired".into(), slots.len() as u64);
    }));
    let (s, w) = (soak.clone(), world.clone());
    handles.push(tokio::spawn(async move {
        while pause(&s, Duration::from_millis(500)).await {
            let _ = held_limit(&s, &w).await;
        }
    }));
    let (s, w) = (soak.clone(), world.clone());
    handles.push(tokio::spawn(async move {
        let mut previous: Option<(f64, i64)> = None;
        loop {
            sample(&s, &w, &mut previous).await;
            if !pause(&s, Duration::from_secs(5)).await {
                break;
            }
        }
    }));
    handles
}

/// Marks the acknowledged tasks now final; an upload's must have succeeded with its
/// file's digest; one that is gone without being seen final is lost.
async fn finals(soak: &Soak, world: &World) -> Result<(), tokio_postgres::Error> {
    let ids = unfinished(soak);
    let Some(c) = world.client().await else {
        return Ok(());
    };
    for part in ids.chunks(2000) {
        let rows = c
            .query(
                "select id, status::text, result from artex.tasks where id = any($1)",
                &[&part],
            )
            .await?;
        let mut found = HashSet::new();
        let mut acked = soak.acked.lock().unwrap();
        for r in rows {
            let id: Uuid = r.get(0);
            let status: String = r.get(1);
            found.insert(id);
            if !FINAL.contains(&status.as_str()) {
                continue;
            }
            let Some(a) = acked.get_mut(&id) else {
                continue;
            };
            if let Expect::Digest(sha) = &a.expect {
                let result: Option<serde_json::Value> = r.get(2);
                let got = result.as_ref().and_then(|v| v["sha256"].as_str());
                if status != "succeeded" || got != Some(sha.as_str()) {
                    soak.violation(
                        "uploads run once with their file",
                        format!("upload task {id}: {status}, sha256 {got:?}, expected {sha}"),
                    );
                }
            }
            a.ended = Some(status);
        }
        for id in part {
            if !found.contains(id) {
                if let Some(a) = acked.get_mut(id) {
                    a.ended = Some("lost".into());
                    soak.violation(
                        "0 acknowledged tasks lost",
                        format!(
                            "task {id} ({}, acknowledged at {:.1}s) is gone, never seen final",
                            a.kind, a.at
                        ),
                    );
                }
            }
        }
    }
    let flows = soak.open_flows();
    if !flows.is_empty() {
        let rows = c
            .query(
                "select flow_id, bool_and(status::text in ('succeeded','failed','timeout','canceled'))
                 from artex.tasks where flow_id = any($1) group by 1",
                &[&flows],
            )
            .await?;
        let mut seen = HashSet::new();
        let mut map = soak.flows.lock().unwrap();
        for r in rows {
            let id: Uuid = r.get(0);
            seen.insert(id);
            if r.get::<_, bool>(1) {
                map.insert(id, true);
            }
        }
        for id in flows {
            if !seen.contains(&id) {
                map.insert(id, true);
                soak.violation(
                    "every flow finished",
                    format!("flow {id} is gone, never seen finished"),
                );
            }
        }
    }
    Ok(())
}

/// No task succeeded twice; no unique key has two unfinished tasks; each schedule slot
/// has one task.
async fn twice(
    soak: &Soak,
    world: &World,
    slots: &mut HashMap<String, HashSet<Uuid>>,
) -> Result<(), ()> {
    let c = world.client().await.ok_or(())?;
    let rows = c
        .query(
            "select task_id, count(*) from artex.task_transitions where to_status = 'succeeded'
             group by 1 having count(*) > 1 limit 20",
            &[],
        )
        .await
        .map_err(|_| ())?;
    for r in rows {
        let id: Uuid = r.get(0);
        let n: i64 = r.get(1);
        soak.violation(
            "0 succeeded twice",
            format!("task {id} succeeded {n} times"),
        );
    }
    let rows = c
        .query(
            "select unique_key, count(*) from artex.tasks
             where unique_key like $1 || '%'
               and status::text not in ('succeeded','failed','timeout','canceled')
             group by 1 having count(*) > 1",
            &[&UNIQUE_PREFIX],
        )
        .await
        .map_err(|_| ())?;
    for r in rows {
        let key: String = r.get(0);
        soak.violation(
            "unique keys",
            format!("key {key}: {} unfinished tasks", r.get::<_, i64>(1)),
        );
    }
    let prefix = format!("schedule:{SCHEDULE}:");
    let rows = c
        .query(
            "select unique_key, id from artex.tasks where unique_key like $1 || '%'",
            &[&prefix],
        )
        .await
        .map_err(|_| ())?;
    for r in rows {
        let key: String = r.get(0);
        let ids = slots.entry(key.clone()).or_default();
        ids.insert(r.get(1));
        if ids.len() == 2 {
            soak.violation(
                "schedules fire once",
                format!("slot {key} has tasks {ids:?}"),
            );
        }
    }
    Ok(())
}

/// The limited kind holds at most its limit (assigned or running, as the limit counts).
async fn held_limit(soak: &Soak, world: &World) -> Result<(), ()> {
    let c = world.client().await.ok_or(())?;
    let n: i64 = c
        .query_one(
            "select count(*) from artex.tasks where kind = $1 and assigned_to is not null and limited",
            &[&LIMITED_KIND],
        )
        .await
        .map_err(|_| ())?
        .get(0);
    let mut counters = soak.counters.lock().unwrap();
    let max = counters
        .entry("limited kind held at most".into())
        .or_insert(0);
    *max = (*max).max(n as u64);
    drop(counters);
    if n > LIMIT {
        soak.violation(
            "kind limits",
            format!("{n} {LIMITED_KIND} tasks held, limit {LIMIT}"),
        );
    }
    Ok(())
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// One sample of the figures (database ones left empty while it is away).
async fn sample(soak: &Soak, world: &World, previous: &mut Option<(f64, i64)>) {
    let mut s = Sample {
        at: soak.now(),
        ..Sample::default()
    };
    for role in crate::world::ROLES {
        let pid = world.pid(role);
        if let Some(rss) = rss_kib(pid) {
            s.procs.push((
                role.to_string(),
                pid,
                rss,
                crate::common::procs::fd_count(pid),
            ));
        }
    }
    if let Some(c) = world.client().await {
        let q = c
            .query_one(
                "select (select count(*) from artex.task_transitions where to_status = 'succeeded'),
                        (select percentile_cont(0.99) within group (order by
                             extract(epoch from finished_at - created_at) * 1000)
                         from artex.tasks where finished_at > now() - interval '5 seconds'
                           and kind in ('noop', 'echo')),
                        (select count(*) from artex.tasks where status::text in ('pending', 'assigned')),
                        (select count(*) from pg_stat_activity where backend_type = 'client backend'),
                        (select sum(pg_total_relation_size(relid))::int8
                         from pg_partition_tree('artex.task_history'))
                          + pg_total_relation_size('artex.tasks')",
                &[],
            )
            .await;
        if let Err(e) = &q {
            soak.count(&format!(
                "sample query failed: {}",
                e.as_db_error().map(|d| d.message()).unwrap_or("connection")
            ));
        }
        if let Ok(r) = q {
            let succeeded: i64 = r.get(0);
            if let Some((at, n)) = *previous {
                if s.at > at && succeeded >= n {
                    s.throughput = Some((succeeded - n) as f64 / (s.at - at));
                }
            }
            *previous = Some((s.at, succeeded));
            s.p99_ms = r.get(1);
            s.backlog = Some(r.get(2));
            s.backends = Some(r.get(3));
            s.table_bytes = r.get(4);
        }
    }
    soak.samples.lock().unwrap().push(s);
}

/// After the load stopped: waits (up to 5 minutes) until every acknowledged task and
/// every flow is seen finished, and the feed consumer has every event written. A drain
/// still open after [`DRAIN_SAYS_WHY`] says once what it waits for.
pub async fn drain(soak: &Soak, world: &World) {
    let started = soak.now();
    let deadline = started + 300.0;
    let mut said = false;
    while soak.now() < deadline {
        let _ = finals(soak, world).await;
        let open =
            unfinished(soak).len() + soak.flows.lock().unwrap().values().filter(|d| !**d).count();
        if open == 0 {
            break;
        }
        if !said && soak.now() - started >= DRAIN_SAYS_WHY {
            said = true;
            still_open(soak, world).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("SOAK drained at {:.1}s", soak.now());
}

/// How long a drain runs before it says what it waits for, seconds (runs drain in 2-5).
const DRAIN_SAYS_WHY: f64 = 30.0;

/// Prints the unfinished acknowledged tasks (at most 10, as the blackboard has them:
/// status, holder, when runnable, retries) and the unfinished flows' count: what a slow
/// drain waits for.
async fn still_open(soak: &Soak, world: &World) {
    let ids = unfinished(soak);
    let flows = soak.flows.lock().unwrap().values().filter(|d| !**d).count();
    eprintln!(
        "SOAK drain at {:.1}s still waits for {} acknowledged tasks and {flows} flows",
        soak.now(),
        ids.len()
    );
    let Some(c) = world.client().await else {
        eprintln!("SOAK drain: no primary to ask about them");
        return;
    };
    let first: Vec<Uuid> = ids.into_iter().take(10).collect();
    let rows = c
        .query(
            "select id, kind, status::text, coalesce(assigned_to, '-'),
                    round(extract(epoch from run_at - now()))::int8, retries, max_retries
             from artex.tasks where id = any($1) order by id",
            &[&first],
        )
        .await;
    match rows {
        Ok(rows) => {
            for r in rows {
                let (id, kind, status, holder): (Uuid, String, String, String) =
                    (r.get(0), r.get(1), r.get(2), r.get(3));
                let (runnable_in, retries, max): (i64, i32, i32) = (r.get(4), r.get(5), r.get(6));
                eprintln!(
                    "SOAK drain: task {id} ({kind}) {status}, held by {holder}, runnable in {runnable_in} s, retries {retries} of {max}"
                );
            }
        }
        Err(e) => eprintln!("SOAK drain: cannot read them: {e}"),
    }
}

/// The checks made once, at the end.
pub async fn at_end(soak: &Soak, world: &World, feed: &std::sync::Mutex<FeedSeen>) {
    let _ = finals(soak, world).await;
    for (id, a) in soak.acked.lock().unwrap().iter() {
        if a.ended.is_none() {
            soak.violation(
                "0 acknowledged tasks lost",
                format!(
                    "task {id} ({}, acknowledged at {:.1}s) never finished",
                    a.kind, a.at
                ),
            );
        }
    }
    for (id, done) in soak.flows.lock().unwrap().iter() {
        if !done {
            soak.violation("every flow finished", format!("flow {id} never finished"));
        }
    }
    overlaps(soak, world);
    let checked = *soak.feed_checked.lock().unwrap();
    feed_complete(soak, world, feed, checked).await;
    soak.counters
        .lock()
        .unwrap()
        .insert("feed reconnections".into(), feed.lock().unwrap().reconnects);
    flat(soak);
    bounded(soak, world).await;
    let log = world.db.server_log();
    for l in log
        .lines()
        .filter(|l| l.contains("deadlock detected"))
        .take(5)
    {
        soak.violation("no deadlock", l.to_string());
    }
    let fired = soak
        .counters
        .lock()
        .unwrap()
        .get("schedule slots fired")
        .copied()
        .unwrap_or(0);
    let minutes = soak.settings.minutes.floor() as u64;
    if fired + 1 < minutes {
        soak.violation(
            "schedules fire once",
            format!("{fired} minute slots fired in a {minutes}-minute run"),
        );
    }
}

/// One execution in the journal: the task, the pid, and when it ran (seconds into the
/// run), less the windows its process was frozen.
struct Execution {
    task: String,
    pid: i32,
    live: Vec<(f64, f64)>,
}

/// No two executions of one task ran at once. An execution with no end line ended with
/// its process (a kill -9 recorded); a frozen process executes nothing while frozen.
fn overlaps(soak: &Soak, world: &World) {
    let unix0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        - soak.now();
    let at = |ms: u128| ms as f64 / 1000.0 - unix0;
    let deaths = soak.deaths.lock().unwrap().clone();
    let frozen = soak.frozen.lock().unwrap().clone();
    let mut open: HashMap<(String, i32), f64> = HashMap::new();
    let mut runs: Vec<(String, i32, f64, f64)> = Vec::new();
    for line in crate::common::journal::read(&world.journal) {
        let (task, pid) = (line.task.to_string(), line.pid);
        match line.what.as_str() {
            "start" => {
                if let Some(prev) = open.insert((task.clone(), pid), at(line.at_ms)) {
                    soak.violation(
                        "0 overlapping executions",
                        format!("task {task} started twice in pid {pid} (first at {prev:.1}s)"),
                    );
                }
            }
            // The execution's code last ran at `active_ms` (its drop, when a worker
            // stopped it, comes later and runs none of it).
            "end" => match open.remove(&(task.clone(), pid)) {
                Some(start) => {
                    runs.push((task, pid, start, at(line.active_ms.unwrap_or(line.at_ms))))
                }
                None => soak.violation(
                    "0 overlapping executions",
                    format!("task {task} ended in pid {pid} without a start: {line:?}"),
                ),
            },
            _ => {}
        }
    }
    for ((task, pid), start) in open {
        match deaths.get(&pid) {
            Some(d) => runs.push((task, pid, start, *d)),
            None => soak.violation(
                "0 overlapping executions",
                format!("task {task}: its execution in pid {pid} (from {start:.1}s) never ended"),
            ),
        }
    }
    let executions: Vec<Execution> = runs
        .into_iter()
        .map(|(task, pid, start, end)| {
            let mut live = vec![(start, end)];
            for (p, f0, f1) in &frozen {
                if *p != pid {
                    continue;
                }
                live = live
                    .into_iter()
                    .flat_map(|(a, b)| {
                        if *f1 <= a || *f0 >= b {
                            vec![(a, b)]
                        } else {
                            [(a, *f0), (*f1, b)]
                                .into_iter()
                                .filter(|(x, y)| y > x)
                                .collect()
                        }
                    })
                    .collect();
            }
            Execution { task, pid, live }
        })
        .collect();
    let mut by_task: BTreeMap<&str, Vec<&Execution>> = BTreeMap::new();
    for e in &executions {
        by_task.entry(&e.task).or_default().push(e);
    }
    let mut counted = 0u64;
    for (task, ex) in by_task {
        for (i, a) in ex.iter().enumerate() {
            for b in &ex[i + 1..] {
                let overlap: f64 = a
                    .live
                    .iter()
                    .flat_map(|x| b.live.iter().map(move |y| (x, y)))
                    .map(|(x, y)| (x.1.min(y.1) - x.0.max(y.0)).max(0.0))
                    .sum();
                if overlap > 0.0 {
                    counted += 1;
                    soak.violation(
                        "0 overlapping executions",
                        format!(
                            "task {task}: executions in pids {} and {} overlapped {:.0} ms ({:?} / {:?})",
                            a.pid,
                            b.pid,
                            overlap * 1000.0,
                            a.live,
                            b.live
                        ),
                    );
                }
            }
        }
    }
    let mut c = soak.counters.lock().unwrap();
    c.insert("journaled executions".into(), executions.len() as u64);
    c.insert("overlapping pairs".into(), counted);
}

/// Every status change the history holds after `after` and up to the consumer's last
/// event reached it, once and in order (the rows up to a position the feed delivered are
/// settled: the feed delivers a row only once every older transaction has ended).
/// Returns the position checked up to.
async fn feed_complete(
    soak: &Soak,
    world: &World,
    feed: &std::sync::Mutex<FeedSeen>,
    after: Option<(u64, i64)>,
) -> Option<(u64, i64)> {
    let c = world.client().await?;
    let events: Vec<((u64, i64), i64, Uuid, String)> = {
        let f = feed.lock().unwrap();
        let start = match after {
            Some(a) => f.events.partition_point(|e| e.0 <= a),
            None => 0,
        };
        f.events[start..].to_vec()
    };
    let (first, last) = (events.first()?.0, events.last()?.0);
    let from = after.unwrap_or(first);
    let rows = c
        .query(
            // The stored rows (their partitions), a row holding a start and an end
            // expanded into its two events as the feed does (V25).
            "select e.xid::text, ev.id, e.task_id, ev.to_status::text, coalesce(ev.reason, ''),
                    ev.at::text, e.tableoid::regclass::text
             from artex.task_history e
             cross join lateral (
                 select e.id,
                        case when e.end_id is null then e.to_status else 'running' end
                            as to_status,
                        case when e.end_id is null then e.reason else 'started' end as reason,
                        case when e.end_id is null then e.at else e.started_at end as at
                 union all
                 select e.end_id, e.to_status, e.reason, e.at where e.end_id is not null
             ) ev
             where (e.xid, coalesce(e.end_id, e.id)) >= ($1::text::xid8, $2::int8)
               and (e.xid, e.id) <= ($3::text::xid8, $4::int8)
               and (e.xid, ev.id) between ($1::text::xid8, $2::int8)
                                      and ($3::text::xid8, $4::int8)
               and e.xid > '1' and e.to_status <> 'assigned'
               and e.from_status is distinct from e.to_status
             order by e.xid, ev.id",
            &[&from.0.to_string(), &from.1, &last.0.to_string(), &last.1],
        )
        .await
        .ok()?;
    let seen: HashSet<(u64, i64)> = events.iter().map(|e| e.0).collect();
    if seen.len() != events.len() {
        soak.violation(
            "feed once and in order",
            format!("{} events came more than once", events.len() - seen.len()),
        );
    }
    let mut missing = Vec::new();
    let mut first_missing = None;
    let mut compared = 0u64;
    for r in &rows {
        let xid: String = r.get(0);
        let id: i64 = r.get(1);
        let Some(p) = parse_position(&format!("{xid}-{id}")) else {
            continue;
        };
        // The row at `after` was compared by the check before this one.
        if after.is_some_and(|a| p <= a) {
            continue;
        }
        compared += 1;
        if seen.contains(&p) {
            continue;
        }
        let task: Uuid = r.get(2);
        let (to, reason, at, part): (String, String, String, String) =
            (r.get(3), r.get(4), r.get(5), r.get(6));
        first_missing.get_or_insert(p);
        missing.push(format!(
            "{xid}-{id} task {task} → {to} ({reason}) at {at} in {part}"
        ));
    }
    if !missing.is_empty() {
        let before = events
            .iter()
            .rfind(|e| Some(e.0) < first_missing)
            .map(|e| e.0);
        soak.violation(
            "feed once and in order",
            format!(
                "{} of {} history rows never reached the consumer (it saw {:?} before the first); {}",
                missing.len(),
                rows.len(),
                before,
                missing[..missing.len().min(6)].join("; ")
            ),
        );
    }
    let mut counters = soak.counters.lock().unwrap();
    *counters.entry("feed events seen".into()).or_insert(0) += events.len() as u64;
    *counters.entry("feed rows compared".into()).or_insert(0) += compared;
    Some(last)
}

/// The median of `v`.
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// RSS and open descriptors of each process that lived from the warm-up to the end grew
/// by at most 10%: the median of the last tenth of the run against the median of the
/// tenth after the warm-up. Descriptors may also differ by a process's database
/// connections ([`CONNECTIONS_SLACK`]): its pool closes them with PostgreSQL's restarts
/// and opens them again as work asks, so their count moves with the faults, not with time.
fn flat(soak: &Soak) {
    let samples = soak.samples.lock().unwrap().clone();
    let Some(end) = samples.last().map(|s| s.at) else {
        return;
    };
    let warm = soak.settings.warm_up().as_secs_f64();
    let tenth = (end - warm) / 10.0;
    // (role, pid) → (at, RSS KiB, descriptors) over time.
    type Series = BTreeMap<(String, i32), Vec<(f64, u64, usize)>>;
    let mut series: Series = BTreeMap::new();
    for s in &samples {
        for (role, pid, rss, fds) in &s.procs {
            series
                .entry((role.clone(), *pid))
                .or_default()
                .push((s.at, *rss, *fds));
        }
    }
    let mut report = Vec::new();
    for ((role, pid), points) in series {
        let (Some(first), Some(last)) = (points.first(), points.last()) else {
            continue;
        };
        if first.0 > warm || last.0 < end - tenth {
            continue;
        }
        let base: Vec<_> = points
            .iter()
            .filter(|p| p.0 >= warm && p.0 <= warm + tenth)
            .collect();
        let tail: Vec<_> = points.iter().filter(|p| p.0 >= end - tenth).collect();
        let m = |v: &[&(f64, u64, usize)], f: fn(&(f64, u64, usize)) -> f64| {
            median(v.iter().map(|p| f(p)).collect())
        };
        let (Some(rss0), Some(rss1), Some(fd0), Some(fd1)) = (
            m(&base, |p| p.1 as f64),
            m(&tail, |p| p.1 as f64),
            m(&base, |p| p.2 as f64),
            m(&tail, |p| p.2 as f64),
        ) else {
            continue;
        };
        report.push(format!(
            "{role} (pid {pid}): RSS {:.1} → {:.1} MiB, descriptors {fd0} → {fd1}",
            rss0 / 1024.0,
            rss1 / 1024.0
        ));
        if rss1 > rss0 * 1.10 {
            soak.violation(
                "memory flat",
                format!(
                    "{role} (pid {pid}): RSS grew from {:.1} to {:.1} MiB after the warm-up",
                    rss0 / 1024.0,
                    rss1 / 1024.0
                ),
            );
        }
        if fd1 > fd0 * 1.10 + CONNECTIONS_SLACK {
            soak.violation(
                "descriptors flat",
                format!("{role} (pid {pid}): open descriptors grew from {fd0} to {fd1} after the warm-up"),
            );
        }
    }
    let mut c = soak.counters.lock().unwrap();
    c.insert(
        format!("long-lived processes checked: {}", report.join("; ")),
        report.len() as u64,
    );
}

/// Backends stayed within the budget; finished tasks and history older than the
/// retention (and the partition slices it prunes by) are gone.
async fn bounded(soak: &Soak, world: &World) {
    let budget = BACKENDS_PER_PROCESS * MAX_PROCESSES + SOAK_BACKENDS;
    let max = soak
        .samples
        .lock()
        .unwrap()
        .iter()
        .filter_map(|s| s.backends)
        .max()
        .unwrap_or(0);
    soak.counters
        .lock()
        .unwrap()
        .insert(format!("backends at most (budget {budget})"), max as u64);
    if max > budget {
        soak.violation(
            "backends within the budget",
            format!("{max} client backends, budget {budget}"),
        );
    }
    let keep = soak.settings.retention_minutes() as f64 * 60.0;
    if soak.settings.minutes * 60.0 < keep + 120.0 {
        return;
    }
    // Tables and indexes plateau once the retention has passed twice: the largest size
    // of the last quarter of the run is at most half as much again as that of the
    // second quarter (pruning goes by whole partitions, and deleted rows' room is
    // reused, not given back).
    let end = soak.settings.length().as_secs_f64();
    if end >= 4.0 * (keep + 120.0) {
        let largest = |from: f64, to: f64| {
            soak.samples
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.at >= from && s.at < to)
                .filter_map(|s| s.table_bytes)
                .max()
        };
        if let (Some(mid), Some(last)) = (largest(end / 4.0, end / 2.0), largest(end * 0.75, end)) {
            soak.counters.lock().unwrap().insert(
                format!(
                    "tables and indexes, MiB, largest in the second quarter → last quarter: {} →",
                    mid >> 20
                ),
                (last >> 20) as u64,
            );
            if last as f64 > mid as f64 * 1.5 {
                soak.violation(
                    "history bounded by the retention",
                    format!(
                        "tables and indexes grew from {} MiB to {} MiB",
                        mid >> 20,
                        last >> 20
                    ),
                );
            }
        }
    }
    let Some(c) = world.client().await else {
        return;
    };
    // A partition's slice is an eighth of the retention, at least a minute; maintenance
    // drops one whose slice ended more than the retention ago, on its own cadence.
    let slack = (keep / 8.0).max(60.0) * 2.0 + 120.0;
    let r = c
        .query_one(
            "select extract(epoch from now() - min(at))::float8 from artex.task_transitions",
            &[],
        )
        .await;
    if let Ok(r) = r {
        let oldest: Option<f64> = r.get(0);
        let oldest = oldest.unwrap_or(0.0);
        soak.counters
            .lock()
            .unwrap()
            .insert("oldest history row, s".into(), oldest as u64);
        if oldest > keep + slack {
            soak.violation(
                "history bounded by the retention",
                format!("the oldest history row is {oldest:.0} s old; retention {keep:.0} s"),
            );
        }
    }
}

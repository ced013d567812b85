//! Schema ranges: only `artex migrate` (and `up`, `db start`) changes the schema; planners,
//! workers and one-shot commands refuse a database outside their build's range with one
//! clear line and exit 1, writing nothing; a build runs against a schema a newer build
//! expanded, and refuses one a newer build contracted beyond it.

mod common;

use std::process::Command;
use std::time::Duration;

use artex_actors::blackboard::{EventFeed, EventPosition, FeedStart, NewTask, MIGRATIONS};
use common::procs::{history_settled, wait_status, Proc};
use common::{count, run_cli, TestDb};
use tokio_postgres::Client;

/// The newest migration this build knows.
fn knows() -> i32 {
    MIGRATIONS.last().map(|m| m.version).unwrap_or(0)
}

/// Empties the test database and migrates it to `V<upto>` the way a build that knew only
/// that much would have, with the runner's table as the first releases made it (no
/// `compatible_from` column).
async fn migrated_up_to(c: &Client, upto: i32) {
    c.batch_execute(
        "drop schema artex cascade;
         create schema artex;
         create table artex.schema_migrations (
             version integer primary key,
             name text not null,
             checksum text not null,
             applied_at timestamptz not null default now())",
    )
    .await
    .unwrap();
    for m in MIGRATIONS.iter().filter(|m| m.version <= upto) {
        c.batch_execute(m.sql).await.unwrap();
        c.execute(
            "insert into artex.schema_migrations (version, name, checksum) values ($1, $2, $3)",
            &[&m.version, &m.name, &m.checksum()],
        )
        .await
        .unwrap();
    }
}

/// The versions recorded as applied.
async fn applied(c: &Client) -> Vec<i32> {
    c.query(
        "select version from artex.schema_migrations order by 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The `artex: error:` lines a process printed (one is expected).
fn error_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("artex: error:"))
        .map(str::to_string)
        .collect()
}

/// Starts `p`, expects it to exit 1 with exactly one error line containing every one of
/// `needles`; returns that line.
fn refused(mut p: Proc, needles: &[&str]) -> String {
    let status = p
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{} kept running on a database outside its range", p.name));
    let log = p.log_text();
    assert_eq!(status.code(), Some(1), "{}: {log}", p.name);
    let lines = error_lines(&log);
    assert_eq!(lines.len(), 1, "{}: one error line expected: {log}", p.name);
    for n in needles {
        assert!(
            lines[0].contains(n),
            "{}: {:?} lacks {n:?}",
            p.name,
            lines[0]
        );
    }
    lines[0].clone()
}

#[tokio::test]
async fn processes_refuse_a_database_missing_a_migration_write_nothing_and_migrate_nothing() {
    let db = TestDb::new().await;
    let c = db.client().await;
    migrated_up_to(&c, 3).await;
    let missing = MIGRATIONS[3].label();
    let needles = [missing.as_str(), "run `artex migrate`"];

    let line = refused(Proc::worker("worker", &db.url, &[]), &needles);
    refused(Proc::planner("planner", &db.url, &[]), &needles);
    let (code, _, err) = run_cli(&db.url, &["submit", "echo"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(error_lines(&err), vec![line.clone()], "{err}");

    // Nothing was written, and nothing migrated: the database is as V3 left it, its
    // runner table not even given the new column.
    assert_eq!(applied(&c).await, vec![1, 2, 3]);
    assert_eq!(count(&c, "select count(*) from artex.workers").await, 0);
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);
    let v4_table = c
        .query_one("select to_regclass('artex.limits') is not null", &[])
        .await
        .unwrap()
        .get::<_, bool>(0);
    assert!(!v4_table, "V4's table appeared: something migrated");
    let column = count(
        &c,
        "select count(*) from information_schema.columns
         where table_schema = 'artex' and table_name = 'schema_migrations'
           and column_name = 'compatible_from'",
    )
    .await;
    assert_eq!(column, 0);

    // What the message says to run is what fixes it.
    let (code, out, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(applied(&c).await, (1..=knows()).collect::<Vec<_>>());
    let marks = count(
        &c,
        "select count(*) from artex.schema_migrations where compatible_from is null",
    )
    .await;
    assert_eq!(marks, 0, "rows of the first releases get their marks");
    let _planner = Proc::planner("planner", &db.url, &[]);
    let _worker = Proc::worker("worker", &db.url, &[]);
    let (code, out, err) = run_cli(
        &db.url,
        &[
            "submit",
            "echo",
            "--payload",
            "{}",
            "--allow-unregistered-kind",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let id = out.trim().parse().unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_build_runs_on_a_schema_a_newer_build_expanded_and_refuses_one_it_contracted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (expand, contract) = (knows() + 1, knows() + 2);
    // What a newer build's `artex migrate` would leave: an expansion of a hot table (a
    // column with a default) and a new table, recorded as an expansion (floor 0).
    c.batch_execute(&format!(
        "alter table artex.tasks add column future_note text not null default '';
         create table artex.future_things (id bigint primary key);
         insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({expand}, 'future_things', 'ffffffffffffffff', 0)"
    ))
    .await
    .unwrap();

    let _planner = Proc::planner("planner", &db.url, &[]);
    let mut worker = Proc::worker("worker", &db.url, &[]);
    let (code, out, err) = run_cli(
        &db.url,
        &[
            "submit",
            "echo",
            "--payload",
            "{}",
            "--allow-unregistered-kind",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let id = out.trim().parse().unwrap();
    wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
    // This build's `artex migrate` has nothing to do there, says so, and refuses nothing.
    let (code, out, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("V{expand}__future_things")),
        "migrate names the newer expansion: {out}"
    );
    assert!(
        worker.wait_exit(Duration::ZERO).is_none(),
        "the worker runs on"
    );

    // A contraction that only builds knowing V<expand> survive: this build is too old.
    c.batch_execute(&format!(
        "insert into artex.schema_migrations (version, name, checksum, compatible_from)
         values ({contract}, 'drop_old_things', 'eeeeeeeeeeeeeeee', {expand})"
    ))
    .await
    .unwrap();
    let needles = [
        &*format!("V{contract}__drop_old_things"),
        &*format!("V{expand} or newer"),
        &*format!("knows up to V{}", knows()),
    ];
    refused(Proc::worker("late worker", &db.url, &[]), &needles);
    refused(Proc::planner("late planner", &db.url, &[]), &needles);
    let (code, _, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("V{contract}__drop_old_things")),
        "{err}"
    );
    assert_eq!(
        applied(&c).await,
        (1..=contract).collect::<Vec<_>>(),
        "the refused migrate changed nothing"
    );
}

#[test]
fn bundle_create_asks_the_binary_for_its_schema_and_refuses_one_that_cannot_say() {
    let keys = common::bundles::Keys::new();
    // A real build answers: the manifest records what it needs.
    let (zip, _) = keys.bundle_of(
        std::path::Path::new(common::artex_bin()),
        "real",
        "real.zip",
    );
    let last = MIGRATIONS.last().unwrap().label();
    let manifest = read_manifest(&zip);
    let needs = manifest["schema"]["needs"].as_array().unwrap();
    assert_eq!(needs.len(), MIGRATIONS.len(), "{manifest}");
    assert_eq!(
        format!(
            "V{}__{}",
            needs[needs.len() - 1]["version"],
            needs[needs.len() - 1]["name"].as_str().unwrap()
        ),
        last
    );

    // A binary that cannot say is refused, naming the ways out; each of them works.
    let script = keys.path("mute");
    std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
    let create = |extra: &[&str]| {
        Command::new(common::artex_bin())
            .args(["bundle", "create", "--binary"])
            .arg(&script)
            .arg("--key")
            .arg(keys.path("secret"))
            .arg("--out")
            .arg(keys.path("mute.zip"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = create(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--schema-of-this-build") && err.contains("--no-schema"),
        "{err}"
    );
    assert!(!keys.path("mute.zip").exists());
    let out = create(&["--schema-of-this-build"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        read_manifest(&keys.path("mute.zip"))["schema"]["needs"]
            .as_array()
            .map(Vec::len),
        Some(MIGRATIONS.len())
    );
    std::fs::remove_file(keys.path("mute.zip")).unwrap();
    let out = create(&["--no-schema"]);
    assert!(out.status.success(), "{out:?}");
    assert!(read_manifest(&keys.path("mute.zip"))
        .get("schema")
        .is_none());
}

fn read_manifest(zip: &std::path::Path) -> serde_json::Value {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(zip).unwrap()).unwrap();
    let entry = archive.by_name("manifest.json").unwrap();
    serde_json::from_reader(entry).unwrap()
}

/// One old-format row of a task's audit trail, as users' audit queries print it.
const AUDIT_ROW: &str = "coalesce(from_status::text, 'new') || '>' || to_status::text
    || ' ' || coalesce(reason, '-') || ' ' || actor || ' ' || coalesce(worker, '-')
    || ' ' || lease_epoch || ' ' || to_char(at, 'HH24:MI:SS.US')";

/// Every task's audit trail, in the order users' queries read it.
async fn audit_trails(c: &Client, order: &str) -> Vec<String> {
    c.query(
        &format!(
            "select task_id::text || ' ' || {AUDIT_ROW} from artex.task_transitions
             order by task_id, {order}"
        ),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

// V10 merges the audit trail and the outbox into one history. A database full of
// old-format rows — a consumer mid-stream, events it has not read, the head of the
// outbox already pruned, assignments and task transfers only the audit had — keeps every row
// a consumer has not read at its position, and its audit trail.
#[tokio::test]
async fn upgrading_old_history_and_outbox_loses_no_unread_event_and_no_audit_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    migrated_up_to(&c, 9).await;
    // Old-format history written by V9's triggers, one transaction per step as the
    // runtime writes it: tasks that ran (one in a combined write, as workers record short
    // tasks), failed, were given back, moved by a task transfer.
    for step in [
        "insert into artex.workers (id, host, pid, version, channel, kinds, capacity)
         values ('w1', 'h', 1, 'v', 'w_1', '{echo}', 10)",
        "insert into artex.tasks (kind, payload)
         select 'echo', jsonb_build_object('i', i) from generate_series(1, 8) i",
        "update artex.tasks set status = 'assigned', assigned_to = 'w1',
             lease_until = now() + interval '1 minute'",
        "update artex.tasks set status = 'running' where (payload->>'i')::int <= 3",
        "update artex.tasks set status = 'succeeded' where (payload->>'i')::int <= 2",
        "update artex.tasks set status = 'failed', error = 'boom' where status = 'running'",
        "update artex.tasks set status = 'succeeded', started_at = now() - interval '1 ms'
             where (payload->>'i')::int = 4",
        "update artex.tasks set assigned_to = 'w2' where (payload->>'i')::int = 5",
        "begin;
         select artex.set_context('reaper', 'lease expired');
         update artex.tasks set status = 'pending', retries = retries + 1
             where status = 'assigned';
         commit",
        "insert into artex.tasks (kind) values ('late')",
    ] {
        c.batch_execute(step).await.unwrap();
    }
    let outbox: Vec<(String, String)> = common::pairs(
        &c,
        "select xid::text || '-' || id,
                    task_id::text || ' ' || coalesce(from_status::text, 'new') || '>'
                    || to_status::text
             from artex.task_events order by xid, id",
    )
    .await;
    assert!(outbox.len() > 20, "{outbox:?}");
    // The outbox's head was pruned through its 3rd event; consumer "mid" read 10 events.
    c.batch_execute(&format!(
        "delete from artex.task_events where (xid, id) <= (
             select xid, id from artex.task_events order by xid, id offset 2 limit 1);
         update artex.event_retention set pruned_xid = '{}', pruned_id = {};
         insert into artex.event_cursors (consumer, last_xid, last_event)
         values ('mid', '{}', {});",
        outbox[2].0.split('-').next().unwrap(),
        outbox[2].0.split('-').nth(1).unwrap(),
        outbox[9].0.split('-').next().unwrap(),
        outbox[9].0.split('-').nth(1).unwrap(),
    ))
    .await
    .unwrap();
    let audit_before = audit_trails(&c, "id").await;
    let rows_before = count(&c, "select count(*) from artex.task_transitions").await;

    let (code, out, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(applied(&c).await, (1..=knows()).collect::<Vec<_>>());
    assert_eq!(
        count(
            &c,
            "select count(*) from pg_tables where tablename = 'task_events'"
        )
        .await,
        0,
        "the outbox is gone"
    );

    // The consumer resumes right after its cursor: every event it had not read, at the
    // same position, in the same order, none it had.
    history_settled(&c).await;
    let read = |start| feed_pairs(&db, start);
    assert_eq!(
        read(FeedStart::Consumer("mid".into())).await,
        outbox[10..],
        "unread events lost or moved"
    );
    // A position held outside the database (an SSE client's Last-Event-ID) too.
    let fifth: EventPosition = outbox[4].0.parse().unwrap();
    assert_eq!(read(FeedStart::After(fifth)).await, outbox[5..]);
    // A reader below what was pruned before the upgrade is still told so.
    let first: EventPosition = outbox[0].0.parse().unwrap();
    assert!(matches!(
        EventFeed::open(
            db.bb.feed(),
            FeedStart::After(first),
            false,
            Duration::from_millis(50)
        )
        .await,
        Err(artex_actors::Error::Refused(_))
    ));

    // The audit trail: every row, with its data, in the same order per task.
    assert_eq!(
        count(&c, "select count(*) from artex.task_transitions").await,
        rows_before
    );
    assert_eq!(audit_trails(&c, "at, id").await, audit_before);

    // New history continues the feed after the old.
    let id = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", serde_json::json!({})), "test")
        .await
        .unwrap();
    history_settled(&c).await;
    let after = read(FeedStart::Consumer("mid".into())).await;
    assert_eq!(after.len(), outbox.len() - 10 + 1);
    assert_eq!(after.last().unwrap().1, format!("{id} new>pending"));
}

/// Every task as a JSON object of its columns, by id.
async fn tasks_as_json(c: &Client) -> Vec<serde_json::Map<String, serde_json::Value>> {
    c.query(
        "select to_jsonb(t)::text from artex.tasks t order by id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| serde_json::from_str(r.get(0)).unwrap())
    .collect()
}

/// The runnable tasks, counted through the runnable index (`tasks_runnable`).
async fn runnable(c: &Client) -> i64 {
    count(
        c,
        "select count(*) from artex.tasks where listed = 'pending'",
    )
    .await
}

/// Tasks in every status, written by plain SQL through the triggers of the schema the
/// database has: 1–3 pending (3 not due), 4 assigned, 5 running, 6 succeeded, 7 failed,
/// 8 timeout, 9 canceled, 10 paused, 11 assigned then given back, 12 canceled while held,
/// 13 paused, 14 blocked; held ones by `w1`.
async fn tasks_in_every_status(c: &Client) {
    let step = |status: &str, i: i32| {
        format!(
            "update artex.tasks set status = '{status}',
                 assigned_to = case when '{status}' = 'assigned' then 'w1' else assigned_to end,
                 lease_until = case when '{status}' = 'assigned'
                                    then now() + interval '5 minutes' else lease_until end
             where (payload->>'i')::int = {i}"
        )
    };
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority, run_at)
         select 'echo', jsonb_build_object('i', i), i % 3,
                case when i = 3 then now() + interval '1 hour' else now() end
         from generate_series(1, 12) i;
         insert into artex.tasks (kind, payload, status) values
             ('echo', '{\"i\": 13}', 'paused'), ('echo', '{\"i\": 14}', 'blocked');",
    )
    .await
    .unwrap();
    // 1–3 pending (3 not due), 4 assigned, 5 running, 6 succeeded, 7 failed, 8 timeout,
    // 9 canceled, 10 paused, 11 assigned then given back, 12 canceled while held.
    for (i, path) in [
        (4, &["assigned"][..]),
        (5, &["assigned", "running"]),
        (6, &["assigned", "running", "succeeded"]),
        (7, &["assigned", "running", "failed"]),
        (8, &["assigned", "timeout"]),
        (9, &["canceled"]),
        (10, &["paused"]),
        (11, &["assigned", "pending"]),
        (12, &["assigned", "running", "canceled"]),
    ] {
        for s in path {
            c.batch_execute(&step(s, i)).await.unwrap();
        }
    }
}

// V15 rebuilds `artex.tasks` with the generated column `listed` and replaces the indexes
// on `status`. A database holding tasks in every status keeps every row as it was, the
// column says each task's status where it should, and the runtime then claims and starts
// the runnable ones through the new indexes.
#[tokio::test]
async fn upgrading_to_hot_rows_keeps_every_task_and_the_runtime_goes_on() {
    let db = TestDb::new().await;
    let c = db.client().await;
    migrated_up_to(&c, 14).await;
    tasks_in_every_status(&c).await;
    // Every task as JSON; compared on the columns it had before (migrations add some).
    let before = tasks_as_json(&c).await;
    let statuses = count(&c, "select count(distinct status) from artex.tasks").await;
    assert_eq!(statuses, 9, "every status is in the database");

    let (code, out, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(applied(&c).await, (1..=knows()).collect::<Vec<_>>());

    let after: Vec<_> = tasks_as_json(&c)
        .await
        .into_iter()
        .zip(&before)
        .map(|(mut now, was)| {
            now.retain(|k, _| was.contains_key(k));
            now
        })
        .collect();
    assert_eq!(after.len(), before.len(), "every task kept");
    assert_eq!(after, before, "every task as it was");
    assert_eq!(runnable(&c).await, 4);
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where assigned_to is not null"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks
             where listed is distinct from case when status in ('assigned', 'running')
                                                then null else status end"
        )
        .await,
        0,
        "listed is the status of every task listed by it"
    );

    // The runtime goes on from there: the due pending tasks are claimed and started, the
    // held ones stay their holder's.
    common::fixtures::worker(&db.bb, "w2", &["echo"], 10).await;
    let report = common::fixtures::assign(&db.bb).await;
    assert_eq!(report.assigned, 3, "{report:?}");
    let started = common::start_assigned(&db.bb, "w2", 10).await;
    assert_eq!(started.len(), 3);
    assert_eq!(runnable(&c).await, 1);
    assert_eq!(
        count(
            &c,
            "select count(*) from artex.tasks where assigned_to = 'w2'"
        )
        .await,
        3
    );
}

/// The feed from `start` as (position, "task from>to") pairs, as a reader gets them.
async fn feed_pairs(db: &TestDb, start: FeedStart) -> Vec<(String, String)> {
    let mut feed = EventFeed::open(db.bb.feed(), start, false, Duration::from_millis(50))
        .await
        .unwrap();
    let batch = feed.next_batch(1000).await.unwrap();
    batch
        .events
        .iter()
        .map(|e| {
            let from = e.from.map(|s| s.to_string()).unwrap_or("new".into());
            (
                e.position.to_string(),
                format!("{} {from}>{}", e.task_id, e.to),
            )
        })
        .collect()
}

// V25 changes how the hot path writes the history: a start written with its end is
// one stored row (`task_history`), read as two transitions through the view that took
// the table's name. A database at V24 holding tasks in every status (one started and
// ended in one write) keeps every audit row and every feed position; after it, the
// worker's combined writes read back as the same three transitions as before, and the
// feed gives each once, in order, after the old events.
#[tokio::test]
async fn upgrading_to_one_row_per_run_keeps_the_audit_and_the_feed_and_the_runtime_goes_on() {
    use artex_actors::blackboard::{AttemptRecord, Outcome, Step};
    let db = TestDb::new().await;
    let c = db.client().await;
    migrated_up_to(&c, 24).await;
    tasks_in_every_status(&c).await;
    c.batch_execute(
        "update artex.tasks set status = 'succeeded', started_at = now() - interval '1 ms'
         where (payload->>'i')::int = 4",
    )
    .await
    .unwrap();
    history_settled(&c).await;
    let audit_before = audit_trails(&c, "at, id").await;
    // The feed as V24 stores it (this build reads only the V25 shape).
    let feed_before: Vec<(String, String)> = common::pairs(
        &c,
        "select xid::text || '-' || id,
                task_id::text || ' ' || coalesce(from_status::text, 'new') || '>'
                || to_status::text
         from artex.task_transitions
         where xid > '1' and to_status <> 'assigned' and from_status is distinct from to_status
         order by xid, id",
    )
    .await;
    assert!(feed_before.len() > 20, "{feed_before:?}");
    let (mid_xid, mid_id) = feed_before[9].0.split_once('-').unwrap();
    c.execute(
        "insert into artex.event_cursors (consumer, last_xid, last_event)
         values ('mid', $1::text::xid8, $2::text::int8)",
        &[&mid_xid, &mid_id],
    )
    .await
    .unwrap();

    let (code, out, err) = run_cli(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(applied(&c).await, (1..=knows()).collect::<Vec<_>>());
    assert_eq!(audit_trails(&c, "at, id").await, audit_before);
    assert_eq!(feed_pairs(&db, FeedStart::Beginning).await, feed_before);
    let resumed = feed_pairs(&db, FeedStart::Consumer("mid".into())).await;
    assert_eq!(resumed, feed_before[10..]);

    // The runtime goes on: the due pending tasks run, each started and ended in one write.
    common::fixtures::worker(&db.bb, "w2", &["echo"], 10).await;
    assert_eq!(common::fixtures::assign(&db.bb).await.assigned, 3);
    let held = c
        .query(
            "select id, lease_epoch from artex.tasks where assigned_to = 'w2' order by id",
            &[],
        )
        .await
        .unwrap();
    let batch: Vec<AttemptRecord> = held
        .iter()
        .map(|r| AttemptRecord {
            id: r.get(0),
            epoch: r.get(1),
            retries: 0,
            max_retries: 3,
            step: Step::Finish(Outcome::Succeeded(serde_json::json!({"ok": true}))),
            started_ago_ms: Some(5.0),
            measured: None,
        })
        .collect();
    assert_eq!(db.bb.worker().record("w2", &batch).await.unwrap().len(), 3);
    history_settled(&c).await;
    for r in &held {
        let id: uuid::Uuid = r.get(0);
        let trail = common::lines_of(
            &c,
            "select coalesce(from_status::text, 'new') || '>' || to_status
                    || ' ' || coalesce(reason, '-') || ' ' || (assigned_at is not null)
             from artex.task_transitions where task_id = $1 order by at, id",
            id,
        )
        .await;
        assert_eq!(
            trail[trail.len() - 2..],
            ["assigned>running started true", "running>succeeded - false"],
            "{id}: {trail:?}"
        );
        assert_eq!(
            count(
                &c,
                &format!(
                    "select count(*) from artex.task_history
                     where task_id = '{id}' and end_id is not null"
                )
            )
            .await,
            1,
            "{id}: one stored row for its start and its end"
        );
    }
    let after = feed_pairs(&db, FeedStart::Consumer("mid".into())).await;
    assert_eq!(after[..resumed.len()], resumed[..]);
    let new: Vec<_> = after[resumed.len()..].iter().map(|p| &p.1).collect();
    let mut expected = Vec::new();
    for r in &held {
        let id: uuid::Uuid = r.get(0);
        expected.push(format!("{id} assigned>running"));
        expected.push(format!("{id} running>succeeded"));
    }
    assert_eq!(new, expected.iter().collect::<Vec<_>>());
}

/// The schema a freshly migrated blackboard has, as `migrations/schema.sql` holds it:
/// `pg_dump --schema-only` of schema `artex`, without the history's time partitions
/// (named by the instant they start: made at migration and by the Maintenance actor) nor
/// what says which server and pg_dump wrote it. `ARTEX_UPDATE_SCHEMA=1` writes the file
/// instead of comparing (`scripts/schema.sh`).
#[tokio::test]
async fn schema_sql_is_the_schema_the_migrations_make() {
    let db = TestDb::new().await;
    let out = Command::new(pg_dump())
        .args([
            "--schema-only",
            "--schema=artex",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=artex.task_transitions_[0-9]*",
            "--exclude-table=artex.task_transitions_before_v10",
            &db.url,
        ])
        .output()
        .expect("running pg_dump");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = schema_text(&String::from_utf8_lossy(&out.stdout));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/schema.sql");
    if std::env::var_os("ARTEX_UPDATE_SCHEMA").is_some_and(|v| v == "1") {
        std::fs::write(path, &made).expect("writing migrations/schema.sql");
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != made {
        let (c, m): (Vec<&str>, Vec<&str>) = (committed.lines().collect(), made.lines().collect());
        let first = c
            .iter()
            .zip(&m)
            .position(|(a, b)| a != b)
            .unwrap_or(c.len().min(m.len()));
        panic!(
            "migrations/schema.sql is not the schema the migrations make: run \
             scripts/schema.sh and commit it. First difference at line {}:\n  schema.sql: {}\n  \
             migrated:   {}",
            first + 1,
            c.get(first).unwrap_or(&"(end of file)"),
            m.get(first).unwrap_or(&"(end of file)")
        );
    }
}

/// `pg_dump` of the server's version: beside the server's binaries (through a link to
/// them too), else on `PATH`.
fn pg_dump() -> std::path::PathBuf {
    let bin = artex::dev_db::find_server_binaries().expect("PostgreSQL's binaries");
    let beside = |dir: &std::path::Path| Some(dir.join("pg_dump")).filter(|p| p.is_file());
    beside(&bin)
        .or_else(|| {
            let real = std::fs::canonicalize(bin.join("initdb")).ok()?;
            beside(real.parent()?)
        })
        .unwrap_or_else(|| "pg_dump".into())
}

/// A dump as `migrations/schema.sql` keeps it: a header of its own; no `SET` lines, no
/// version lines, no `\restrict` keys (random per dump); blank lines single.
fn schema_text(dump: &str) -> String {
    let mut out = String::from(
        "-- The schema a freshly migrated blackboard has: every table, index, function,\n\
         -- trigger and view of schema `artex` after the migrations of this folder, as\n\
         -- pg_dump prints them. Generated by scripts/schema.sh, never edited: change the\n\
         -- schema with a new migration, then regenerate (a test fails until you do).\n\
         -- Left out: the history's time partitions (task_transitions_<start>, made at\n\
         -- migration and by the Maintenance actor, shaped as task_transitions_default).\n\n",
    );
    let dump = dump
        .replace("--\n-- PostgreSQL database dump complete\n--\n", "")
        .replace("--\n-- PostgreSQL database dump\n--\n", "");
    let mut blank = true;
    for line in dump.lines() {
        let skip = line.starts_with("SET ")
            || line.starts_with("SELECT pg_catalog.set_config")
            || line.starts_with("\\restrict")
            || line.starts_with("\\unrestrict")
            || line.starts_with("-- Dumped ")
            || line.starts_with("-- PostgreSQL database dump");
        if skip {
            continue;
        }
        let is_blank = line.trim().is_empty();
        if is_blank && blank {
            continue;
        }
        blank = is_blank;
        out.push_str(line.trim_end());
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

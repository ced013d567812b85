//! Cron schedules (migrations/V18): each slot fires exactly once with several planners
//! running at once and across a planner killed mid-way; the catch-up rules for slots
//! missed while no planner ran; pause, resume and remove from the command line, audited;
//! bad expressions and time zones refused naming the option. The API's side is in
//! tests/api/schedules.rs, the dashboard's in tests/dashboard.rs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use artex_actors::scheduler::Scheduler;
use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;

use common::procs::{wait_for, Proc};
use common::{count, run_cli, TestDb};

/// `artex schedule add NAME --cron CRON --kind echo …` (no worker declares the kind in
/// most tests), which must succeed.
fn add(url: &str, name: &str, cron: &str, extra: &[&str]) {
    let mut args = vec![
        "schedule",
        "add",
        name,
        "--cron",
        cron,
        "--kind",
        "echo",
        "--allow-unregistered-kind",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = run_cli(url, &args);
    assert_eq!(code, 0, "schedule add {name}: {out}{err}");
}

/// Moves a schedule back in time, as if no planner had run for a while: its first slot
/// not yet dealt with is `minutes` minutes before the current minute.
async fn missed_since(c: &Client, name: &str, minutes: i32) {
    let n = c
        .execute(
            "update artex.schedules
             set next_slot = date_trunc('minute', now()) - make_interval(mins => $2)
             where name = $1",
            &[&name, &minutes],
        )
        .await
        .expect("move the schedule back");
    assert_eq!(n, 1);
}

/// The slots that have a task, from the tasks' unique keys, with how many tasks each.
async fn slots_fired(c: &Client, name: &str) -> BTreeMap<DateTime<Utc>, i64> {
    let prefix = format!("schedule:{name}:");
    let rows = c
        .query(
            "select unique_key, count(*) from artex.tasks where unique_key like $1 || '%'
             group by unique_key",
            &[&prefix],
        )
        .await
        .expect("tasks by slot");
    rows.iter()
        .map(|r| {
            let key: String = r.get(0);
            let slot = DateTime::parse_from_rfc3339(&key[prefix.len()..])
                .expect("a slot in RFC 3339")
                .with_timezone(&Utc);
            (slot, r.get(1))
        })
        .collect()
}

/// The schedule's first slot not yet dealt with.
async fn next_slot(c: &Client, name: &str) -> Option<DateTime<Utc>> {
    c.query_one(
        "select next_slot from artex.schedules where name = $1",
        &[&name],
    )
    .await
    .expect("next slot")
    .get(0)
}

/// Every minute from `first` to `last`, each with exactly one task, and nothing else.
fn assert_each_minute_once(fired: &BTreeMap<DateTime<Utc>, i64>, first: DateTime<Utc>) {
    let twice: Vec<_> = fired.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "slots with more than one task: {twice:?}");
    let last = *fired.keys().last().expect("slots fired");
    let expected: Vec<DateTime<Utc>> = (0..)
        .map(|i| first + chrono::TimeDelta::minutes(i))
        .take_while(|s| *s <= last)
        .collect();
    let got: Vec<DateTime<Utc>> = fired.keys().copied().collect();
    assert_eq!(got, expected, "each minute from {first} to {last}, once");
}

/// Lines of a planner's log that say a slot was fired, or found its task already there.
fn log_count(p: &Proc, what: &str) -> usize {
    p.log_text().lines().filter(|l| l.contains(what)).count()
}

/// Schedules whose every minute of the last thirty was missed, `--catch-up all`, and
/// three planners started at once: each minute of each gets one task, none twice, no
/// planner even tries a slot another fired (the row lock), and the tasks run.
#[tokio::test]
async fn each_missed_slot_fires_once_with_three_planners() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let names: Vec<String> = (0..6).map(|i| format!("every-minute-{i}")).collect();
    let mut firsts = Vec::new();
    for name in &names {
        add(&db.url, name, "* * * * *", &["--catch-up", "all"]);
        missed_since(&c, name, 30).await;
        firsts.push(next_slot(&c, name).await.expect("a first slot"));
    }
    let now_minute: DateTime<Utc> = c
        .query_one("select date_trunc('minute', now())", &[])
        .await
        .unwrap()
        .get(0);
    let planners: Vec<Proc> = (0..3)
        .map(|i| Proc::planner(&format!("sched-planner-{i}"), &db.url, &[]))
        .collect();
    let _worker = Proc::worker("sched-worker", &db.url, &[]);
    for (name, first) in names.iter().zip(&firsts) {
        let fired = wait_for("the 31 slots to fire", Duration::from_secs(60), || async {
            let fired = slots_fired(&c, name).await;
            (fired.keys().filter(|s| **s <= now_minute).count() >= 31).then_some(fired)
        })
        .await;
        assert_each_minute_once(&fired, *first);
    }
    // Settled: the schedules moved past now (a new minute may fire meanwhile).
    wait_for(
        "the schedules to be past now",
        Duration::from_secs(60),
        || async {
            let left = count(
                &c,
                "select count(*) from artex.schedules where next_slot <= now()",
            )
            .await;
            (left == 0).then_some(())
        },
    )
    .await;
    for (name, first) in names.iter().zip(&firsts) {
        // The schedule counted what it fired (one snapshot: a slot's task and the
        // count commit together).
        let row = c
            .query_one(
                "select s.fired, (select count(*) from artex.tasks t
                                  where t.unique_key like 'schedule:' || s.name || ':%')
                 from artex.schedules s where s.name = $1",
                &[name],
            )
            .await
            .unwrap();
        let (counted, tasks): (i64, i64) = (row.get(0), row.get(1));
        assert!(
            counted >= 31 && counted == tasks,
            "{name}: {counted} {tasks}"
        );
        assert_each_minute_once(&slots_fired(&c, name).await, *first);
    }
    // One planner fired each slot: no slot is logged as fired twice, across the three.
    // The logs come through pipes and may trail the database (seen on a loaded host:
    // 155 of 186 lines when read at once): wait for every slot's line.
    let fired_lines = || -> Vec<String> {
        planners
            .iter()
            .flat_map(|p| {
                p.log_text()
                    .lines()
                    .filter(|l| l.contains("schedule: slot fired"))
                    .filter_map(|l| {
                        let from = l.find("schedule=")?;
                        let to = l.find(" task_id=")?;
                        Some(l[from..to].to_string())
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let logged = wait_for(
        "a log line for each of the 186 slots fired",
        Duration::from_secs(10),
        || async {
            let lines = fired_lines();
            (lines.len() >= 6 * 31).then_some(lines)
        },
    )
    .await;
    let distinct: std::collections::BTreeSet<&String> = logged.iter().collect();
    assert_eq!(
        distinct.len(),
        logged.len(),
        "a slot fired twice: {logged:?}"
    );
    // None found a slot's task there already (no second attempt at a slot, which the
    // unique key would have caught).
    let again: usize = planners
        .iter()
        .map(|p| log_count(p, "schedule: slot already had its task"))
        .sum();
    assert_eq!(again, 0, "a slot was attempted twice");
    // The worker ran them.
    wait_for("the tasks to run", Duration::from_secs(60), || async {
        let left = count(
            &c,
            "select count(*) from artex.tasks where unique_key like 'schedule:every-minute-%'
             and status <> 'succeeded'",
        )
        .await;
        (left == 0).then_some(())
    })
    .await;
}

/// A planner killed (SIGKILL) while it fires a long backlog, started again beside
/// another: the backlog fires whole, no slot twice.
#[tokio::test]
async fn a_planner_killed_mid_way_fires_no_slot_twice() {
    let db = TestDb::new().await;
    let c = db.client().await;
    add(&db.url, "backlog", "* * * * *", &["--catch-up", "all"]);
    // 2,500 minutes: three passes of at most 1,000 slots, a transaction each.
    missed_since(&c, "backlog", 2500).await;
    let first = next_slot(&c, "backlog").await.expect("a first slot");
    let mut a = Proc::planner("sched-killed", &db.url, &[]);
    wait_for(
        "the first slots to fire",
        Duration::from_secs(60),
        || async { (!slots_fired(&c, "backlog").await.is_empty()).then_some(()) },
    )
    .await;
    a.signal(Signal::SIGKILL);
    a.wait_exit(Duration::from_secs(10)).expect("killed");
    let before = slots_fired(&c, "backlog").await.len();
    assert!(
        before < 2501,
        "the kill came after the whole backlog: {before}"
    );
    let _a2 = Proc::planner("sched-restarted", &db.url, &[]);
    let _b = Proc::planner("sched-other", &db.url, &[]);
    let fired = wait_for(
        "the whole backlog to fire",
        Duration::from_secs(90),
        || async {
            let past = next_slot(&c, "backlog")
                .await
                .is_some_and(|s| s > Utc::now());
            let fired = slots_fired(&c, "backlog").await;
            (past && fired.len() >= 2501).then_some(fired)
        },
    )
    .await;
    assert_each_minute_once(&fired, first);
}

/// The catch-up rules, on one pass at a chosen time: three hours of hourly slots missed
/// (10:00 to 13:00, now 13:05, or 13:00:10 when on time).
#[tokio::test]
async fn catch_up_rules_decide_what_missed_slots_fire() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for rule in ["none", "last", "all"] {
        add(&db.url, rule, "0 * * * *", &["--catch-up", rule]);
    }
    add(&db.url, "on-time", "0 * * * *", &["--catch-up", "none"]);
    c.batch_execute("update artex.schedules set next_slot = '2026-03-01T10:00:00Z'")
        .await
        .unwrap();
    let at = |s: &str| -> DateTime<Utc> { s.parse().unwrap() };
    let planner = db.bb.planner();
    // `on-time` is looked at within its slot's tolerance, the others five minutes late.
    c.batch_execute("update artex.schedules set paused = true where name = 'on-time'")
        .await
        .unwrap();
    let report = Scheduler::run_once(&planner, "test", Some(at("2026-03-01T13:05:00Z")))
        .await
        .expect("a pass");
    assert_eq!(report.turns.len(), 3, "{report:?}");
    let hours = |hs: &[u32]| -> Vec<DateTime<Utc>> {
        hs.iter()
            .map(|h| at(&format!("2026-03-01T{h:02}:00:00Z")))
            .collect()
    };
    let keys = |m: BTreeMap<DateTime<Utc>, i64>| m.into_keys().collect::<Vec<_>>();
    assert_eq!(keys(slots_fired(&c, "none").await), hours(&[]));
    assert_eq!(keys(slots_fired(&c, "last").await), hours(&[13]));
    assert_eq!(keys(slots_fired(&c, "all").await), hours(&[10, 11, 12, 13]));
    for rule in ["none", "last", "all"] {
        assert_eq!(
            next_slot(&c, rule).await,
            Some(at("2026-03-01T14:00:00Z")),
            "{rule}"
        );
    }
    // A second pass at the same time fires nothing more.
    let again = Scheduler::run_once(&planner, "test", Some(at("2026-03-01T13:05:00Z")))
        .await
        .expect("a pass");
    assert_eq!(again.fired(), 0, "{again:?}");
    // `none` fires a slot due now: ten seconds after it.
    c.batch_execute(
        "update artex.schedules set paused = false, next_slot = '2026-03-01T10:00:00Z'
         where name = 'on-time'",
    )
    .await
    .unwrap();
    Scheduler::run_once(&planner, "test", Some(at("2026-03-01T13:00:10Z")))
        .await
        .expect("a pass");
    assert_eq!(keys(slots_fired(&c, "on-time").await), hours(&[13]));
    // Each task carries the schedule's task, and its history names the slot.
    let row = c
        .query_one(
            "select t.kind, x.reason from artex.tasks t
             join artex.task_transitions x on x.task_id = t.id
             where t.unique_key = 'schedule:last:2026-03-01T13:00:00Z'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "echo");
    let reason: String = row.get(1);
    assert!(
        reason.contains("schedule last: slot 2026-03-01T13:00:00"),
        "{reason}"
    );
}

/// Paused: no slot fires; resumed: from the first slot after now (the pause's slots are
/// skipped); removed: gone, its tasks stay. Every change is recorded with its actor.
#[tokio::test]
async fn pause_resume_and_remove_from_the_command_line() {
    let db = TestDb::new().await;
    let c = db.client().await;
    add(
        &db.url,
        "report",
        "*/5 * * * *",
        &["--timezone", "Europe/Berlin"],
    );
    let (code, out, err) = run_cli(
        &db.url,
        &["schedule", "pause", "report", "--reason", "maintenance"],
    );
    assert_eq!(code, 0, "{out}{err}");
    missed_since(&c, "report", 60).await;
    let planner = db.bb.planner();
    let report = Scheduler::run_once(&planner, "test", None).await.unwrap();
    assert!(
        report.turns.is_empty(),
        "a paused schedule fired: {report:?}"
    );
    let (_, out, _) = run_cli(&db.url, &["schedule", "list", "--json"]);
    let list: Value = serde_json::from_str(&out).expect("JSON");
    let s = &list["schedules"][0];
    assert_eq!(s["name"], "report");
    assert_eq!(s["paused"], true);
    assert_eq!(s["timezone"], "Europe/Berlin");
    assert_eq!(s["catch_up"], "last");
    // The table for people names what a list shows.
    let (_, table, _) = run_cli(&db.url, &["schedule", "list"]);
    let head = table.lines().next().unwrap_or_default();
    for col in [
        "NAME",
        "CRON",
        "TIMEZONE",
        "KIND",
        "PAUSED",
        "LAST SLOT",
        "NEXT SLOT",
    ] {
        assert!(head.contains(col), "{table}");
    }
    assert!(
        table.contains("*/5 * * * *") && table.contains("Europe/Berlin"),
        "{table}"
    );

    let (code, out, err) = run_cli(&db.url, &["schedule", "resume", "report", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let resumed: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(resumed["paused"], false);
    let next: DateTime<Utc> = resumed["next_slot"].as_str().unwrap().parse().unwrap();
    assert!(next > Utc::now() - chrono::TimeDelta::seconds(5), "{next}");
    let report = Scheduler::run_once(&planner, "test", None).await.unwrap();
    let fired: Vec<_> = report.turns.iter().flat_map(|t| &t.fired).collect();
    assert!(
        fired.iter().all(|f| f.slot >= next),
        "the pause's slots fired on resume: {report:?}"
    );

    let (code, _, err) = run_cli(&db.url, &["schedule", "remove", "report"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_cli(&db.url, &["schedule", "show", "report"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no schedule named \"report\""), "{err}");
    let (code, _, err) = run_cli(&db.url, &["schedule", "pause", "report"]);
    assert_eq!(code, 2, "{err}");

    let changes: Vec<(String, String, Option<String>)> = c
        .query(
            "select change, actor, reason from artex.schedule_changes
             where schedule = 'report' order by id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let what: Vec<&str> = changes.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(what, ["added", "paused", "resumed", "removed"]);
    assert!(
        changes.iter().all(|c| c.1.starts_with("cli:")),
        "{changes:?}"
    );
    assert_eq!(changes[1].2.as_deref(), Some("maintenance"));
}

/// A bad expression, time zone, catch-up rule or name is refused before anything is
/// written, with exit 2 and a message naming the option and what was expected; a name
/// taken is refused too.
#[tokio::test]
async fn bad_schedules_are_refused_naming_the_option() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let cases: &[(&[&str], &str)] = &[
        (&["--cron", "61 * * * *"], "--cron"),
        (&["--cron", "* * * *"], "--cron"),
        (&["--cron", "0 0 30 2 *"], "--cron"),
        (
            &["--cron", "* * * * *", "--timezone", "Mars/Olympus"],
            "--timezone",
        ),
        (
            &["--cron", "* * * * *", "--timezone", "europe/berlin"],
            "--timezone",
        ),
        (&["--cron", "* * * * *", "--catch-up", "some"], "--catch-up"),
    ];
    for (extra, option) in cases {
        let mut args = vec![
            "schedule",
            "add",
            "bad",
            "--kind",
            "echo",
            "--allow-unregistered-kind",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run_cli(&db.url, &args);
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(
            err.contains(option),
            "{extra:?} should name {option}: {err}"
        );
        assert!(
            err.contains("expected"),
            "{extra:?} should say what was expected: {err}"
        );
    }
    let (code, _, err) = run_cli(
        &db.url,
        &[
            "schedule",
            "add",
            "no name",
            "--cron",
            "* * * * *",
            "--kind",
            "echo",
        ],
    );
    assert_eq!(code, 2, "{err}");
    // A kind no worker declared, as `submit` refuses it.
    let (code, _, err) = run_cli(
        &db.url,
        &[
            "schedule",
            "add",
            "nightly",
            "--cron",
            "0 2 * * *",
            "--kind",
            "echo",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--kind") && err.contains("--allow-unregistered-kind"),
        "{err}"
    );
    assert_eq!(count(&c, "select count(*) from artex.schedules").await, 0);
    add(&db.url, "nightly", "0 2 * * *", &[]);
    let (code, _, err) = run_cli(
        &db.url,
        &[
            "schedule",
            "add",
            "nightly",
            "--cron",
            "0 3 * * *",
            "--kind",
            "echo",
            "--allow-unregistered-kind",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exists already"), "{err}");
    // The table checks what SQL writers store too.
    for bad in [
        "insert into artex.schedules (name, cron, timezone, kind, created_by, updated_by)
         values ('x', '* * * * *', 'Mars/Olympus', 'echo', 'sql', 'sql')",
        "insert into artex.schedules (name, cron, kind, created_by, updated_by)
         values ('x', '* * *', 'echo', 'sql', 'sql')",
    ] {
        let e = c.batch_execute(bad).await.expect_err(bad);
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
            "{e}"
        );
    }
}

/// A schedule inserted in SQL, its next slot left to the default (the insert's time):
/// the next pass moves it to its first slot at or after the insert, fires nothing before
/// it, and fires that slot when it comes; the insert is audited with the database user.
#[tokio::test]
async fn a_schedule_written_in_sql_fires_from_its_first_slot_after_the_insert() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.schedules (name, cron, kind, catch_up, created_by, updated_by)
         values ('from-sql', '*/10 * * * *', 'echo', 'all', 'sql', 'sql')",
    )
    .await
    .unwrap();
    let inserted: DateTime<Utc> = next_slot(&c, "from-sql").await.expect("the default");
    let planner = db.bb.planner();
    let report = Scheduler::run_once(&planner, "test", Some(inserted))
        .await
        .unwrap();
    assert_eq!(report.fired(), 0, "{report:?}");
    let first = next_slot(&c, "from-sql").await.expect("a first slot");
    assert!(first >= inserted && first - inserted <= chrono::TimeDelta::minutes(10));
    assert_eq!(chrono::Timelike::minute(&first) % 10, 0, "{first}");
    let report = Scheduler::run_once(&planner, "test", Some(first))
        .await
        .unwrap();
    assert_eq!(report.fired(), 1, "{report:?}");
    assert_eq!(
        slots_fired(&c, "from-sql")
            .await
            .into_keys()
            .collect::<Vec<_>>(),
        vec![first]
    );
    let actor: String = c
        .query_one(
            "select actor from artex.schedule_changes where schedule = 'from-sql'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!actor.is_empty() && !actor.starts_with("cli:"), "{actor}");
}

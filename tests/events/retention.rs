//! Retention: history kept in time partitions dropped whole (held back for a live
//! consumer, then 410), finished tasks pruned past it, and the partitions made ahead.

use std::time::Duration;

use artex_actors::blackboard::{EventPosition, NewTask, TaskStatus};
use artex_actors::maintenance::Maintenance;
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_postgres::Client;

use crate::common::procs::{history_settled, wait_for, Proc};
use crate::common::{count, pairs, run_cli as artex, TestDb};
use crate::{all_positions, FEED_ROWS};

/// The partition that holds the history written so far, and where its slice ends.
async fn current_partition(c: &Client) -> (String, DateTime<Utc>) {
    let r = c
        .query_one(
            "select p.name, p.hi from artex.history_partitions p
             where p.name = (select tableoid::regclass::text from artex.task_history
                             order by at desc limit 1)
                or 'artex.' || p.name = (select tableoid::regclass::text
                                         from artex.task_history order by at desc limit 1)",
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
            .operator()
            .submit(&NewTask::new("echo", json!({ "i": i })), "test")
            .await
            .unwrap();
    }
    let all = all_positions(&c).await;
    assert_eq!(all.len(), 100);
    let at = |i: usize| all[i].parse::<EventPosition>().unwrap();
    // "live" has read 40 events; "stale" read 10 and then went silent.
    db.bb.feed().ack_events("live", at(39)).await.unwrap();
    db.bb.feed().ack_events("stale", at(9)).await.unwrap();
    let (code, out, err) = artex(&db.url, &["events", "retention", "--set", "1d"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("keep history 86400s"), "{out}");
    history_settled(&c).await;
    let (part, hi) = current_partition(&c).await;

    // A minute after the partition's slice passed the retention: "live" (heard from
    // then) still needs it, so it stays, and nothing is lost to anyone.
    let t1 = hi + chrono::Duration::days(1) + chrono::Duration::minutes(1);
    let alive = "update artex.event_cursors set updated_at = $1 where consumer = 'live'";
    c.execute(alive, &[&t1]).await.unwrap();
    let r = Maintenance::run_once(&db.bb.maintenance(), Some(t1))
        .await
        .unwrap();
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
    let r = Maintenance::run_once(&db.bb.maintenance(), Some(t2))
        .await
        .unwrap();
    assert!(r.partitions_dropped.contains(&part), "{r:?}");
    assert!(all_positions(&c).await.is_empty());
    let r = db.bb.feed().event_retention().await.unwrap();
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

/// Every planner runs the maintenance: a prune of finished tasks while another is under
/// way leaves the retention to that one and deletes nothing, instead of waiting for the
/// rows it holds (two of them deadlocked after a failover in the fleet soak: V68).
#[tokio::test]
async fn a_prune_while_another_runs_leaves_the_retention_to_it() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.tasks (kind) select 'echo' from generate_series(1, 100);
         update artex.tasks set status = 'canceled';",
    )
    .await
    .unwrap();
    let later = Utc::now() + chrono::Duration::days(15);
    let prune = "select artex.prune_finished_tasks($1, 1000)";
    let first = db.client().await;
    first.batch_execute("begin").await.unwrap();
    let n: i64 = first.query_one(prune, &[&later]).await.unwrap().get(0);
    assert_eq!(n, 100);
    // The first's transaction still holds the rows it deleted.
    let second: i64 = tokio::time::timeout(Duration::from_secs(10), c.query_one(prune, &[&later]))
        .await
        .expect("the second prune waited for the first")
        .unwrap()
        .get(0);
    assert_eq!(second, 0, "the second deletes nothing");
    first.batch_execute("commit").await.unwrap();
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);
    // Alone, it prunes.
    c.batch_execute(
        "insert into artex.tasks (kind) values ('echo');
         update artex.tasks set status = 'canceled';",
    )
    .await
    .unwrap();
    let alone: i64 = c.query_one(prune, &[&later]).await.unwrap().get(0);
    assert_eq!(alone, 1);
}

#[tokio::test]
async fn finished_tasks_past_the_retention_go_unless_an_unfinished_flow_needs_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // A lone task and a flow that both finished; a flow with one task finished and one
    // still blocked. (Plain SQL: fixed ids, and `b` held blocked with nothing upstream,
    // a state no API makes.)
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
    let report = Maintenance::run_once(
        &db.bb.maintenance(),
        Some(Utc::now() + chrono::Duration::days(15)),
    )
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
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    let in_default = "select count(*) from artex.task_transitions_default";
    assert_eq!(count(&c, in_default).await, 1);
    let r = Maintenance::run_once(&db.bb.maintenance(), None)
        .await
        .unwrap();
    assert!(r.partitions_made.len() >= 2, "{r:?}");
    assert_eq!(count(&c, in_default).await, 0);
    let trail = db.bb.operator().transitions(id).await.unwrap();
    assert_eq!(trail.len(), 1);
    assert_eq!(trail[0].to_status, TaskStatus::Pending);
    // Nothing left to make until time moves on.
    let again = Maintenance::run_once(&db.bb.maintenance(), None)
        .await
        .unwrap();
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
        .maintenance()
        .set_event_retention(Duration::from_secs(3600))
        .await
        .unwrap();
    let (_, hi) = {
        db.bb
            .operator()
            .submit(&NewTask::new("echo", json!({})), "test")
            .await
            .unwrap();
        current_partition(&c).await
    };
    // A minute before the partition holding now ends: the next ones are due.
    let r = Maintenance::run_once(
        &db.bb.maintenance(),
        Some(hi - chrono::Duration::minutes(1)),
    )
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

// Found by the hour-long soak: after `--history-retention 10m` on a fresh blackboard the
// partition holding now was still a day wide (made at the default retention), and nothing
// was pruned for the hour. Its rows past the new retention now go row by row (V22); a
// live consumer holds back what it has not read, until it falls silent.
#[tokio::test]
async fn a_shortened_retention_prunes_the_wide_partition_holding_now_row_by_row() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keep = chrono::Duration::minutes(10);
    db.bb
        .maintenance()
        .set_event_retention(keep.to_std().unwrap())
        .await
        .unwrap();
    for i in 0..60 {
        db.bb
            .operator()
            .submit(&NewTask::new("echo", json!({ "i": i })), "test")
            .await
            .unwrap();
    }
    let rows: Vec<(String, DateTime<Utc>)> = pairs(
        &c,
        &format!(
            "select xid::text || '-' || id, at from artex.task_transitions
             where {FEED_ROWS} order by xid, id"
        ),
    )
    .await;
    assert_eq!(rows.len(), 60);
    let positions =
        |from: usize| -> Vec<String> { rows[from..].iter().map(|r| r.0.clone()).collect() };
    let (part, hi) = current_partition(&c).await;
    let lo: DateTime<Utc> = c
        .query_one(
            "select lo from artex.history_partitions where name = $1",
            &[&part],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        hi - lo > chrono::Duration::seconds(75),
        "made wide: {lo} .. {hi}"
    );

    // The retention has passed for the first 40 rows; "live" (heard from now) has read 20.
    let t1 = rows[39].1 + keep + chrono::Duration::microseconds(1);
    db.bb
        .feed()
        .ack_events("live", rows[19].0.parse::<EventPosition>().unwrap())
        .await
        .unwrap();
    let alive = "update artex.event_cursors set updated_at = $1 where consumer = 'live'";
    c.execute(alive, &[&t1]).await.unwrap();
    let r = Maintenance::run_once(&db.bb.maintenance(), Some(t1))
        .await
        .unwrap();
    assert_eq!(r.history_rows_pruned, 20, "{r:?}");
    assert!(!r.partitions_dropped.contains(&part), "{r:?}");
    assert_eq!(all_positions(&c).await, positions(20));
    let pruned = db.bb.feed().event_retention().await.unwrap().pruned_through;
    assert_eq!(
        pruned.to_string(),
        rows[19].0,
        "readers below it are told they missed events"
    );

    // "live" falls silent, and every row has passed the retention: they go row by row.
    // The moment is the last row's expiry, not a fixed step past `t1`: the partition
    // holding now may end minutes from now (its slice ends on the width's multiples), and
    // a later moment would find the whole partition past the retention.
    let t2 = t1.max(rows[59].1 + keep) + chrono::Duration::microseconds(1);
    assert!(
        t2 < hi + keep,
        "the partition holding the rows has not yet passed"
    );
    let silent = t2 - keep - chrono::Duration::minutes(1);
    c.execute(alive, &[&silent]).await.unwrap();
    let r = Maintenance::run_once(&db.bb.maintenance(), Some(t2))
        .await
        .unwrap();
    assert_eq!(r.history_rows_pruned, 40, "{r:?}");
    assert!(all_positions(&c).await.is_empty());
    let pruned = db.bb.feed().event_retention().await.unwrap().pruned_through;
    assert_eq!(pruned.to_string(), rows[59].0);
    // The partition itself still goes whole once its slice has passed the retention.
    let r = Maintenance::run_once(&db.bb.maintenance(), Some(hi + keep))
        .await
        .unwrap();
    assert!(r.partitions_dropped.contains(&part), "{r:?}");
    assert_eq!(r.history_rows_pruned, 0, "{r:?}");
}

// Found by the fleet-topology soak: PostgreSQL forgets its statistics after a crash and on
// a standby's promotion, so autovacuum counted `artex.tasks`'s dead rows from zero after
// each failover and, failing over every minute, seldom vacuumed it (its tables grew 1.5×
// in the hour). The maintenance analyzes a table whose statistics know of no vacuum and
// no analyze, which estimates its dead rows again, and only then.
#[tokio::test]
async fn tables_whose_statistics_the_server_forgot_are_analyzed_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "insert into artex.tasks (kind) select 'echo' from generate_series(1, 500);
         update artex.tasks set status = 'canceled' where status = 'pending';",
    )
    .await
    .unwrap();
    // What a crash or a promotion leaves: no counts, no time of a vacuum or an analyze.
    c.batch_execute("select pg_stat_reset()").await.unwrap();
    let stats = "select n_dead_tup, last_analyze is not null or last_autoanalyze is not null
                 from pg_stat_all_tables where relid = 'artex.tasks'::regclass";
    let (dead, analyzed): (i64, bool) = {
        let row = c.query_one(stats, &[]).await.unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((dead, analyzed), (0, false), "statistics reset");

    let r = Maintenance::run_once(&db.bb.maintenance(), None)
        .await
        .unwrap();
    assert!(r.tables_analyzed.iter().any(|t| t == "tasks"), "{r:?}");
    assert!(
        r.tables_analyzed
            .iter()
            .all(|t| !t.starts_with("task_transitions")),
        "the history's partitions are left alone: {r:?}"
    );
    let row = c.query_one(stats, &[]).await.unwrap();
    let (dead, analyzed): (i64, bool) = (row.get(0), row.get(1));
    assert!(analyzed, "tasks analyzed");
    assert!(dead >= 400, "the dead rows estimated again: {dead}");

    // Once: the next run finds every table's statistics known.
    let r = Maintenance::run_once(&db.bb.maintenance(), None)
        .await
        .unwrap();
    assert!(r.tables_analyzed.is_empty(), "{r:?}");
}

/// The retention walks the finished tasks by status and id (V69: no index of finish
/// times for the tasks artex makes): a task with a UUIDv7 goes once the cutoff passes
/// its end, one that ended after the cutoff stays however old its id, one whose id a
/// host with a clock ahead made goes once the cutoff passes that id's time, and one
/// whose id is not a UUIDv7 (named by plain SQL) goes by its end, through the partial
/// index that holds only such tasks. The bound the walk stops at is the rule
/// `artex.uuid_v7` makes its ids by.
#[tokio::test]
async fn finished_tasks_are_pruned_by_their_ids_time_order_whatever_their_ids() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The bound: every id made at or after a time is at least its floor, and below the
    // floor of the next millisecond after it.
    for _ in 0..20 {
        let before: DateTime<Utc> = c
            .query_one("select clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
        let id: uuid::Uuid = c
            .query_one("select artex.uuid_v7()", &[])
            .await
            .unwrap()
            .get(0);
        let after: DateTime<Utc> = c
            .query_one("select clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
        let r = c
            .query_one(
                "select artex.uuid_v7_floor($1::timestamptz) <= $2, $2 < artex.uuid_v7_floor($3::timestamptz + interval '1 millisecond')",
                &[&before, &id, &after],
            )
            .await
            .unwrap();
        assert!(
            r.get::<_, bool>(0) && r.get::<_, bool>(1),
            "{before} {id} {after}"
        );
    }
    // Five ended tasks: `made` by artex, `late` ended a week from now, `ahead` with a
    // UUIDv7 of three days from now, `random` named by a random (version 4) id above
    // every UUIDv7, `low` by one below them all.
    c.batch_execute(
        "insert into artex.tasks (kind, payload) values ('echo', '\"made\"'), ('echo', '\"late\"');
         insert into artex.tasks (id, kind, payload) values
             (artex.uuid_v7_floor(now() + interval '3 days'), 'echo', '\"ahead\"'),
             ('f1e2d3c4-b5a6-4978-8a6b-5c4d3e2f1a0b', 'echo', '\"random\"'),
             ('00a1b2c3-d4e5-4f60-8172-8394a5b6c7d8', 'echo', '\"low\"');
         update artex.tasks set status = 'canceled';
         update artex.tasks set finished_at = now() + interval '7 days' where payload = '\"late\"';
         insert into artex.tasks (kind, payload) values ('echo', '\"open\"');",
    )
    .await
    .unwrap();
    let left = || async {
        let mut left: Vec<String> = c
            .query("select payload #>> '{}' from artex.tasks", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        left.sort();
        left
    };
    let prune = "select artex.prune_finished_tasks($1, 1000)";
    // Only the tasks whose ids are not UUIDv7 are in the partial index.
    let unordered: i64 = c
        .query_one(
            "select count(*) from artex.tasks
             where finished_at is not null and get_byte(uuid_send(id), 6) >> 4 <> 7",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unordered, 2);
    // Fifteen days on (retention 14 days: the cutoff a day from now), all but the late
    // one, the one ahead and the unfinished one go.
    let later = Utc::now() + chrono::Duration::days(15);
    let n: i64 = c.query_one(prune, &[&later]).await.unwrap().get(0);
    assert_eq!(n, 3);
    assert_eq!(left().await, ["ahead", "late", "open"]);
    // Once the cutoff passes the late one's end and the other's id, they go too.
    let n: i64 = c
        .query_one(prune, &[&(later + chrono::Duration::days(7))])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    assert_eq!(left().await, ["open"]);
}

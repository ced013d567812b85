//! A task's and a worker's own facts (V59): checked where they are written, under the
//! names of the constraints that checked them before, word for word the same rules, and
//! not at the writes of the hot path, which set none of them.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::common::{fixtures, TestDb};
use crate::insert_task;

/// What a write of `sql` was refused with: its constraint's name (or its message when it
/// names none); `None` when it was written. The write is undone either way.
async fn refusal(c: &Client, sql: &str) -> Option<String> {
    c.batch_execute("begin").await.unwrap();
    let outcome = c.batch_execute(sql).await;
    c.batch_execute("rollback").await.unwrap();
    match outcome {
        Ok(()) => None,
        Err(e) => {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("{sql}: not a database error: {e}"));
            assert_eq!(
                db.code(),
                &SqlState::CHECK_VIOLATION,
                "{sql}: refused with {} ({})",
                db.message(),
                db.code().code()
            );
            Some(
                db.constraint()
                    .map(str::to_string)
                    .unwrap_or_else(|| db.message().to_string()),
            )
        }
    }
}

/// A task's facts, each broken by one value: refused at the insert and at an update of
/// a stored task, with the constraint's name and a message saying what is wrong.
#[tokio::test]
async fn a_task_whose_facts_break_a_rule_is_refused_under_the_rules_name() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let stored = insert_task(&c).await;
    // (the rule, the column, a value that breaks it)
    let broken = [
        ("tasks_kind_check", "kind", "repeat('k', 201)"),
        ("flow_task_named", "flow_task", "'orphan'"),
        ("tasks_host_check", "host", "''"),
        ("tasks_limit_key_check", "limit_key", "repeat('é', 101)"),
        ("tasks_shard_check", "shard", "1024"),
        ("tasks_shard_key_check", "shard_key", "''"),
        ("tasks_tags_valid", "tags", "array['ok', '']"),
        ("tasks_timeout_ms_check", "timeout_ms", "0"),
        ("tasks_unique_key_check", "unique_key", "repeat('u', 201)"),
        ("tasks_progress_check", "progress", "1.5"),
        (
            "tasks_progress_message_check",
            "progress_message",
            "repeat('m', 201)",
        ),
    ];
    for (rule, column, value) in broken {
        // The insert's trigger sets the shard from the shard key: an insert cannot
        // break that rule, an update can.
        if column != "shard" {
            let insert = if column == "kind" {
                format!("insert into artex.tasks (kind) values ({value})")
            } else {
                format!("insert into artex.tasks (kind, {column}) values ('echo', {value})")
            };
            assert_eq!(
                refusal(&c, &insert).await.as_deref(),
                Some(rule),
                "{insert}"
            );
        }
        let update = format!("update artex.tasks set {column} = {value} where id = '{stored}'");
        let refused = refusal(&c, &update).await;
        if column == "kind" {
            // A kind that changes is first checked as a kind name, as before V59.
            let refused = refused.unwrap_or_default();
            assert!(
                refused.contains("is not a kind name"),
                "{update}: {refused}"
            );
        } else {
            assert_eq!(refused.as_deref(), Some(rule), "{update}");
        }
    }
    let e = c
        .batch_execute(&format!(
            "update artex.tasks set host = '' where id = '{stored}'"
        ))
        .await
        .unwrap_err();
    let db = e.as_db_error().unwrap();
    assert_eq!(
        db.message(),
        format!("artex: task {stored} refused: host is empty (tasks_host_check)")
    );
    assert_eq!((db.schema(), db.table()), (Some("artex"), Some("tasks")));
    // Good values of the same columns are written.
    let good = "update artex.tasks set host = 'h1', limit_key = repeat('é', 100),
        shard_key = 'k', tags = array['a', 'b'], timeout_ms = 1, unique_key = 'u',
        progress = 1, progress_message = repeat('m', 200), shard = 1023 where id = $1";
    assert_eq!(c.execute(good, &[&stored]).await.unwrap(), 1);
}

/// A worker's facts likewise, at its registration and at an update.
#[tokio::test]
async fn a_worker_whose_facts_break_a_rule_is_refused_under_the_rules_name() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let c = db.client().await;
    let broken = [
        ("workers_id_check", "id", "''"),
        ("workers_host_check", "host", "''"),
        ("workers_pid_check", "pid", "0"),
        ("workers_version_check", "version", "''"),
        ("workers_channel_check", "channel", "repeat('c', 64)"),
        ("workers_http_addr_check", "http_addr", "''"),
        ("workers_lease_ms_check", "lease_ms", "0"),
        (
            "workers_binary_sha256_check",
            "binary_sha256",
            "repeat('A', 64)",
        ),
        ("workers_session_check", "session", "''"),
        ("workers_slots_check", "slots", "0"),
        ("workers_wake_addr_check", "wake_addr", "repeat('a', 300)"),
    ];
    let row = [
        ("id", "'w2'"),
        ("host", "'h'"),
        ("pid", "1"),
        ("version", "'v'"),
        ("channel", "'c'"),
        ("kinds", "array['echo']"),
        ("capacity", "1"),
    ];
    for (rule, column, value) in broken {
        let mut cols: Vec<(&str, &str)> =
            row.iter().filter(|(c, _)| *c != column).copied().collect();
        cols.push((column, value));
        let insert = format!(
            "insert into artex.workers ({}) values ({})",
            cols.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", "),
            cols.iter().map(|(_, v)| *v).collect::<Vec<_>>().join(", ")
        );
        assert_eq!(
            refusal(&c, &insert).await.as_deref(),
            Some(rule),
            "{insert}"
        );
        let update = format!("update artex.workers set {column} = {value} where id = 'w1'");
        assert_eq!(
            refusal(&c, &update).await.as_deref(),
            Some(rule),
            "{update}"
        );
    }
    let good = "update artex.workers set binary_sha256 = repeat('a', 64), session = 's',
        slots = 1, wake_addr = repeat('a', 299), channel = repeat('c', 63) where id = 'w1'";
    assert_eq!(c.execute(good, &[]).await.unwrap(), 1);
}

/// The rules V59 checks in triggers are the constraints they replace, word for word:
/// one value at a time, each on a boundary, a table with those constraints (as the
/// schema had them up to V58) refuses exactly what `artex.task_fact_broken` and
/// `artex.worker_fact_broken` name, under the same name.
#[tokio::test]
async fn the_moved_rules_refuse_what_the_constraints_they_replace_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "create temp table task_rules (
            kind text, flow_id uuid, flow_task text, host text, limit_key text,
            shard smallint, shard_key text, tags text[], timeout_ms integer,
            unique_key text, progress real, progress_message text,
            constraint tasks_kind_check check (kind <> '' and length(kind) <= 200),
            constraint flow_task_named check ((flow_id is null) = (flow_task is null)),
            constraint tasks_flow_task_check check (flow_task <> ''),
            constraint tasks_host_check check (host <> ''),
            constraint tasks_limit_key_check
                check (limit_key <> '' and octet_length(limit_key) <= 200),
            constraint tasks_shard_check check (shard >= 0 and shard < 1024),
            constraint tasks_shard_key_check check (shard_key <> ''),
            constraint tasks_tags_valid check (tags is null or artex.tags_valid(tags)),
            constraint tasks_timeout_ms_check check (timeout_ms > 0),
            constraint tasks_unique_key_check
                check (unique_key <> '' and octet_length(unique_key) <= 200),
            constraint tasks_progress_check check (progress >= 0 and progress <= 1),
            constraint tasks_progress_message_check check (char_length(progress_message) <= 200)
        );
        create temp table worker_rules (
            id text, host text, pid integer, version text, channel text, http_addr text,
            lease_ms integer, binary_sha256 text, session text, slots integer,
            wake_addr text,
            constraint workers_id_check check (id <> ''),
            constraint workers_host_check check (host <> ''),
            constraint workers_pid_check check (pid > 0),
            constraint workers_version_check check (version <> ''),
            constraint workers_channel_check check (channel <> '' and length(channel) < 64),
            constraint workers_http_addr_check check (http_addr <> ''),
            constraint workers_lease_ms_check check (lease_ms > 0),
            constraint workers_binary_sha256_check check (binary_sha256 ~ '^[0-9a-f]{64}$'),
            constraint workers_session_check check (session <> '' and length(session) < 64),
            constraint workers_slots_check check (slots > 0),
            constraint workers_wake_addr_check
                check (wake_addr <> '' and length(wake_addr) < 300)
        );",
    )
    .await
    .unwrap();
    let task_columns = "kind, flow_id, flow_task, host, limit_key, shard, shard_key, tags, \
        timeout_ms, unique_key, progress, progress_message";
    let task_base = [
        ("kind", "'echo'::text"),
        ("flow_id", "null::uuid"),
        ("flow_task", "null::text"),
        ("host", "null::text"),
        ("limit_key", "null::text"),
        ("shard", "0::smallint"),
        ("shard_key", "null::text"),
        ("tags", "null::text[]"),
        ("timeout_ms", "null::integer"),
        ("unique_key", "null::text"),
        ("progress", "null::real"),
        ("progress_message", "null::text"),
    ];
    let flow = "'0196a000-0000-7000-8000-000000000001'::uuid";
    let task_values: Vec<Vec<(&str, String)>> = [
        ("kind", "''"),
        ("kind", "repeat('k', 200)"),
        ("kind", "repeat('k', 201)"),
        ("kind", "repeat('é', 200)"),
        ("flow_task", "'a'"),
        ("flow_id", flow),
        ("host", "''"),
        ("host", "'h'"),
        ("limit_key", "''"),
        ("limit_key", "repeat('é', 100)"),
        ("limit_key", "repeat('é', 101)"),
        ("shard", "(-1)::smallint"),
        ("shard", "1023::smallint"),
        ("shard", "1024::smallint"),
        ("shard_key", "''"),
        ("tags", "'{}'::text[]"),
        ("tags", "array['a', null]"),
        ("tags", "array[repeat('t', 64)]"),
        ("tags", "array[repeat('t', 65)]"),
        (
            "tags",
            "array(select 't' || i from generate_series(1, 20) i)",
        ),
        (
            "tags",
            "array(select 't' || i from generate_series(1, 21) i)",
        ),
        ("tags", "array[['a'], ['b']]"),
        ("timeout_ms", "0"),
        ("timeout_ms", "1"),
        ("unique_key", "repeat('u', 200)"),
        ("unique_key", "repeat('u', 201)"),
        ("unique_key", "''"),
        ("progress", "(-0.01)::real"),
        ("progress", "0::real"),
        ("progress", "1::real"),
        ("progress", "1.01::real"),
        ("progress", "'NaN'::real"),
        ("progress_message", "repeat('m', 200)"),
        ("progress_message", "repeat('é', 201)"),
    ]
    .iter()
    .map(|(col, v)| one_changed(&task_base, col, v))
    .chain([
        // A flow task names both.
        one_changed(
            &one_changed(&task_base, "flow_id", flow),
            "flow_task",
            "'a'",
        ),
        one_changed(&one_changed(&task_base, "flow_id", flow), "flow_task", "''"),
    ])
    .collect();
    for values in &task_values {
        compare(
            &c,
            "task_rules",
            task_columns,
            "artex.task_fact_broken",
            values,
        )
        .await;
    }
    let worker_columns = "id, host, pid, version, channel, http_addr, lease_ms, \
        binary_sha256, session, slots, wake_addr";
    let worker_base = [
        ("id", "'w1'::text"),
        ("host", "'h'::text"),
        ("pid", "1"),
        ("version", "'v'::text"),
        ("channel", "'c'::text"),
        ("http_addr", "null::text"),
        ("lease_ms", "null::integer"),
        ("binary_sha256", "null::text"),
        ("session", "null::text"),
        ("slots", "null::integer"),
        ("wake_addr", "null::text"),
    ];
    for (col, v) in [
        ("id", "''"),
        ("host", "''"),
        ("pid", "0"),
        ("pid", "-1"),
        ("version", "''"),
        ("channel", "''"),
        ("channel", "repeat('c', 63)"),
        ("channel", "repeat('c', 64)"),
        ("http_addr", "''"),
        ("http_addr", "'127.0.0.1:1'"),
        ("lease_ms", "0"),
        ("lease_ms", "1"),
        ("binary_sha256", "repeat('0a', 32)"),
        ("binary_sha256", "repeat('0A', 32)"),
        ("binary_sha256", "repeat('a', 63)"),
        ("binary_sha256", "repeat('a', 64) || E'\\n'"),
        ("session", "''"),
        ("session", "repeat('s', 63)"),
        ("session", "repeat('s', 64)"),
        ("slots", "0"),
        ("slots", "1"),
        ("wake_addr", "''"),
        ("wake_addr", "repeat('a', 299)"),
        ("wake_addr", "repeat('a', 300)"),
    ] {
        let values = one_changed(&worker_base, col, v);
        compare(
            &c,
            "worker_rules",
            worker_columns,
            "artex.worker_fact_broken",
            &values,
        )
        .await;
    }
}

fn one_changed<V: AsRef<str>>(
    base: &[(&'static str, V)],
    column: &str,
    value: &str,
) -> Vec<(&'static str, String)> {
    base.iter()
        .map(|(c, v)| {
            (
                *c,
                if *c == column {
                    value.to_string()
                } else {
                    v.as_ref().to_string()
                },
            )
        })
        .collect()
}

/// Inserts `values` into `table` (the constraints) and asks `function` (the rules):
/// both must name the same broken rule, or none.
async fn compare(
    c: &Client,
    table: &str,
    columns: &str,
    function: &str,
    values: &[(&str, String)],
) {
    let list = values
        .iter()
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let by_constraint = refusal(
        c,
        &format!("insert into {table} ({columns}) values ({list})"),
    )
    .await;
    let by_rule: Option<String> = c
        .query_one(&format!("select {function}({list})"), &[])
        .await
        .unwrap_or_else(|e| panic!("{function}({list}): {e}"))
        .get(0);
    assert_eq!(by_rule, by_constraint, "{function}({list})");
}

/// The hot writes set no column a rule reads, so neither trigger runs for them: a
/// worker's claim and its outcomes call neither function; an update that sets a fact
/// calls it once a row.
#[tokio::test]
async fn the_hot_writes_do_not_check_the_facts_again() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let c = db.client().await;
    for _ in 0..3 {
        insert_task(&c).await;
    }
    c.batch_execute("set track_functions = 'pl'; begin")
        .await
        .unwrap();
    let claimed = c
        .query(
            "select id, lease_epoch from artex.claim_and_read('w1', 10, 1000000, true)
             where id is not null",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3, "the worker's claim takes the three tasks");
    let ids: Vec<uuid::Uuid> = claimed.iter().map(|r| r.get(0)).collect();
    let epochs: Vec<i64> = claimed.iter().map(|r| r.get(1)).collect();
    let n = ids.len();
    let written = c
        .query(
            "select * from artex.record_attempts('w1', $1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &ids,
                &epochs,
                &vec!["succeeded"; n],
                &vec![serde_json::json!({}); n],
                &vec![None::<String>; n],
                &vec![false; n],
                &vec![None::<f64>; n],
                &vec![Some(1.0f64); n],
            ],
        )
        .await
        .unwrap();
    assert!(!written.is_empty(), "the outcomes are written");
    let calls = "select coalesce(sum(calls), 0)::int8 from pg_stat_xact_user_functions
        where schemaname = 'artex'
          and funcname in ('tasks_check_input_update', 'workers_check_facts')";
    let called: i64 = c.query_one(calls, &[]).await.unwrap().get(0);
    assert_eq!(called, 0, "the claim and the outcomes ran a fact trigger");
    c.execute(
        "update artex.tasks set host = 'h1' where id = any($1)",
        &[&ids],
    )
    .await
    .unwrap();
    let called: i64 = c.query_one(calls, &[]).await.unwrap().get(0);
    assert_eq!(called, 3, "an update of a fact checks each row");
    c.batch_execute("commit").await.unwrap();
    let done: i64 = c
        .query_one(
            "select count(*) from artex.tasks where status = 'succeeded' and host = 'h1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(done, 3);
}

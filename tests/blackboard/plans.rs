//! Query plans at scale: the claim reads only the tasks it takes and walks a queue of
//! 100,000 in its order, the trigger does not join a bulk update's old and new rows in
//! a nested loop, and the limits' check does not join its counts so either; a limited
//! or fair round walks its queue by its indexes whatever the statistics.

use serde_json::Value;

use crate::common::{fixtures, function_statements, TestDb};

/// Whether a plan (EXPLAIN's JSON) walks the index `name` anywhere.
fn uses_index(plan: &Value, name: &str) -> bool {
    match plan {
        Value::Object(o) => {
            o.get("Index Name").and_then(Value::as_str) == Some(name)
                || o.values().any(|v| uses_index(v, name))
        }
        Value::Array(a) => a.iter().any(|v| uses_index(v, name)),
        _ => false,
    }
}

/// Rows of `relation` a plan (EXPLAIN ANALYZE's JSON) looked up, over all its loops:
/// those its scans returned and those their filters removed.
fn rows_read(plan: &Value, relation: &str) -> f64 {
    match plan {
        Value::Object(o) => {
            let here = if o.get("Relation Name").and_then(Value::as_str) == Some(relation) {
                let n = |key: &str| o.get(key).and_then(Value::as_f64).unwrap_or(0.0);
                (n("Actual Rows")
                    + n("Rows Removed by Filter")
                    + n("Rows Removed by Index Recheck"))
                    * n("Actual Loops")
            } else {
                0.0
            };
            here + o.values().map(|v| rows_read(v, relation)).sum::<f64>()
        }
        Value::Array(a) => a.iter().map(|v| rows_read(v, relation)).sum(),
        _ => 0.0,
    }
}

#[tokio::test]
async fn the_claim_reads_only_the_tasks_it_takes_and_walks_a_large_queue_in_order() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // 99,000 tasks that are not runnable and 1,000 that are. (Paused at insert, which is
    // legal: moving 99,000 rows in one UPDATE would hit the trigger's quadratic join, see
    // `a_bulk_update_does_not_join_old_and_new_rows_in_a_nested_loop`.)
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority, status)
             select 'echo', jsonb_build_object('n', g), g % 3, 'paused'
             from generate_series(1, 99000) g;
         insert into artex.tasks (kind, payload, priority)
             select 'echo', jsonb_build_object('n', g), g % 3 from generate_series(1, 1000) g;
         analyze artex.tasks;",
    )
    .await
    .unwrap();
    let counts: Vec<(String, i64)> = crate::common::pairs(
        &c,
        "select status::text, count(*) from artex.tasks group by 1 order by 1",
    )
    .await;
    assert_eq!(
        counts,
        [("paused".to_string(), 99000), ("pending".to_string(), 1000)]
    );

    // The head of the runnable queue, which the round's read and a worker's claim lock
    // (V51), as they call it: every shard, then two shards of four (several planners).
    // Its statement's plan is cached by PL/pgSQL, custom for the first calls of a
    // session, then generic: both must behave.
    // A planner of two shards of four passes the other planners' tasks on its walk:
    // about as many as its own.
    let cases = [
        (
            "force_custom_plan",
            "'{echo,sleep}', null, 1, '{}', 100",
            100.0,
        ),
        (
            "force_generic_plan",
            "'{echo,sleep}', null, 1, '{}', 100",
            100.0,
        ),
        (
            "force_generic_plan",
            "'{echo,sleep}', null, 4, '{0,2}', 100",
            300.0,
        ),
        (
            "force_custom_plan",
            "'{echo,sleep}', 'h', 4, '{0,2}', 100",
            300.0,
        ),
    ];
    let head = |mode: &'static str, args: &'static str, analyze: bool| {
        let db = &db;
        async move {
            let plans = explained(
                db,
                &format!(
                    "begin;
                     set local plan_cache_mode = {mode};
                     select count(*) from artex.runnable_head({args});
                     rollback"
                ),
                analyze,
            )
            .await;
            let mut heads = plans
                .into_iter()
                .filter(|(text, _)| text.contains("limit p_n"))
                .map(|(_, plan)| plan);
            let plan = heads.next().expect("runnable_head's statement ran");
            assert!(heads.next().is_none(), "runnable_head ran one statement");
            plan
        }
    };
    // Whatever the plan, the queue is ordered and cut before a task's row is read: the
    // claim reads (and locks) no more task rows than it takes.
    for (mode, args, most) in cases {
        let plan = head(mode, args, true).await;
        let read = rows_read(&plan, "tasks");
        assert!(
            read <= most,
            "{mode}, runnable_head({args}) read {read} task rows to take 100:\n{plan:#}"
        );
    }
    // A queue of 100,000 is walked in its order, not sorted whole.
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority)
             select 'echo', jsonb_build_object('n', g), g % 3 from generate_series(1, 99000) g;
         analyze artex.tasks;",
    )
    .await
    .unwrap();
    for (mode, args, _) in cases {
        let plan = head(mode, args, false).await;
        assert!(
            uses_index(&plan, "tasks_runnable"),
            "{mode}, runnable_head({args}) does not walk tasks_runnable:\n{plan:#}"
        );
    }
}

/// Plans (EXPLAIN JSON) of `node` and below that join two transition tables in a nested
/// loop: transition tables have no index, so such a join compares every pair of rows.
fn nested_loops_over_transition_tables(node: &Value) -> usize {
    fn tuplestore_scans(node: &Value) -> usize {
        let here = usize::from(node["Node Type"] == "Named Tuplestore Scan");
        here + children(node).map(tuplestore_scans).sum::<usize>()
    }
    fn children(node: &Value) -> impl Iterator<Item = &Value> {
        node["Plans"].as_array().into_iter().flatten()
    }
    let here = usize::from(node["Node Type"] == "Nested Loop" && tuplestore_scans(node) >= 2);
    here + children(node)
        .map(nested_loops_over_transition_tables)
        .sum::<usize>()
}

/// The plans of every statement `sql` runs, nested ones included (auto_explain's JSON
/// output, with `analyze` when asked), each with its query text.
async fn explained(db: &TestDb, sql: &str, analyze: bool) -> Vec<(String, Value)> {
    // auto_explain reports the plans as notices.
    let (c, mut connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    c.batch_execute(&format!(
        "load 'auto_explain';
         set auto_explain.log_min_duration = 0;
         set auto_explain.log_nested_statements = on;
         set auto_explain.log_analyze = {analyze};
         set auto_explain.log_format = json;
         set client_min_messages = log;
         {sql};
         reset client_min_messages;"
    ))
    .await
    .unwrap();
    drop(c);
    let mut plans = Vec::new();
    while let Some(m) = notices.recv().await {
        let Some(start) = m.find('{') else { continue };
        let logged: Value = serde_json::from_str(&m[start..])
            .unwrap_or_else(|e| panic!("auto_explain output {m:?}: {e}"));
        let text = logged["Query Text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        plans.push((text, logged["Plan"].clone()));
    }
    plans
}

#[tokio::test]
async fn a_bulk_update_does_not_join_old_and_new_rows_in_a_nested_loop() {
    const N: usize = 20_000;
    let db = TestDb::new().await;
    // paused -> pending wakes the planner, so the statement's `exists` stops at the first
    // row and the test stays fast whatever the plan; the plan is the same either way.
    db.client()
        .await
        .batch_execute(&format!(
            "insert into artex.tasks (kind, status) select 'echo', 'paused'
                 from generate_series(1, {N})"
        ))
        .await
        .unwrap();
    let plans = explained(&db, "update artex.tasks set status = 'pending'", false).await;
    let mut joins = 0;
    for (text, plan) in plans.iter().filter(|(text, _)| text.contains("old_rows")) {
        joins += 1;
        assert_eq!(
            nested_loops_over_transition_tables(plan),
            0,
            "quadratic join of the {N} updated rows:\n{text}\n{plan:#}"
        );
    }
    assert!(
        joins >= 2,
        "auto_explain reported {joins} joins of old_rows"
    );
}

/// The CTE scans of a plan (EXPLAIN ANALYZE's JSON) run again and again over many rows:
/// (CTE, rows per scan, scans). A CTE has no index, so a nested loop with one on its
/// inner side compares every pair of rows.
fn rescanned_ctes(node: &Value) -> Vec<(String, f64, f64)> {
    let mut found = Vec::new();
    if node["Node Type"] == "CTE Scan" {
        let rows = node["Actual Rows"].as_f64().unwrap_or(0.0);
        let loops = node["Actual Loops"].as_f64().unwrap_or(0.0);
        if rows >= 50.0 && loops >= 2.0 {
            let name = node["CTE Name"].as_str().unwrap_or_default().to_string();
            found.push((name, rows, loops));
        }
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        found.extend(rescanned_ctes(child));
    }
    found
}

/// `tasks` tasks of a limited kind (5 a key) over 1,000 keys, analyzed while none is
/// held (as a fresh backlog is), then the first 1,000 assigned: one held by every key.
async fn thousand_keys_holding_one(db: &TestDb, c: &tokio_postgres::Client, tasks: i32) {
    fixtures::worker(&db.bb, "sim", &["echo"], 100_000).await;
    c.execute(
        "insert into artex.kind_limits (kind, concurrency, key_concurrency, updated_by)
             values ('echo', 100000, 5, 'test')",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "insert into artex.tasks (kind, limit_key)
             select 'echo', 'k' || (g % 1000) from generate_series(1, $1) g",
        &[&tasks],
    )
    .await
    .unwrap();
    c.batch_execute("analyze artex.tasks").await.unwrap();
    assert_eq!(fixtures::assign(&db.bb).await.assigned, 1000);
}

#[tokio::test]
async fn the_limits_check_counts_held_tasks_without_a_quadratic_join() {
    let db = TestDb::new().await;
    let c = db.client().await;
    thousand_keys_holding_one(&db, &c, 2000).await;
    let ask = "select artex.over_limits(array(
                   select id from artex.tasks where status = 'pending' order by id))";
    // Its answer: the next task of every key fits under 5 a key, none under 1.
    let denied = || async {
        let row = c.query_one(ask, &[]).await.unwrap();
        row.get::<_, Vec<uuid::Uuid>>(0).len()
    };
    assert_eq!(denied().await, 0);
    // The 1,000 tasks asked for are checked against the 1,000 keys' held counts by a
    // hash or merge join, not by comparing every pair (a million, 70–100 ms).
    for (text, plan) in explained(&db, ask, true).await {
        let rescans = rescanned_ctes(&plan);
        assert!(
            rescans.is_empty(),
            "CTEs scanned again and again (name, rows, scans): {rescans:?}\n{text}\n{plan:#}"
        );
    }
    c.batch_execute("update artex.kind_limits set key_concurrency = 1")
        .await
        .unwrap();
    assert_eq!(denied().await, 1000, "every key holds its one task");
}

#[tokio::test]
async fn a_limited_round_walks_its_head_in_order_with_stale_statistics() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The table analyzed with no limited task waiting, then a backlog of 20,000 over
    // 1,000 keys: the statistics a burst after an idle spell meets (autovacuum analyzes
    // a minute later at best).
    fixtures::worker(&db.bb, "sim", &["echo"], 100).await;
    c.batch_execute(
        "insert into artex.kind_limits (kind, concurrency, key_concurrency, updated_by)
             values ('echo', 100000, 5, 'test');
         analyze artex.tasks;
         insert into artex.tasks (kind, limit_key)
             select 'echo', 'k' || (g % 1000) from generate_series(1, 20000) g;",
    )
    .await
    .unwrap();
    // The round as the planner calls it (its statements' plans are generic: the
    // function forces them), rolled back.
    let plans = explained(
        &db,
        "begin;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         rollback",
        true,
    )
    .await;
    let mut heads = 0;
    for (text, plan) in &plans {
        let rescans = rescanned_ctes(plan);
        assert!(
            rescans.is_empty(),
            "CTEs scanned again and again (name, rows, scans): {rescans:?}\n{text}\n{plan:#}"
        );
        if text.contains("limit p_n") && text.contains("and t.limited") {
            heads += 1;
            // The head is twice the worker's 100 free places: walked in order and cut
            // there, not 20,000 tasks gathered and sorted.
            let read = rows_read(plan, "tasks");
            assert!(
                read <= 200.0,
                "the head read {read} task rows to keep 200:\n{text}\n{plan:#}"
            );
        }
    }
    assert_eq!(heads, 1, "the round read the limited head once");
    // What the round claims: the worker's 100 places.
    let claimed: i64 = c
        .query_one(
            "select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true)
             where task is not null",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 100);
}

/// The node of a plan (EXPLAIN ANALYZE's JSON) that handled the most rows over all its
/// loops (those it returned and those its filters and join filters removed): a join
/// that compares every pair shows there, as a nested loop's rescans or a merge join's
/// re-read inner side.
fn busiest_node(node: &Value) -> (String, f64) {
    let n = |key: &str| node[key].as_f64().unwrap_or(0.0);
    let here = (
        format!(
            "{} {}",
            node["Node Type"].as_str().unwrap_or_default(),
            node["CTE Name"].as_str().unwrap_or_default()
        ),
        (n("Actual Rows") + n("Rows Removed by Filter") + n("Rows Removed by Join Filter"))
            * n("Actual Loops"),
    );
    node["Plans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(busiest_node)
        .fold(here, |a, b| if b.1 > a.1 { b } else { a })
}

/// A limited round sets its head beside what each key holds without comparing every
/// pair (V65): analyzed while nothing was held, then 1,000 keys holding a task each, the
/// round's checks of its head (whether it fits whole; what fits when it does not) and
/// its walk of the keys handle each row of `held` once, not once per task or key (1,447 ×
/// 754 rows took 35–130 ms a round late in a burst).
#[tokio::test]
async fn a_limited_round_counts_held_tasks_without_a_quadratic_join() {
    let db = TestDb::new().await;
    let c = db.client().await;
    thousand_keys_holding_one(&db, &c, 4000).await;
    let round = "begin;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         rollback";
    let claimed = || async {
        c.query_one(
            "select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true)
             where task is not null",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    // Five a key: the head's first 1,000 fit whole. One a key: none fits, and the round
    // walks the keys.
    for (key_concurrency, fits) in [(5, 1000), (1, 0)] {
        c.execute(
            "update artex.kind_limits set key_concurrency = $1",
            &[&key_concurrency],
        )
        .await
        .unwrap();
        for (text, plan) in explained(&db, round, true).await {
            let rescans = rescanned_ctes(&plan);
            assert!(
                rescans.is_empty(),
                "{key_concurrency} a key: CTEs scanned again and again (name, rows, scans): {rescans:?}\n{text}\n{plan:#}"
            );
            // 3,000 tasks wait and 1,000 keys hold one: a million rows is every pair.
            let (node, rows) = busiest_node(&plan);
            assert!(
                rows < 100_000.0,
                "{key_concurrency} a key: {node} handled {rows} rows\n{text}\n{plan:#}"
            );
        }
        assert_eq!(claimed().await, fits, "{key_concurrency} a key");
    }
}

/// Fails naming every statement of `plans` that read more than `most` task rows, to
/// take `what`.
fn assert_none_read_over(plans: &[(String, Value)], most: f64, what: &str) {
    let over: Vec<(f64, &str)> = plans
        .iter()
        .map(|(text, plan)| (rows_read(plan, "tasks"), text.as_str()))
        .filter(|(read, _)| *read > most)
        .collect();
    assert!(
        over.is_empty(),
        "statements that read over {most} task rows to take {what} (rows, statement): {over:#?}"
    );
}

/// `sql` in a block of its own, committed, that auto_explain does not log, for a session
/// script of [`explained`]. (Committed: a block rolled back would take back the settings
/// of every statement before it in the batch, auto_explain's among them.)
fn unlogged(sql: &str) -> String {
    format!(
        "begin;
         set auto_explain.log_min_duration = -1;
         {sql};
         set auto_explain.log_min_duration = 0;
         commit;"
    )
}

/// A fresh blackboard's `tasks` is empty when its planner and workers first claim (its
/// statistics say so too: building its indexes counted no row), and each session keeps
/// the plans it made then until the table is analyzed again: a minute or more after a
/// burst, with PostgreSQL's default autovacuum. The claims must walk the runnable
/// tasks' index in its order all the same, not read the whole backlog and sort it
/// (V51: 10 ms a round for 20,000 tasks, against 1 ms).
#[tokio::test]
async fn the_claims_walk_the_queue_in_order_with_plans_made_on_an_empty_table() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "sim", &["echo"], 100).await;
    // One session, as a planner's or a worker's: an empty round and an empty claim plan
    // the statements on the empty table; then the burst; then the same calls, rolled
    // back.
    let plans = explained(
        &db,
        "begin;
         analyze artex.tasks;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         select count(*) from artex.claim_and_read('sim', 1000, 1000000, true);
         insert into artex.tasks (kind) select 'echo' from generate_series(1, 20000);
         commit;
         begin;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         rollback;
         begin;
         select count(*) from artex.claim_and_read('sim', 1000, 1000000, true);
         rollback",
        true,
    )
    .await;
    // Each claim takes the worker's 100 free places: it reads them, then updates them
    // by their keys (a few rows more for the look that anything waits). No statement of
    // the session reads more.
    assert_none_read_over(&plans, 250.0, "100");
    let c = db.client().await;
    let claimed: i64 = c
        .query_one(
            "select claimed from artex.claim_and_read('sim', 1000, 1000000, true) where n = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claimed, 100, "the worker's claim takes its 100 free places");
}

/// A worker's claim and an idle worker's offer first look whether a runnable task of
/// their kinds waits. With plans made while most tasks were runnable (a worker started
/// on a backlog: its session keeps the plan) that look scanned the table from its start,
/// through every task that has left the queue since: 18,981 rows for the first runnable
/// one once 19,000 of 20,000 had ended. Since V72 it walks the runnable queue's index in
/// its order whatever the statistics.
#[tokio::test]
async fn the_looks_for_a_runnable_task_walk_the_queue_with_plans_made_on_a_backlog() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "sim", &["echo"], 100).await;
    // One session, as a worker's: a claim and an offer plan their statements on the
    // backlog (rolled back), then 19,000 tasks at the queue's front leave it (paused here,
    // unseen by auto_explain), then the same claim; then the rest leave it too, and the
    // same offer.
    let claim = "begin;
         select count(*) from artex.claim_and_read_unknown('sim', 1000, 1000000, true, '{}', '{}');
         rollback;";
    let offer = "begin; select artex.offer_slot('sim'); rollback;";
    let script = [
        unlogged(
            "insert into artex.tasks (kind) select 'echo' from generate_series(1, 20000);
             analyze artex.tasks",
        ),
        claim.into(),
        offer.into(),
        unlogged(
            "update artex.tasks set status = 'paused'
                 where id in (select id from artex.tasks order by id limit 19000)",
        ),
        claim.into(),
        unlogged("update artex.tasks set status = 'paused' where status = 'pending'"),
        offer.into(),
    ];
    let plans = explained(&db, &script.join("\n"), true).await;
    // Each claim takes the worker's 100 free places: it reads them, then updates them
    // by their keys, and its look reads the queue's first row; the offer's look finds
    // the queue empty.
    assert_none_read_over(&plans, 250.0, "100");
}

/// A worker's outcomes name their tasks by id. With the plan its session made on a table
/// whose statistics said no task was held (a fresh blackboard), `record_attempts` walked
/// every task the worker holds by the holder's index and hashed them against the batch:
/// ~2,000 rows and ~2,000 old rows a batch at a default worker's full depth, whatever the
/// batch's size. Since V73 it finds each task by key from the outcomes.
#[tokio::test]
async fn a_workers_outcomes_find_their_tasks_by_key_however_many_it_holds() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "sim", &["echo"], 2100).await;
    // One session, as a worker's: its first batch plans on the empty table (nothing
    // written), then it holds 2,000 tasks and writes the outcomes of 100 of them.
    let script = [
        unlogged("analyze artex.tasks"),
        "select count(*) from artex.record_attempts('sim', '{}', '{}', '{}', '{}', '{}', '{}',
             '{}', '{}')"
            .into(),
        unlogged(
            "insert into artex.tasks (kind) select 'echo' from generate_series(1, 2000);
             select count(*) from artex.claim_and_read_unknown('sim', 2100, 1000000000, false,
                 '{}', '{}');
             create table batch as select id, lease_epoch from artex.tasks
                 where assigned_to = 'sim' order by id limit 100",
        ),
        succeeded_from("batch", 100),
    ];
    let plans = explained(&db, &script.join(";\n"), true).await;
    // Each of the 100 is looked up by its key, and its row as it was by its key; the walk
    // of the 2,000 it holds read 4,100. No statement reads what it holds.
    assert_none_read_over(&plans, 1000.0, "100 outcomes with 2,000 held");
}

/// `sim`'s outcomes, all succeeded, of the `n` tasks (id, lease_epoch) in table `batch`.
fn succeeded_from(batch: &str, n: usize) -> String {
    format!(
        "select count(*) from artex.record_attempts('sim',
             (select array_agg(id order by id) from {batch}),
             (select array_agg(lease_epoch order by id) from {batch}),
             array_fill('succeeded'::text, array[{n}]), array_fill(null::jsonb, array[{n}]),
             array_fill(null::text, array[{n}]), array_fill(false, array[{n}]),
             array_fill(0::float8, array[{n}]), array_fill(1::float8, array[{n}]))"
    )
}

/// A fair kind's round on plans made while the table was empty (a fresh blackboard, or
/// a planner started on an idle queue): behind a backlog of 20,000 tasks of one key, it
/// reaches another key's task by `tasks_limited_waiting`, walks the keys by it too, and
/// looks each task it takes up by its key (V67). With those statistics PostgreSQL
/// otherwise read the key's tasks by walking every limited task, or scanned the table
/// and sorted it, and scanned it again for each task taken: 120–145 ms a round.
#[tokio::test]
async fn a_fair_round_walks_each_key_by_its_index_with_plans_made_on_an_empty_table() {
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "sim", &["echo"], 100).await;
    let plans = explained(
        &db,
        "insert into artex.kind_limits (kind, fair, updated_by) values ('echo', true, 'test');
         analyze artex.tasks;
         begin;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         insert into artex.tasks (kind, limit_key)
             select 'echo', 'big' from generate_series(1, 20000);
         insert into artex.tasks (kind, limit_key) values ('echo', 'small');
         commit;
         begin;
         select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true);
         rollback",
        true,
    )
    .await;
    // The worker's 100 places: each key's first 100 tasks at most, the keys walked, and
    // the 100 taken looked up. No statement of the session reads more.
    assert_none_read_over(&plans, 1000.0, "100");
    // The late key's task is among them.
    let c = db.client().await;
    let small: i64 = c
        .query_one(
            "select count(*) from artex.dispatch_round(600, 1000, 1, '{}', '{}', true) r
             join artex.tasks t on t.id = r.task where t.limit_key = 'small'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(small, 1, "the round takes the late key's task");
}

/// Every plan-cached function of the hot path exists, takes the arguments its call
/// sends, and runs one statement that plans (its own source, prepared and EXPLAINed:
/// the statement lives only there).
#[tokio::test]
async fn the_hot_path_functions_take_their_calls_and_their_statements_plan() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let calls = artex_actors::blackboard::hot_calls();
    assert_eq!(calls.len(), 6);
    for (function, call) in calls {
        let args: i16 = c
            .query_one(
                "select pronargs from pg_proc
                 where proname = $1 and pronamespace = 'artex'::regnamespace",
                &[&function],
            )
            .await
            .unwrap_or_else(|e| panic!("artex.{function}: {e}"))
            .get(0);
        let sent = call.matches('$').count();
        assert_eq!(
            sent, args as usize,
            "{call} sends {sent} arguments; artex.{function} takes {args}"
        );
        let statements = function_statements(&c, function).await;
        assert!(
            !statements.is_empty(),
            "artex.{function} runs no `return query …;`"
        );
        let types: String = c
            .query_one(
                "select array_to_string(array(select format_type(t, null)
                     from unnest(proargtypes) t), ', ')
                 from pg_proc where proname = $1 and pronamespace = 'artex'::regnamespace",
                &[&function],
            )
            .await
            .unwrap()
            .get(0);
        let nulls = vec!["null"; args as usize].join(", ");
        for (n, statement) in statements.iter().enumerate() {
            c.batch_execute(&format!(
                "begin; prepare hot_{function}({types}) as {statement}"
            ))
            .await
            .unwrap_or_else(|e| panic!("artex.{function}'s statement {n} does not prepare: {e}"));
            let plan: Value = c
                .query_one(
                    &format!("explain (format json) execute hot_{function}({nulls})"),
                    &[],
                )
                .await
                .unwrap_or_else(|e| panic!("artex.{function}'s statement {n} does not plan: {e}"))
                .get(0);
            c.batch_execute(&format!("deallocate hot_{function}; rollback"))
                .await
                .unwrap();
            assert!(plan[0]["Plan"].is_object(), "{function} {n}: {plan}");
        }
    }
}

/// `dispatch_round` has two statements (V34): the roster and the claim alone, when no kind
/// is limited and no limited task waits, and the whole round otherwise. Without limits
/// they return the same rows: each runs, in a transaction of its own rolled back, the
/// scanner's arguments (every shard; two shards of four, no walk; a worker left out) over workers
/// and tasks of two kinds, four priorities, future run times and a pinned host.
#[tokio::test]
async fn the_rounds_small_statement_returns_what_the_whole_one_returns_without_limits() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 5).await;
    fixtures::worker(&db.bb, "w2", &["echo", "sleep"], 20).await;
    c.batch_execute(
        "insert into artex.tasks (kind, payload, priority, run_at, host)
             select case when g % 3 = 0 then 'sleep' else 'echo' end,
                    jsonb_build_object('n', g), g % 4,
                    now() + case when g % 7 = 0 then interval '1 hour' else interval '0' end,
                    case when g % 11 = 0 then 'elsewhere' end
             from generate_series(1, 60) g;
         analyze artex.tasks;",
    )
    .await
    .unwrap();
    let statements = function_statements(&c, "dispatch_round").await;
    assert_eq!(statements.len(), 2, "dispatch_round's statements");
    let cases = [
        "600, 100, 1, '{}', '{}', true",
        "600, 10, 4, '{0,2}', '{}', false",
        "600, 100, 1, '{}', '{w1}', true",
    ];
    let mut rounds: Vec<Vec<Vec<String>>> = Vec::new();
    for statement in &statements {
        c.batch_execute(&format!(
            "begin; prepare round(float8, int8, int4, int4[], text[], bool) as
                 select r::text from ({statement}) r"
        ))
        .await
        .unwrap();
        let mut these = Vec::new();
        for args in cases {
            let rows = c
                .query(&format!("execute round({args})"), &[])
                .await
                .unwrap();
            these.push(rows.iter().map(|r| r.get(0)).collect());
        }
        c.batch_execute("deallocate round; rollback").await.unwrap();
        rounds.push(these);
    }
    for (i, args) in cases.iter().enumerate() {
        assert!(
            rounds[0][i].len() > 2,
            "round({args}) claimed nothing: {:?}",
            rounds[0][i]
        );
        assert_eq!(
            rounds[0][i], rounds[1][i],
            "round({args}): the small statement (left) and the whole one (right) differ"
        );
    }
}

//! A task's row is updated in place (HOT: no new index entry) between the facts that
//! place it: its start, its lease renewals, its checkpoints and its progress write no
//! index entry, whoever writes them (migrations/V15__hot_task_rows.sql, V18).

use crate::common::TestDb;

/// The session's updates of `artex.tasks` not yet sent to the statistics: (all, HOT).
/// Within one transaction, the difference of two readings is what ran between them.
async fn updates(c: &tokio_postgres::Transaction<'_>) -> (i64, i64) {
    let r = c
        .query_one(
            "select n_tup_upd, n_tup_hot_upd from pg_stat_xact_user_tables
             where relid = 'artex.tasks'::regclass",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn a_task_s_start_renewals_checkpoints_and_progress_are_hot_updates() {
    // Few tasks, so that their page has room for every version the steps write even if
    // none is pruned: HOT needs the new version to fit on the old one's page (the
    // runtime's batches find it there thanks to the fill factor of 50 and pruning).
    const N: i64 = 4;
    let db = TestDb::new().await;
    let mut c = db.client().await;
    c.batch_execute(
        "insert into artex.tasks (kind, payload)
         select 'echo', jsonb_build_object('i', i) from generate_series(1, 4) i",
    )
    .await
    .unwrap();
    // The life of a task as the runtime writes it, in plain SQL, and how many of the N
    // updates of each step are HOT: every step but the new facts (a holder, another
    // holder, the end).
    let steps: [(&str, &str, i64); 8] = [
        (
            "assignment",
            "update artex.tasks set status = 'assigned', assigned_to = 'w1',
                 lease_until = now() + interval '1 minute'",
            0,
        ),
        (
            "renewal",
            "update artex.tasks set lease_until = now() + interval '2 minutes'",
            N,
        ),
        ("start", "update artex.tasks set status = 'running'", N),
        (
            "renewal while running",
            "update artex.tasks set lease_until = now() + interval '3 minutes'",
            N,
        ),
        (
            "checkpoint",
            "update artex.tasks set checkpoint = '{\"at\": 1}'",
            N,
        ),
        (
            "progress",
            "update artex.tasks set progress = 0.5, progress_message = 'half',
                 progress_at = now()",
            N,
        ),
        ("handover", "update artex.tasks set assigned_to = 'w2'", 0),
        (
            "end",
            "update artex.tasks set status = 'succeeded', result = '{}'",
            0,
        ),
    ];
    let history = "select count(*) from artex.task_transitions";
    for (step, sql, hot) in steps {
        let tx = c.transaction().await.unwrap();
        let before = updates(&tx).await;
        let rows_before: i64 = tx.query_one(history, &[]).await.unwrap().get(0);
        tx.batch_execute(sql).await.unwrap();
        let after = updates(&tx).await;
        if step == "progress" {
            let rows_after: i64 = tx.query_one(history, &[]).await.unwrap().get(0);
            assert_eq!(rows_after, rows_before, "progress wrote history rows");
        }
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (N, hot),
            "{step}: (updates, HOT updates)"
        );
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn no_index_of_tasks_names_a_column_that_changes_between_a_claim_and_the_end() {
    // What an index names (key, expression or predicate) makes an update that changes
    // it write a new entry in every index. A task's start, renewals and checkpoints
    // change these columns: no index may name one (`listed` stands for `status`).
    let db = TestDb::new().await;
    let c = db.client().await;
    let rows = c
        .query(
            "select i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
             from pg_index i where i.indrelid = 'artex.tasks'::regclass",
            &[],
        )
        .await
        .unwrap();
    assert!(
        rows.len() >= 4,
        "the indexes of artex.tasks: {}",
        rows.len()
    );
    let changing = [
        "status",
        "lease_until",
        "lease_epoch",
        "retries",
        "started_at",
        "updated_at",
        "checkpoint",
        "error",
        "result",
        "payload",
    ];
    for r in rows {
        let (name, def): (String, String) = (r.get(0), r.get(1));
        let named = def
            .split_once(" USING ")
            .map(|(_, rest)| rest)
            .unwrap_or(&def);
        for col in changing {
            let mentions = named
                .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                .any(|w| w == col);
            assert!(!mentions, "{name} names {col}: {def}");
        }
    }
}

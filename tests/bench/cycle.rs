//! cycle: the two hot functions alone, by plain SQL (issue 39). W1's tasks assigned to one
//! registered worker and ended in rounds of 500 by `artex.assign_and_wake` and
//! `artex.record_attempts` on one connection, from a checkpoint; no process of artex runs.
//! The WAL and the cluster's CPU per task that a change of the schema or of the two
//! functions makes, without what a run counts with them (heartbeats, renewals, reads and
//! the length of the run, which moves with the host's speed).

use uuid::Uuid;

use crate::history::lsn;
use crate::report::{fixed, result, Progress};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::{sql, Bench};

const DB: &str = "bench_cycle";
/// Tasks assigned, then ended, per round.
const ROUND: i64 = 500;

pub async fn run(bench: &mut Bench) {
    let n = bench.sizes.w1;
    let c = bench.rig.new_db(DB).await;
    exec(&c, sql::CYCLE_WORKER).await;
    insert_noops(&c, n).await;
    exec(&c, sql::CHECKPOINT).await;
    let (wal0, cpu0) = (lsn(&c).await.1, bench.rig.pg_cpu_s());
    let mut progress = Progress::new("cycle", n.into());
    let mut done = 0u64;
    while done < u64::from(n) {
        c.query_one(sql::CYCLE_ASSIGN, &[&ROUND])
            .await
            .expect("a round's assignment");
        let held = c
            .query(sql::CYCLE_HELD, &[&ROUND])
            .await
            .expect("the tasks the round assigned");
        assert!(
            !held.is_empty(),
            "cycle: a round assigned nothing at {done}/{n}"
        );
        let ids: Vec<Uuid> = held.iter().map(|r| r.get(0)).collect();
        let epochs: Vec<i64> = held.iter().map(|r| r.get(1)).collect();
        let ended = c
            .query(sql::CYCLE_RECORD, &[&ids, &epochs])
            .await
            .expect("the round's outcomes");
        assert_eq!(ended.len(), ids.len(), "cycle: outcomes refused");
        done += ids.len() as u64;
        progress.show(done);
    }
    progress.end();
    let (wal1, cpu1) = (lsn(&c).await.1, bench.rig.pg_cpu_s());
    bench.rig.check_all_succeeded(&c, DB, n.into()).await;
    println!("# cycle: {n} tasks, rounds of {ROUND}, plain SQL");
    let per_task = f64::from(n);
    result(
        "cycle_wal_bytes_per_task",
        fixed((wal1 - wal0) as f64 / per_task, 0),
        "bytes",
    );
    result(
        "cycle_cpu_us_per_task_postgres",
        fixed((cpu1 - cpu0) * 1e6 / per_task, 0),
        "us",
    );
    bench.rig.drop_db(DB, c).await;
}

//! cycle: the two hot functions alone, by plain SQL (issue 39). W1's tasks assigned to one
//! registered worker and ended in rounds of 500 by `artex.assign_and_wake` and
//! `artex.record_attempts` on one connection, from a checkpoint; no process of artex runs.
//! The WAL and the cluster's CPU per task that a change of the schema or of the two
//! functions makes, without what a run counts with them (heartbeats, renewals, reads and
//! the length of the run, which moves with the host's speed). Then the same tasks by the
//! worker's own path (`cycle_claim_*`): its claim and read (`artex.claim_and_read_unknown`)
//! with the tasks it holds passed as known, and its outcomes, as a worker of 2,010 slots
//! runs them in a burst. With ARTEX_BENCH_PROFILE=1, each half's statements.
use tokio_postgres::Client;
use uuid::Uuid;

use crate::history::lsn;
use crate::report::{fixed, profile_print, profile_reset, result, Progress};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::{sql, Bench};

const DB: &str = "bench_cycle";
const DB_CLAIMS: &str = "bench_cycle_claims";
/// The rounds' worker: slots enough that a round never finds it full.
const ROUNDS_WORKER: i64 = 2_000_000_000;
/// The claims' worker: its slots, as a default worker's at full depth in W1 from idle
/// (and the most a read returns), and its read's bytes.
const CLAIM_LIMIT: i64 = 2010;
const CLAIM_BYTES: i64 = 64 << 20;
/// Tasks assigned, then ended, per round.
const ROUND: i64 = 500;

pub async fn run(bench: &mut Bench) {
    let n = bench.sizes.w1;
    let c = bench.rig.new_db(DB).await;
    worker(&c, ROUNDS_WORKER).await;
    insert_noops(&c, n).await;
    exec(&c, sql::CHECKPOINT).await;
    let from = start(bench, &c).await;
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
    println!("# cycle: {n} tasks, rounds of {ROUND}, plain SQL");
    report(bench, c, DB, "cycle", n, from).await;
    claims(bench).await;
}

/// The worker's path: W1's tasks claimed and read by `artex.claim_and_read_unknown` (the
/// worker's own statement) by a worker of 2,010 slots, its oldest 500 ended by
/// `artex.record_attempts` after each claim, so that each claim finds the room the last
/// outcomes freed and passes the tasks it still holds as known, as a worker does in a
/// burst.
async fn claims(bench: &mut Bench) {
    let n = bench.sizes.w1;
    let c = bench.rig.new_db(DB_CLAIMS).await;
    worker(&c, CLAIM_LIMIT).await;
    insert_noops(&c, n).await;
    exec(&c, sql::CHECKPOINT).await;
    let from = start(bench, &c).await;
    let mut progress = Progress::new("cycle, claims", n.into());
    let mut held: std::collections::VecDeque<(Uuid, i64)> = Default::default();
    let mut done = 0u64;
    while done < u64::from(n) {
        let (known, epochs): (Vec<Uuid>, Vec<i64>) = held.iter().copied().unzip();
        let read = c
            .query(
                sql::CYCLE_CLAIM,
                &[&CLAIM_LIMIT, &CLAIM_BYTES, &known, &epochs],
            )
            .await
            .expect("a claim and its read");
        held.extend(
            read.iter()
                .filter(|r| r.get::<_, i64>(2) > 0)
                .map(|r| (r.get(0), r.get(1))),
        );
        let take = held.len().min(ROUND as usize);
        assert!(take > 0, "cycle: a claim found nothing at {done}/{n}");
        let (ids, epochs): (Vec<Uuid>, Vec<i64>) = held.drain(..take).unzip();
        let ended = c
            .query(sql::CYCLE_RECORD, &[&ids, &epochs])
            .await
            .expect("the oldest outcomes");
        assert_eq!(ended.len(), ids.len(), "cycle: outcomes refused");
        done += ids.len() as u64;
        progress.show(done);
    }
    progress.end();
    println!("# cycle, claims: {n} tasks, a worker of {CLAIM_LIMIT} slots, outcomes of {ROUND}");
    report(bench, c, DB_CLAIMS, "cycle_claim", n, from).await;
}

/// The half's worker, of `slots` slots.
async fn worker(c: &Client, slots: i64) {
    let slots = i32::try_from(slots).expect("slots fit a worker's capacity");
    c.execute(sql::CYCLE_WORKER, &[&slots])
        .await
        .expect("the cycle's worker");
}

/// Where a half starts: the WAL's position and the cluster's CPU seconds, after its
/// profile's reset.
async fn start(bench: &Bench, c: &Client) -> (i64, f64) {
    profile_reset(c).await;
    (lsn(c).await.1, bench.rig.pg_cpu_s())
}

/// A half's end: its statements (profiled), every task succeeded, its WAL and the
/// cluster's CPU per task since `from` as `{prefix}_wal_bytes_per_task` and
/// `{prefix}_cpu_us_per_task_postgres`, its database dropped.
async fn report(bench: &mut Bench, c: Client, db: &str, prefix: &str, n: u32, from: (i64, f64)) {
    let (wal, cpu) = (lsn(&c).await.1 - from.0, bench.rig.pg_cpu_s() - from.1);
    profile_print(&c, prefix, n).await;
    bench.rig.check_all_succeeded(&c, db, n.into()).await;
    let per_task = f64::from(n);
    result(
        &format!("{prefix}_wal_bytes_per_task"),
        fixed(wal as f64 / per_task, 0),
        "bytes",
    );
    result(
        &format!("{prefix}_cpu_us_per_task_postgres"),
        fixed(cpu * 1e6 / per_task, 1),
        "us",
    );
    bench.rig.drop_db(db, c).await;
}

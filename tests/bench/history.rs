//! history: rows and WAL per finished task, by table (issue 13). W1's workload with 1
//! worker, from a checkpoint: history rows per task, and the WAL of the insert and of the
//! run, whole and split by relation (pg_waldump: each record counted whole for the
//! relation of its first block; commit records and the like under `none`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio_postgres::Client;

use crate::report::{fixed, result, Progress};
use crate::rig::exec;
use crate::w1::insert_noops;
use crate::{sql, Bench};

const DB: &str = "bench_history";

pub async fn run(bench: &mut Bench) {
    let n = bench.sizes.w1;
    let c = bench.rig.new_db(DB).await;
    // The WAL of the whole part kept on disk for pg_waldump (checkpoints recycle it).
    exec(&bench.rig.admin, sql::WAL_KEEP).await;
    exec(&bench.rig.admin, sql::RELOAD_CONF).await;
    exec(&c, sql::CHECKPOINT).await;
    let lsn0 = lsn(&c).await;
    insert_noops(&c, n).await;
    exec(&c, sql::CHECKPOINT).await;
    let lsn1 = lsn(&c).await;
    let args = bench.worker_args.clone();
    bench.rig.start_runtime(DB, 1, "artex", &args);
    let mut progress = Progress::new("history", n.into());
    bench.rig.drained(&c, &mut progress).await;
    bench.rig.stop_runtime().await;
    drop(c);
    bench.rig.wait_idle(DB).await;
    let c = bench.rig.client(DB).await;
    let lsn2 = lsn(&c).await;
    bench.rig.check_all_succeeded(&c, DB, n.into()).await;
    println!("# History: {n} tasks, 1 planner + 1 worker");
    let rows: i64 = c
        .query_one(sql::HISTORY_ROWS, &[])
        .await
        .expect("history rows")
        .get(0);
    let per_task = |x: i64, decimals| fixed(x as f64 / f64::from(n), decimals);
    result("history_rows_per_task", per_task(rows, 2), "rows");
    result(
        "history_wal_bytes_per_task_insert",
        per_task(lsn1.1 - lsn0.1, 0),
        "bytes",
    );
    result(
        "history_wal_bytes_per_task_run",
        per_task(lsn2.1 - lsn1.1, 0),
        "bytes",
    );
    match pg_waldump() {
        Some(waldump) => {
            let map = relmap(&c).await;
            let wal = bench.rig.pgdata().join("pg_wal");
            for (label, from, to) in [("insert", &lsn0, &lsn1), ("run", &lsn1, &lsn2)] {
                let split = wal_by_relation(&waldump, &wal, &from.0, &to.0, &map).await;
                for (rel, bytes) in split {
                    result(
                        &format!("history_wal_bytes_per_task_{label}_{rel}"),
                        per_task(bytes, 0),
                        "bytes",
                    );
                }
            }
        }
        None => println!("# history: pg_waldump not found, no WAL split"),
    }
    exec(&bench.rig.admin, sql::WAL_KEEP_RESET).await;
    exec(&bench.rig.admin, sql::RELOAD_CONF).await;
    bench.rig.drop_db(DB, c).await;
}

/// The WAL position: as pg_waldump takes it, and in bytes.
pub async fn lsn(c: &Client) -> (String, i64) {
    let r = c
        .query_one(sql::WAL_LSN, &[])
        .await
        .expect("the WAL position");
    (r.get(0), r.get(1))
}

/// pg_waldump: on PATH, else beside the server's programs.
fn pg_waldump() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("pg_waldump"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let pg_ctl = artex::dev_db::find_server_binaries().ok()?.join("pg_ctl");
        let dir = pg_ctl.canonicalize().ok()?.parent()?.to_path_buf();
        Some(dir.join("pg_waldump")).filter(|p| p.is_file())
    })
}

/// Each relfilenode of artex's schema and the name its WAL counts under.
async fn relmap(c: &Client) -> HashMap<String, String> {
    let rows = c.query(sql::RELMAP, &[]).await.expect("the relations");
    rows.iter()
        .map(|r| (r.get::<_, i64>(0).to_string(), r.get(1)))
        .collect()
}

/// WAL bytes from `from` to `to` by relation, in name order.
async fn wal_by_relation(
    waldump: &PathBuf,
    wal: &std::path::Path,
    from: &str,
    to: &str,
    map: &HashMap<String, String>,
) -> BTreeMap<String, i64> {
    let mut child = Command::new(waldump)
        .arg("-p")
        .arg(wal)
        .args(["-s", from, "-e", to])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("pg_waldump");
    let mut lines = BufReader::new(child.stdout.take().expect("its output")).lines();
    let mut sum = BTreeMap::new();
    while let Some(line) = lines.next_line().await.expect("pg_waldump's output") {
        if let Some((rel, bytes)) = record(&line, map) {
            *sum.entry(rel).or_insert(0) += bytes;
        }
    }
    let _ = child.wait().await;
    sum
}

/// One pg_waldump line: the relation of its first block (`none`, or `other` outside
/// artex's schema) and the record's total length.
fn record(line: &str, map: &HashMap<String, String>) -> Option<(String, i64)> {
    let tot = line.split("len (rec/tot):").nth(1)?;
    let tot: i64 = tot
        .split(',')
        .next()?
        .split('/')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    // The first `rel SPC/DB/NODE`, as the bash bench's awk matched it.
    let node = line.split("rel ").skip(1).find_map(|rest| {
        let path = rest.split([' ', ',']).next()?;
        let parts: Vec<&str> = path.split('/').collect();
        let digits = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        (parts.len() == 3 && parts.iter().all(digits)).then(|| parts[2].to_string())
    });
    let rel = match node {
        Some(node) => map.get(&node).cloned().unwrap_or_else(|| "other".into()),
        None => "none".into(),
    };
    Some((rel, tot))
}

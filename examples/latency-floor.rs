//! W2's floor (scripts/bench.sh): the least a PostgreSQL queue can do between an insert
//! and a handler start, measured the way W2 measures artex. One session LISTENs on
//! `floor_jobs`; each notification (or a 200 ms poll) claims what is runnable with
//! `for update skip locked` in one durable statement, and what it claimed "starts" when
//! that statement returns: its wall-clock time is written back with the job's end
//! (`started_us`, Unix microseconds), so the bench compares it with the insert's
//! `created_at` exactly as it does artex's `stamp` handler.
//!
//! `latency-floor setup URL` creates the table (a statement trigger sends the NOTIFY, as
//! artex's insert trigger does); `latency-floor run URL N` serves until N jobs ended.
//! It prints `listening` once it is.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};

const SETUP: &str = "
    create table if not exists floor_jobs (
        id bigint generated always as identity primary key,
        status smallint not null default 0,
        created_at timestamptz not null default now(),
        started_us bigint,
        warmup boolean not null default false);
    create index if not exists floor_jobs_runnable on floor_jobs (id) where status = 0;
    create or replace function floor_jobs_notify() returns trigger language plpgsql as $$
    begin perform pg_notify('floor_jobs', ''); return null; end $$;
    create or replace trigger floor_jobs_notify after insert on floor_jobs
        for each statement execute function floor_jobs_notify();";

// The claim: one statement, one durable commit, as a queue's dequeue is.
const CLAIM: &str = "update floor_jobs set status = 1
    where id in (select id from floor_jobs where status = 0 order by id limit 100
                 for update skip locked)
    returning id";

const DONE: &str = "update floor_jobs set status = 2, started_us = $2 where id = any($1)";

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

async fn run(url: &str, jobs: Option<u64>) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("latency-floor: connection ended: {e}");
                    break;
                }
            }
        }
    });
    let Some(jobs) = jobs else {
        return client.batch_execute(SETUP).await;
    };
    let claim = client.prepare(CLAIM).await?;
    let done = client.prepare(DONE).await?;
    client.batch_execute("listen floor_jobs").await?;
    // The bench starts inserting once it reads this.
    println!("listening");
    let mut ended = 0u64;
    while ended < jobs {
        // A notification, or the poll; every wake-up already queued folds into this one.
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
        while rx.try_recv().is_ok() {}
        loop {
            let ids: Vec<i64> = client
                .query(&claim, &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if ids.is_empty() {
                break;
            }
            let started = now_us();
            client.execute(&done, &[&ids, &started]).await?;
            ended += ids.len() as u64;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (url, jobs) = match args.get(1..).unwrap_or_default() {
        [cmd, url] if cmd == "setup" => (url, None),
        [cmd, url, n] if cmd == "run" => match n.parse::<u64>() {
            Ok(n) => (url, Some(n)),
            Err(e) => {
                eprintln!("latency-floor: job count '{n}': {e}; expected a whole number");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: latency-floor setup URL | latency-floor run URL JOBS");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latency-floor: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(url, jobs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency-floor: {e}");
            ExitCode::FAILURE
        }
    }
}

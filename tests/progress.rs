//! A running task's progress (`ctx.progress` in a handler), with real planner and worker
//! processes: however often a handler reports, its worker writes about once a second and
//! once more with the outcome, no history row; the values reach `artex task show` (text
//! and JSON), `/events` as `event: progress` and `artex events tail --follow --progress`.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use artex_actors::blackboard::NewTask;
use artex_testkit::http::Request;
use chrono::{DateTime, Utc};
use common::procs::{wait_for, wait_status, worker_http, Proc};
use common::{run_cli, TestDb};
use serde_json::{json, Value};
use uuid::Uuid;

/// (progress, message, progress_at, status) of `id`.
async fn progress_of(
    c: &tokio_postgres::Client,
    id: Uuid,
) -> (Option<f32>, Option<String>, Option<DateTime<Utc>>, String) {
    let r = c
        .query_one(
            "select progress, progress_message, progress_at, status::text
             from artex.tasks where id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[tokio::test]
async fn ten_thousand_reports_are_written_about_once_a_second_and_the_last_with_the_outcome() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    // 10,000 reports in 3 s, the last value held 1.5 s: about 5 s of running.
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new(
                "progress",
                json!({ "steps": 10000, "ms": 3000, "hold_ms": 1500 }),
            ),
            "test",
        )
        .await
        .unwrap();
    // Every version of the progress the row went through, read every 20 ms (a write
    // lives at least ~1 s: none is missed).
    let mut written = BTreeSet::new();
    let mut seen_running = Vec::new();
    let status = loop {
        let (p, m, at, status) = progress_of(&c, id).await;
        if let Some(at) = at {
            written.insert(at);
        }
        if status == "running" {
            if let (Some(p), Some(m)) = (p, m) {
                seen_running.push((p, m));
            }
        }
        if status != "running" && status != "assigned" && status != "pending" {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, "succeeded");
    // About one write a second over ~5 s, plus the last: far from 10,000.
    assert!(
        (3..=9).contains(&written.len()),
        "{} progress writes for 10,000 reports: {written:?}",
        written.len()
    );
    let gaps: Vec<i64> = written
        .iter()
        .zip(written.iter().skip(1))
        .map(|(a, b)| (*b - *a).num_milliseconds())
        .collect();
    // The throttle: writes at least ~a second apart, but for the last one (the outcome's).
    assert!(
        gaps[..gaps.len() - 1].iter().all(|g| *g >= 900),
        "writes closer than the throttle allows: {gaps:?} ms"
    );
    // Seen while it ran: values between 0 and 1 with their messages, rising.
    assert!(seen_running.len() > 10, "{seen_running:?}");
    assert!(seen_running.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(seen_running.iter().any(|(p, _)| *p > 0.0 && *p < 1.0));
    let (p, m) = &seen_running[seen_running.len() / 2];
    let step = (*p * 10000.0).round() as i64;
    assert_eq!(m, &format!("step {step} of 10000"));
    // The last value stays, and no history row was written for any of it.
    let (p, m, _, _) = progress_of(&c, id).await;
    assert_eq!((p, m.as_deref()), (Some(1.0), Some("step 10000 of 10000")));
    let history = common::lines_of(
        &c,
        "select coalesce(from_status::text, 'new') || '>' || to_status::text
         from artex.task_transitions where task_id = $1 order by at, id",
        id,
    )
    .await;
    assert_eq!(
        history,
        ["new>pending", "assigned>running", "running>succeeded"]
    );

    // `artex task show`, text and JSON.
    let (code, out, err) = run_cli(&db.url, &["task", "show", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("progress:"))
        .unwrap_or_else(|| panic!("no progress line in:\n{out}"));
    assert!(
        line.contains("100% [####################] step 10000 of 10000 (at "),
        "{line}"
    );
    let (code, out, err) = run_cli(&db.url, &["task", "show", &id.to_string(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let task = v.get("task").unwrap_or(&v);
    assert_eq!(task["progress"], json!(1.0), "{out}");
    assert_eq!(task["progress_message"], json!("step 10000 of 10000"));
    assert!(task["progress_at"].is_string());
}

#[tokio::test]
async fn a_task_that_ends_before_the_first_periodic_write_keeps_its_last_value() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let ids = db
        .bb
        .operator()
        .submit_many(
            &(0..20)
                .map(|_| NewTask::new("progress", json!({ "steps": 500, "ms": 0 })))
                .collect::<Vec<_>>(),
            "test",
        )
        .await
        .unwrap();
    for id in ids {
        wait_status(&db.bb, id, "succeeded", Duration::from_secs(30)).await;
        let (p, m, at, _) = progress_of(&c, id).await;
        assert_eq!(
            (p, m.as_deref()),
            (Some(1.0), Some("step 500 of 500")),
            "{id}"
        );
        assert!(at.is_some());
    }
}

#[tokio::test]
async fn progress_reaches_server_sent_events_as_progress_events() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let w = Proc::worker("worker", &db.url, &[]);
    let http = worker_http(&c, &w).await;
    let mut stream = Request::get("/events")
        .header("Accept", "text/event-stream")
        .bearer(common::READ_TOKEN)
        .start(&http)
        .unwrap();
    assert_eq!(stream.head().unwrap().status, 200);
    let id = db
        .bb
        .operator()
        .submit(
            // A step a second: each periodic write has a new value.
            &NewTask::new("progress", json!({ "steps": 4, "ms": 10000 })),
            "test",
        )
        .await
        .unwrap();
    // Task events carry an id; progress events none (not durable, not replayed). Lines
    // of one event come together; a blank line ends it (chunk sizes are skipped).
    let (mut event, mut with_id) = (None, false);
    let mut progress = Vec::new();
    while progress.len() < 3 {
        let mut line = String::new();
        assert!(stream.read_line(&mut line).unwrap() > 0, "the stream ended");
        let line = line.trim_end();
        if line.is_empty() {
            (event, with_id) = (None, false);
        } else if let Some(e) = line.strip_prefix("event: ") {
            event = Some(e.to_string());
        } else if line.starts_with("id: ") {
            with_id = true;
        } else if let Some(data) = line.strip_prefix("data: ") {
            if event.as_deref() == Some("progress") {
                assert!(!with_id, "a progress event with an id: {data}");
                let v: Value = serde_json::from_str(data).unwrap();
                assert_eq!(v["task_id"], json!(id.to_string()), "{v}");
                assert_eq!(v["kind"], json!("progress"));
                assert!(v["at"].is_string());
                progress.push(v);
            }
        }
    }
    let fractions: Vec<f64> = progress
        .iter()
        .map(|v| v["progress"].as_f64().unwrap())
        .collect();
    assert!(fractions.windows(2).all(|w| w[0] < w[1]), "{fractions:?}");
    assert!(
        fractions.iter().all(|f| (0.25..=1.0).contains(f)),
        "{fractions:?}"
    );
    let step = (fractions[0] * 4.0).round() as i64;
    assert_eq!(progress[0]["message"], json!(format!("step {step} of 4")));
    wait_for("the task to finish", Duration::from_secs(30), || async {
        (progress_of(&c, id).await.3 == "succeeded").then_some(())
    })
    .await;
}

#[tokio::test]
async fn events_tail_follow_progress_prints_progress_lines_beside_the_task_events() {
    use std::io::BufRead;
    let db = TestDb::new().await;
    let _p = Proc::planner("planner", &db.url, &[]);
    let _w = Proc::worker("worker", &db.url, &[]);
    let mut tail = std::process::Command::new(common::artex_bin())
        .args(["events", "tail", "--follow", "--progress"])
        .env("ARTEX_DATABASE_URL", &db.url)
        .env("ARTEX_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("artex events tail");
    let stdout = tail.stdout.take().unwrap();
    let (lines, read) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    // Following once it printed a first task's events; its progress session connects
    // meanwhile (a value written before would be missed: the task below reports for
    // 4 s, and at least 2 of its 4 values are asked for — on a loaded machine the
    // session has been seen to connect after the first).
    let first = db
        .bb
        .operator()
        .submit(&NewTask::new("echo", json!({})), "test")
        .await
        .unwrap();
    let next = |what: &str| -> Value {
        let line = read
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no line from artex events tail: waiting for {what}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    while next("the first task's events")["task_id"] != json!(first.to_string()) {}
    let id = db
        .bb
        .operator()
        .submit(
            &NewTask::new("progress", json!({ "steps": 4, "ms": 10000 })),
            "test",
        )
        .await
        .unwrap();
    let (mut progress, mut ended) = (Vec::new(), false);
    while !ended {
        let v = next("the progress task's progress and end");
        if v["task_id"] != json!(id.to_string()) {
            continue;
        }
        if v["event"] == json!("progress") {
            assert!(
                v.get("position").is_none(),
                "progress has no feed position: {v}"
            );
            assert_eq!(v["kind"], json!("progress"));
            progress.push(v["progress"].as_f64().unwrap());
        } else {
            assert!(v["position"].is_string(), "a task event: {v}");
            ended = v["to"] == json!("succeeded");
        }
    }
    // The progress events and the task's events come through two sessions of the
    // server (a LISTEN and the feed's reads): the last value may follow the end.
    while let Ok(line) = read.recv_timeout(Duration::from_secs(2)) {
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        if v["task_id"] == json!(id.to_string()) && v["event"] == json!("progress") {
            progress.push(v["progress"].as_f64().unwrap());
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    assert_eq!(progress.last(), Some(&1.0));
}

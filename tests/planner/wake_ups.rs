//! A round's wake-ups: the tasks they carry (a fair kind's with its priority and key), and
//! the connections a planner pushes them over.

use artex_actors::assigner::Assigner;
use artex_actors::blackboard::{NewTask, Push};
use artex_actors::waker::Waker;
use serde_json::json;

use crate::common::{self, count, fixtures, status_of, TestDb};
use crate::config;

/// A worker's wake-up carries the tasks it was given, as its own read would return them,
/// in start order; a big one is left to the read (a plain wake-up). The worker's read
/// then sees the versions the wake-up carried, so a late wake-up is never taken again.
#[tokio::test]
async fn a_wake_up_carries_the_assigned_tasks_and_a_later_read_sees_them() {
    use artex_actors::blackboard::carried::{carries_assignments, parse_carried};
    let db = TestDb::new().await;
    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let mut listener = db
        .bb
        .feed()
        .listen(&["artex_w_w1".to_string()])
        .await
        .unwrap();
    let mut tasks: Vec<NewTask> = (0..4)
        .map(|i| NewTask {
            priority: 10 - i,
            ..NewTask::new("echo", json!({ "n": i }))
        })
        .collect();
    tasks.push(NewTask {
        priority: 0,
        ..NewTask::new("echo", json!({ "big": "x".repeat(2000) }))
    });
    let ids = db.bb.operator().submit_many(&tasks, "test").await.unwrap();
    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((report.assigned, report.workers_notified), (5, 1));

    let mut carried = Vec::new();
    let mut plain = 0;
    while carried.len() < 4 || plain == 0 {
        let n = listener.recv().await.expect("the session is up");
        if carries_assignments(&n.payload) {
            carried.extend(parse_carried(&n.payload).unwrap());
        } else {
            assert_eq!(n.payload, "", "the big task's plain wake-up");
            plain += 1;
        }
    }
    let got: Vec<_> = carried.iter().map(|c| c.task.id).collect();
    assert_eq!(got, ids[..4], "the small ones, in start order");
    for (c, i) in carried.iter().zip(0..) {
        assert_eq!(c.task.payload, json!({ "n": i }));
        assert_eq!((c.task.epoch, c.task.kind.as_str()), (1, "echo"));
        assert!(c.lease_until_ms > 0.0);
    }
    let read = db
        .bb
        .worker()
        .read_assigned("w1", 10, i64::MAX, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read.tasks.len(),
        5,
        "the read returns all five, the big one too"
    );
    assert!(
        carried.iter().all(|c| read.snapshot.sees(c.xid)),
        "{:?}",
        read.snapshot
    );
    assert!(read.db_clock_ms > 0.0);
}

/// A fair kind's tasks come carried too, each with its priority and limit key, which the
/// worker's local queue takes turns by (migrations/V64; before, their worker got a plain
/// wake-up and read them).
#[tokio::test]
async fn a_fair_kind_s_wake_up_carries_its_tasks_with_their_priority_and_key() {
    use artex_actors::blackboard::carried::{carries_assignments, parse_carried};
    use artex_actors::blackboard::LimitSpec;
    let db = TestDb::new().await;
    let ops = db.bb.operator();
    fixtures::worker(&db.bb, "w1", &["fk", "echo"], 10).await;
    let spec = LimitSpec {
        fair: true,
        concurrency: None,
        key_concurrency: None,
        rate_per_sec: None,
    };
    ops.set_kind_limit("fk", &spec, "test").await.unwrap();
    let mut listener = db
        .bb
        .feed()
        .listen(&["artex_w_w1".to_string()])
        .await
        .unwrap();
    let tasks = vec![
        NewTask {
            limit_key: Some("a".into()),
            priority: 5,
            ..NewTask::new("fk", json!({ "n": 0 }))
        },
        NewTask::new("fk", json!({ "n": 1 })),
        NewTask::new("echo", json!({ "n": 2 })),
    ];
    let ids = ops.submit_many(&tasks, "test").await.unwrap();
    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!((report.assigned, report.workers_notified), (3, 1));
    let mut carried = Vec::new();
    while carried.len() < 3 {
        let n = listener.recv().await.expect("the session is up");
        assert!(
            carries_assignments(&n.payload),
            "every task carried, no plain wake-up: {:?}",
            n.payload
        );
        carried.extend(parse_carried(&n.payload).unwrap());
    }
    let got: Vec<_> = carried
        .iter()
        .map(|c| {
            (
                c.task.id,
                c.task.kind.as_str(),
                c.task.priority,
                c.task.limit_key.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (ids[0], "fk", 5, Some("a")),
            (ids[1], "fk", 0, None),
            (ids[2], "echo", 0, None)
        ],
        "in start order; a plain kind's task carries no key"
    );
}

/// Reads one `POST /wake` from a fake worker's side of the connection; returns its body.
async fn read_push(sock: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut length = 0;
    loop {
        let mut line = String::new();
        assert!(
            sock.read_line(&mut line).await.unwrap() > 0,
            "the push ended early"
        );
        if line.trim_end().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    sock.read_exact(&mut body).await.unwrap();
    String::from_utf8(body).unwrap()
}

/// Found by the hour-long soak: a planner kept the kept-alive wake-up connection of every
/// worker that died, one descriptor each (in CLOSE_WAIT) for as long as it lived. A
/// connection the worker closes between pushes is now closed by the planner at once, and
/// the next push opens another.
#[tokio::test]
async fn a_wake_up_connection_the_worker_closes_is_closed_by_the_planner_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::time::timeout;

    let db = TestDb::new().await;
    let waker = Waker::start(db.bb.planner(), "test-planner").await.unwrap();
    let worker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = worker.local_addr().unwrap().to_string();
    let within = std::time::Duration::from_secs(30);

    waker.greet(&[("w1".to_string(), addr.clone())]);
    let (sock, _) = timeout(within, worker.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    assert_eq!(read_push(&mut sock).await, r#"[""]"#, "a plain wake-up");
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    sock.get_mut().write_all(answer).await.unwrap();
    // The worker's side goes, as a killed process's does (FIN), and no push follows.
    sock.get_mut().shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(within, sock.read_to_end(&mut rest))
        .await
        .expect("the planner closes its side instead of keeping the descriptor")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // The link lives on: the next push reaches the worker over a new connection.
    waker.deliver(vec![Push {
        worker: "w1".into(),
        addr: addr.clone(),
        payloads: vec!["cancel".into()],
        tasks: Vec::new(),
    }]);
    let (sock, _) = timeout(within, worker.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    assert_eq!(read_push(&mut sock).await, r#"["cancel"]"#);
}

/// Found by CI: a killed worker's listening socket may take a connection while its
/// process is being torn down, and reset it; the push is not refused, so its tasks were
/// left to their leases. A reset push keeps them the worker's (it may have read them), and
/// the first probe refused gives them back.
#[tokio::test]
async fn a_push_reset_keeps_its_tasks_until_a_probe_is_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (id, _waker, port) = a_push_reset(&db).await;
    assert_eq!(
        status_of(&c, id).await,
        "assigned",
        "a reset push may have been read"
    );
    // The port closes: the next probe is refused, and the task comes back.
    drop(port);
    common::procs::wait_for("the task given back", WITHIN, || async {
        (status_of(&c, id).await == "pending").then_some(())
    })
    .await;
    assert_eq!(
        common::last_reason(&c, id).await.as_deref(),
        Some("wake-up not delivered to worker w1")
    );
}

/// A worker heard from since its push was reset is alive (polling: a proxy in front of
/// it refuses, say): a refused probe then gives nothing back, it reads its tasks itself.
/// Its address answers again afterwards, so that the probe loop is seen past the
/// refused probe's handling (a give-back there would be written by then).
#[tokio::test]
async fn a_worker_heard_from_since_its_push_failed_keeps_its_tasks_when_a_probe_is_refused() {
    use tokio::io::{AsyncWriteExt, BufReader};
    use tokio::time::timeout;

    let db = TestDb::new().await;
    let c = db.client().await;
    let (id, waker, port) = a_push_reset(&db).await;
    let addr = port.local_addr().unwrap();
    db.bb.worker().heartbeat("w1", 0, 10).await.unwrap();
    drop(port);
    common::procs::wait_for("the worker found polling", WITHIN, || async {
        waker.polling().contains(&"w1".to_string()).then_some(())
    })
    .await;
    // The address answers the next probe: the worker is reachable again.
    let port = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (sock, _) = timeout(WITHIN, port.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    assert_eq!(read_push(&mut sock).await, r#"[""]"#, "a probe");
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    sock.get_mut().write_all(answer).await.unwrap();
    common::procs::wait_for("the worker reachable again", WITHIN, || async {
        (!waker.unreachable().contains(&"w1".to_string())).then_some(())
    })
    .await;
    assert_eq!(status_of(&c, id).await, "assigned");
}

const WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A task assigned to worker `w1`, whose port (returned, still open) read the push that
/// announced it and reset the connection, as a dying process's kernel does; returned
/// once the Waker found the worker unreachable.
async fn a_push_reset(db: &TestDb) -> (uuid::Uuid, Waker, tokio::net::TcpListener) {
    use tokio::io::BufReader;
    use tokio::time::timeout;

    fixtures::worker(&db.bb, "w1", &["echo"], 10).await;
    let id = fixtures::task(&db.bb, "echo").await;
    let report = Assigner::run_once(&db.bb.planner(), &config())
        .await
        .unwrap();
    assert_eq!(report.assigned, 1);
    let waker = Waker::start(db.bb.planner(), "test-planner").await.unwrap();
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    waker.deliver(vec![Push {
        worker: "w1".into(),
        addr: port.local_addr().unwrap().to_string(),
        payloads: vec![String::new()],
        tasks: vec![id],
    }]);
    let (sock, _) = timeout(WITHIN, port.accept()).await.unwrap().unwrap();
    let mut sock = BufReader::new(sock);
    read_push(&mut sock).await;
    sock.get_ref().set_zero_linger().unwrap();
    drop(sock);
    common::procs::wait_for("the push to fail", WITHIN, || async {
        waker
            .unreachable()
            .contains(&"w1".to_string())
            .then_some(())
    })
    .await;
    (id, waker, port)
}

/// A worker whose wake-up address stops answering (its port behind a proxy that refuses)
/// is found alive by its heartbeats, given work and polls for it; when the address
/// answers again, pushes go through again and every reader of the roster says so.
#[tokio::test]
async fn a_worker_whose_wake_address_comes_back_is_pushed_to_again() {
    use artex_testkit::proxy::Proxy;
    use common::procs::{http_get, wait_for, worker_id, Proc};
    use std::time::Duration;

    let db = TestDb::new().await;
    let c = db.client().await;
    // The worker's port, known before it starts, so that its wake address can be a proxy
    // in front of it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = format!("127.0.0.1:{port}");
    let proxy = Proxy::start(&http);
    proxy.refuse(true);
    let w = Proc::worker(
        "w",
        &db.url,
        &["--http", &http, "--wake-addr", &proxy.addr()],
    );
    let id = worker_id(&c, &w).await;
    let _p = Proc::planner("p", &db.url, &[]);
    let bb = db.bb.clone();
    let wake_ups = || {
        let (bb, id) = (bb.clone(), id.clone());
        async move {
            let workers = bb.operator().workers(100).await.unwrap();
            workers
                .into_iter()
                .find(|w| w.id == id)
                .map(|w| w.wake_ups.to_string())
        }
    };
    for _ in 0..3 {
        fixtures::task(&db.bb, "echo").await;
    }
    wait_for(
        "the tasks done by polling",
        Duration::from_secs(30),
        || async {
            (count(
                &c,
                "select count(*) from artex.tasks where status = 'succeeded'",
            )
            .await
                == 3)
                .then_some(())
        },
    )
    .await;
    // The planner's first push (its greeting, or a round's wake-up) fails; the worker may
    // have claimed and run the three by its own polls before that.
    wait_for(
        "the planner to find the worker unreachable",
        Duration::from_secs(10),
        || async { (wake_ups().await.as_deref() == Some("unreachable, polling")).then_some(()) },
    )
    .await;
    let health = wait_for(
        "/health to say it polls",
        Duration::from_secs(10),
        || async {
            let (_, body) = http_get(&http, "/health").ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (v["wake_ups"] == "unreachable, polling").then_some(v)
        },
    )
    .await;
    assert_eq!(health["ready"], true, "a note, not a failure: {health}");

    // The address answers again: the planner's probe goes through, the record is cleared,
    // and the worker hears of it with its next heartbeat.
    proxy.refuse(false);
    wait_for(
        "pushes to go through again",
        Duration::from_secs(20),
        || async { (wake_ups().await.as_deref() == Some("pushed")).then_some(()) },
    )
    .await;
    wait_for("/health to say pushed", Duration::from_secs(10), || async {
        let (_, body) = http_get(&http, "/health").ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (v["wake_ups"] == "pushed").then_some(())
    })
    .await;
    // Pushes go over one kept-alive connection: what went up through the proxy counts.
    let pushed_before = proxy.up_bytes();
    for _ in 0..2 {
        fixtures::task(&db.bb, "echo").await;
    }
    wait_for("the new tasks done", Duration::from_secs(30), || async {
        (count(
            &c,
            "select count(*) from artex.tasks where status = 'succeeded'",
        )
        .await
            == 5)
            .then_some(())
    })
    .await;
    assert!(
        proxy.up_bytes() > pushed_before,
        "no push reached the worker after its address came back"
    );
    assert!(proxy
        .first_lines()
        .iter()
        .all(|l| l.starts_with("POST /wake")));
    assert!(
        w.log_text()
            .contains("planners reach this worker's wake-up address again"),
        "{}",
        w.log_text()
    );
}

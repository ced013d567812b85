//! The traceparent a submission carries is stored with its task, from every surface;
//! an invalid one is refused naming the field, and nothing is written.

use artex_actors::blackboard::NewTask;
use artex_actors::trace::TraceParent;
use artex_testkit::http::Request;
use serde_json::json;
use uuid::Uuid;

use crate::common::procs::{serve_address, Proc};
use crate::common::{count, fixtures, run_cli, TestDb};

const WRITE_TOKEN: &str = "tracing-write-token";

/// Distinct valid contexts, one per surface, so each row shows where its value came from.
fn tp(n: u8) -> String {
    format!(
        "00-{:032x}-{:016x}-01",
        0x4bf9_0000_u128 + n as u128,
        0x00f0_0000 + n as u64
    )
}

async fn stored(c: &tokio_postgres::Client, id: Uuid) -> Option<String> {
    c.query_one("select traceparent from artex.tasks where id = $1", &[&id])
        .await
        .expect("the task's row")
        .get(0)
}

/// `artex serve` with a write token; (process, address, token folder).
async fn serve(url: &str) -> (Proc, String, tempfile::TempDir) {
    let tokens = tempfile::tempdir().expect("token folder");
    let file = tokens.path().join("write");
    std::fs::write(&file, WRITE_TOKEN).expect("write token");
    let p = Proc::start(
        "serve",
        url,
        &["serve", "--http", "127.0.0.1:0"],
        &[("ARTEX_WRITE_TOKEN_FILE", file.to_str().unwrap())],
    );
    let addr = serve_address(&p).await;
    (p, addr, tokens)
}

fn post(addr: &str, body: &str, traceparent: Option<&str>) -> artex_testkit::http::Response {
    let mut r = Request::new("POST", "/api/v1/tasks")
        .bearer(WRITE_TOKEN)
        .json_text(body);
    if let Some(tp) = traceparent {
        r = r.header("traceparent", tp);
    }
    r.send(addr).expect("POST /api/v1/tasks")
}

#[tokio::test]
async fn a_traceparent_is_stored_from_every_surface() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::register(&db.bb, &fixtures::registration("w1", &["echo"], 4)).await;

    // The library: one task, a keyed batch (its own statement), and `submit_in`.
    let ops = db.bb.operator();
    let lib = NewTask {
        traceparent: Some(tp(1)),
        ..NewTask::new("echo", json!({}))
    };
    let id = ops.submit(&lib, "test").await.unwrap();
    assert_eq!(stored(&c, id).await, Some(tp(1)));
    let keyed = NewTask {
        unique_key: Some("k".into()),
        traceparent: Some(tp(2)),
        ..NewTask::new("echo", json!({}))
    };
    let id = ops.submit(&keyed, "test").await.unwrap();
    assert_eq!(stored(&c, id).await, Some(tp(2)));

    // SQL: `artex.submit`'s argument; a plain insert without it is simply not traced.
    let id: Uuid = c
        .query_one(
            "select id from artex.submit('echo', traceparent => $1)",
            &[&tp(3)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored(&c, id).await, Some(tp(3)));
    let id: Uuid = c
        .query_one(
            "insert into artex.tasks (kind) values ('echo') returning id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored(&c, id).await, None);
    // An older caller's call, with the fourteen arguments before it, still works.
    let id: Uuid = c
        .query_one(
            "select id from artex.submit('echo', '{}', 0, null, null, null, null, null, \
             null, false, 'old', null, null, null)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored(&c, id).await, None);

    // The CLI: the flag, and the TRACEPARENT variable a traced parent process sets.
    let (code, out, err) = run_cli(&db.url, &["submit", "echo", "--traceparent", &tp(4)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(stored(&c, out.trim().parse().unwrap()).await, Some(tp(4)));
    let out = std::process::Command::new(crate::common::artex_bin())
        .args(["submit", "echo"])
        .env("ARTEX_DATABASE_URL", &db.url)
        .env("TRACEPARENT", tp(5))
        .output()
        .expect("run artex");
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(stored(&c, id).await, Some(tp(5)));

    // The API: the header, for one task and for each task of a batch.
    let (_serve, addr, _tokens) = serve(&db.url).await;
    let one = post(&addr, r#"{"kind": "echo"}"#, Some(&tp(6)));
    assert_eq!(one.status, 201, "{}", one.text());
    let id = one.json()["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(stored(&c, id).await, Some(tp(6)));
    let batch = post(
        &addr,
        r#"[{"kind": "echo"}, {"kind": "echo"}]"#,
        Some(&tp(7)),
    );
    assert_eq!(batch.status, 201, "{}", batch.text());
    for id in batch.json()["ids"].as_array().unwrap() {
        let id = id.as_str().unwrap().parse().unwrap();
        assert_eq!(stored(&c, id).await, Some(tp(7)));
    }
    // Without the header (and tracing off here), none.
    let none = post(&addr, r#"{"kind": "echo"}"#, None);
    let id = none.json()["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(stored(&c, id).await, None);
}

#[tokio::test]
async fn an_invalid_traceparent_is_refused_naming_the_field() {
    let db = TestDb::new().await;
    let c = db.client().await;
    fixtures::register(&db.bb, &fixtures::registration("w1", &["echo"], 4)).await;
    let bad = [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "not a traceparent",
    ];
    let (_serve, addr, _tokens) = serve(&db.url).await;
    for tp in bad {
        // The library, before anything is sent.
        let task = NewTask {
            traceparent: Some(tp.into()),
            ..NewTask::new("echo", json!({}))
        };
        let e = db.bb.operator().submit(&task, "test").await.unwrap_err();
        assert!(e.to_string().contains("traceparent: "), "{tp}: {e}");
        assert!(e.to_string().contains("W3C traceparent"), "{tp}: {e}");

        // The API: 400, the header named.
        let r = post(&addr, r#"{"kind": "echo"}"#, Some(tp));
        assert_eq!(r.status, 400, "{tp}: {}", r.text());
        assert_eq!(r.json()["field"], "traceparent", "{}", r.text());
        assert!(r.json()["error"]
            .as_str()
            .unwrap()
            .contains("traceparent header: "));

        // The CLI: the option named.
        let (code, _, err) = run_cli(&db.url, &["submit", "echo", "--traceparent", tp]);
        assert_ne!(code, 0, "{tp}");
        assert!(err.contains("--traceparent: "), "{tp}: {err}");

        // SQL: `artex.submit` names the argument; a plain insert meets the column's check.
        let e = c
            .query(
                "select * from artex.submit('echo', traceparent => $1)",
                &[&tp],
            )
            .await
            .unwrap_err();
        assert!(
            format!("{e:?}").contains("artex.submit: traceparent"),
            "{tp}: {e:?}"
        );
        let e = c
            .execute(
                "insert into artex.tasks (kind, traceparent) values ('echo', $1)",
                &[&tp],
            )
            .await
            .unwrap_err();
        assert!(
            format!("{e:?}").contains("tasks_traceparent_check"),
            "{tp}: {e:?}"
        );
        let db_error = e.as_db_error().expect("a database error");
        assert_eq!(db_error.code().code(), "23514", "{tp}: {e:?}");
        assert_eq!(db_error.constraint(), Some("tasks_traceparent_check"));
    }
    assert_eq!(count(&c, "select count(*) from artex.tasks").await, 0);

    // An update that writes the column meets the same rule (V58: a trigger checks it
    // where it is written).
    let id: Uuid = c
        .query_one(
            "insert into artex.tasks (kind, traceparent) values ('echo', $1) returning id",
            &[&tp(9)],
        )
        .await
        .unwrap()
        .get(0);
    for bad_tp in bad {
        let e = c
            .execute(
                "update artex.tasks set traceparent = $2 where id = $1",
                &[&id, &bad_tp],
            )
            .await
            .unwrap_err();
        let db_error = e.as_db_error().expect("a database error");
        assert_eq!(db_error.code().code(), "23514", "{bad_tp}: {e:?}");
        assert_eq!(db_error.constraint(), Some("tasks_traceparent_check"));
        assert!(
            db_error.message().contains("not a W3C traceparent"),
            "{e:?}"
        );
    }
    for good in [Some(tp(10)), None] {
        c.execute(
            "update artex.tasks set traceparent = $2 where id = $1",
            &[&id, &good],
        )
        .await
        .unwrap();
        assert_eq!(stored(&c, id).await, good);
    }
}

/// The blackboard's rule (`artex.traceparent_valid`, which the insert's and the update's
/// triggers apply) and the Rust one every surface applies (`TraceParent::parse`) take
/// and refuse the same values.
#[tokio::test]
async fn the_sql_and_the_rust_traceparent_rules_agree() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cases = [
        good,
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        "fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        "",
        "not a traceparent",
    ];
    for tp in cases {
        let sql: bool = c
            .query_one("select artex.traceparent_valid($1)", &[&tp])
            .await
            .unwrap()
            .get(0);
        assert_eq!(sql, TraceParent::parse(tp).is_ok(), "{tp:?}");
    }
    assert!(
        TraceParent::parse(good).is_ok(),
        "the cases hold a valid one"
    );
}

//! schemathesis, an off-the-shelf property-based API tester, drives the real `artex serve`
//! and a real worker's uploads from `docs/openapi.json` alone (issue 25): every request it
//! makes from the document, valid or not, must be answered as the document says (status,
//! headers, body schema; valid input accepted, invalid refused; 405 for an undeclared
//! method; a deleted schedule gone). What a schema cannot say is in
//! `tests/api/schemathesis.toml`, each with why.
//!
//! Deterministic: a fixed seed and number of cases per operation (a failure replays);
//! `ARTEX_SCHEMATHESIS_SEED` runs another seed by hand. schemathesis is installed (pinned,
//! in a venv) by `scripts/test.sh`, which says where in `ARTEX_SCHEMATHESIS`.

use std::process::{Command, Output, Stdio};

use crate::common::procs::{serve_address, worker_http, Proc};
use crate::common::TestDb;
use crate::WRITE_TOKEN;

/// The seed CI runs.
const SEED: &str = "1";

/// Generated cases per operation and phase (as issue 25's run).
const CASES: &str = "30";

#[tokio::test]
async fn schemathesis_finds_the_api_doing_what_docs_openapi_json_says() {
    let Some(st) = std::env::var_os("ARTEX_SCHEMATHESIS") else {
        panic!(
            "ARTEX_SCHEMATHESIS is not set: run this test through scripts/test.sh (e.g. \
             scripts/test.sh -E 'binary(api) & test(schemathesis)'), which installs \
             schemathesis and says where it is"
        );
    };
    let seed = std::env::var("ARTEX_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.into());
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().expect("a folder");
    let token = dir.path().join("write-token");
    std::fs::write(&token, WRITE_TOKEN).expect("write token");
    let token = token.to_str().expect("a UTF-8 path");
    let uploads = dir.path().join("uploads");
    let serve = Proc::start(
        "serve",
        &db.url,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--write-token-file",
            token,
        ],
        &[],
    );
    let worker = Proc::worker(
        "schemathesis-worker",
        &db.url,
        &[
            "--write-token-file",
            token,
            "--upload-dir",
            uploads.to_str().expect("a UTF-8 path"),
        ],
    );
    let serve_addr = serve_address(&serve).await;
    let worker_addr = worker_http(&db.client().await, &worker).await;

    // `artex serve` takes every route but the uploads, which are a worker's: both at once.
    let runs = [
        ("artex serve", "serve", serve_addr, "--exclude-path-regex"),
        (
            "a worker's uploads",
            "uploads",
            worker_addr,
            "--include-path-regex",
        ),
    ]
    .map(|(what, name, addr, filter)| {
        let child = Command::new(&st)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // Hypothesis's own files (caches of Unicode tables and of constants) go with
            // the test's folder: none in the repository, none carried from a run to the next.
            .env(
                "HYPOTHESIS_STORAGE_DIRECTORY",
                dir.path().join(format!("hypothesis-{name}")),
            )
            .args(["--config-file", "tests/api/schemathesis.toml", "run"])
            .arg("docs/openapi.json")
            .args(["--url", &format!("http://{addr}")])
            .args(["-H", &format!("Authorization: Bearer {WRITE_TOKEN}")])
            .args(["-n", CASES, "--seed", &seed, "--workers", "1", "--no-color"])
            .args([filter, "^/api/v1/uploads"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting schemathesis ({st:?}): {e}"));
        (what, child)
    });
    let mut failed = Vec::new();
    for (what, child) in runs {
        let out: Output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .expect("the waiting thread")
            .expect("schemathesis's output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            // The summary: how many cases, in how long.
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            println!(
                "schemathesis against {what}, seed {seed}:\n{}",
                tail.join("\n")
            );
        } else {
            failed.push(format!(
                "schemathesis against {what}, seed {seed}: {}\n{text}",
                out.status
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

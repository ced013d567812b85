//! Each model action names the SQL it stands for, with the hash of that SQL as the model
//! was last reviewed against it: a changed statement fails here until the action is
//! reviewed and its hash updated.

use std::path::Path;

use artex_model::actions::ALL_SQL;
use artex_model::statements::{check_all, constant_text, digest, function_text};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("model/ lies in the repository")
}

#[test]
fn every_action_s_sql_is_as_reviewed() {
    let problems = check_all(root(), ALL_SQL);
    assert!(
        problems.is_empty(),
        "the SQL of model actions changed since they were reviewed:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_changed_statement_is_named_with_its_action() {
    // The check itself can fail: a repository whose RECLAIM lost its lease test.
    let dir = tempfile_dir();
    let real = std::fs::read_to_string(root().join("actors/src/blackboard/planner/reap.rs"))
        .expect("reap.rs");
    let broken = real.replacen("and lease_until < coalesce($1::timestamptz, now())", "", 1);
    assert_ne!(
        real, broken,
        "the reaper's lease test is where the test expects it"
    );
    let file = dir.join("actors/src/blackboard/planner/reap.rs");
    std::fs::create_dir_all(file.parent().expect("a folder")).expect("folders");
    std::fs::write(&file, broken).expect("write");
    let table: &[(&str, &[artex_model::statements::Sql])] =
        &[("Reclaim", artex_model::actions::RECLAIM_SQL)];
    let problems = check_all(&dir, table);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("RECLAIM") && problems[0].contains("review the model action Reclaim"),
        "{}",
        problems[0]
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn whitespace_alone_changes_no_hash() {
    assert_eq!(digest("select  1\n  from t"), digest("select 1 from t"));
    assert_ne!(digest("select 1 from t"), digest("select 2 from t"));
    let schema = "CREATE FUNCTION artex.f(a int) RETURNS int\n    AS $$\n select a\n$$;\nCREATE FUNCTION artex.g()";
    assert!(function_text(schema, "f").expect("f").ends_with("$$;\n"));
    assert!(function_text(schema, "h").is_err());
    let rust = "const A: &str = \"select 1\n    from t\";\n";
    assert_eq!(
        constant_text(rust, "A", "x.rs").expect("A"),
        "select 1\n    from t"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "artex-model-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    dir
}

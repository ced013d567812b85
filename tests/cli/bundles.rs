//! `bundle create`: its steps on standard error, its result with `--json`.

use crate::{artex, json_of, stderr, stdout};

/// `bundle create` tells its steps on standard error, a line each when it is no terminal
/// (a test, a log); `--json` prints the bundle's path, size and manifest.
#[test]
fn bundle_create_tells_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "keygen",
            "--secret",
            &p("key"),
            "--public",
            &p("key.pub"),
            "--json",
        ],
    );
    let v = json_of(&out);
    assert_eq!(v["public"], p("key.pub"), "{v}");
    // A "binary" that answers the schema question as artex does.
    let schema = stdout(&artex(None, None, &["schema", "--json"]));
    let bin = p("worker");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\nif [ \"$1\" = schema ]; then echo '{}'; exit 0; fi\nexit 1\n",
            schema.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let size = std::fs::metadata(&bin).unwrap().len();
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "create",
            "--binary",
            &bin,
            "--key",
            &p("key"),
            "--out",
            &p("b.zip"),
            "--json",
        ],
    );
    let v = json_of(&out);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "a line per step, no bar: {err}");
    assert!(
        lines[0].starts_with("artex: bundle: asking") && lines[0].contains("schema"),
        "{err}"
    );
    assert_eq!(
        lines[1],
        format!("artex: bundle: hashing and compressing {bin} ({size} bytes)")
    );
    assert!(lines[2].contains(&format!("wrote {}", p("b.zip"))), "{err}");
    assert!(
        !err.contains('\r'),
        "no redrawn bar off a terminal: {err:?}"
    );
    assert_eq!(v["path"], p("b.zip"), "{v}");
    assert_eq!(
        v["bytes"].as_u64(),
        Some(std::fs::metadata(p("b.zip")).unwrap().len()),
        "{v}"
    );
    assert_eq!(
        v["manifest"]["binary_sha256"].as_str().map(str::len),
        Some(64),
        "{v}"
    );
    assert!(v["manifest"]["schema"]["needs"].is_array(), "{v}");

    // What a worker would verify, before a rolling upgrade: the same manifest; refused
    // with a key it was not signed with.
    let info = json_of(&artex(
        None,
        None,
        &[
            "bundle",
            "info",
            &p("b.zip"),
            "--public-key",
            &p("key.pub"),
            "--json",
        ],
    ));
    assert_eq!(info["manifest"], v["manifest"], "{info}");
    assert_eq!(info["bytes"], v["bytes"], "{info}");
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "keygen",
            "--secret",
            &p("other"),
            "--public",
            &p("other.pub"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = artex(
        None,
        None,
        &[
            "bundle",
            "info",
            &p("b.zip"),
            "--public-key",
            &p("other.pub"),
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert!(stderr(&out).contains("signature"), "{}", stderr(&out));
}

//! How upgrades are set up: refused when not configured, and a worker will not start on
//! an upgrade folder that is not its own alone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::bundles::{Keys, TOKEN};
use crate::common::procs::{worker_http, Proc, FAST_WORKER};
use crate::common::TestDb;
use crate::curl_upgrade;

#[tokio::test]
async fn upgrades_are_refused_when_not_configured() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let keys = Keys::new();
    let w = Proc::worker("plain", &db.url, &[]);
    let http = worker_http(&c, &w).await;
    let (code, body) = curl_upgrade(&http, &keys.variant_bundle(1).0, Some(TOKEN), false);
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("upgrades not configured"),
        "{body}"
    );
}

#[tokio::test]
async fn an_upgrade_folder_not_ours_alone_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let db = TestDb::new().await;
    let keys = Keys::new();
    let root = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&str, PathBuf, &str)> = Vec::new();
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    cases.push(("mode 0777", open, "mode 0777"));
    let private = root.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    cases.push(("symlink", link, "symlink"));
    if nix::unistd::geteuid().is_root() {
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        cases.push(("another owner", theirs, "owned by uid 65534"));
    } else {
        eprintln!("the wrong-owner case needs root to make a folder someone else's");
    }
    let key_flags = |dir: &Path| {
        let mut f = keys.flags("unused");
        let at = f.iter().position(|a| a == "--upgrade-dir").unwrap();
        f[at + 1] = dir.to_string_lossy().into_owned();
        f
    };
    let refused = |what: &str, p: &mut Proc, folder: &Path, why: &str| {
        let status = p
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{what}: {} started anyway", p.name));
        assert!(!status.success(), "{what}: {status:?}");
        let log = p.log_text();
        assert!(
            log.contains("upgrade folder")
                && log.contains(&folder.display().to_string())
                && log.contains(why),
            "{what}: the message names the folder and what is wrong: {log}"
        );
    };
    for (what, folder, why) in &cases {
        let args: Vec<String> = ["worker".to_string()]
            .into_iter()
            .chain(FAST_WORKER.iter().map(|s| s.to_string()))
            .chain(key_flags(folder))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = Proc::start("worker", &db.url, &args, &[]);
        refused(what, &mut p, folder, why);
    }
    // The default folder, in the temp folder, is held to the same rule; `artex master`
    // checks it too.
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let default = tmp.join(format!("artex-upgrade-{}", nix::unistd::geteuid()));
    std::fs::create_dir(&default).unwrap();
    std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut flags = keys.flags("unused");
    flags.truncate(4); // key and token, no --upgrade-dir
    for command in ["worker", "master"] {
        let args: Vec<String> = [command.to_string()]
            .into_iter()
            .chain(FAST_WORKER.iter().map(|s| s.to_string()))
            .chain(flags.iter().cloned())
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let tmpdir = tmp.to_str().unwrap();
        let mut p = Proc::start(command, &db.url, &args, &[("TMPDIR", tmpdir)]);
        refused(
            &format!("default folder, {command}"),
            &mut p,
            &default,
            "mode 0777",
        );
    }
}

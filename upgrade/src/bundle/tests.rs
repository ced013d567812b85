//! Bundle tests: a valid round trip, and a hostile corpus written by hand, each case
//! asserting its own refusal and that nothing was left anywhere.

use super::*;
use std::collections::BTreeSet;
use std::io::Cursor;
use tempfile::TempDir;

/// A scratch root holding `bundle.zip` and the private `dest` directory, so "nothing
/// written outside dest" is checked by listing the root.
struct Scene {
    root: TempDir,
    zip: PathBuf,
    dest: PathBuf,
    key: SigningKey,
}

impl Scene {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("dest");
        fs::create_dir(&dest).unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o700)).unwrap();
        Self {
            zip: root.path().join("bundle.zip"),
            dest,
            root,
            key: SigningKey::from_bytes(&[7u8; 32]),
        }
    }

    fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    fn unpack(&self) -> Result<VerifiedBundle> {
        self.unpack_with(&Limits::default())
    }

    fn unpack_with(&self, limits: &Limits) -> Result<VerifiedBundle> {
        unpack(&self.zip, &self.public(), limits, &self.dest)
    }

    fn write(&self, bytes: &[u8]) {
        fs::write(&self.zip, bytes).unwrap();
    }

    /// After a refusal: the root holds only what the test put there, and dest is empty.
    fn assert_untouched(&self) {
        let names: BTreeSet<String> = fs::read_dir(self.root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let expected: BTreeSet<String> = ["bundle.zip", "dest"].map(String::from).into();
        assert_eq!(names, expected, "something was written next to dest");
        let left: Vec<_> = fs::read_dir(&self.dest).unwrap().collect();
        assert!(left.is_empty(), "dest not empty after a refusal: {left:?}");
    }
}

fn manifest_for(binary: &[u8]) -> Manifest {
    Manifest {
        version: "1.2.3".into(),
        target: TARGET.into(),
        channel_protocol: PROTOCOL_VERSION,
        binary_sha256: hex::encode(Sha256::digest(binary)),
        created_at: None,
        schema: None,
    }
}

fn sign(key: &SigningKey, manifest: &[u8]) -> Vec<u8> {
    hex::encode(key.sign(manifest).to_bytes()).into_bytes()
}

fn deflated() -> SimpleFileOptions {
    SimpleFileOptions::default().compression_method(CompressionMethod::Deflated)
}

/// Writes the given entries, in order, with the zip crate.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data) in entries {
        zip.start_file(*name, deflated()).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// A well-formed bundle with the given binary, manifest and signature bytes.
fn bundle_of(binary: &[u8], manifest: &[u8], sig: &[u8]) -> Vec<u8> {
    zip_of(&[
        (BINARY_NAME, binary),
        (MANIFEST_NAME, manifest),
        (SIGNATURE_NAME, sig),
    ])
}

fn valid_bundle(key: &SigningKey, binary: &[u8]) -> Vec<u8> {
    let manifest = serde_json::to_vec(&manifest_for(binary)).unwrap();
    let sig = sign(key, &manifest);
    bundle_of(binary, &manifest, &sig)
}

/// Replaces every occurrence of `from` (same length as `to`), asserting it was in both
/// the local header and the central directory.
fn patch_all(mut bytes: Vec<u8>, from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut hits = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            hits += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(hits >= 2, "expected {from:?} in local and central headers");
    bytes
}

/// Offset of the central directory record named `name`.
fn central_record(bytes: &[u8], name: &[u8]) -> usize {
    (0..bytes.len() - CENTRAL_LEN)
        .find(|&i| {
            bytes[i..i + 4] == CENTRAL_SIGNATURE
                && bytes[i + CENTRAL_LEN..].starts_with(name)
                && usize::from(u16_at(bytes, i + 28)) == name.len()
        })
        .expect("central record not found")
}

const BINARY: &[u8] = b"#!/bin/sh\necho artex-next-generation\n";

#[test]
fn a_created_bundle_round_trips_and_runs() {
    let scene = Scene::new();
    let src = scene.root.path().join("src-bin");
    fs::write(&src, BINARY).unwrap();
    let schema = Schema {
        needs: vec![SchemaMigration {
            version: 1,
            name: "blackboard".into(),
            checksum: "0123456789abcdef".into(),
        }],
    };
    let manifest = create(&src, &scene.key, "9.9.9", Some(schema.clone()), &scene.zip).unwrap();
    fs::remove_file(&src).unwrap();
    assert_eq!(manifest.version, "9.9.9");
    assert_eq!(manifest.schema, Some(schema));
    assert_eq!(manifest.target, TARGET);
    assert_eq!(manifest.channel_protocol, PROTOCOL_VERSION);
    assert_eq!(manifest.binary_sha256, hex::encode(Sha256::digest(BINARY)));
    let stamp = manifest.created_at.clone().unwrap();
    assert!(stamp.len() == 20 && stamp.ends_with('Z'), "{stamp}");

    let bundle = scene.unpack().unwrap();
    assert_eq!(bundle.manifest, manifest);
    assert_eq!(bundle.binary, scene.dest.join(BINARY_NAME));
    assert_eq!(fs::read(&bundle.binary).unwrap(), BINARY);
    let mode = fs::metadata(&bundle.binary).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    let out = std::process::Command::new(&bundle.binary).output().unwrap();
    assert_eq!(out.stdout, b"artex-next-generation\n");
    // Only the bundle and dest/artex: no temporary files left by create or unpack.
    let names: BTreeSet<String> = fs::read_dir(scene.root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["bundle.zip", "dest"].map(String::from).into());
}

#[test]
fn keygen_writes_private_hex_keys_that_sign_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = (dir.path().join("k.secret"), dir.path().join("k.pub"));
    keygen(&secret, &public).unwrap();
    assert_eq!(fs::metadata(&secret).unwrap().mode() & 0o777, 0o600);
    let text = fs::read_to_string(&public).unwrap();
    assert_eq!(text.trim().len(), 64);
    let (sk, pk) = (
        load_secret_key(&secret).unwrap(),
        load_public_key(&public).unwrap(),
    );
    assert_eq!(sk.verifying_key(), pk);
    pk.verify_strict(b"m", &sk.sign(b"m")).unwrap();

    // Two runs give two different keys (the randomness is real).
    let (s2, p2) = (dir.path().join("2.secret"), dir.path().join("2.pub"));
    keygen(&s2, &p2).unwrap();
    assert_ne!(load_public_key(&p2).unwrap(), pk);

    // Never overwrite, either file; the existing keys stay intact.
    let before = fs::read(&secret).unwrap();
    let err = keygen(&secret, &dir.path().join("new.pub")).unwrap_err();
    assert!(
        matches!(err, Error::KeyExists { ref path } if *path == secret),
        "{err:?}"
    );
    let err = keygen(&dir.path().join("new.secret"), &public).unwrap_err();
    assert!(
        matches!(err, Error::KeyExists { ref path } if *path == public),
        "{err:?}"
    );
    assert_eq!(fs::read(&secret).unwrap(), before);
    assert!(!dir.path().join("new.secret").exists());
    assert!(!dir.path().join("new.pub").exists());
}

#[test]
fn key_loading_says_what_is_wrong_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    fs::write(&short, "abcd\n").unwrap();
    let err = load_public_key(&short).unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyLength {
                expected: 64,
                found: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("short"), "{err}");

    let not_hex = dir.path().join("not-hex");
    fs::write(&not_hex, "z".repeat(64)).unwrap();
    let err = load_secret_key(&not_hex).unwrap_err();
    assert!(matches!(err, Error::KeyNotHex { .. }), "{err:?}");

    let missing = dir.path().join("missing");
    let err = load_public_key(&missing).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("missing"), "{err}");

    // 32 bytes that are not a curve point.
    let off_curve = dir.path().join("off-curve");
    let mut bytes = [0u8; 32];
    bytes[0] = 2;
    bytes[31] = 0x7f;
    let candidates = (0u8..=255).find_map(|b| {
        bytes[1] = b;
        VerifyingKey::from_bytes(&bytes).is_err().then_some(bytes)
    });
    let bad = candidates.expect("some 32-byte string is off the curve");
    fs::write(&off_curve, hex::encode(bad)).unwrap();
    let err = load_public_key(&off_curve).unwrap_err();
    assert!(matches!(err, Error::KeyInvalid { .. }), "{err:?}");
}

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

/// The valid bundle's three entries plus one more named `extra`.
fn zip_with_extra(bundle: &[u8], extra: &str) -> Vec<u8> {
    let mut archive = ZipArchive::new(Cursor::new(bundle)).unwrap();
    let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).unwrap();
        let mut data = Vec::new();
        f.read_to_end(&mut data).unwrap();
        entries.push((f.name().to_owned(), data));
    }
    entries.push((extra.to_owned(), b"payload".to_vec()));
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    zip_of(&refs)
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
    let cases: [(&[u8], &str); 7] = [
        (b"", "empty name"),
        (b"art\0ex", "contains NUL"),
        (b"/artex", "absolute path"),
        (b"dir\\artex", "contains a backslash"),
        (b"C:artex", "starts with a drive letter"),
        (b"a/../artex", "contains a `..` component"),
        (
            b"bin/artex",
            "contains a path separator (bundle entries are flat)",
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
    assert_eq!(check_name(b"artex").unwrap(), BINARY_NAME);
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
                limit: 8,
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

#[test]
fn corrupted_binary_data_is_refused_and_removed() {
    let scene = Scene::new();
    // Stored, so flipping a byte of the data leaves the stream decodable and only the
    // CRC can notice; the partially written binary must be removed.
    let manifest = serde_json::to_vec(&manifest_for(BINARY)).unwrap();
    let sig = sign(&scene.key, &manifest);
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    zip.start_file(BINARY_NAME, stored).unwrap();
    zip.write_all(BINARY).unwrap();
    zip.start_file(MANIFEST_NAME, stored).unwrap();
    zip.write_all(&manifest).unwrap();
    zip.start_file(SIGNATURE_NAME, stored).unwrap();
    zip.write_all(&sig).unwrap();
    let bytes = zip.finish().unwrap().into_inner();
    let bytes = patch_once(bytes, b"next-generation", b"NEXT-generation");
    scene.write(&bytes);
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::EntryRead { ref name, .. } if name == "\"artex\""),
        "{err:?}"
    );
    scene.assert_untouched();
}

fn patch_once(mut bytes: Vec<u8>, from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern present");
    bytes[at..at + to.len()].copy_from_slice(to);
    bytes
}

#[test]
fn binary_not_matching_the_manifest_is_refused_and_removed() {
    let scene = Scene::new();
    // A correctly signed manifest, but for other bytes than the ones shipped.
    let manifest = serde_json::to_vec(&manifest_for(b"the binary that was signed")).unwrap();
    let sig = sign(&scene.key, &manifest);
    scene.write(&bundle_of(BINARY, &manifest, &sig));
    let err = scene.unpack().unwrap_err();
    match &err {
        Error::DigestMismatch { expected, found } => {
            assert_eq!(
                expected,
                &hex::encode(Sha256::digest(b"the binary that was signed"))
            );
            assert_eq!(found, &hex::encode(Sha256::digest(BINARY)));
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    scene.assert_untouched();
}

#[test]
fn tampered_manifest_is_refused() {
    let scene = Scene::new();
    let manifest = serde_json::to_vec(&manifest_for(BINARY)).unwrap();
    let sig = sign(&scene.key, &manifest);
    let tampered = String::from_utf8(manifest)
        .unwrap()
        .replace("1.2.3", "6.6.6")
        .into_bytes();
    scene.write(&bundle_of(BINARY, &tampered, &sig));
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err:?}");
    scene.assert_untouched();
}

#[test]
fn signature_by_another_key_is_refused() {
    let scene = Scene::new();
    let other = SigningKey::from_bytes(&[9u8; 32]);
    scene.write(&valid_bundle(&other, BINARY));
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::BadSignature { .. }), "{err:?}");
    scene.assert_untouched();
    // And the very same bundle is accepted under the key that signed it.
    unpack(
        &scene.zip,
        &other.verifying_key(),
        &Limits::default(),
        &scene.dest,
    )
    .unwrap();
}

#[test]
fn malformed_signature_is_refused() {
    let scene = Scene::new();
    let manifest = serde_json::to_vec(&manifest_for(BINARY)).unwrap();
    scene.write(&bundle_of(BINARY, &manifest, &[b'z'; 128]));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::BadSignature { ref reason } if reason.contains("not hex")),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn a_manifest_from_before_the_schema_field_still_verifies() {
    let scene = Scene::new();
    // The exact shape older `artex bundle create` signed: no "schema" key, and the
    // protocol under its JSON name, `handover_protocol`.
    let manifest = format!(
        r#"{{"version": "0.1.0", "target": "{TARGET}", "handover_protocol": {PROTOCOL_VERSION},
            "binary_sha256": "{}"}}"#,
        hex::encode(Sha256::digest(BINARY))
    );
    let sig = sign(&scene.key, manifest.as_bytes());
    scene.write(&bundle_of(BINARY, manifest.as_bytes(), &sig));
    let bundle = scene.unpack().unwrap();
    assert_eq!(bundle.manifest.schema, None);
}

#[test]
fn wrong_protocol_version_is_refused() {
    let scene = Scene::new();
    let mut m = manifest_for(BINARY);
    m.channel_protocol = PROTOCOL_VERSION + 1;
    let manifest = serde_json::to_vec(&m).unwrap();
    let sig = sign(&scene.key, &manifest);
    scene.write(&bundle_of(BINARY, &manifest, &sig));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::ProtocolMismatch { expected: PROTOCOL_VERSION, found } if found == PROTOCOL_VERSION + 1),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn wrong_target_is_refused() {
    let scene = Scene::new();
    let mut m = manifest_for(BINARY);
    m.target = "riscv64gc-unknown-none-elf".into();
    let manifest = serde_json::to_vec(&m).unwrap();
    let sig = sign(&scene.key, &manifest);
    scene.write(&bundle_of(BINARY, &manifest, &sig));
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::TargetMismatch { .. }), "{err:?}");
    scene.assert_untouched();
}

#[test]
fn signed_but_invalid_manifest_json_is_refused() {
    let scene = Scene::new();
    let manifest = br#"{"version": "1"}"#;
    let sig = sign(&scene.key, manifest);
    scene.write(&bundle_of(BINARY, manifest, &sig));
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::ManifestInvalid { .. }), "{err:?}");
    scene.assert_untouched();
}

#[test]
fn missing_manifest_is_refused() {
    let scene = Scene::new();
    let manifest = serde_json::to_vec(&manifest_for(BINARY)).unwrap();
    let sig = sign(&scene.key, &manifest);
    scene.write(&zip_of(&[(BINARY_NAME, BINARY), (SIGNATURE_NAME, &sig)]));
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(
            err,
            Error::MissingEntry {
                name: MANIFEST_NAME
            }
        ),
        "{err:?}"
    );
    scene.assert_untouched();
}

#[test]
fn destination_must_be_fresh_and_private() {
    let scene = Scene::new();
    scene.write(&valid_bundle(&scene.key, BINARY));
    fs::set_permissions(&scene.dest, fs::Permissions::from_mode(0o755)).unwrap();
    let err = scene.unpack().unwrap_err();
    assert!(matches!(err, Error::DestInvalid { .. }), "{err:?}");
    fs::set_permissions(&scene.dest, fs::Permissions::from_mode(0o700)).unwrap();

    fs::write(scene.dest.join("artex"), b"old").unwrap();
    let err = scene.unpack().unwrap_err();
    assert!(
        matches!(err, Error::DestInvalid { ref reason, .. } if reason.contains("not empty")),
        "{err:?}"
    );
    assert_eq!(fs::read(scene.dest.join("artex")).unwrap(), b"old");
}

#[test]
fn rfc3339_formatting_matches_known_dates() {
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339_utc(1_709_164_800), "2024-02-29T00:00:00Z");
    assert_eq!(rfc3339_utc(4_102_444_799), "2099-12-31T23:59:59Z");
}

mod fuzz;

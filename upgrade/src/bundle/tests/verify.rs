//! Well-formed archives refused for what they carry: a binary that is not the signed one,
//! a manifest tampered with or signed by another key, another protocol or target; and a
//! destination that is not fresh and private. Each leaves nothing behind.

use super::*;

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

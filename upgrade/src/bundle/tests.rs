//! Bundle tests: a valid round trip, and a hostile corpus written by hand, each case
//! asserting its own refusal and that nothing was left anywhere.
//!
//! # Layout
//! - here: the scene and the archive builders every case uses, the round trip, the keys.
//! - `archive`: archives refused for their shape: names, entry types, counts, sizes.
//! - `verify`: well-formed archives refused for what they carry: binary, manifest,
//!   signature, target; and the destination's rules.
//! - `tasks`: bundles carrying a tasks folder: round trip, tampered and unsigned files.
//! - `fuzz`: valid and hostile bundles mutated at random.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Cursor, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

use super::create::rfc3339_utc;
use super::directory::{check_name, u16_at, EntryName, CENTRAL_LEN, CENTRAL_SIGNATURE, S_IFMT};
use super::*;
use crate::channel::PROTOCOL_VERSION;
use crate::error::{Error, Result};

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
        tasks: Vec::new(),
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
fn rfc3339_formatting_matches_known_dates() {
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339_utc(1_709_164_800), "2024-02-29T00:00:00Z");
    assert_eq!(rfc3339_utc(4_102_444_799), "2099-12-31T23:59:59Z");
}

mod archive;
mod fuzz;
mod tasks;
mod verify;

//! The bundle reader fuzzed (issue 25 §2): valid bundles and the hostile set above, mutated
//! (bit flips, truncations, header fields set to lying sizes and offsets, spliced and
//! duplicated headers, hostile names, symlink modes, inserted and deleted bytes) and
//! unpacked. Whatever the bytes: no panic, nothing written but `dest/artex`, never more
//! than the size limit, and a bundle passes only with a manifest this key signed and the
//! very binary that manifest names. Bounded and seeded: `testkit/src/fuzz.rs`.

use super::*;
use crate::bundle::directory::{EOCD_LEN, EOCD_SIGNATURE};

use artex_testkit::fuzz as cases;

mod mutation;

use mutation::{apply, mutation, Mutation};

/// Small limits, so that bombs and lying sizes meet them with little work.
const LIMITS: Limits = Limits {
    max_entries: 8,
    max_binary_bytes: 64 * 1024,
    max_manifest_bytes: 4096,
    max_ratio: 200,
    max_tasks_bytes: 16 * 1024,
};

/// The corpus: what is mutated. Built once per target.
struct Corpus {
    key: SigningKey,
    /// (name, archive bytes).
    seeds: Vec<(&'static str, Vec<u8>)>,
    /// Every (manifest, binary) this key signed: the only pairs a bundle may unpack to.
    signed: Vec<(Manifest, Vec<u8>)>,
}

fn stored() -> SimpleFileOptions {
    SimpleFileOptions::default().compression_method(CompressionMethod::Stored)
}

fn binary_of(len: usize, salt: u8) -> Vec<u8> {
    let mut x = 0x9e37_79b9u32 ^ u32::from(salt);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A signed bundle of `binary`, each entry with `opts`.
fn signed_bundle(
    key: &SigningKey,
    binary: &[u8],
    opts: SimpleFileOptions,
    signed: &mut Vec<(Manifest, Vec<u8>)>,
) -> Vec<u8> {
    let m = manifest_for(binary);
    let manifest = serde_json::to_vec(&m).unwrap();
    let sig = sign(key, &manifest);
    signed.push((m, binary.to_vec()));
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, data) in [
        (BINARY_NAME, binary),
        (MANIFEST_NAME, &manifest[..]),
        (SIGNATURE_NAME, &sig[..]),
    ] {
        zip.start_file(name, opts).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

impl Corpus {
    fn new() -> Corpus {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[9u8; 32]);
        let mut signed = Vec::new();
        let mut seeds = Vec::new();
        let small = binary_of(300, 1);
        let big = binary_of(40_000, 2);
        seeds.push((
            "valid, deflated",
            signed_bundle(&key, &small, deflated(), &mut signed),
        ));
        seeds.push((
            "valid, stored",
            signed_bundle(&key, &small, stored(), &mut signed),
        ));
        seeds.push((
            "valid, 40 KB binary",
            signed_bundle(&key, &big, deflated(), &mut signed),
        ));
        seeds.push((
            "valid, empty binary",
            signed_bundle(&key, b"", stored(), &mut signed),
        ));
        // Signed by another key: must never pass, however mutated.
        seeds.push((
            "another key's",
            signed_bundle(&other, &small, stored(), &mut Vec::new()),
        ));
        // The hostile set: each of the hand-written refusals' archives.
        seeds.push((
            "binary over the limit",
            signed_bundle(&key, &binary_of(70_000, 3), stored(), &mut signed),
        ));
        let valid = signed_bundle(&key, &small, stored(), &mut Vec::new());
        seeds.push(("extra entry ../x", zip_with_extra(&valid, "../x")));
        seeds.push(("extra entry README", zip_with_extra(&valid, "README")));
        seeds.push((
            "duplicate artex",
            patch_all(zip_with_extra(&valid, "artey"), b"artey", b"artex"),
        ));
        seeds.push(("symlink artex", symlink_bundle(&key, &small)));
        seeds.push(("zip bomb", bomb(&key)));
        seeds.push(("many entries", many_entries(20)));
        let m = serde_json::to_vec(&manifest_for(b"what was signed")).unwrap();
        let s = sign(&key, &m);
        seeds.push(("digest mismatch", bundle_of(&small, &m, &s)));
        let tampered = String::from_utf8(m.clone())
            .unwrap()
            .replace("1.2.3", "6.6.6");
        seeds.push((
            "tampered manifest",
            bundle_of(&small, tampered.as_bytes(), &s),
        ));
        Corpus { key, seeds, signed }
    }
}

fn symlink_bundle(key: &SigningKey, binary: &[u8]) -> Vec<u8> {
    let manifest = serde_json::to_vec(&manifest_for(binary)).unwrap();
    let sig = sign(key, &manifest);
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    zip.add_symlink(BINARY_NAME, "/bin/sh", SimpleFileOptions::default())
        .unwrap();
    zip.start_file(MANIFEST_NAME, deflated()).unwrap();
    zip.write_all(&manifest).unwrap();
    zip.start_file(SIGNATURE_NAME, deflated()).unwrap();
    zip.write_all(&sig).unwrap();
    zip.finish().unwrap().into_inner()
}

fn bomb(key: &SigningKey) -> Vec<u8> {
    let zeros = vec![0u8; 4 << 20];
    let manifest = serde_json::to_vec(&manifest_for(&zeros)).unwrap();
    let sig = sign(key, &manifest);
    bundle_of(&zeros, &manifest, &sig)
}

fn many_entries(n: usize) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for i in 0..n {
        zip.start_file(format!("f{i}"), stored()).unwrap();
        zip.write_all(b"x").unwrap();
    }
    zip.finish().unwrap().into_inner()
}

#[derive(Debug, Clone)]
struct Case {
    seed: usize,
    /// The limits unpacked under: [`LIMITS`], or one of them tightened to the seed's
    /// sizes (`tight`: 0 binary, 1 manifest, 2 ratio, 3 entries), so that a limit is met
    /// on its edge as well as far from it.
    tight: Option<(u8, u64)>,
    mutations: Vec<Mutation>,
}

/// A scratch root with `bundle.zip`, the private `dest`, and `outside/` holding a
/// sentinel: what a path escape would reach.
struct Ground {
    root: tempfile::TempDir,
    dest: PathBuf,
    zip: PathBuf,
}

impl Ground {
    fn new(bytes: &[u8]) -> Ground {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("dest");
        fs::create_dir(&dest).unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o700)).unwrap();
        fs::create_dir(root.path().join("outside")).unwrap();
        fs::write(root.path().join("outside").join("sentinel"), b"untouched").unwrap();
        let zip = root.path().join("bundle.zip");
        fs::write(&zip, bytes).unwrap();
        Ground { root, dest, zip }
    }

    /// Every path under the root, with its size.
    fn listing(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir).unwrap() {
                let e = e.unwrap();
                let meta = e.path().symlink_metadata().unwrap();
                let rel = e
                    .path()
                    .strip_prefix(self.root.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if meta.is_dir() {
                    stack.push(e.path());
                }
                out.push((rel, meta.len()));
            }
        }
        out.sort();
        out
    }
}

/// How the cases ended: `Ok` or the refusal's variant, and how often.
type Outcomes = std::cell::RefCell<std::collections::BTreeMap<String, u64>>;

fn outcome(r: &Result<VerifiedBundle>) -> String {
    match r {
        Ok(_) => "Ok".to_string(),
        Err(e) => {
            let d = format!("{e:?}");
            d[..d.find([' ', '(', '{']).unwrap_or(d.len())].to_string()
        }
    }
}

fn limits_of(tight: Option<(u8, u64)>) -> Limits {
    match tight {
        None => LIMITS,
        Some((0, v)) => Limits {
            max_binary_bytes: v,
            ..LIMITS
        },
        Some((1, v)) => Limits {
            max_manifest_bytes: v,
            ..LIMITS
        },
        Some((2, v)) => Limits {
            max_ratio: v,
            ..LIMITS
        },
        Some((_, v)) => Limits {
            max_entries: v as usize,
            ..LIMITS
        },
    }
}

fn check(corpus: &Corpus, case: &Case, outcomes: &Outcomes) {
    let (name, seed) = &corpus.seeds[case.seed % corpus.seeds.len()];
    let mut bytes = seed.clone();
    for m in &case.mutations {
        apply(&mut bytes, m);
    }
    let limits = limits_of(case.tight);
    let ground = Ground::new(&bytes);
    let before = ground.listing();
    let result = unpack(
        &ground.zip,
        &corpus.key.verifying_key(),
        &limits,
        &ground.dest,
    );
    let after = ground.listing();
    *outcomes.borrow_mut().entry(outcome(&result)).or_default() += 1;
    let binary = ground.dest.join(BINARY_NAME);
    match result {
        Err(e) => {
            assert_eq!(
                after, before,
                "seed {name:?}: refused ({e}) but the files changed"
            );
        }
        Ok(bundle) => {
            let written = fs::read(&binary).unwrap();
            assert!(
                written.len() as u64 <= limits.max_binary_bytes,
                "seed {name:?}: {} bytes written, over the limit",
                written.len()
            );
            let mut expected = before.clone();
            expected.push(("dest/artex".into(), written.len() as u64));
            expected.sort();
            assert_eq!(after, expected, "seed {name:?}: wrote more than dest/artex");
            assert!(
                corpus
                    .signed
                    .iter()
                    .any(|(m, b)| *m == bundle.manifest && *b == written),
                "seed {name:?}: unpacked a manifest or binary this key never signed: {:?}",
                bundle.manifest
            );
            assert_eq!(bundle.binary, binary);
        }
    }
    assert!(
        !Path::new("/tmp/artex-fuzz-pwned").exists(),
        "an absolute name was written"
    );
}

#[test]
fn mutated_bundles_are_refused_or_pass_only_as_signed() {
    let corpus = Corpus::new();
    // Without mutations, the corpus itself is checked first: every valid seed passes.
    for (name, bytes) in &corpus.seeds {
        let ground = Ground::new(bytes);
        let r = unpack(
            &ground.zip,
            &corpus.key.verifying_key(),
            &LIMITS,
            &ground.dest,
        );
        assert_eq!(r.is_ok(), name.starts_with("valid"), "{name}: {r:?}");
    }
    let seeds = corpus.seeds.len();
    let outcomes = Outcomes::default();
    cases::run(
        "bundle::unpack",
        1000,
        |rng| Case {
            seed: rng.usize(..seeds),
            tight: match rng.u8(0..4) {
                0 => {
                    // Around the seeds' own sizes: 300, 40,000 and 0 bytes of binary,
                    // ~170 of manifest, 3 entries, ratios near 1 (stored) and 3:1.
                    let edges: [(u8, &[u64]); 4] = [
                        (0, &[0, 299, 300, 301, 39_999, 40_000]),
                        (1, &[100, 160, 170, 180, 4096]),
                        (2, &[1, 2, 3, 4]),
                        (3, &[2, 3, 4]),
                    ];
                    let (which, values) = edges[rng.usize(0..4)];
                    Some((which, values[rng.usize(..values.len())]))
                }
                _ => None,
            },
            mutations: (0..[1, 1, 1, 2, 2, 3, 4][rng.usize(0..7)])
                .map(|_| mutation(rng))
                .collect(),
        },
        |c| {
            cases::shrink_vec(&c.mutations)
                .into_iter()
                .map(|mutations| Case {
                    mutations,
                    ..c.clone()
                })
                .collect()
        },
        |c| check(&corpus, c, &outcomes),
    );
    // The mutations must reach every layer, or the run proves little: some bundles still
    // pass, and the refusals come from the end record to the signature and the digest.
    let outcomes = outcomes.into_inner();
    eprintln!("bundle::unpack outcomes: {outcomes:?}");
    let total: u64 = outcomes.values().sum();
    if total >= 500 {
        let ok = outcomes.get("Ok").copied().unwrap_or(0);
        assert!(
            ok * 100 >= total,
            "only {ok} of {total} cases passed: {outcomes:?}"
        );
        for deep in ["ZipCorrupt", "UnsafeEntryName", "EntryRead", "BadSignature"] {
            assert!(
                outcomes.contains_key(deep),
                "no case refused as {deep}: {outcomes:?}"
            );
        }
    }
}

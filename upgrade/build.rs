//! Records the target triple this crate is built for, so a bundle can name the target its
//! binary was built for and a worker can refuse a bundle built for another machine.

fn main() {
    // Cargo always sets TARGET for build scripts; fall back to "unknown" rather than fail
    // a build over a label.
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=ARTEX_UPGRADE_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}

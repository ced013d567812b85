//! `artex bundle keygen|create`: signing keys and signed upgrade bundles, made with
//! `artex_upgrade::bundle` (which also verifies them on the worker's side).

use clap::Subcommand;

use crate::error::Result;

/// `artex bundle …`
#[derive(Debug, Subcommand)]
pub(crate) enum BundleCommand {
    /// Make an ed25519 key pair (hex files; the secret one mode 0600).
    Keygen {
        /// Where to write the secret key (refuses to overwrite).
        #[arg(long)]
        secret: std::path::PathBuf,
        /// Where to write the public key (give it to workers: --upgrade-public-key).
        #[arg(long)]
        public: std::path::PathBuf,
    },
    /// Package a binary with a signed manifest for `curl -T bundle.zip …/upgrade`.
    Create {
        /// The new artex binary (or a binary built on the artex crate).
        #[arg(long)]
        binary: std::path::PathBuf,
        /// The secret key from `artex bundle keygen`.
        #[arg(long)]
        key: std::path::PathBuf,
        /// Where to write the bundle.
        #[arg(long)]
        out: std::path::PathBuf,
        /// The version recorded in the manifest (default: this build's).
        #[arg(long)]
        manifest_version: Option<String>,
    },
}

/// Runs `artex bundle …`.
pub(crate) fn bundle(command: BundleCommand) -> Result {
    match command {
        BundleCommand::Keygen { secret, public } => {
            artex_upgrade::bundle::keygen(&secret, &public)?;
            println!(
                "secret key: {}\npublic key: {}",
                secret.display(),
                public.display()
            );
            Ok(())
        }
        BundleCommand::Create {
            binary,
            key,
            out,
            manifest_version,
        } => {
            let key = artex_upgrade::bundle::load_secret_key(&key)?;
            let version = manifest_version.unwrap_or_else(|| crate::VERSION.to_string());
            let manifest = artex_upgrade::bundle::create(&binary, &key, &version, &out)?;
            println!(
                "{} (version {}, sha256 {})",
                out.display(),
                manifest.version,
                manifest.binary_sha256
            );
            Ok(())
        }
    }
}

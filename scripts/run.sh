#!/usr/bin/env bash
# The one command that runs artex on a fresh Debian/Ubuntu machine: installs the
# PostgreSQL server binaries if they are missing, builds artex, and runs `artex up`
# (embedded PostgreSQL in ./.artex, a planner and a worker). Extra args go to `artex up`.
set -euo pipefail
cd "$(dirname "$0")/.."

have_pg() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
if ! have_pg; then
  echo "PostgreSQL server binaries not found: installing the postgresql package" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (>= 1.89) with rustup first" >&2; exit 1; }
# The first build takes minutes on a small machine: cargo shows its progress.
cargo build --release
# Reads (/status, /metrics, /events) open on this local run; a fleet uses tokens.
exec target/release/artex up --public-read "$@"

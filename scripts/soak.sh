#!/usr/bin/env bash
# The soak (issue 25 §1, tests/soak/): a fleet in network namespaces runs a steady mix
# of tasks, flows, uploads, unique and scheduled tasks under a kind limit, with
# operators, API readers and an /events consumer, while a seeded schedule of
# overlapping faults hits it (kill -9, hot upgrades good and bad, PostgreSQL crashes and
# 20 s stops, link cuts, SIGSTOP past the lease, a full upload disk). Fails if any
# invariant breaks; writes report.md, soak.svg, faults.tsv, samples.tsv and every
# process's log to the output folder.
#
#   scripts/soak.sh [--minutes N] [--seed S] [--out DIR]
#
# Defaults: 3 minutes (what scripts/test.sh runs), a random seed (printed: pass it back
# to replay the same faults), target/soak/seed-S. Needs root (namespaces, a tmpfs);
# PostgreSQL runs as the `postgres` user.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=3
seed=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
        --seed) seed=${2:?--seed needs a number}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "scripts/soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/soak.sh: run it as root: it creates network namespaces and mounts a tmpfs" >&2
    exit 2
fi
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && ! command -v pg_ctl >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
fi
if ! command -v curl >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y curl
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
seed=${seed:-$(( (RANDOM << 15) | RANDOM ))}
out=${out:-target/soak/seed-$seed}
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "soak: $minutes minutes, seed $seed, report in $out"

# The tests' harness writes its read token beside the test cluster's folder.
if [ -z "${ARTEX_TEST_PG_DIR:-}" ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/artex-soak.XXXXXX")
    chmod 0755 "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    export ARTEX_TEST_PG_DIR="$tmp/cluster"
fi
export ARTEX_SOAK_MINUTES=$minutes ARTEX_SOAK_SEED=$seed ARTEX_SOAK_OUT=$out
cargo nextest run --workspace --run-ignored only -E 'binary(soak)' --no-capture

#!/usr/bin/env bash
# The soak (issue 25 §1, tests/soak/): a fleet in network namespaces runs a steady mix
# of tasks, flows, uploads, unique and scheduled tasks under a kind limit, with
# operators, API readers and an /events consumer, while a seeded schedule of
# overlapping faults hits it (kill -9, hot upgrades good and bad, PostgreSQL crashes and
# 20 s stops, link cuts, SIGSTOP past the lease, a full upload disk). Fails if any
# invariant breaks; writes report.md, soak.svg, faults.tsv, samples.tsv and every
# process's log to the output folder.
#
#   scripts/soak.sh [--minutes N] [--seed S] [--out DIR] [--topology single|fleet]
#
# --topology fleet soaks the production topology: a pg_auto_failover primary and
# synchronous standby, a pgbouncer in transaction mode beside each (LISTEN through a
# session alias), a streaming replica serving `artex serve`'s reads; its faults add
# failovers (host killed, link cut), pgbouncer restarts and the replica's loss.
#
# Defaults: 3 minutes (what scripts/test.sh runs, in each topology), a random seed
# (printed: pass it back to replay the same faults), the single topology,
# target/soak/seed-S (target/soak/fleet-seed-S). Needs root (namespaces, a tmpfs);
# PostgreSQL, pg_autoctl and pgbouncer run as the `postgres` user.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=3
seed=""
out=""
topology=single
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
        --seed) seed=${2:?--seed needs a number}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --topology) topology=${2:?--topology needs single or fleet}; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "scripts/soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$topology" in
    single|fleet) ;;
    *) echo "scripts/soak.sh: --topology $topology: expected single or fleet" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/soak.sh: run it as root: it creates network namespaces and mounts a tmpfs" >&2
    exit 2
fi
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && ! command -v pg_ctl >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
fi
if [ "$topology" = fleet ] && { [ ! -x /usr/sbin/pgbouncer ] || [ ! -x /usr/bin/pg_autoctl ]; }; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer \
        postgresql-15-auto-failover pg-auto-failover-cli
fi
if ! command -v curl >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y curl
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
seed=${seed:-$(( (RANDOM << 15) | RANDOM ))}
if [ "$topology" = fleet ]; then
    out=${out:-target/soak/fleet-seed-$seed}
else
    out=${out:-target/soak/seed-$seed}
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "soak: $minutes minutes, seed $seed, topology $topology, report in $out"

# The tests' harness writes its read token beside the test cluster's folder.
if [ -z "${ARTEX_TEST_PG_DIR:-}" ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/artex-soak.XXXXXX")
    chmod 0755 "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    export ARTEX_TEST_PG_DIR="$tmp/cluster"
fi
export ARTEX_SOAK_MINUTES=$minutes ARTEX_SOAK_SEED=$seed ARTEX_SOAK_OUT=$out \
    ARTEX_SOAK_TOPOLOGY=$topology
cargo nextest run --workspace --run-ignored only -E 'binary(soak)' --no-capture

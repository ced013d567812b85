#!/usr/bin/env bash
# Runs the whole test suite, on a fresh Debian/Ubuntu machine too (as root or with sudo):
# installs PostgreSQL's server binaries, pgbouncer, pg_auto_failover, Prometheus, Chromium and its WebDriver (the
# dashboard's browser tests) and cargo-nextest if missing, runs every test
# against one throwaway cluster, then stops and removes it, then a 3-minute soak in each
# topology (one server; a failover formation behind pgbouncer). Extra arguments go to
# `cargo nextest run` (e.g. `scripts/test.sh -E 'test(fencing)'`).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Where initdb and pg_ctl are: PATH, else the newest /usr/lib/postgresql/*/bin (Debian).
pg_bin() {
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v pg_ctl)"
    else
        ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true
    fi
}

if [ -z "$(pg_bin)" ]; then
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
fi
# tests/pooler.rs runs artex through a real pgbouncer (Debian's package).
if [ ! -x /usr/sbin/pgbouncer ]; then
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer
fi
# tests/failover.rs runs a pg_auto_failover formation (a monitor and two nodes).
if [ ! -x /usr/bin/pg_autoctl ] || ! ls /usr/lib/postgresql/*/lib/pgautofailover.so >/dev/null 2>&1; then
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        postgresql-15-auto-failover pg-auto-failover-cli
fi
# tests/metrics/ scrapes serve, a worker and a planner with a real Prometheus, and checks
# docs/alerts.yml with promtool.
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus
fi
# tests/dashboard/ drives a headless Chromium through chromedriver.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
# tests/api/schemathesis.rs runs schemathesis (Python, pinned) against docs/openapi.json,
# from a venv of its own: Debian's pip is externally managed. A venv cannot be moved, so
# it is built in place and only counts once the binary answers.
SCHEMATHESIS_VERSION=4.32.5
st_venv="${XDG_CACHE_HOME:-$HOME/.cache}/artex/schemathesis-$SCHEMATHESIS_VERSION"
if ! "$st_venv/bin/schemathesis" --version >/dev/null 2>&1; then
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
    fi
    rm -rf "$st_venv"
    python3 -m venv "$st_venv"
    "$st_venv/bin/pip" install --quiet --disable-pip-version-check \
        "schemathesis==$SCHEMATHESIS_VERSION"
fi
export ARTEX_SCHEMATHESIS="$st_venv/bin/schemathesis"

# The postgres user runs the cluster when we are root: it must reach the folder (0755).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/artex-test.XXXXXX")
chmod 0755 "$tmp"
export ARTEX_TEST_PG_DIR="$tmp/cluster"
stop_cluster() {
    if [ -f "$ARTEX_TEST_PG_DIR/pg/postmaster.pid" ]; then
        local stop=("$(pg_bin)/pg_ctl" -D "$ARTEX_TEST_PG_DIR/pg" -m fast -w stop)
        if [ "$(id -u)" -eq 0 ]; then stop=(runuser -u postgres -- "${stop[@]}"); fi
        (cd / && "${stop[@]}" >/dev/null) || echo "warning: could not stop the test cluster" >&2
    fi
    rm -rf "$tmp"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cargo nextest run --workspace "$@"
# nextest does not run doc tests, nor the soak (ignored there); a filtered run skips both.
if [ $# -eq 0 ]; then
    cargo test --workspace --doc
    # Three minutes of every fault together (scripts/soak.sh; its report goes to
    # target/soak/seed-S, the seed printed first so that a failure replays), on one
    # PostgreSQL server, then in the production topology (failover, pgbouncer, replica).
    scripts/soak.sh --minutes 3
    scripts/soak.sh --minutes 3 --topology fleet
fi

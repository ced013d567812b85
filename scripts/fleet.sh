#!/usr/bin/env bash
# A fleet on one machine (tests/common/fleet.rs is the same for tests): each host a
# network namespace with eth0 on a bridge in a switch namespace of its own, so the
# machine's own network is never touched; PostgreSQL runs on host `db`. Needs root.
#
#   scripts/fleet.sh up N             hosts db, p1, w1…wN at 198.18.0.1, .2, .3… (/24)
#   scripts/fleet.sh exec HOST CMD…   run CMD on HOST, with ARTEX_DATABASE_URL set
#   scripts/fleet.sh partition HOST   cut HOST off (its switch port down); heal HOST undoes
#   scripts/fleet.sh freeze HOST      SIGSTOP every process on HOST; thaw HOST undoes
#   scripts/fleet.sh down             kill everything on the fleet, remove it
set -euo pipefail
cd "$(dirname "$0")/.."

P=artex-fleet-
SW=${P}switch
DIR=${ARTEX_FLEET_DIR:-/tmp/artex-fleet}
URL=postgresql://postgres@198.18.0.1:5432/postgres

die() { echo "fleet.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (it creates network namespaces)"
host() { [ -e "/run/netns/$P${1:-}" ] || die "no host '${1:-}' (is the fleet up?)"; echo "$P$1"; }
pg_bin() {
    if command -v pg_ctl >/dev/null; then dirname "$(command -v pg_ctl)"
    else ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1; fi
}
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

up() {
    local n=${1:?usage: fleet.sh up N}
    [ ! -e "/run/netns/$SW" ] || die "a fleet is up already: scripts/fleet.sh down first"
    trap 'echo "fleet.sh up failed; scripts/fleet.sh down removes what it made" >&2' ERR
    ip netns add "$SW"
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    local i=0 h
    for h in db p1 $(seq -f 'w%g' 1 "$n"); do
        i=$((i + 1))
        ip netns add "$P$h"
        ip -n "$SW" link add "p-$h" type veth peer name eth0 netns "$P$h"
        ip -n "$SW" link set "p-$h" master br0 up
        ip -n "$P$h" addr add "198.18.0.$i/24" dev eth0
        ip -n "$P$h" link set eth0 up
        ip -n "$P$h" link set lo up
        echo "$h 198.18.0.$i"
    done
    # PostgreSQL on db: TCP on its address (trust for the fleet's range, first line
    # wins) and a Unix socket in $DIR/pg for psql from the machine itself.
    local bin
    bin=$(pg_bin)
    mkdir -p "$DIR" && chmod 0755 "$DIR" && rm -rf "$DIR/pg"
    install -d -o postgres -m 0700 "$DIR/pg"
    as_postgres "$bin/initdb" -D "$DIR/pg" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    sed -i '1i host all all 198.18.0.0/15 trust' "$DIR/pg/pg_hba.conf"
    (cd / && ip netns exec "${P}db" runuser -u postgres -- "$bin/pg_ctl" start -w \
        -D "$DIR/pg" -l "$DIR/pg/server.log" \
        -o "-c listen_addresses=198.18.0.1 -c unix_socket_directories=$DIR/pg" >/dev/null)
    local artex=${ARTEX_BIN:-$(ls target/release/artex target/debug/artex 2>/dev/null | head -n 1)}
    if [ -n "$artex" ]; then
        ip netns exec "${P}p1" env ARTEX_DATABASE_URL="$URL" ARTEX_LOG=warn "$artex" migrate >/dev/null
    else
        echo "no artex binary built: migrate with scripts/fleet.sh exec p1 PATH/TO/artex migrate"
    fi
    artex=${artex:-target/release/artex}
    cat <<EOF
PostgreSQL on db: $URL (exec sets ARTEX_DATABASE_URL); from this machine: psql -h $DIR/pg -U postgres
  scripts/fleet.sh exec p1 $artex planner &
  scripts/fleet.sh exec w1 $artex worker --http 198.18.0.3:8080 --public-read &
  scripts/fleet.sh exec p1 $artex submit echo --payload '{"hello":"fleet"}'
  scripts/fleet.sh exec w2 curl -s 198.18.0.3:8080/status
  scripts/fleet.sh partition w1; scripts/fleet.sh heal w1; scripts/fleet.sh down
EOF
}

signal_all() {
    local pid
    for pid in $(ip netns pids "$1"); do kill "-$2" "$pid" 2>/dev/null || true; done
}

down() {
    if [ -f "$DIR/pg/postmaster.pid" ]; then
        signal_all "${P}db" CONT
        as_postgres "$(pg_bin)/pg_ctl" stop -w -m fast -D "$DIR/pg" >/dev/null || true
    fi
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^$P" || true); do
        signal_all "$ns" KILL
        ip netns delete "$ns"
    done
    rm -rf "$DIR"
}

cmd=${1:-}
case "$cmd" in
    exec | partition | heal | freeze | thaw) ns=$(host "${2:-}") ;;
esac
case "$cmd" in
    up) up "${2:-}" ;;
    exec) [ $# -ge 3 ] || die "usage: fleet.sh exec HOST CMD…"
          shift 2
          exec ip netns exec "$ns" env ARTEX_DATABASE_URL="$URL" "$@" ;;
    partition) ip -n "$SW" link set "p-$2" down ;;
    heal) ip -n "$SW" link set "p-$2" up ;;
    freeze) signal_all "$ns" STOP ;;
    thaw) signal_all "$ns" CONT ;;
    down) down ;;
    *) die "usage: fleet.sh up N | exec HOST CMD… | partition|heal|freeze|thaw HOST | down" ;;
esac

#!/usr/bin/env bash
# Rolling hot upgrade of a fleet, one worker at a time, stopping at the first failure.
#
#   scripts/rolling-upgrade.sh [--token-file FILE] [--read-token-file FILE] [--timeout SECS]
#                              BUNDLE HOST:PORT...
#
# For each host, in the order given: PUT the bundle to http://HOST:PORT/upgrade (bearer
# token from --token-file, else $ARTEX_UPGRADE_TOKEN; it is passed to curl on a file
# descriptor, never on its command line), then wait until /health answers 200 and
# /status reports the new binary's sha256 (taken from the upgrade's JSON answer; /status
# needs the read token, from --read-token-file, else $ARTEX_READ_TOKEN, unless the
# workers run with --public-read). A
# refused upload, a rollback, or a host not healthy on the new build within --timeout
# seconds of the upgrade's answer (default 60) ends the run with a message naming the host and exit status 1; the
# hosts after it are not touched. Needs bash and curl only: the JSON fields read are
# flat strings and numbers, matched with sed.
#
# Progress, one line per step on standard output, each prefixed `rolling-upgrade: [i/N]
# HOST:` (the host's place in the run and the number of hosts): `uploading BUNDLE (SIZE
# bytes)`, `upgraded, pid OLD -> NEW; waiting for the new generation`, `healthy on SHA256
# (S s)`; the run ends with `all N hosts upgraded: …`. A failure is one line on standard
# error, `FAILED at HOST (i of N): why`, then the hosts upgraded before it.
#
# Migrate first, with the new build (`NEW/artex migrate`): a worker refuses a bundle whose
# build needs a migration the database lacks (409, naming it) and the run stops there,
# no host changed. See migrations/README.md.
set -euo pipefail

usage() {
    echo "usage: $0 [--token-file FILE] [--read-token-file FILE] [--timeout SECS] BUNDLE HOST:PORT..." >&2
    exit 2
}

token=${ARTEX_UPGRADE_TOKEN:-}
read_token=${ARTEX_READ_TOKEN:-}
timeout=60
while [ $# -gt 0 ]; do
    case $1 in
        --token-file)
            [ $# -ge 2 ] || usage
            [ -r "$2" ] || { echo "rolling-upgrade: cannot read the token file $2" >&2; exit 2; }
            token=$(tr -d '[:space:]' <"$2")
            shift 2 ;;
        --read-token-file)
            [ $# -ge 2 ] || usage
            [ -r "$2" ] || { echo "rolling-upgrade: cannot read the read-token file $2" >&2; exit 2; }
            read_token=$(tr -d '[:space:]' <"$2")
            shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; timeout=$2; shift 2 ;;
        -h | --help) usage ;;
        --) shift; break ;;
        -*) echo "rolling-upgrade: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 2 ] || usage
[[ $timeout =~ ^[0-9]+$ ]] || { echo "rolling-upgrade: --timeout wants whole seconds, not $timeout" >&2; exit 2; }
bundle=$1
shift
[ -f "$bundle" ] || { echo "rolling-upgrade: no bundle at $bundle" >&2; exit 2; }
[ -n "$token" ] || { echo "rolling-upgrade: no token: set ARTEX_UPGRADE_TOKEN or pass --token-file" >&2; exit 2; }

# A flat JSON field's value (string or number) from stdin.
field() { sed -nE "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"?([^\",}]*)\"?.*/\1/p" | head -n 1; }

done_hosts=()
fail() {
    echo "rolling-upgrade: FAILED at $host ($((${#done_hosts[@]} + 1)) of $total): $*" >&2
    echo "rolling-upgrade: upgraded before the failure: ${done_hosts[*]:-none}" >&2
    exit 1
}

size=$(wc -c <"$bundle" | tr -d '[:space:]')

total=$#
n=0
for host in "$@"; do
    n=$((n + 1))
    at="rolling-upgrade: [$n/$total] $host:"
    start=$(date +%s)
    echo "$at uploading $(basename "$bundle") ($size bytes)"
    answer=$(curl -sS --max-time 300 -o - -w '\n%{http_code}' -T "$bundle" \
        -H @<(printf 'Authorization: Bearer %s\n' "$token") "http://$host/upgrade" 2>&1) ||
        fail "upload failed: $(sed '$d' <<<"$answer" | tr '\n' ' ')"
    code=${answer##*$'\n'}
    body=${answer%$'\n'*}
    [ "$code" = 200 ] || fail "HTTP $code: $body"
    sha=$(field new_binary_sha256 <<<"$body")
    [ -n "$sha" ] || fail "no new_binary_sha256 in the answer: $body"
    echo "$at $(field status <<<"$body"), pid $(field old_pid <<<"$body") -> $(field new_pid <<<"$body"); waiting for the new generation (/health, then /status on sha256 $sha)"

    deadline=$(($(date +%s) + timeout))
    until [ "$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "http://$host/health" || true)" = 200 ]; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "/health not 200 within ${timeout}s"
        sleep 0.2
    done
    until [ "$(curl -fsS --max-time 5 -H @<(printf 'Authorization: Bearer %s\n' "$read_token") \
        "http://$host/status" 2>/dev/null | field binary_sha256)" = "$sha" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "/status does not report sha256 $sha within ${timeout}s"
        sleep 0.2
    done
    done_hosts+=("$host")
    echo "$at healthy on $sha ($(($(date +%s) - start)) s)"
done
echo "rolling-upgrade: all ${#done_hosts[@]} hosts upgraded: ${done_hosts[*]}"

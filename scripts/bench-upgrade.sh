#!/usr/bin/env bash
# Hot-upgrade benchmark (release build): 5 upgrades in a row of one worker under HTTP load
# (4 curl loops, one connection per request, on /health and /status) and task traffic.
# Prints RESULT lines: time from upload to takeover (new process serving, tasks moved)
# and to the old process's exit, median and max; requests served and failed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
A="$PWD/target/release/artex"
work=$(mktemp -d "${TMPDIR:-/tmp}/artex-bench-upgrade.XXXXXX"); chmod 0755 "$work"
pids=()
cleanup() {
  touch "$work/stop"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${last:-}" ] && kill "$last" 2>/dev/null || true
  wait 2>/dev/null || true
  "$A" db stop --data-dir "$work/db" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
gone() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true); [ -z "$s" ] || [ "$s" = Z ]; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

export ARTEX_DATABASE_URL=$("$A" db start --data-dir "$work/db" 2>/dev/null)
export ARTEX_LOG=warn
touch "$work/submit-failed"
"$A" bundle keygen --secret "$work/key" --public "$work/key.pub" >/dev/null
echo "bench-token" > "$work/token"
for n in 1 2 3 4 5; do
  cp "$A" "$work/artex-$n"; echo "bench build $n" >> "$work/artex-$n"
  "$A" bundle create --binary "$work/artex-$n" --key "$work/key" --out "$work/b$n.zip" \
    --manifest-version "bench-$n" >/dev/null
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
addr="127.0.0.1:$port"
"$A" planner >"$work/planner.log" 2>&1 & pids+=($!)
"$A" worker --http "$addr" --public-read --upgrade-public-key "$work/key.pub" --upgrade-token-file "$work/token" \
  --upgrade-dir "$work/up" >"$work/worker.log" 2>&1 & last=$!
until curl -fs "http://$addr/health" >/dev/null; do sleep 0.05; done
for i in 1 2 3 4; do
  (while [ ! -e "$work/stop" ]; do for p in health status; do
     curl -s -o /dev/null --max-time 10 -w '%{http_code}\n' "http://$addr/$p" >> "$work/codes"
   done; done) & pids+=($!)
done
(while [ ! -e "$work/stop" ]; do
   "$A" submit echo --payload '{"bench":true}' >/dev/null 2>&1 || echo x >> "$work/submit-failed"
   sleep 0.05
 done) & pids+=($!)
sleep 1
taken=(); exited=()
for n in 1 2 3 4 5; do
  t0=$(now_ms)
  resp=$(curl -fsS -T "$work/b$n.zip" -H "Authorization: Bearer bench-token" "http://$addr/upgrade")
  t1=$(now_ms)
  old=$(echo "$resp" | json "['old_pid']"); new=$(echo "$resp" | json "['new_pid']")
  server_ms=$(echo "$resp" | json "['timings_ms']['taken_over']")
  while ! gone "$old"; do sleep 0.01; done
  t2=$(now_ms)
  taken+=("$server_ms"); exited+=($((t2 - t0)))
  echo "upgrade $n: pid $old -> $new, taken over ${server_ms} ms after upload, old exited $((t2 - t0)) ms after upload (curl $((t1 - t0)) ms)" >&2
  last=$new
done
touch "$work/stop"; sleep 1
median() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
max() { printf '%s\n' "$@" | sort -n | tail -1; }
ok=$(grep -c '^200$' "$work/codes" || true); bad=$(grep -vc '^200$' "$work/codes" || true)
echo "RESULT upgrade_takeover_ms_median=$(median "${taken[@]}") ms"
echo "RESULT upgrade_takeover_ms_max=$(max "${taken[@]}") ms"
echo "RESULT upgrade_old_exit_ms_median=$(median "${exited[@]}") ms"
echo "RESULT upgrade_old_exit_ms_max=$(max "${exited[@]}") ms"
echo "RESULT upgrade_requests_ok=$ok requests"
echo "RESULT upgrade_requests_failed=$bad requests"
echo "RESULT upgrade_submits_failed=$(wc -l < "$work/submit-failed") submits"
[ "$bad" -eq 0 ]

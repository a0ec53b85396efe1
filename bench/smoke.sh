#!/usr/bin/env bash
# ctest bench_smoke: idem-bench for about two seconds against an idemd on a
# fresh SQLite file, a mix of every request type with duplicates. Passes when
# idem-bench's exactly-once verification passes; asserts no speed at all.
#
#   smoke.sh IDEM_BENCH IDEMD IDEMCTL
set -euo pipefail
bench=$1 idemd=$2 idemctl=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-smoke.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

for attempt in 1 2 3; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$idemd" --listen "127.0.0.1:$port" --db "sqlite:$dir/smoke.db" 2>"$dir/idemd.log" &
  pid=$!
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break 2; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
done
[ -n "$pid" ] || { echo "smoke: idemd did not start"; cat "$dir/idemd.log"; exit 1; }

"$bench" --url "127.0.0.1:$port" --db "sqlite:$dir/smoke.db" --idemctl "$idemctl" \
  --duration 2 --concurrency 16 --mix 6,2,1,1 --dup-ratio 0.3 --seed 7

#!/usr/bin/env bash
# bench/callgrind.sh: instructions per request, the repeatable measure of
# idemd's CPU cost (docs/benchmarks.md). Wall-clock rates on this shared
# machine move by 2x from one minute to the next; callgrind's instruction
# counts do not. idemd runs under `valgrind --tool=callgrind` on a fresh
# SQLite database; idem-bench sends N first payment requests, then the very
# same N requests again (same keys and bodies: N replays). The counters are
# zeroed after a short warm-up and dumped after each phase, so each figure
# is idemd's instructions, all threads, for that phase only, divided by N.
#
#   bench/callgrind.sh [BUILD_DIR [N]]     (build, 2000)
#
# Prints "first Ir/request", "replay Ir/request" and the top functions of
# each phase (self cost, BENCH_CG_TOP of them, 25); BENCH_CG_KEEP=DIR keeps
# the callgrind files there; BENCH_CG_IDEMD_FLAGS adds idemd options
# (e.g. "--batch-max 1").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
n=${2:-2000}
top=${BENCH_CG_TOP:-25}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-cg.XXXXXX")
pid=

cleanup() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [ -n "${BENCH_CG_KEEP:-}" ]; then
    mkdir -p "$BENCH_CG_KEEP" && cp "$tmp"/cg.out* "$BENCH_CG_KEEP"/ 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

db="sqlite:$tmp/cg.db"
demo=$("$build/idemctl" --db "$db" demo)
merchant=$(sed -n 's/^Demo merchant \([^,]*\),.*/\1/p' <<<"$demo")
api_key=$(sed -n 's/^  \(sk_[0-9a-f_]*\)$/\1/p' <<<"$demo" | head -n 1)
secret=$(sed -n '/signing secret/{n;s/^  //p}' <<<"$demo")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" \
  "$build/idemd" --db "$db" --listen "127.0.0.1:$port" ${BENCH_CG_IDEMD_FLAGS:-} \
  >/dev/null 2>"$tmp/idemd.log" &
pid=$!
for _ in $(seq 1 600); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/idemd.log" >&2; exit 1; }
  sleep 0.1
done

load() { # run-id requests
  "$build/bench/idem-bench" --url "127.0.0.1:$port" --merchant "$merchant:$api_key" \
    --channel mock --channel-secret "$secret" --no-verify --concurrency 8 --threads 1 \
    --run-id "$1" --requests "$2" --json >"$tmp/load.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("  answers:", d.get("answers", d.get("status", "?")))' \
    "$tmp/load.json" >&2 || true
}

load warm 200 # first requests and their caches settle before counting
callgrind_control -z "$pid" >/dev/null
load cgrun "$n"
callgrind_control -d first "$pid" >/dev/null
load cgrun "$n"
callgrind_control -d replay "$pid" >/dev/null

# callgrind numbers its dumps: .1 is the first phase, .2 the replays.
# libmicrohttpd zeroes its per-connection pool for every request with
# memset (rep stosb, which callgrind counts a byte at a time); that line is
# shown apart so that the rest can be compared.
i=0
for phase in first replay; do
  i=$((i + 1))
  f=$tmp/cg.out.$i
  total=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
  mhd=$(callgrind_annotate --tree=caller --threshold=100 "$f" 2>/dev/null |
    awk 'BEGIN {RS = ""} /\*  [^\n]*__memset_avx2_unaligned_erms/ {
           n = split($0, l, "\n")
           for (j = 1; j <= n; j++) if (l[j] ~ /< .*libmicrohttpd/) {
             v = l[j]; sub(/^ */, "", v); sub(/ .*/, "", v); gsub(",", "", v); s += v }
         } END {print s + 0}' || true)
  printf '%s: %d Ir/request (N=%d), of which %d in libmicrohttpd'"'"'s pool memset\n' \
    "$phase" $((total / n)) "$n" $((${mhd:-0} / n))
  if [ "$top" -gt 0 ]; then
    callgrind_annotate --inclusive=no --threshold=100 "$f" 2>/dev/null |
      sed -n '/file:function/,$p' | grep -v 'clone.S\|pthread_create.c' |
      sed -n "3,$((top + 2))p" | cut -c1-150
  fi
done

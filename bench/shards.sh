#!/usr/bin/env bash
# bench/shards.sh: first-request throughput of one idemd over 1, 2 and 3
# SQLite shards (--db given 1, 2, 3 times), on this one machine: the figure
# is the overhead of sharding, not its scale (the shards share two cores and
# one disk). docs/scaling.md, "Sharding", has the table.
#
#   bench/shards.sh [BUILD_DIR]        (default build)
#
# Each run: fresh files, the mock channel and BENCH_MERCHANTS merchants made
# by idemctl over the shards (so they spread by the directory's function),
# then idem-bench sends first payment requests (no duplicates) for
# BENCH_DURATION seconds from BENCH_CONCURRENCY connections and checks the
# balances through the API (exactly once). Runs are interleaved
# (1, 2, 3, 1, 2, 3, ...) BENCH_ROUNDS times so that a noisy minute hits
# every shard count alike; the table prints every run and the median.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
dur=${BENCH_DURATION:-10}
conc=${BENCH_CONCURRENCY:-32}
merchants=${BENCH_MERCHANTS:-12}
rounds=${BENCH_ROUNDS:-3}
idemd=$build/idemd
idemctl=$build/idemctl
bench=$build/bench/idem-bench
for b in "$idemd" "$idemctl" "$bench"; do
  [ -x "$b" ] || { echo "shards.sh: $b is missing: build first" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-shards.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
json_get() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

run_one() { # shards round
  local n=$1 r=$2 dir="$tmp/run-$1-$2" dbs=() m=() secret port out
  mkdir -p "$dir"
  for i in $(seq 0 $((n - 1))); do dbs+=(--db "sqlite:$dir/shard$i.db"); done
  "$idemctl" "${dbs[@]}" migrate >/dev/null
  secret=$("$idemctl" "${dbs[@]}" --json channel add mock | json_get 'd["secret"]')
  for i in $(seq 1 "$merchants"); do
    m+=(--merchant "$("$idemctl" "${dbs[@]}" --json merchant add "bench$i" |
      json_get 'd["merchant_id"] + ":" + d["api_key"]')")
  done
  port=$(free_port)
  "$idemd" --listen "127.0.0.1:$port" "${dbs[@]}" --sweep-interval-ms 0 >"$dir/idemd.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  out=$("$bench" --url "127.0.0.1:$port" "${m[@]}" --channel mock --channel-secret "$secret" \
    --duration "$dur" --concurrency "$conc" --run-id "s${n}r${r}" --json)
  kill -TERM "$pid"; wait "$pid" || { echo "shards.sh: idemd did not exit 0" >&2; exit 1; }
  pid=
  python3 - "$n" "$out" >>"$tmp/results.jsonl" <<'EOF'
import json, sys
d = json.loads(sys.argv[2])
assert d["verify"] == "ok", d
print(json.dumps({"shards": int(sys.argv[1]), "rps": d["rps"], "p50": d["p50_ms"],
                  "p99": d["p99_ms"], "errors": d["transport_errors"]}))
EOF
  echo "shards.sh: $n shard(s), round $r: $(tail -n 1 "$tmp/results.jsonl")" >&2
}

for r in $(seq 1 "$rounds"); do
  for n in 1 2 3; do run_one "$n" "$r"; done
done

python3 - "$tmp/results.jsonl" "$dur" "$conc" "$merchants" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = None
print("| shards (SQLite files) | first requests/s, each run | median | vs 1 shard | p50 ms | p99 ms |")
print("|---|---|---|---|---|---|")
for n in (1, 2, 3):
    rs = [r for r in rows if r["shards"] == n]
    med = statistics.median(r["rps"] for r in rs)
    base = base or med
    print("| %d | %s | %.0f | %.2f | %.1f | %.1f |" % (
        n, ", ".join("%.0f" % r["rps"] for r in rs), med, med / base,
        statistics.median(r["p50"] for r in rs), statistics.median(r["p99"] for r in rs)))
print()
print("(%ss per run, %s connections, %s merchants spread by the directory; "
      "every run verified exactly-once through the API)" % tuple(sys.argv[2:5]))
EOF

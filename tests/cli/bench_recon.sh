#!/usr/bin/env bash
# The reconciliation import benchmark (not a timed test): generates a file of
# ROWS rows (default 1,000,000) with tests/cli/gen_recon.py, imports it into
# a fresh database twice (the second run inserts nothing), and prints rows/s
# and peak RSS (/usr/bin/time -v) for each run.
#
#   tests/cli/bench_recon.sh BUILD_DIR [DB_URL] [ROWS]
#
# DB_URL defaults to a temp SQLite file; give an empty PostgreSQL/MariaDB
# database to measure those (scripts/db-up.sh starts throwaway servers).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: bench_recon.sh BUILD_DIR [DB_URL] [ROWS]}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-recon-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
db=${2:-sqlite:$tmp/bench.db}
rows=${3:-1000000}
ctl=$(find "$build" -name idemctl -type f -perm -u+x | head -n 1)

python3 "$here/gen_recon.py" "$tmp/recon.csv" "$rows"
echo "file: $rows rows, $(stat -c %s "$tmp/recon.csv") bytes; store: ${db%%:*}"
"$ctl" --db "$db" channel add bench >/dev/null
for run in first second; do
  /usr/bin/time -v -o "$tmp/time.txt" "$ctl" --db "$db" recon import bench "$tmp/recon.csv" \
    --json >"$tmp/report.json"
  secs=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tmp/time.txt" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time.txt")
  python3 - "$tmp/report.json" "$secs" "$rss" "$run" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
secs, rss, run = float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("%s import: %.1f s, %.0f rows/s, peak RSS %.1f MiB; inserted %d, duplicates %d, "
      "invalid %d" % (run, secs, r["rows"] / secs, rss / 1024, r["inserted"],
                       r["duplicates"], len(r["invalid"])))
PY
done

#!/usr/bin/env bash
# bench/first-pair.sh: first requests on SQLite or MariaDB, idemd (one or
# more builds) beside the raw loop doing the same writes, in one invocation,
# interleaved, so a change is measured against the build before it minutes
# apart on the same disk. bench/pg-pair.sh is the same for PostgreSQL.
#
#   bench/first-pair.sh sqlite|mariadb BUILD_DIR [BUILD_DIR...]
#
# Each round runs the raw baseline (raw-sqlite at 1 and 100 units per
# COMMIT, or raw-mariadb's 32 clients), then every build in turn, the order
# rotating by round: a fresh idemd with its defaults on a fresh database,
# idem-bench for BENCH_DURATION seconds at BENCH_CONCURRENCY connections,
# and the exactly-once check. Per run: req/s, p99, and idemd's CPU per
# answer (utime + stime of all its threads from /proc/PID/stat over the
# load). At the end, the median of each row over the rounds. Durable, as
# bench/run.sh: SQLite synchronous=FULL, MariaDB innodb_flush_log_at_trx_commit=1.
# Knobs: PAIR_ROUNDS (3), BENCH_DURATION (8), BENCH_CONCURRENCY (32).
# The first build's idem-bench, idemctl and raw tools drive every run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
backend=${1:-}
shift || true
case "$backend" in sqlite | mariadb) ;; *)
  echo "usage: bench/first-pair.sh sqlite|mariadb BUILD_DIR [BUILD_DIR...]" >&2
  exit 2
  ;;
esac
[ $# -ge 1 ] || { echo "first-pair.sh: name at least one build directory" >&2; exit 2; }
builds=()
for b in "$@"; do builds+=("$(cd "$b" && pwd)"); done
tool=${builds[0]}
rounds=${PAIR_ROUNDS:-3}
dur=${BENCH_DURATION:-8}
conc=${BENCH_CONCURRENCY:-32}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-pair.XXXXXX")
results=$tmp/results.tsv
server_pid=
db_state=
log() { echo "first-pair: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
trap bench_cleanup EXIT

if [ "$backend" = mariadb ]; then
  eval "$("$root/scripts/db-up.sh" --mariadb)"
  db_state=$IDEM_TEST_DB_STATE
  my_sock=$db_state/mariadb/mysql.sock
  mariadb --no-defaults -S "$my_sock" -u root -e 'SET GLOBAL innodb_flush_log_at_trx_commit = 1'
fi

ndb=0
url=
# new_db: url names a fresh, empty database (not in a subshell: ndb counts)
new_db() {
  ndb=$((ndb + 1))
  if [ "$backend" = sqlite ]; then
    url="sqlite:$tmp/pair$ndb.db"
  else
    mariadb --no-defaults -S "$my_sock" -u root -e "CREATE DATABASE idem_pair$ndb"
    url="${IDEM_TEST_MARIADB_URL%/*}/idem_pair$ndb"
  fi
}

# record LABEL RPS P99 CPU_US
record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$results"; printf 'first-pair: %-10s %8.0f req/s  p99 %6s ms  idemd %6s us/ans\n' "$@" >&2; }

raw_round() {
  local rps
  new_db
  "$tool/idemctl" --db "$url" demo >/dev/null
  if [ "$backend" = sqlite ]; then
    for k in 1 100; do
      rps=$("$tool/bench/raw-sqlite" --db "${url#sqlite:}" --per-commit "$k" --duration "$dur" --json |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["rps"]))')
      record "raw_$k" "$rps" - -
    done
  else
    rps=$("$tool/bench/raw-mariadb" --db "$url" --clients "$conc" --duration "$dur" --json |
      python3 -c 'import json,sys; print(round(json.load(sys.stdin)["rps"]))')
    record raw "$rps" - -
  fi
}

idemd_run() { # LABEL BUILD
  local label=$1 b=$2 port t0 t1 out
  new_db
  port=$(free_port)
  "$b/idemd" --db "$url" --listen "127.0.0.1:$port" >/dev/null 2>"$tmp/$label.log" &
  server_pid=$!
  for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    kill -0 "$server_pid" 2>/dev/null || { log "$label: idemd exited: $(tail -n 1 "$tmp/$label.log")"; exit 1; }
    sleep 0.05
  done
  t0=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
  out=$("$tool/bench/idem-bench" --url "127.0.0.1:$port" --db "$url" --idemctl "$tool/idemctl" \
    --concurrency "$conc" --duration "$dur" --json) || out='{"rps":0}'
  t1=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
  stop_server
  read -r rps p99 cpu verify < <(python3 -c '
import json, sys
d = json.loads(sys.argv[1]); ticks = int(sys.argv[2]); hz = int(sys.argv[3]); dur = float(sys.argv[4])
n = d.get("rps", 0) * dur
print(round(d.get("rps", 0)), round(d.get("p99_ms", 0), 2), round(ticks / hz * 1e6 / n, 1) if n else 0, d.get("verify", "-"))
' "$out" $((t1 - t0)) "$(getconf CLK_TCK)" "$dur")
  [ "$verify" = ok ] || log "$label: exactly-once check says $verify"
  record "$label" "$rps" "$p99" "$cpu"
}

log "$backend, ${#builds[@]} build(s), $rounds rounds of $dur s, $conc connections"
for r in $(seq 1 "$rounds"); do
  log "round $r of $rounds"
  raw_round
  n=${#builds[@]}
  for i in $(seq 0 $((n - 1))); do
    j=$(((i + r - 1) % n))
    idemd_run "b$j" "${builds[$j]}"
  done
done
echo "# $backend, builds: ${builds[*]}"
echo "# $(nproc) cores, $(uname -r), $dur s per run, $conc connections, $rounds rounds"
python3 - "$results" <<'PY'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    label, rps, p99, cpu = line.rstrip("\n").split("\t")
    rows.setdefault(label, []).append((float(rps), p99, cpu))
for label, v in rows.items():
    med = statistics.median(r for r, _, _ in v)
    cpus = [float(c) for _, _, c in v if c not in ("-", "0")]
    p99s = [float(p) for _, p, _ in v if p != "-"]
    print("%-8s median %8.0f req/s  runs %s%s" % (
        label, med, " ".join("%.0f" % r for r, _, _ in v),
        "  idemd %.0f us/ans  p99 %.1f ms" % (statistics.median(cpus), statistics.median(p99s))
        if cpus else ""))
PY

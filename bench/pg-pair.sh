#!/usr/bin/env bash
# bench/pg-pair.sh: first requests on PostgreSQL, idemd (one or more builds)
# against pgbench doing the same writes, in one invocation, interleaved, so
# every round gives ratios made minutes apart on the same server. The same
# method as bench/run.sh's PostgreSQL rows (durable server, pgbench -n -M
# prepared -c 32 -j 2 with the three statements of a first payment, idemd
# defaults = group commit on), only repeated and with CPU accounting:
#
#   bench/pg-pair.sh BUILD_DIR [BUILD_DIR...]
#
# Per run it prints req/s, idemd's CPU per answer and the PostgreSQL
# server's CPU per answer (user + system ticks of the postmaster and its
# children, sampled every 0.25 s), and at the end the median of each row over the
# rounds. Knobs: PAIR_ROUNDS (3), BENCH_DURATION (10), BENCH_CONCURRENCY
# (32), PAIR_NOGC (1 also runs each build with --batch-max 1), PAIR_DURABLE
# (1; 0 runs the server with fsync and synchronous_commit off),
# PAIR_PROFILE (1: one extra short idemd run per build with
# pg_stat_statements, printing the statements executed per answer).
# The first build's idem-bench and idemctl drive every run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: pg-pair.sh BUILD_DIR [BUILD_DIR...]" >&2; exit 2; }
builds=()
for b in "$@"; do builds+=("$(cd "$b" && pwd)"); done
rounds=${PAIR_ROUNDS:-3}
dur=${BENCH_DURATION:-10}
conc=${BENCH_CONCURRENCY:-32}
nogc=${PAIR_NOGC:-1}
profile=${PAIR_PROFILE:-0}
bench=${builds[0]}/bench/idem-bench
idemctl=${builds[0]}/idemctl

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-pgpair.XXXXXX")
server_pid=
db_state=
log() { echo "pg-pair: $*" >&2; }
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
trap bench_cleanup EXIT

eval "$("$root/scripts/db-up.sh" --pg)"
db_state=$IDEM_TEST_DB_STATE
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
pg_port=$(cat "$db_state/pg/port")
as_pg_user() {
  local user
  user=$(stat -c %U "$db_state/pg/data")
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}
pg_restart() {
  as_pg_user "$pg_bin/pg_ctl" -D "$db_state/pg/data" -l "$db_state/pg/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=$db_state/pg \
        -c max_connections=300 -c shared_buffers=32MB $*" restart >/dev/null
}
if [ "${PAIR_DURABLE:-1}" = 1 ]; then
  log "restarting PostgreSQL with fsync=on, synchronous_commit=on"
  pg_restart
else
  # db-up.sh's test settings (fsync, synchronous_commit off): what is left
  # when the disk flush costs nothing, i.e. CPU and round trips.
  log "PostgreSQL left with fsync=off, synchronous_commit=off (PAIR_DURABLE=0)"
  pg_restart "-c fsync=off -c synchronous_commit=off"
fi
psql -q "$IDEM_TEST_PG_URL" -c 'CREATE DATABASE idem_bench' >/dev/null
pg_url=${IDEM_TEST_PG_URL%/*}/idem_bench
"$idemctl" --db "$pg_url" demo >/dev/null
merchant=$(psql -qtA "$pg_url" -c 'SELECT id FROM merchants ORDER BY created_at LIMIT 1')
channel=$(psql -qtA "$pg_url" -c 'SELECT name FROM channels LIMIT 1')
# The same script as bench/run.sh's.
cat >"$tmp/first.sql" <<SQL
BEGIN;
INSERT INTO idem_records (scope, business_type, idem_key, version, status, fingerprint, owner, lease_until, created_at, expires_at) VALUES ('$merchant', 'payment', 'pgb-' || txid_current(), 1, 'PROCESSING', '3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468', 'pgbench-owner', 1, 1, 86400001) ON CONFLICT (scope, business_type, idem_key) DO NOTHING RETURNING id AS rid \gset
INSERT INTO payments (id, merchant_id, merchant_order_no, amount, currency, channel, description, metadata, status, refunded_amount, fingerprint, created_at, updated_at) VALUES ('pay_pgb' || txid_current(), '$merchant', 'pgb-' || txid_current(), 1000, 'CNY', '$channel', NULL, NULL, 'processing', 0, '3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468', 1, 1);
UPDATE idem_records SET version = version + 1, status = 'SUCCEEDED', http_status = 201, response = convert_to('{"id": "pay_pgbench0000000000000000", "object": "payment", "merchant_order_no": "pgb-0000000000", "amount": 1000, "currency": "CNY", "channel": "$channel", "status": "processing", "refunded_amount": 0, "created_at": "2026-01-01T00.00.00Z", "updated_at": "2026-01-01T00.00.00Z"}', 'UTF8'), owner = NULL, lease_until = NULL, completed_at = 1 WHERE id = :rid AND owner = 'pgbench-owner' AND status = 'PROCESSING';
END;
SQL

# pg_cpu_start / pg_cpu_stop: ticks of this server's processes while the
# sampler ran (processes that ended between samples lose at most 0.25 s).
pg_cpu_start() {
  python3 - "$tmp/pgcpu" "$(head -n 1 "$db_state/pg/data/postmaster.pid")" <<'PY' &
import os, sys, time, signal
seen = {}
stop = False
def h(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, h)
open(sys.argv[1] + '.ready', 'w').close()
def sample(first):
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % p) as f:
                s = f.read()
        except OSError:
            continue
        f = s[s.rindex(')') + 2:].split()
        # this server only: the postmaster and its children
        if p != sys.argv[2] and f[1] != sys.argv[2]:
            continue
        t = int(f[11]) + int(f[12])
        if p not in seen:
            seen[p] = [t if first else 0, t]
        seen[p][1] = t
sample(True)
while not stop:
    time.sleep(0.25)
    sample(False)
sample(False)
with open(sys.argv[1], 'w') as f:
    f.write(str(sum(b - a for a, b in seen.values())))
PY
  sampler=$!
  for _ in $(seq 1 100); do [ -e "$tmp/pgcpu.ready" ] && break; sleep 0.05; done
  rm -f "$tmp/pgcpu.ready"
}
# Not in a $(...): only this shell can wait for the sampler. Sets pg_ticks.
pg_cpu_stop() {
  kill -TERM "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  pg_ticks=$(cat "$tmp/pgcpu" 2>/dev/null || echo 0)
  rm -f "$tmp/pgcpu"
}
hz=$(getconf CLK_TCK)
results=$tmp/results.tsv
: >"$results"

# row KEY RPS ANSWERS IDEMD_TICKS PG_TICKS P99 IDEMD_SWITCHES
# (idemd's voluntary context switches, all threads: counted, not timed)
row() {
  local us_idemd=- us_pg=- sc=-
  if [ "$3" -gt 0 ]; then
    us_idemd=$(python3 -c "print(round($4 * 1e6 / $hz / $3, 1))")
    us_pg=$(python3 -c "print(round($5 * 1e6 / $hz / $3, 1))")
    [ "$7" -gt 0 ] && sc=$(python3 -c "print(round($7 / $3, 1))")
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$us_idemd" "$us_pg" "$6" "$(cut -d' ' -f1 /proc/loadavg)" "$sc" >>"$results"
  log "$(printf '%-20s %6s req/s  idemd %5s us/ans  pg %5s us/ans  %4s waits/ans  p99 %s ms  load %s' "$1" "$2" "$us_idemd" "$us_pg" "$sc" "$6" "$(cut -d' ' -f1 /proc/loadavg)")"
}

# Voluntary context switches of all of PID's threads: each wait for the
# database (or for work) is one; a round trip saved is one fewer.
csw() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'
}

checkpoint() {
  psql -qtA "$pg_url" -c CHECKPOINT >/dev/null
}

run_pgbench() {
  local out tps n
  checkpoint
  pg_cpu_start
  out=$(pgbench -n -M prepared -f "$tmp/first.sql" -c "$conc" -j $((conc < 2 ? conc : 2)) -T "$dur" "$pg_url" 2>&1) || { echo "$out" >&2; }
  pg_cpu_stop
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | head -n 1)
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
  row pgbench "${tps%.*}" "${n:-0}" 0 "$pg_ticks" - 0
}

# run_idemd KEY BUILD [FLAGS...]
run_idemd() {
  local key=$1 build=$2 out t0 t1 io0 io1 rps n p99 port
  shift 2
  port=$(free_port)
  "$build/idemd" --db "$pg_url" --listen "127.0.0.1:$port" "$@" >/dev/null 2>"$tmp/idemd.log" &
  server_pid=$!
  for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.05
  done
  checkpoint
  t0=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
  io0=$(csw "$server_pid")
  pg_cpu_start
  out=$("$bench" --url "127.0.0.1:$port" --db "$pg_url" --idemctl "$idemctl" \
    --concurrency "$conc" --json --label "$key" --duration "$dur" 2>"$tmp/bench.err") || tail -n 5 "$tmp/bench.err" >&2
  pg_cpu_stop
  t1=$(awk '{print $14 + $15}' "/proc/$server_pid/stat")
  io1=$(csw "$server_pid")
  stop_server
  read -r rps n p99 verify < <(python3 -c 'import json,sys
d=json.loads(sys.argv[1] or "{}")
print(int(d.get("rps",0)), d.get("requests",0), round(d.get("p99_ms",0),1), d.get("verify","-"))' "$out")
  [ "$verify" = ok ] || log "$key: exactly-once check: $verify"
  row "$key" "$rps" "${n:-0}" $((t1 - t0)) "$pg_ticks" "$p99" $((io1 - io0))
}

if [ "$profile" = 1 ]; then
  log "profile: statements per answer (pg_stat_statements)"
  pg_restart "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
  psql -q "$pg_url" -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null
  for i in "${!builds[@]}"; do
    for mode in gc nogc; do
      flags=()
      [ "$mode" = nogc ] && flags=(--batch-max 1)
      psql -qtA "$pg_url" -c 'SELECT pg_stat_statements_reset()' >/dev/null
      run_idemd "profile_b${i}_$mode" "${builds[$i]}" "${flags[@]}"
      psql -qtA "$pg_url" -F ' | ' -c "SELECT calls, round(total_exec_time::numeric, 0) AS ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'idem_bench') ORDER BY calls DESC LIMIT 20" >&2
      psql -qtA "$pg_url" -c "SELECT 'xact_commit', xact_commit FROM pg_stat_database WHERE datname = 'idem_bench'" >&2
    done
  done
  if [ "${PAIR_DURABLE:-1}" = 1 ]; then pg_restart; else pg_restart "-c fsync=off -c synchronous_commit=off"; fi
fi

# Every run starts from a CHECKPOINT (so none inherits the previous run's
# dirty buffers), and the builds take turns going first.
for r in $(seq 1 "$rounds"); do
  log "round $r of $rounds"
  order=("${!builds[@]}")
  if [ $((r % 2)) = 0 ]; then
    order=()
    for ((i = ${#builds[@]} - 1; i >= 0; i--)); do order+=("$i"); done
  fi
  run_pgbench
  for i in "${order[@]}"; do
    run_idemd "b${i}_first" "${builds[$i]}"
    if [ "$nogc" = 1 ]; then run_idemd "b${i}_first_nogc" "${builds[$i]}" --batch-max 1; fi
  done
done

echo "# builds: ${builds[*]}"
echo "# $(nproc) cores, $(uname -r), ${dur} s per run, $conc connections, $rounds rounds"
echo -e "# run\treq/s\tidemd_us\tpg_us\tp99_ms\tload1\tidemd_waits"
cat "$results"
python3 - "$results" <<'PY'
import sys, statistics as st
rows = {}
order = []
for line in open(sys.argv[1]):
    k, rps, ui, up, p99, load, sc = line.rstrip('\n').split('\t')
    if k not in rows:
        rows[k] = []
        order.append(k)
    rows[k].append((float(rps), ui, up, p99, load, sc))
pgb = [r[0] for r in rows.get('pgbench', [])]
print('# medians (ratio: median of the per-round ratios to that round\'s pgbench)')
for k in order:
    v = rows[k]
    med = st.median(r[0] for r in v)
    num = lambda i: [float(r[i]) for r in v if r[i] not in ('-', '')]
    ratio = ''
    if k != 'pgbench' and pgb:
        ratio = '%.2fx' % st.median(r[0] / p for r, p in zip(v, pgb) if p > 0)
    ui, up, sc = num(1), num(2), num(5)
    print('%-20s %8.0f req/s  idemd %s us  pg %s us  %s waits  %s' % (k, med,
          '%.0f' % st.median(ui) if ui else '-', '%.0f' % st.median(up) if up else '-',
          '%.1f' % st.median(sc) if sc else '-', ratio))
PY

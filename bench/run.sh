#!/usr/bin/env bash
# bench/run.sh: the benchmark behind docs/benchmarks.md. `make bench` calls it
# after building; it builds nothing itself. Every scenario runs idemd (fresh,
# on a free loopback port, on a temp database) and its baseline in this one
# invocation, on this machine, so every result is also a ratio. At the end
# the table between the markers in docs/benchmarks.md is replaced; the prose
# around it is kept.
#
#   bench/run.sh [BUILD_DIR]           (default build-bench)
#
# Knobs (environment): BENCH_DURATION seconds per timed run (10),
# BENCH_CONCURRENCY connections / clients (32), BENCH_RSS_KEYS distinct keys
# for the memory run (1000000), BENCH_RSS_SECONDS its time cap (60, twice),
# BENCH_DBS "pg mariadb" (which servers to start; "" for SQLite only),
# BENCH_DURABLE 1 (run the servers with fsync on; 0 keeps db-up.sh's
# test settings), BENCH_DOC (docs/benchmarks.md; "" to print only),
# BENCH_RSS 1 (0 skips the memory runs).
#
# Every server run also records the server's CPU time over the load
# (utime + stime from /proc/PID/stat, all threads): the table prints it per
# answered request. It includes idem-bench's untimed warm-up and its
# verification reads, a few hundred requests against tens of thousands.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build-bench}" && pwd)
dur=${BENCH_DURATION:-10}
conc=${BENCH_CONCURRENCY:-32}
rss_keys=${BENCH_RSS_KEYS:-1000000}
rss_secs=${BENCH_RSS_SECONDS:-60}
dbs=${BENCH_DBS-pg mariadb}
durable=${BENCH_DURABLE:-1}
doc=${BENCH_DOC-$root/docs/benchmarks.md}

idemd=$build/idemd
idemctl=$build/idemctl
bench=$build/bench/idem-bench
static=$build/bench/static-server
raw_sqlite=$build/bench/raw-sqlite
raw_mariadb=$build/bench/raw-mariadb
for b in "$idemd" "$idemctl" "$bench" "$static" "$raw_sqlite" "$raw_mariadb"; do
  [ -x "$b" ] || { echo "run.sh: $b is missing: build first (make bench)" >&2; exit 1; }
done

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench.XXXXXX")
results=$tmp/results.jsonl
: >"$results"
server_pid=
db_state=
log() { echo "run.sh: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
trap bench_cleanup EXIT

# idemd flags that exist in this build (group commit and cache arrived later)
help_text=$("$idemd" --help 2>&1 || true)
has_flag() { grep -q -- "$1" <<<"$help_text"; }
gc_flags=()
has_flag --batch-max && gc_flags=(--batch-max 1)
cache_cap_mb=
if has_flag --cache-mb; then cache_cap_mb=${BENCH_CACHE_MB:-64}; fi


# start_server NAME CMD... : start a server on $port (chosen here), wait
# until it answers. idemd answers /healthz; static-server answers anything.
start_server() {
  local name=$1
  shift
  for attempt in 1 2 3; do
    port=$(free_port)
    "$@" --listen "127.0.0.1:$port" >/dev/null 2>"$tmp/$name.log" &
    server_pid=$!
    for _ in $(seq 1 200); do
      if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then return 0; fi
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.05
    done
    log "$name did not start on port $port (attempt $attempt)"
    tail -n 5 "$tmp/$name.log" >&2 || true
    stop_server
  done
  return 1
}

# record KEY JSON-LINE [EXTRA-JSON-FIELDS]: one result, tagged
record() {
  local extra=${3:-}
  [ -n "$extra" ] || extra='{}'
  python3 -c 'import json,sys; d=json.loads(sys.argv[2]); d["key"]=sys.argv[1]; d.update(json.loads(sys.argv[3])); print(json.dumps(d))' \
    "$1" "$2" "$extra" >>"$results"
  python3 -c 'import json,sys; d=json.loads(sys.argv[2]); print("run.sh: %-28s %10.0f req/s  p99 %s ms  verify %s" % (sys.argv[1], d.get("rps",0), round(d.get("p99_ms",0),2) if "p99_ms" in d else "-", d.get("verify","-")))' \
    "$1" "$2" >&2
}

# The server's CPU time so far (user + system, clock ticks, all threads).
ticks() {
  awk '{print $14 + $15}' "/proc/$server_pid/stat" 2>/dev/null || echo 0
}
hz=$(getconf CLK_TCK)

# cpu_json TICKS-BEFORE TICKS-AFTER: the extra fields of a server run
cpu_json() {
  echo "{\"cpu_ticks\": $(($2 - $1)), \"clk_tck\": $hz}"
}

# load KEY DB-URL ARGS... : idem-bench against the running idemd
load() {
  local key=$1 db=$2 out t0 t1
  shift 2
  t0=$(ticks)
  out=$("$bench" --url "127.0.0.1:$port" --db "$db" --idemctl "$idemctl" \
    --concurrency "$conc" --json --label "$key" "$@") || true
  t1=$(ticks)
  [ -n "$out" ] || out='{"rps":0,"verify":"error"}'
  record "$key" "$out" "$(cpu_json "$t0" "$t1")"
}

# idemd_run KEY DB-URL [IDEMD FLAGS...] -- [BENCH ARGS...]
idemd_run() {
  local key=$1 db=$2 flags=() args=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  args=("$@")
  start_server idemd "$idemd" --db "$db" "${flags[@]}"
  load "$key" "$db" "${args[@]}"
  stop_server
}

unique=(--duration "$dur")
hot=(--duration "$dur" --dup-ratio 0.9 --hot-keys 1000)
replay=(--duration "$dur" --dup-ratio 1 --hot-keys 1000)

# ---- 1. replay path, cache warm, vs libmicrohttpd's static body -----------
log "replay path vs static body"
start_server static "$static"
t0=$(ticks)
out=$("$bench" --url "127.0.0.1:$port" --no-verify --concurrency "$conc" --json \
  --label static "${replay[@]}") || out='{"rps":0}'
record static "$out" "$(cpu_json "$t0" "$(ticks)")"
stop_server
idemd_run replay "sqlite:$tmp/replay.db" -- "${replay[@]}"

# ---- 2. first requests on SQLite (synchronous=FULL) vs the raw loop -------
log "SQLite first requests vs raw loop"
"$idemctl" --db "sqlite:$tmp/raw.db" demo >/dev/null
record raw_sqlite_1 "$("$raw_sqlite" --db "$tmp/raw.db" --per-commit 1 --duration "$dur" --json)"
record raw_sqlite_100 "$("$raw_sqlite" --db "$tmp/raw.db" --per-commit 100 --duration "$dur" --json)"
if [ ${#gc_flags[@]} -gt 0 ]; then
  idemd_run sqlite_first_nogc "sqlite:$tmp/first-nogc.db" "${gc_flags[@]}" -- "${unique[@]}"
fi
idemd_run sqlite_first "sqlite:$tmp/first.db" -- "${unique[@]}"

# ---- 3. 90 % duplicates over 1,000 hot keys (vs sqlite_first) -------------
log "90 % duplicates over 1,000 hot keys"
idemd_run sqlite_hot90 "sqlite:$tmp/hot.db" -- "${hot[@]}"

# ---- 4. PostgreSQL and MariaDB vs pgbench / the raw client ----------------
if [ -n "$dbs" ]; then
  log "starting throwaway database servers ($dbs)"
  up_args=()
  case "$dbs" in
    pg) up_args=(--pg) ;;
    mariadb) up_args=(--mariadb) ;;
  esac
  eval "$("$root/scripts/db-up.sh" "${up_args[@]}")"
  db_state=${IDEM_TEST_DB_STATE:-}
fi

as_pg_user() {
  local user
  user=$(stat -c %U "$db_state/pg/data")
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}

if [ -n "${IDEM_TEST_PG_URL:-}" ] && command -v pgbench >/dev/null; then
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  pg_port=$(cat "$db_state/pg/port")
  if [ "$durable" = 1 ]; then
    # db-up.sh runs PostgreSQL with fsync and synchronous_commit off (fine for
    # tests); a commit here must reach the disk, so restart it without those.
    log "restarting PostgreSQL with fsync=on, synchronous_commit=on"
    as_pg_user "$pg_bin/pg_ctl" -D "$db_state/pg/data" -l "$db_state/pg/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=$db_state/pg \
          -c max_connections=300 -c shared_buffers=32MB" restart >/dev/null
  fi
  psql -q "$IDEM_TEST_PG_URL" -c 'CREATE DATABASE idem_bench' >/dev/null
  pg_url=${IDEM_TEST_PG_URL%/*}/idem_bench
  "$idemctl" --db "$pg_url" demo >/dev/null
  merchant=$(psql -qtA "$pg_url" -c 'SELECT id FROM merchants ORDER BY created_at LIMIT 1')
  channel=$(psql -qtA "$pg_url" -c 'SELECT name FROM channels LIMIT 1')
  # The writes of a first payment request, as idemd's PostgreSQL store sends
  # them. No ':' before a letter or digit inside literals: pgbench would
  # take it for a variable.
  cat >"$tmp/first.sql" <<SQL
BEGIN;
INSERT INTO idem_records (scope, business_type, idem_key, version, status, fingerprint, owner, lease_until, created_at, expires_at) VALUES ('$merchant', 'payment', 'pgb-' || txid_current(), 1, 'PROCESSING', '3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468', 'pgbench-owner', 1, 1, 86400001) ON CONFLICT (scope, business_type, idem_key) DO NOTHING RETURNING id AS rid \gset
INSERT INTO payments (id, merchant_id, merchant_order_no, amount, currency, channel, description, metadata, status, refunded_amount, fingerprint, created_at, updated_at) VALUES ('pay_pgb' || txid_current(), '$merchant', 'pgb-' || txid_current(), 1000, 'CNY', '$channel', NULL, NULL, 'processing', 0, '3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468', 1, 1);
UPDATE idem_records SET version = version + 1, status = 'SUCCEEDED', http_status = 201, response = convert_to('{"id": "pay_pgbench0000000000000000", "object": "payment", "merchant_order_no": "pgb-0000000000", "amount": 1000, "currency": "CNY", "channel": "$channel", "status": "processing", "refunded_amount": 0, "created_at": "2026-01-01T00.00.00Z", "updated_at": "2026-01-01T00.00.00Z"}', 'UTF8'), owner = NULL, lease_until = NULL, completed_at = 1 WHERE id = :rid AND owner = 'pgbench-owner' AND status = 'PROCESSING';
END;
SQL
  log "pgbench -c $conc -j 2 -T $dur"
  pgb=$(pgbench -n -M prepared -f "$tmp/first.sql" -c "$conc" -j 2 -T "$dur" "$pg_url" 2>&1) || {
    echo "$pgb" >&2
    pgb=
  }
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$pgb" | head -n 1)
  record pgbench "{\"rps\": ${tps:-0}, \"label\": \"pgbench\"}"
  if [ ${#gc_flags[@]} -gt 0 ]; then
    idemd_run pg_first_nogc "$pg_url" "${gc_flags[@]}" -- "${unique[@]}"
  fi
  idemd_run pg_first "$pg_url" -- "${unique[@]}"
else
  log "PostgreSQL not available: skipped"
fi

if [ -n "${IDEM_TEST_MARIADB_URL:-}" ]; then
  my_admin=$IDEM_TEST_MARIADB_URL
  my_url=${my_admin%/*}/idem_bench
  my_sock=$db_state/mariadb/mysql.sock
  if [ "$durable" = 1 ]; then
    log "MariaDB: innodb_flush_log_at_trx_commit=1"
    mariadb --no-defaults -S "$my_sock" -u root -e 'SET GLOBAL innodb_flush_log_at_trx_commit = 1'
  fi
  mariadb --no-defaults -S "$my_sock" -u root -e 'CREATE DATABASE idem_bench'
  "$idemctl" --db "$my_url" demo >/dev/null
  log "raw-mariadb --clients $conc"
  record raw_mariadb "$("$raw_mariadb" --db "$my_url" --clients "$conc" --duration "$dur" --json || echo '{"rps":0}')"
  if [ ${#gc_flags[@]} -gt 0 ]; then
    idemd_run my_first_nogc "$my_url" "${gc_flags[@]}" -- "${unique[@]}"
  fi
  idemd_run my_first "$my_url" -- "${unique[@]}"
else
  log "MariaDB not available: skipped"
fi
if [ -n "$db_state" ]; then
  "$root/scripts/db-down.sh" "$db_state" >/dev/null 2>&1 || true
  db_state=
fi

# ---- 5. peak RSS after N distinct keys ------------------------------------
# The same load twice: with the front cache off, then on with a small cap
# (BENCH_RSS_CACHE_MB, 16) that the keys overflow well before the end. The
# difference of the two peaks is what the cache holds, which must stay
# within its cap; everything else (SQLite's page caches, connections,
# arenas) grows alike in both runs.
rss_cap=${BENCH_RSS_CACHE_MB:-16}
rss_run() { # key cache-mb
  local key=$1 mb=$2 out hwm_start hwm_end
  local flags=(--sqlite-synchronous normal)
  [ -n "$cache_cap_mb" ] && flags+=(--cache-mb "$mb")
  start_server "idemd_$key" "$idemd" --db "sqlite:$tmp/$key.db" "${flags[@]}"
  hwm_start=$(awk '/^VmHWM/ {print $2}' "/proc/$server_pid/status")
  out=$("$bench" --url "127.0.0.1:$port" --db "sqlite:$tmp/$key.db" --idemctl "$idemctl" \
    --concurrency "$conc" --json --label "$key" --requests "$rss_keys" --duration "$rss_secs") || true
  hwm_end=$(awk '/^VmHWM/ {print $2}' "/proc/$server_pid/status")
  stop_server
  [ -n "$out" ] || out='{"rps":0,"verify":"error"}'
  record "$key" "$out" \
    "{\"hwm_start_kb\": ${hwm_start:-0}, \"hwm_end_kb\": ${hwm_end:-0}, \"cache_mb\": \"$mb\", \"keys_target\": $rss_keys}"
}
if [ "${BENCH_RSS:-1}" = 1 ]; then
  log "peak RSS after up to $rss_keys distinct keys (cap ${rss_secs}s each), cache off then ${rss_cap} MB"
  rss_run rss_nocache 0
  rss_run rss "$rss_cap"
fi

# ---- the table --------------------------------------------------------------
machine=$(printf '%s cores, %s; Linux %s; %s' "$(nproc)" \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" "$(uname -r)" \
  "$(df -h "$tmp" | awk 'NR==2 {print $1 " (" $2 ")"}')")
# The machine is shared: say how busy it was (1, 5, 15-minute load averages).
machine="$machine; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
python3 "$root/bench/table.py" "$results" "$machine" "$dur" "$conc" \
  "$([ ${#gc_flags[@]} -gt 0 ] && echo yes || echo no)" "$durable" "${doc:-}"

#!/usr/bin/env bash
# Starts a throwaway N-node MariaDB Galera cluster (galera-4) on loopback for
# the Galera test suite and benchmarks: every node's data, socket, logs and
# config in one temp state dir, every port (SQL, group communication, IST,
# SST) a free one on 127.0.0.1, a cluster name of its own so it can never
# join anything else. Prints shell lines to eval:
#
#   eval "$(scripts/galera-up.sh 3)"
#   ... IDEM_TEST_GALERA_URLS: comma-separated admin URLs, node 1 first ...
#   scripts/galera-down.sh "$IDEM_TEST_GALERA_STATE"
#
# Each node's dir holds start.sh (start it again after a kill: recovers its
# position from InnoDB, then rejoins by IST) and mariadbd.pid, which is how
# the fault tests kill -9 a node and bring it back. Installs nothing:
# scripts/deps.sh --all installs galera-4, mariadb-server and rsync.
#
# Unlike db-up.sh's server, this one is durable the way a production node is
# (innodb_flush_log_at_trx_commit=1): the suite's "nothing acknowledged is
# lost when a node dies" must test Galera and idemd, not a relaxed fsync.
# docs/scaling.md explains every wsrep setting below.
set -euo pipefail

n=${1:-3}
case "$n" in
  [1-9]) ;;
  *) echo "usage: galera-up.sh [N]   (1 to 9 nodes, default 3)" >&2; exit 2 ;;
esac

log() { echo "galera-up.sh: $*" >&2; }

my_sbin=${IDEM_MARIADB_SBIN:-/usr/sbin}
provider=${IDEM_GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}
for need in "$my_sbin/mariadbd" "$provider"; do
  [ -e "$need" ] || { log "$need not found (install: scripts/deps.sh --all)"; exit 1; }
done
for cmd in mariadb-install-db mariadb rsync; do
  command -v "$cmd" >/dev/null || { log "$cmd not found (install: scripts/deps.sh --all)"; exit 1; }
done

user=mysql
[ "$(id -u)" -eq 0 ] || user=$(id -un)
as_user() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}

state=$(mktemp -d "${TMPDIR:-/tmp}/idem-galera.XXXXXX")
chmod 755 "$state"
started=0
trap 'if [ $started -eq 0 ]; then "$(dirname "$0")/galera-down.sh" "$state" >&2 || true; fi' EXIT

# 4 ports a node, all held open at once so no two of them are the same.
read -r -a ports <<<"$(python3 - "$((4 * n))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)"

gcomm=
for i in $(seq 1 "$n"); do
  gcomm+="${gcomm:+,}127.0.0.1:${ports[$((4 * (i - 1) + 1))]}"
done
cluster=idem-test-${state##*.}

# One data dir made once, copied to every node before the first start; the
# joiners' copies are replaced by their state transfer from node 1 anyway.
mkdir -p "$state/seed"
[ "$(id -u)" -ne 0 ] || chown "$user" "$state/seed"
as_user mariadb-install-db --no-defaults --datadir="$state/seed/data" \
  --auth-root-authentication-method=normal --skip-test-db >"$state/seed/install.log" 2>&1 ||
  { cat "$state/seed/install.log" >&2; exit 1; }

for i in $(seq 1 "$n"); do
  dir=$state/n$i
  sql_port=${ports[$((4 * (i - 1)))]}
  gm_port=${ports[$((4 * (i - 1) + 1))]}
  ist_port=${ports[$((4 * (i - 1) + 2))]}
  sst_port=${ports[$((4 * (i - 1) + 3))]}
  mkdir -p "$dir"
  cp -a "$state/seed/data" "$dir/data"
  echo "$sql_port" >"$dir/port"
  cat >"$dir/my.cnf" <<CNF
# Node $i of a throwaway idem test cluster (scripts/galera-up.sh).
[mariadbd]
datadir = $dir/data
socket = $dir/mysql.sock
pid-file = $dir/mariadbd.pid
log-error = $dir/server.log
port = $sql_port
bind-address = 127.0.0.1
skip-networking = 0
skip-name-resolve
max_connections = 300
character_set_server = utf8mb4
collation_server = utf8mb4_bin
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
# Durable commits, as in production: an acknowledged write is on this node's
# disk, not only in the other nodes' memory.
innodb_flush_log_at_trx_commit = 1
# Galera's requirements: row events are what it replicates, and interleaved
# auto-increment locks so parallel appliers never queue on a table lock.
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $provider
wsrep_cluster_name = $cluster
wsrep_cluster_address = gcomm://$gcomm
wsrep_node_name = n$i
wsrep_node_address = 127.0.0.1:$gm_port
# rsync SST: a plain file copy on loopback, no credentials needed.
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$sst_port
# Two appliers for two cores.
wsrep_slave_threads = 2
# Causal reads: a SELECT or START TRANSACTION first waits until this node has
# applied every write set the cluster committed before it, so a payment
# acknowledged by node 1 is never "not found" (a stored 404) on node 2.
wsrep_sync_wait = 1
# Failure detection sized for loopback (no jitter): a node that stops
# answering is suspected after 3 s, evicted after 6 s at most, so a kill -9
# stalls the survivors seconds, not the default 5 to 15. pc.recovery lets the
# members of the last primary component re-form it after they all crashed.
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$gm_port;ist.recv_addr=127.0.0.1:$ist_port;gcache.size=64M;evs.keepalive_period=PT1S;evs.inactive_check_period=PT1S;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S;evs.install_timeout=PT6S;pc.recovery=TRUE;repl.causal_read_timeout=PT10S"
CNF
  # start.sh [--new-cluster]: start this node in the background. After a
  # crash its grastate.dat says seqno -1; the position InnoDB recovered is
  # passed on so the node rejoins by IST (the donor keeps serving) instead of
  # a full SST (the donor blocks its writes while it copies).
  cat >"$dir/start.sh" <<START
#!/usr/bin/env bash
set -euo pipefail
dir=$dir
as_user() { if [ "\$(id -u)" -eq 0 ]; then runuser -u $user -- "\$@"; else "\$@"; fi; }
extra=()
[ "\${1:-}" = --new-cluster ] && extra+=(--wsrep-new-cluster)
if [ -f "\$dir/data/grastate.dat" ] && grep -q '^seqno: *-1' "\$dir/data/grastate.dat"; then
  rm -f "\$dir/recover.log"
  as_user $my_sbin/mariadbd --defaults-file="\$dir/my.cnf" --wsrep-recover \\
    --log-error="\$dir/recover.log" </dev/null >/dev/null 2>&1 || true
  pos=\$(sed -n 's/.*WSREP: Recovered position: *//p' "\$dir/recover.log" 2>/dev/null | tail -n 1)
  [ -n "\$pos" ] && extra+=(--wsrep-start-position="\$pos")
fi
as_user $my_sbin/mariadbd --defaults-file="\$dir/my.cnf" "\${extra[@]}" </dev/null >/dev/null 2>&1 &
echo \$! >"\$dir/launcher.pid"
START
  chmod 755 "$dir/start.sh"
  [ "$(id -u)" -ne 0 ] || chown -R "$user" "$dir"
done
rm -rf "$state/seed"

status_of() { # node var
  mariadb --no-defaults -S "$state/n$1/mysql.sock" -u root -N -B \
    -e "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | cut -f2
}

wait_synced() { # node want_size
  local i=$1 size=$2 t
  for t in $(seq 1 480); do
    if [ "$(status_of "$i" wsrep_local_state_comment)" = Synced ] &&
      [ "$(status_of "$i" wsrep_cluster_size)" = "$size" ]; then
      return 0
    fi
    if [ -f "$state/n$i/launcher.pid" ] && ! kill -0 "$(cat "$state/n$i/launcher.pid")" 2>/dev/null; then
      log "node $i exited during startup"
      break
    fi
    sleep 0.25
  done
  log "node $i did not reach Synced with $size nodes (log $state/n$i/server.log):"
  tail -n 15 "$state/n$i/server.log" >&2 || true
  return 1
}

t0=$(date +%s.%N)
"$state/n1/start.sh" --new-cluster
wait_synced 1 1
my_pass='idem p@ss:/%'
my_pass_url='idem%20p%40ss%3A%2F%25'
# Users are DDL: replicated to every node that joins.
mariadb --no-defaults -S "$state/n1/mysql.sock" -u root <<SQL
CREATE USER 'idem'@'127.0.0.1' IDENTIFIED BY '$my_pass';
GRANT ALL PRIVILEGES ON *.* TO 'idem'@'127.0.0.1' WITH GRANT OPTION;
SQL
# Joiners one at a time: node 1 is every joiner's donor, one SST at a time.
for i in $(seq 2 "$n"); do
  "$state/n$i/start.sh"
  wait_synced "$i" "$i"
done
urls=
for i in $(seq 1 "$n"); do
  urls+="${urls:+,}mysql://idem:$my_pass_url@127.0.0.1:$(cat "$state/n$i/port")/mysql"
done
echo "$n" >"$state/nodes"
log "$n-node Galera cluster $cluster up in $(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)") s (state $state)"
started=1
printf 'export'
printf ' %q' "IDEM_TEST_GALERA_STATE=$state" "IDEM_TEST_GALERA_URLS=$urls"
printf '\n'

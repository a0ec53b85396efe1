#!/usr/bin/env bash
# Starts throwaway PostgreSQL and MariaDB servers for the test suite, owned
# by the caller: data, sockets and logs in one temp state dir, listening on
# free ports on 127.0.0.1 only, tuned for speed (fsync off), never for data
# anyone keeps. Prints shell lines to eval:
#
#   eval "$(scripts/db-up.sh)"          # both servers whose binaries exist
#   eval "$(scripts/db-up.sh --pg)"     # only PostgreSQL (--mariadb: only MariaDB)
#   ... IDEM_TEST_PG_URL / IDEM_TEST_MARIADB_URL are admin URLs ...
#   scripts/db-down.sh "$IDEM_TEST_DB_STATE"
#
# The URLs name an admin database; the tests create a fresh database per
# test under it. Run as root, the servers run as the postgres / mysql system
# users (PostgreSQL refuses root). Installs nothing: scripts/deps.sh --all
# installs the servers.
set -euo pipefail

want_pg=auto want_my=auto
case "${1:-}" in
  --pg) want_my=no want_pg=yes ;;
  --mariadb) want_pg=no want_my=yes ;;
  "") ;;
  *) echo "usage: db-up.sh [--pg|--mariadb]" >&2; exit 2 ;;
esac

log() { echo "db-up.sh: $*" >&2; }

# Where the server binaries are. IDEM_PG_BIN names one PostgreSQL bin dir;
# IDEM_PG_ROOT (default /usr/lib/postgresql) and IDEM_MARIADB_SBIN (default
# /usr/sbin) are where to look: the tests point them at an empty dir to
# simulate a machine without the servers. A glob, not `ls | sort` under
# pipefail: with no PostgreSQL installed, ls failing ended the script silently.
pg_bin=${IDEM_PG_BIN:-}
if [ -z "$pg_bin" ]; then
  for d in "${IDEM_PG_ROOT:-/usr/lib/postgresql}"/*/bin; do
    [ -x "$d/initdb" ] || continue
    if [ -z "$pg_bin" ] || [ "$(printf '%s\n%s\n' "$pg_bin" "$d" | sort -V | tail -n 1)" = "$d" ]; then
      pg_bin=$d
    fi
  done
fi
have_pg() { [ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] && [ -x "$pg_bin/pg_ctl" ]; }
my_sbin=${IDEM_MARIADB_SBIN:-/usr/sbin}
my_bin=
[ -x "$my_sbin/mariadbd" ] && my_bin=$my_sbin/mariadbd
have_my() {
  [ -n "$my_bin" ] && command -v mariadb-install-db >/dev/null && command -v mariadb >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Run a command as the server's system user when we are root.
as_user() {
  local user=$1
  shift
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}

state=$(mktemp -d "${TMPDIR:-/tmp}/idem-db.XXXXXX")
chmod 755 "$state"
exports=("IDEM_TEST_DB_STATE=$state")
started=0
# On any failure, stop what was started so nothing is left running.
trap 'if [ $started -eq 0 ]; then "$(dirname "$0")/db-down.sh" "$state" >&2 || true; fi' EXIT

start_pg() {
  local user=postgres dir=$state/pg port
  [ "$(id -u)" -eq 0 ] || user=$(id -un)
  mkdir -p "$dir"
  [ "$(id -u)" -ne 0 ] || chown "$user" "$dir"
  as_user "$user" "$pg_bin/initdb" -D "$dir/data" -U idem --auth=trust -E UTF8 --no-locale \
    --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
  for attempt in 1 2 3; do
    port=$(free_port)
    if as_user "$user" "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir \
          -c max_connections=300 -c fsync=off -c synchronous_commit=off \
          -c full_page_writes=off -c shared_buffers=32MB" start >&2; then
      echo "$port" >"$dir/port"
      exports+=("IDEM_TEST_PG_URL=postgresql://idem@127.0.0.1:$port/postgres")
      log "PostgreSQL on 127.0.0.1:$port (log $dir/server.log)"
      return 0
    fi
    log "PostgreSQL did not start on port $port (attempt $attempt)"
    tail -n 5 "$dir/server.log" >&2 || true
  done
  return 1
}

# The test user's password has URL-special characters on purpose: the store's
# URL parser must percent-decode it.
my_pass='idem p@ss:/%'
my_pass_url='idem%20p%40ss%3A%2F%25'

start_my() {
  local user=mysql dir=$state/mariadb port sock
  [ "$(id -u)" -eq 0 ] || user=$(id -un)
  mkdir -p "$dir"
  [ "$(id -u)" -ne 0 ] || chown "$user" "$dir"
  sock=$dir/mysql.sock
  as_user "$user" mariadb-install-db --no-defaults --datadir="$dir/data" \
    --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 ||
    { cat "$dir/install.log" >&2; return 1; }
  for attempt in 1 2 3; do
    port=$(free_port)
    as_user "$user" "$my_bin" --no-defaults --datadir="$dir/data" --socket="$sock" \
      --port="$port" --bind-address=127.0.0.1 --skip-networking=0 --skip-name-resolve \
      --pid-file="$dir/mariadbd.pid" --log-error="$dir/server.log" \
      --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 --sync-binlog=0 \
      --max-connections=300 --character-set-server=utf8mb4 --collation-server=utf8mb4_bin \
      </dev/null >/dev/null 2>&1 &
    for _ in $(seq 1 120); do
      if mariadb --no-defaults -S "$sock" -u root -e 'SELECT 1' >/dev/null 2>&1; then break; fi
      kill -0 $! 2>/dev/null || break
      sleep 0.25
    done
    if mariadb --no-defaults -S "$sock" -u root -e 'SELECT 1' >/dev/null 2>&1; then
      mariadb --no-defaults -S "$sock" -u root <<SQL
CREATE USER 'idem'@'127.0.0.1' IDENTIFIED BY '$my_pass';
GRANT ALL PRIVILEGES ON *.* TO 'idem'@'127.0.0.1' WITH GRANT OPTION;
SQL
      echo "$port" >"$dir/port"
      exports+=("IDEM_TEST_MARIADB_URL=mysql://idem:$my_pass_url@127.0.0.1:$port/mysql")
      log "MariaDB on 127.0.0.1:$port (log $dir/server.log)"
      return 0
    fi
    log "MariaDB did not start on port $port (attempt $attempt)"
    tail -n 5 "$dir/server.log" >&2 || true
    [ -f "$dir/mariadbd.pid" ] && kill "$(cat "$dir/mariadbd.pid")" 2>/dev/null || true
    wait $! 2>/dev/null || true
  done
  return 1
}

# Asked for by name (--pg, --mariadb), a missing server is an error; in the
# default mode it is reported and the caller (run-tests.sh) decides.
missing() {
  if [ "$2" = auto ]; then
    log "$1 server binaries not found: not started (install: scripts/deps.sh --all)"
  else
    log "$1 server binaries not found (install: scripts/deps.sh --all)"
    exit 1
  fi
}
if [ "$want_pg" != no ]; then
  if have_pg; then start_pg; else missing PostgreSQL "$want_pg"; fi
fi
if [ "$want_my" != no ]; then
  if have_my; then start_my; else missing MariaDB "$want_my"; fi
fi
started=1
printf 'export'
for e in "${exports[@]}"; do printf " %q" "$e"; done
printf '\n'

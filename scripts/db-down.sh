#!/usr/bin/env bash
# Stops the throwaway servers scripts/db-up.sh started and removes their
# state dir (data, sockets, logs). Only touches processes whose pid files are
# inside that dir, so it can never stop a server it did not start.
#
#   scripts/db-down.sh "$IDEM_TEST_DB_STATE"
set -uo pipefail
state=${1:?usage: db-down.sh STATE_DIR}
case "$state" in
  */idem-db.*) ;;
  *) echo "db-down.sh: $state is not a db-up.sh state dir" >&2; exit 2 ;;
esac
[ -d "$state" ] || exit 0

pg_bin=${IDEM_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}

if [ -f "$state/pg/data/postmaster.pid" ]; then
  pid=$(head -n 1 "$state/pg/data/postmaster.pid")
  user=$(stat -c %U "$state/pg/data")
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$user" -- "$pg_bin/pg_ctl" -D "$state/pg/data" -m immediate -w stop >/dev/null 2>&1
  else
    "$pg_bin/pg_ctl" -D "$state/pg/data" -m immediate -w stop >/dev/null 2>&1
  fi
  # pg_ctl failed (no binary, already half dead): signal the postmaster itself.
  kill -0 "$pid" 2>/dev/null && kill -QUIT "$pid" 2>/dev/null
fi

if [ -f "$state/mariadb/mariadbd.pid" ]; then
  pid=$(cat "$state/mariadb/mariadbd.pid")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
fi

rm -rf "$state"

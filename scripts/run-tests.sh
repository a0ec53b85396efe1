#!/usr/bin/env bash
# Runs the whole test suite from a configured build directory:
#   scripts/run-tests.sh BUILD_DIR [ctest args...]
# `make test` and `make test-asan` call it; so does .ci/run (through make).
#
# The PostgreSQL and MariaDB suites need servers: this starts throwaway ones
# (scripts/db-up.sh), exports their URLs to ctest and always stops them
# (scripts/db-down.sh), whatever happens. `make test` installs the servers
# first (scripts/deps.sh --all). A missing server is an error with a message
# saying so, never a silent skip; IDEM_TEST_ALLOW_SKIP=1 runs what can run
# and lets those suites report "skipped" (never under CI). Servers a developer
# started by hand (IDEM_TEST_DB_STATE exported from db-up.sh) are reused.
#
# The Galera suite (tests/galera, label galera) needs a 3-node cluster: it is
# started (scripts/galera-up.sh 3) only when the selection holds a galera_
# test, and always stopped at the end (scripts/galera-down.sh), like the
# servers above; one exported by hand (IDEM_TEST_GALERA_STATE) is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift

own_db=
own_galera=
cleanup() {
  if [ -n "$own_galera" ]; then "$here/galera-down.sh" "$own_galera" || true; fi
  if [ -n "$own_db" ]; then "$here/db-down.sh" "$own_db" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${IDEM_TEST_DB_STATE:-}" ]; then
  db_env=$("$here/db-up.sh") || {
    echo "run-tests.sh: could not start the test database servers (see above)" >&2
    exit 1
  }
  eval "$db_env"
  own_db=$IDEM_TEST_DB_STATE
fi
absent=()
[ -n "${IDEM_TEST_PG_URL:-}" ] || absent+=(PostgreSQL)
[ -n "${IDEM_TEST_MARIADB_URL:-}" ] || absent+=(MariaDB)
if [ ${#absent[@]} -gt 0 ]; then
  if [ -n "${CI:-}" ] || [ "${IDEM_TEST_ALLOW_SKIP:-0}" != 1 ]; then
    echo "run-tests.sh: no ${absent[*]} server: the suite runs every backend." >&2
    echo "run-tests.sh: install the servers with scripts/deps.sh --all (make test does)," >&2
    echo "run-tests.sh: or set IDEM_TEST_ALLOW_SKIP=1 to skip their suites." >&2
    exit 1
  fi
  echo "run-tests.sh: no ${absent[*]} server: their suites are skipped (IDEM_TEST_ALLOW_SKIP=1)" >&2
fi
export IDEM_TEST_PG_URL IDEM_TEST_MARIADB_URL

selected=$(cd "$build" && ctest -N "$@" 2>/dev/null) || selected=
if [ -z "${IDEM_TEST_GALERA_STATE:-}" ] && grep -q ' galera_' <<<"$selected"; then
  if galera_env=$("$here/galera-up.sh" 3); then
    eval "$galera_env"
    own_galera=$IDEM_TEST_GALERA_STATE
    export IDEM_TEST_GALERA_STATE IDEM_TEST_GALERA_URLS
  elif [ -n "${CI:-}" ] || [ "${IDEM_TEST_ALLOW_SKIP:-0}" != 1 ]; then
    echo "run-tests.sh: could not start the Galera test cluster (see above);" >&2
    echo "run-tests.sh: scripts/deps.sh --all installs galera-4 and rsync." >&2
    exit 1
  else
    echo "run-tests.sh: no Galera cluster: the galera suite skips (IDEM_TEST_ALLOW_SKIP=1)" >&2
    export IDEM_TEST_GALERA_SKIP="run-tests.sh could not start the Galera cluster"
  fi
fi

cd "$build"
# Most suites spend their time waiting (on idemd, a database server, a
# fault's timer): measured, a whole run kept about a third of two cores
# busy at -j 2. So ctest runs twice as many jobs as there are cores
# (IDEM_TEST_JOBS overrides); the suites that bound a client's wait in
# seconds count as two jobs each (PROCESSORS 2 in their CMakeLists).
jobs=${IDEM_TEST_JOBS:-$((2 * $(nproc 2>/dev/null || echo 2)))}
ctest --output-on-failure -j "$jobs" "$@"

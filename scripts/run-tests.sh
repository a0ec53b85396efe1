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
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift

if [ -z "${IDEM_TEST_DB_STATE:-}" ]; then
  db_env=$("$here/db-up.sh") || {
    echo "run-tests.sh: could not start the test database servers (see above)" >&2
    exit 1
  }
  eval "$db_env"
  trap '"$here/db-down.sh" "$IDEM_TEST_DB_STATE"' EXIT
  trap 'exit 130' INT TERM
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

cd "$build"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"

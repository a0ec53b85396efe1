#!/usr/bin/env bash
# Runs the whole test suite from a configured build directory:
#   scripts/run-tests.sh BUILD_DIR [ctest args...]
# `make test` and `make test-asan` call it; so does .ci/run (through make).
#
# The PostgreSQL and MariaDB suites need servers: when their binaries are
# installed this starts throwaway ones (scripts/db-up.sh), exports their URLs
# to ctest and always stops them (scripts/db-down.sh), whatever happens.
# Without a server binary its suites report "skipped". Under CI nothing may
# be skipped, so there a missing server is an error. Servers a developer
# started by hand (IDEM_TEST_DB_STATE exported from db-up.sh) are reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift

if [ -z "${IDEM_TEST_DB_STATE:-}" ]; then
  db_env=$("$here/db-up.sh")
  eval "$db_env"
  trap '"$here/db-down.sh" "$IDEM_TEST_DB_STATE"' EXIT
  trap 'exit 130' INT TERM
fi
if [ -n "${CI:-}" ] && { [ -z "${IDEM_TEST_PG_URL:-}" ] || [ -z "${IDEM_TEST_MARIADB_URL:-}" ]; }; then
  echo "run-tests.sh: CI must run every backend: install the servers with scripts/deps.sh --all" >&2
  exit 1
fi
export IDEM_TEST_PG_URL IDEM_TEST_MARIADB_URL

cd "$build"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"

#!/usr/bin/env bash
# Runs the whole test suite from a configured build directory:
#   scripts/run-tests.sh BUILD_DIR [ctest args...]
# `make test` and `make test-asan` call it; so does .ci/run (through make).
set -euo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR [ctest args]}
shift
cd "$build"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --output-on-failure -j "$jobs" "$@"

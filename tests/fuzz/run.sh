#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]: run each libFuzzer target
# of BUILD_DIR (make fuzz builds them with clang) for SECONDS, starting from
# the seed corpus tests/fuzz/corpus/<target>. New inputs go to
# BUILD_DIR/fuzz-corpus/<target>, crashes to BUILD_DIR/fuzz-artifacts/.
# Exit 1 when any target found a crash (its reproducer is printed).
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
secs=${2:-60}
shift 2 || true
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(key request fingerprint recon signature store_url http)
# The targets' SQLite store: tmpfs when there is one (no fsync cost).
[ -d /dev/shm ] && export TMPDIR=${TMPDIR:-/dev/shm}
mkdir -p "$build/fuzz-artifacts"
failed=()
printf '%-12s %10s %8s %6s %s\n' target execs cov corpus result
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  work=$build/fuzz-corpus/$t
  log=$build/fuzz-artifacts/$t.log
  mkdir -p "$work"
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t-" "$work" "$here/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  n=$(find "$work" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    res=ok
  else
    res="CRASH (exit $rc): $(grep -o "$build/fuzz-artifacts/$t-[^ ]*" "$log" | tail -1)"
    failed+=("$t")
  fi
  printf '%-12s %10s %8s %6s %s\n' "$t" "${execs:-?}" "${cov:-?}" "$n" "$res"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]}; logs in $build/fuzz-artifacts/" >&2
  exit 1
fi

#!/usr/bin/env bash
# Stops the throwaway Galera cluster scripts/galera-up.sh started and removes
# its state dir. Only signals processes recorded in pid files inside that dir
# whose command line names the dir (a recycled pid is never hit), so it can
# never stop a server it did not start, including other helpers' db-up.sh
# servers.
#
#   scripts/galera-down.sh "$IDEM_TEST_GALERA_STATE"
set -uo pipefail
state=${1:?usage: galera-down.sh STATE_DIR}
case "$state" in
  */idem-galera.*) ;;
  *) echo "galera-down.sh: $state is not a galera-up.sh state dir" >&2; exit 2 ;;
esac
[ -d "$state" ] || exit 0

# Is pid alive and started for this state dir (its command line names it)?
ours() {
  local pid=$1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr "\\0" " " 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$state/"
}

pids=()
for f in "$state"/n*/mariadbd.pid "$state"/n*/launcher.pid "$state"/n*/data/rsync_sst.pid; do
  [ -f "$f" ] || continue
  pid=$(head -n 1 "$f" 2>/dev/null | tr -dc 0-9)
  if ours "$pid"; then pids+=("$pid"); fi
done
# Nodes first with SIGTERM (all at once: a node shutting down alone would
# otherwise wait for the others' view change), then whatever is left.
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
for _ in $(seq 1 150); do
  alive=0
  for pid in "${pids[@]}"; do ours "$pid" && alive=1; done
  [ $alive -eq 0 ] && break
  sleep 0.1
done
for pid in "${pids[@]}"; do ours "$pid" && kill -KILL "$pid" 2>/dev/null; done
# SST helpers (wsrep_sst_rsync, rsync --daemon) a killed node left behind.
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = $$ ] && continue
  cmd=$(tr "\\0" " " 2>/dev/null <"$p/cmdline") || continue
  case "$cmd" in
    *mariadbd*"$state/"* | *rsync*"$state/"* | *wsrep_sst*"$state/"*) kill -KILL "$pid" 2>/dev/null ;;
  esac
done
sleep 0.2
rm -rf "$state"

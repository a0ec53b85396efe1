# bench/lib.sh: what the benchmark scripts share; sourced, never run. The
# script sets root, tmp, server_pid and db_state before its trap fires.

# Stop the server the script started, if any, and wait for it to exit.
stop_server() {
  if [ -n "${server_pid:-}" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}

# On exit: the server, the throwaway database servers, the temp dir.
bench_cleanup() {
  stop_server
  if [ -n "${db_state:-}" ]; then "$root/scripts/db-down.sh" "$db_state" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}

# A free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
